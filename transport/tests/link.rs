//! Ring links over memory windows: between threads (heap windows), between
//! processes (memfd windows set up by name), with faults injected into the
//! windows, and with a peer killed outright.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::crc::Crc32c;
use barlink_transport::link::{
    IoError, LinkConfig, Listener, NamedOptions, ProgressOptions, ProgressThread, RingLink,
    STREAM_MESSAGES_FROM, SetupError, Side, connect, connect_named, create_named_ring, init_ring,
    pair_windows,
};
use barlink_transport::ring::Geometry;
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::ShmOptions;
use barlink_transport::window::{FaultConfig, FaultWindow, HeapWindow, Window, WindowError};
use barlink_transport::{Delivery, EngineConfig, LinkError, RecvTarget};

mod common;
use common::ring_links::{
    TIMEOUT, answer_for, engine_config, linked_in_one_thread, message, stream, thread_links,
};

#[test]
fn ten_thousand_mixed_messages_between_threads_arrive_intact_in_order() {
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let (a, b) = thread_links(window_a, window_b, |w| w, |w| w);
    let (a, b) = stream(a, b, 10_000, 1);
    // No corruption on a clean window; a retransmission may still happen
    // when a thread is descheduled past the retransmission timeout.
    assert_eq!(
        a.engine().stats().retransmits_nak,
        0,
        "{:?}",
        a.engine().stats()
    );
    assert_eq!(b.engine().stats().crc_failures, 0);
    assert_eq!(b.engine().stats().messages_delivered, 10_000);
}

#[test]
fn faults_in_the_windows_lose_nothing() {
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    // Bulk writes into either ring are flipped, dropped, torn or stalled,
    // index stores flipped, dropped or stalled.
    let faults = FaultConfig::none()
        .with_bit_flip(0.002)
        .with_drop(0.001)
        .with_tear(0.001)
        .with_stall(0.001, 3);
    let make = |seed: u64| {
        let faults = faults.clone();
        move |w: Arc<HeapWindow>| -> Arc<dyn Window> { Arc::new(FaultWindow::new(w, faults, seed)) }
    };
    let a_own: Arc<dyn Window> = window_a.clone();
    let b_own: Arc<dyn Window> = window_b.clone();
    let geometry = Geometry::for_window(window_a.len(), engine_config().mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let a = RingLink::<_>::new(a_own, make(7)(window_b), engine_config(), 1).unwrap();
    let b = RingLink::<_>::new(b_own, make(8)(window_a), engine_config(), 1).unwrap();
    let (a, b) = stream(a, b, 3000, 2);
    let caught = b.engine().stats().crc_failures + b.engine().stats().malformed;
    assert!(
        caught > 0,
        "faults were injected and caught: {:?}",
        b.engine().stats()
    );
    assert!(a.engine().stats().retransmits() > 0);
}

/// A window that counts the pieces read out of it by the streaming copies.
struct CountsStreaming {
    inner: Arc<HeapWindow>,
    streamed: Arc<AtomicU64>,
}

impl Window for CountsStreaming {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.inner.write(offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.inner.read(offset, dst)
    }
    fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.inner.read_crc(offset, dst, crc)
    }
    fn read_crc_streaming(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        self.streamed.fetch_add(1, AtomicOrdering::Relaxed);
        self.inner.read_crc_streaming(offset, dst, crc)
    }
    fn load_u64(&self, offset: usize, order: AtomicOrdering) -> Result<u64, WindowError> {
        self.inner.load_u64(offset, order)
    }
    fn store_u64(
        &self,
        offset: usize,
        value: u64,
        order: AtomicOrdering,
    ) -> Result<(), WindowError> {
        self.inner.store_u64(offset, value, order)
    }
    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: AtomicOrdering,
    ) -> Result<u64, WindowError> {
        self.inner.fetch_add_u64(offset, value, order)
    }
}

#[test]
fn messages_that_land_around_the_cache_arrive_intact_through_faults() {
    // Large enough to take the streaming copy out of the ring (and only
    // those); flipped and torn writes into the rings must still be caught
    // by the CRC of what landed and resent.
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let faults = FaultConfig::none().with_bit_flip(0.002).with_tear(0.001);
    let geometry = Geometry::for_window(window_a.len(), engine_config().mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let a_writes: Arc<dyn Window> = Arc::new(FaultWindow::new(window_b.clone(), faults, 11));
    let streamed = Arc::new(AtomicU64::new(0));
    let b_own: Arc<dyn Window> = Arc::new(CountsStreaming {
        inner: window_b,
        streamed: streamed.clone(),
    });
    let a_own: Arc<dyn Window> = window_a.clone();
    let mut a = RingLink::<_>::new(a_own, a_writes, engine_config(), 1).unwrap();
    let mut b = RingLink::<_>::new(b_own, window_a, engine_config(), 1).unwrap();
    let base = STREAM_MESSAGES_FROM as usize;
    // The first, one byte short of the threshold, lands without streaming.
    let lens = [base - 1, base, base + 1, base + 4097, base + (1 << 20) + 63];
    let expected: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(index, &len)| {
            let mut data = vec![0u8; len];
            SplitMix64::new(index as u64 + 1).fill(&mut data);
            data
        })
        .collect();
    let to_send = expected.clone();
    let sender = thread::spawn(move || {
        // The first alone: none of the next one's packets can land before
        // the receiver has taken it and acknowledged it.
        for (index, data) in to_send.into_iter().enumerate() {
            a.send_blocking(data, TIMEOUT).unwrap();
            if index == 0 {
                a.flush(TIMEOUT).unwrap();
            }
        }
        a.flush(TIMEOUT).unwrap();
        a
    });
    for (index, want) in expected.iter().enumerate() {
        let got = b.recv(TIMEOUT).unwrap();
        assert!(
            got == *want,
            "message {index} ({} bytes) differs",
            want.len()
        );
        if index == 0 {
            assert_eq!(
                streamed.load(AtomicOrdering::Relaxed),
                0,
                "a message below STREAM_MESSAGES_FROM was streamed"
            );
        }
    }
    // Every packet of the four large messages, at least (resent ones too).
    let packets = lens[1..]
        .iter()
        .map(|len| len.div_ceil(engine_config().max_payload_len() as usize) as u64)
        .sum::<u64>();
    let pieces = streamed.load(AtomicOrdering::Relaxed);
    assert!(
        pieces >= packets,
        "{pieces} pieces streamed, {packets} packets in large messages"
    );
    // Answer the sender's flush.
    while !sender.is_finished() {
        b.progress().unwrap();
    }
    let _a = sender.join().unwrap();
    assert!(
        b.engine().stats().crc_failures > 0,
        "faults were injected and caught: {:?}",
        b.engine().stats()
    );
}

#[test]
fn messages_received_into_one_buffer_land_in_that_buffer() {
    // Four messages of 64 KiB (large enough not to be taken in a batch)
    // wait in the ring before the receiver asks for any. A receive that
    // read them all at once would assemble the three behind the first in
    // buffers of its own; one that stops at the message its caller waits
    // for assembles each in the buffer the caller gives back.
    let (mut a, mut b) = linked_in_one_thread();
    let sent: Vec<Vec<u8>> = (0..4u64)
        .map(|seed| {
            let mut data = vec![0u8; 64 << 10];
            SplitMix64::new(seed + 1).fill(&mut data);
            data
        })
        .collect();
    for data in &sent {
        a.send_blocking(data.clone(), TIMEOUT).unwrap();
    }
    a.push(TIMEOUT).unwrap();
    let mut buf = Vec::with_capacity(64 << 10);
    let memory = buf.as_ptr();
    for (index, want) in sent.iter().enumerate() {
        let len = b.recv_into(&mut buf, TIMEOUT).unwrap();
        assert_eq!(len, want.len());
        assert!(buf == *want, "message {index} differs");
        assert_eq!(
            buf.as_ptr(),
            memory,
            "message {index} landed outside the caller's buffer"
        );
    }
}

#[test]
fn small_messages_waiting_in_the_ring_are_taken_in_one_round() {
    // The receive that stops at a large message still takes small ones in
    // a batch: one round for eight, not a round (and a load of the peer's
    // index line) for each.
    let (mut a, mut b) = linked_in_one_thread();
    for index in 0..8u8 {
        a.send_blocking(vec![index; 64], TIMEOUT).unwrap();
    }
    a.push(TIMEOUT).unwrap();
    let mut buf = Vec::new();
    b.recv_into(&mut buf, TIMEOUT).unwrap();
    assert_eq!(buf, vec![0u8; 64]);
    assert_eq!(
        b.engine().messages_ready(),
        7,
        "the other seven came in the same round"
    );
}

/// A posted target standing for one range of a larger buffer.
struct RangeOf {
    bytes: Vec<u8>,
    buffer_len: u64,
}

impl RecvTarget for RangeOf {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
    fn buffer_len(&self) -> u64 {
        self.buffer_len
    }
}

#[test]
fn ranges_of_a_large_posted_buffer_land_around_the_cache() {
    // Messages far below the threshold, each landing in a posted target:
    // streamed only where the target says it is a range of a buffer of
    // STREAM_MESSAGES_FROM bytes or more.
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let geometry = Geometry::for_window(window_a.len(), engine_config().mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let streamed = Arc::new(AtomicU64::new(0));
    let b_own: Arc<dyn Window> = Arc::new(CountsStreaming {
        inner: window_b.clone(),
        streamed: streamed.clone(),
    });
    let a_own: Arc<dyn Window> = window_a.clone();
    let mut a = RingLink::<_>::new(a_own, window_b, engine_config(), 1).unwrap();
    let mut b = RingLink::<_>::new(b_own, window_a, engine_config(), 1).unwrap();
    let len = 64 << 10;
    let large = STREAM_MESSAGES_FROM;
    for (round, buffer_len) in [(0u64, 0u64), (1, large - 1), (2, large), (3, 4 * large)] {
        let mut data = vec![0u8; len];
        SplitMix64::new(round + 1).fill(&mut data);
        let before = streamed.load(AtomicOrdering::Relaxed);
        b.post_recv(Box::new(RangeOf {
            bytes: vec![0u8; len],
            buffer_len,
        }));
        a.send_blocking(data.clone(), TIMEOUT).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let landed = loop {
            a.progress().unwrap();
            if let Some(delivery) = b.try_recv_delivery().unwrap() {
                break delivery;
            }
            assert!(Instant::now() < deadline, "round {round}: nothing arrived");
        };
        let Delivery::Landed { recv, len: got, .. } = landed else {
            panic!("round {round}: the message did not land in the posted target");
        };
        assert_eq!(got, len);
        assert!(
            recv.into_target().bytes_mut() == &data[..],
            "round {round} differs"
        );
        let pieces = streamed.load(AtomicOrdering::Relaxed) - before;
        if buffer_len >= large {
            assert!(
                pieces > 0,
                "a range of a {buffer_len}-byte buffer was not streamed"
            );
        } else {
            assert_eq!(
                pieces, 0,
                "a range of a {buffer_len}-byte buffer was streamed"
            );
        }
    }
}

#[test]
fn bad_windows_are_refused_with_a_reason() {
    let tiny = HeapWindow::new(4096).unwrap();
    let error = Geometry::for_window(tiny.len(), 4096).unwrap_err();
    assert!(error.to_string().contains("too small"), "{error}");
    // A window nobody laid a ring out in.
    let blank = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let ring = Arc::new(HeapWindow::new(1 << 20).unwrap());
    init_ring(&*ring, Geometry::for_window(1 << 20, 4096).unwrap(), 1).unwrap();
    let error = RingLink::<_>::new(ring.clone(), blank.clone(), engine_config(), 1).unwrap_err();
    assert!(matches!(error, SetupError::NotARing { .. }), "{error}");
    assert!(error.to_string().contains("not a barlink ring"));
    // A ring of another layout version.
    blank
        .write(0, &barlink_transport::ring::RING_MAGIC.to_le_bytes())
        .unwrap();
    blank.write(8, &99u32.to_le_bytes()).unwrap();
    let error = RingLink::<_>::new(ring.clone(), blank.clone(), engine_config(), 1).unwrap_err();
    assert!(
        matches!(error, SetupError::RingVersion { found: 99 }),
        "{error}"
    );
    // The peer's slots are smaller than our packets.
    let small_slots = Arc::new(HeapWindow::new(1 << 20).unwrap());
    init_ring(
        &*small_slots,
        Geometry::for_window(1 << 20, 1024).unwrap(),
        1,
    )
    .unwrap();
    let error = RingLink::<_>::new(ring, small_slots, engine_config(), 1).unwrap_err();
    assert!(
        matches!(
            error,
            SetupError::SlotsTooSmall {
                slot_size,
                mtu: 4096
            } if slot_size as usize == Geometry::slot_size_for(1024)
        ),
        "{error}"
    );
}

fn unique(name: &str) -> String {
    format!(
        "test-{name}-{}-{}",
        std::process::id(),
        SplitMix64::new(Instant::now().elapsed().as_nanos() as u64).next_u64()
    )
}

fn link_config() -> LinkConfig {
    LinkConfig {
        engine: engine_config(),
        window_len: 1 << 20,
        setup_timeout: Duration::from_secs(10),
        ..LinkConfig::default()
    }
}

#[test]
fn a_name_in_use_and_a_missing_listener_are_clear_errors() {
    let name = unique("busy");
    let _first = Listener::bind(&name).unwrap();
    let error = Listener::bind(&name).unwrap_err();
    assert!(matches!(error, SetupError::NameInUse { .. }), "{error}");
    assert!(error.to_string().contains("in use"));
    let config = LinkConfig {
        setup_timeout: Duration::from_millis(200),
        ..link_config()
    };
    let started = Instant::now();
    let error = connect::<Vec<u8>>(&unique("nobody"), &config).unwrap_err();
    assert!(matches!(error, SetupError::NoListener { .. }), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up in time"
    );
    let listener = Listener::bind(&unique("lonely")).unwrap();
    let error = listener.accept::<Vec<u8>>(&config).unwrap_err();
    assert!(matches!(error, SetupError::Timeout { .. }), "{error}");
}

/// The child side of the process tests: connects by name and streams
/// messages, then (for the kill test) keeps the link up until killed.
const CHILD_ROLE: &str = "BARLINK_LINK_TEST_CHILD";

#[test]
#[ignore = "the child side of the two-process tests, which start it with --ignored"]
fn child_process_role() {
    let Ok(spec) = std::env::var(CHILD_ROLE) else {
        return; // Only meaningful when spawned by the tests below.
    };
    let mut parts = spec.split(',');
    let name = parts.next().unwrap().to_string();
    let count: u64 = parts.next().unwrap().parse().unwrap();
    let mut linger = false;
    let mut seed = 3;
    for part in parts {
        match part.strip_prefix("seed=") {
            Some(value) => seed = value.parse().unwrap(),
            None => linger = part == "linger",
        }
    }
    let mut link = connect(&name, &link_config()).unwrap();
    for index in 0..count {
        link.send_blocking(message(seed, index, 200_000), TIMEOUT)
            .unwrap();
    }
    link.flush(TIMEOUT).unwrap();
    if linger {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            link.progress().unwrap();
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Keeps `link` acknowledging until `child` exits (at most `TIMEOUT`);
/// the child must succeed.
fn drive_until_exit<W: Window>(
    link: &mut RingLink<W>,
    child: &mut std::process::Child,
    what: &str,
) {
    let until = Instant::now() + TIMEOUT;
    loop {
        link.progress().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{what} failed: {status}");
            return;
        }
        assert!(Instant::now() < until, "{what} did not finish");
    }
}

fn spawn_child(name: &str, count: u64, linger: bool) -> std::process::Child {
    spawn_child_with(name, count, linger, 3)
}

fn spawn_child_with(name: &str, count: u64, linger: bool, seed: u64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_role",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ROLE,
            format!(
                "{name},{count}{},seed={seed}",
                if linger { ",linger" } else { "" }
            ),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn ten_thousand_messages_between_processes_by_name() {
    let name = unique("procs");
    let listener = Listener::bind(&name).unwrap();
    let mut child = spawn_child(&name, 10_000, false);
    let mut link: RingLink<_> = listener.accept(&link_config()).unwrap();
    for index in 0..10_000 {
        let got = link
            .recv(TIMEOUT)
            .unwrap_or_else(|e| panic!("message {index}: {e}"));
        assert!(got == message(3, index, 200_000), "message {index} differs");
        link.recycle(got);
    }
    drive_until_exit(&mut link, &mut child, "child");
    assert_eq!(link.engine().stats().messages_delivered, 10_000);
}

#[test]
fn a_peer_killed_with_sigkill_is_reported_within_the_deadline() {
    let name = unique("kill");
    let listener = Listener::bind(&name).unwrap();
    let mut child = spawn_child(&name, 100, true);
    let mut link: RingLink<_> = listener.accept(&link_config()).unwrap();
    for _ in 0..100 {
        link.recv(TIMEOUT).unwrap();
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = Instant::now();
    let error = link.recv(TIMEOUT).unwrap_err();
    let took = killed_at.elapsed();
    assert!(
        matches!(error, IoError::Closed(LinkError::PeerLost { .. })),
        "{error}"
    );
    let deadline = engine_config().peer_timeout + Duration::from_millis(500);
    assert!(
        took <= deadline,
        "reported after {took:?}, deadline {deadline:?}"
    );
}

/// A receiver whose caller does not take messages holds the credit they
/// use: the sender stops (its sends time out, nothing is dropped), memory
/// stays bounded by the window, and everything arrives once the caller
/// receives again.
#[test]
fn a_caller_that_does_not_receive_slows_the_sender_instead_of_queueing() {
    let len = (1 << 20) + barlink_transport::ring::CONTROL_LEN;
    let (mut a, mut b) = thread_links(
        Arc::new(HeapWindow::new(len).unwrap()),
        Arc::new(HeapWindow::new(len).unwrap()),
        |w| w,
        |w| w,
    );
    let payload = vec![0x5Au8; 3000];
    let window = engine_config().recv_window as usize;
    let mut queued = 0;
    // B is driven (progress) but its caller never receives.
    loop {
        match a.send_blocking(payload.clone(), Duration::from_millis(50)) {
            Ok(_) => queued += 1,
            Err(barlink_transport::link::IoError::Timeout { .. }) => break,
            Err(other) => panic!("{other}"),
        }
        for _ in 0..50 {
            b.progress().unwrap();
            a.progress().unwrap();
        }
        assert!(queued < 100 * window, "the sender never stopped");
    }
    for _ in 0..1000 {
        b.progress().unwrap();
        a.progress().unwrap();
    }
    let waiting = b.engine().messages_ready();
    assert!(
        waiting <= window,
        "{waiting} messages held for a window of {window}"
    );
    assert!(b.engine().buffered_bytes() <= 3 * window * engine_config().mtu);
    // Now B's caller receives: every message queued arrives, once.
    let mut received = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while received < queued {
        assert!(
            std::time::Instant::now() < deadline,
            "{received} of {queued} arrived"
        );
        if let Some(data) = b.try_recv().unwrap() {
            assert_eq!(data, payload);
            received += 1;
        }
        a.progress().unwrap();
    }
    a.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(a.completed(), queued as u64);
}

/// A peer killed in the middle of a stream (packets of a half-sent message
/// in flight) and started again under the same name: the surviving side
/// reports the old link lost, accepts the new one, and the new session
/// delivers only the new peer's messages, from its first, in order.
#[test]
fn a_restarted_peer_reconnects_and_no_old_data_reaches_the_new_session() {
    let name = unique("restart");
    let listener = Listener::bind(&name).unwrap();
    let mut first = spawn_child_with(&name, 1_000_000, false, 5);
    let mut old: RingLink<_> = listener.accept(&link_config()).unwrap();
    for index in 0..200 {
        let got = old.recv(TIMEOUT).unwrap();
        assert!(got == message(5, index, 200_000), "message {index} differs");
    }
    first.kill().unwrap(); // SIGKILL, mid-stream
    first.wait().unwrap();
    // Whatever the old peer had fully delivered may still be taken; then
    // the loss is reported, never a message of another session.
    let mut index = 200;
    let error = loop {
        match old.recv(TIMEOUT) {
            Ok(got) => {
                assert!(got == message(5, index, 200_000), "message {index} differs");
                index += 1;
            }
            Err(error) => break error,
        }
    };
    assert!(
        matches!(error, IoError::Closed(LinkError::PeerLost { .. })),
        "{error}"
    );
    let mut second = spawn_child_with(&name, 1_000, false, 6);
    let mut new: RingLink<_> = listener.accept(&link_config()).unwrap();
    for index in 0..1_000 {
        let got = new
            .recv(TIMEOUT)
            .unwrap_or_else(|e| panic!("new session, message {index}: {e}"));
        assert!(
            got == message(6, index, 200_000),
            "new session, message {index} is not the new peer's"
        );
    }
    drive_until_exit(&mut new, &mut second, "second child");
    assert_eq!(new.engine().stats().messages_delivered, 1_000);
}

/// Links driven by background progress threads: 10,000 mixed messages each
/// way at once, callers only sending and receiving.
#[test]
fn links_driven_by_progress_threads_move_ten_thousand_messages_each_way() {
    let (a, b) = thread_links(
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        |w| w,
        |w| w,
    );
    let options = ProgressOptions::default();
    let a = Arc::new(ProgressThread::spawn(a, options).unwrap());
    let b = Arc::new(ProgressThread::spawn(b, options).unwrap());
    let count = 10_000;
    let mut workers = Vec::new();
    for (from, to, seed) in [(&a, &b, 11), (&b, &a, 12)] {
        let from = Arc::clone(from);
        workers.push(thread::spawn(move || {
            for index in 0..count {
                from.send_blocking(message(seed, index, 200_000), TIMEOUT)
                    .unwrap_or_else(|e| panic!("send {index}: {e}"));
            }
            from.flush(TIMEOUT).unwrap();
        }));
        let to = Arc::clone(to);
        workers.push(thread::spawn(move || {
            for index in 0..count {
                let got = to
                    .recv(TIMEOUT)
                    .unwrap_or_else(|e| panic!("recv {index}: {e}"));
                assert!(
                    got == message(seed, index, 200_000),
                    "message {index} differs"
                );
                to.recycle(got);
            }
        }));
    }
    for worker in workers {
        worker.join().expect("worker");
    }
    assert_eq!(a.completed(), count);
    assert_eq!(b.completed(), count);
    assert_eq!(a.stats().messages_delivered, count);
    let a = Arc::into_inner(a).unwrap();
    let b = Arc::into_inner(b).unwrap();
    // Close both at once: each needs the other's thread to answer.
    let closer = thread::spawn(move || b.close(TIMEOUT));
    a.close(TIMEOUT).unwrap();
    closer.join().unwrap().unwrap();
}

/// A progress-thread link whose peer stops answering reports the loss to a
/// caller blocked in `recv` within the heartbeat deadline, and a timeout
/// is a timeout while the peer is alive.
#[test]
fn a_progress_thread_reports_a_silent_peer_and_times_out_waits() {
    let (a, b) = thread_links(
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        |w| w,
        |w| w,
    );
    let a = ProgressThread::spawn(a, ProgressOptions::default()).unwrap();
    let b = ProgressThread::spawn(b, ProgressOptions::default()).unwrap();
    b.send_blocking(vec![7; 10_000], TIMEOUT).unwrap();
    assert_eq!(a.recv(TIMEOUT).unwrap(), vec![7; 10_000]);
    let error = a.recv(Duration::from_millis(100)).unwrap_err();
    assert!(matches!(error, IoError::Timeout { .. }), "{error}");
    // The peer's thread stops and its link is left undriven.
    let b = b.into_link().unwrap();
    let stopped_at = Instant::now();
    let error = a.recv(TIMEOUT).unwrap_err();
    let took = stopped_at.elapsed();
    assert!(
        matches!(error, IoError::Closed(LinkError::PeerLost { .. })),
        "{error}"
    );
    let deadline = engine_config().peer_timeout + Duration::from_millis(500);
    assert!(
        took <= deadline,
        "reported after {took:?}, deadline {deadline:?}"
    );
    drop(b);
}

/// A private directory for ring files (removed at the end).
fn ring_dir(tag: &str) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(unique(tag));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

fn named_options(dir: &std::path::Path) -> NamedOptions {
    NamedOptions {
        engine: engine_config(),
        window_len: 1 << 20,
        shm: ShmOptions::default().with_dir(dir),
        setup_timeout: Duration::from_secs(10),
        reclaim_stale: false,
    }
}

/// The pid of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Links over named ring files (no socket): the two sides find each
/// other's files, move messages, and remove their files when done.
#[test]
fn a_link_over_named_ring_files_needs_no_socket() {
    let dir = ring_dir("named");
    let options = named_options(&dir);
    let second = {
        let options = options.clone();
        thread::spawn(move || {
            let mut link: RingLink<_> = connect_named("pair", Side::Second, &options).unwrap();
            for index in 0..1_000 {
                let got = link.recv(TIMEOUT).unwrap();
                assert!(
                    got == message(21, index, 200_000),
                    "message {index} differs"
                );
            }
            answer_for(&mut link, Duration::from_millis(300));
        })
    };
    let mut first: RingLink<_> = connect_named("pair", Side::First, &options).unwrap();
    for index in 0..1_000 {
        first
            .send_blocking(message(21, index, 200_000), TIMEOUT)
            .unwrap();
    }
    first.flush(TIMEOUT).unwrap();
    second.join().unwrap();
    drop(first);
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "ring files left behind: {left:?}");
    std::fs::remove_dir(&dir).unwrap();
}

/// A ring file left by a process that died is named as stale, with the
/// command that removes it, and reclaimed only when asked; a live owner's
/// file is "in use"; a file that is no ring says so.
#[test]
fn stale_live_and_foreign_ring_files_are_told_apart() {
    let dir = ring_dir("stale");
    let shm = ShmOptions::default().with_dir(&dir);
    let kept = shm.clone().with_unlink_on_drop(false);
    // A crashed owner: its ring file stays, with its pid inside.
    let window = create_named_ring("crashed", 1 << 20, 4096, &kept, false).unwrap();
    let dead = dead_pid();
    window
        .write(
            barlink_transport::ring::offset::OWNER_PID,
            &dead.to_le_bytes(),
        )
        .unwrap();
    drop(window);
    let error = create_named_ring("crashed", 1 << 20, 4096, &shm, false).unwrap_err();
    assert!(
        matches!(&error, SetupError::StaleRing { owner_pid, .. } if *owner_pid == dead),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("no longer runs") && text.contains("rm "),
        "{text}"
    );
    // Reclaimed on request: laid out anew, owned by this process.
    let window = create_named_ring("crashed", 1 << 20, 4096, &shm, true).unwrap();
    let info = barlink_transport::link::read_ring_info(&window).unwrap();
    assert_eq!(info.owner_pid, std::process::id());
    // While its owner runs, the same name is in use.
    let error = create_named_ring("crashed", 1 << 20, 4096, &shm, true).unwrap_err();
    assert!(matches!(error, SetupError::NameInUse { .. }), "{error}");
    drop(window);
    // A file that is not a ring is never taken over.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("foreign"))
            .unwrap();
        std::io::Write::write_all(&mut file, &[0x42; 8192]).unwrap();
    }
    let error = create_named_ring("foreign", 1 << 20, 4096, &shm, true).unwrap_err();
    assert!(matches!(error, SetupError::NotARing { .. }), "{error}");
    std::fs::remove_file(dir.join("foreign")).unwrap();
    // The other side's file is stale: connecting reports it, not a bare
    // timeout.
    let window = create_named_ring("gone.first", 1 << 20, 4096, &kept, false).unwrap();
    window
        .write(
            barlink_transport::ring::offset::OWNER_PID,
            &dead.to_le_bytes(),
        )
        .unwrap();
    drop(window);
    let options = NamedOptions {
        setup_timeout: Duration::from_millis(200),
        ..named_options(&dir)
    };
    let error = connect_named::<Vec<u8>>("gone", Side::Second, &options).unwrap_err();
    assert!(matches!(error, SetupError::StaleRing { .. }), "{error}");
    std::fs::remove_file(dir.join("gone.first")).unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    std::fs::remove_dir(&dir).unwrap();
}

/// A ring file that an earlier layout version left is told apart by its
/// owner as a current one is: stale once the owner is gone (reclaimed on
/// request, and named so when it is the other side's), in use while it
/// runs, and then named by its version.
#[test]
fn a_ring_file_of_an_older_layout_is_told_stale_or_in_use() {
    use barlink_transport::ring::{RING_VERSION, offset};
    let dir = ring_dir("older");
    let shm = ShmOptions::default().with_dir(&dir);
    let kept = shm.clone().with_unlink_on_drop(false);
    let older = RING_VERSION - 1;
    let leave = |name: &str, owner: u32| {
        let window = create_named_ring(name, 1 << 20, 4096, &kept, false).unwrap();
        window.write(offset::VERSION, &older.to_le_bytes()).unwrap();
        window
            .write(offset::OWNER_PID, &owner.to_le_bytes())
            .unwrap();
    };
    let dead = dead_pid();
    leave("crashed", dead);
    let error = create_named_ring("crashed", 1 << 20, 4096, &shm, false).unwrap_err();
    assert!(
        matches!(&error, SetupError::StaleRing { owner_pid, .. } if *owner_pid == dead),
        "{error}"
    );
    let window = create_named_ring("crashed", 1 << 20, 4096, &shm, true).unwrap();
    let info = barlink_transport::link::read_ring_info(&window).unwrap();
    assert_eq!(info.owner_pid, std::process::id());
    drop(window);
    // A running owner's: in use, named by its version.
    leave("running", std::process::id());
    let error = create_named_ring("running", 1 << 20, 4096, &shm, true).unwrap_err();
    assert!(matches!(error, SetupError::NameInUse { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("layout version {older}")),
        "{error}"
    );
    // The other side's: stale while its owner is gone, another version's
    // while it runs.
    let options = NamedOptions {
        setup_timeout: Duration::from_millis(200),
        ..named_options(&dir)
    };
    leave("gone.first", dead);
    let error = connect_named::<Vec<u8>>("gone", Side::Second, &options).unwrap_err();
    assert!(matches!(error, SetupError::StaleRing { .. }), "{error}");
    leave("live.first", std::process::id());
    let error = connect_named::<Vec<u8>>("live", Side::Second, &options).unwrap_err();
    assert!(
        matches!(error, SetupError::RingVersion { found } if found == older),
        "{error}"
    );
    for name in ["running", "gone.first", "live.first"] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    std::fs::remove_dir(&dir).unwrap();
}

/// Two windows both sides can reach (as two device BARs are): each side
/// lays out its ring and waits for the other's; a side that comes back
/// alone finds the other's ring full of the old session and says so
/// instead of writing where nobody reads; when both come back, it works.
#[test]
fn paired_windows_need_both_sides_fresh() {
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let place = std::path::Path::new("window b");
    let session = |seed: u64| {
        let (wa, wb) = (window_a.clone(), window_b.clone());
        let other = thread::spawn(move || {
            let mut link: RingLink<_> = pair_windows(
                wb,
                wa,
                engine_config(),
                TIMEOUT,
                std::path::Path::new("window a"),
            )
            .unwrap();
            for index in 0..500 {
                let got = link.recv(TIMEOUT).unwrap();
                assert!(
                    got == message(seed, index, 200_000),
                    "message {index} differs"
                );
            }
            answer_for(&mut link, Duration::from_millis(300));
        });
        let mut link: RingLink<_> = pair_windows(
            window_a.clone(),
            window_b.clone(),
            engine_config(),
            TIMEOUT,
            place,
        )
        .unwrap();
        for index in 0..500 {
            link.send_blocking(message(seed, index, 200_000), TIMEOUT)
                .unwrap();
        }
        link.flush(TIMEOUT).unwrap();
        other.join().unwrap();
    };
    session(31);
    let error = pair_windows::<_, Vec<u8>>(
        window_a.clone(),
        window_b.clone(),
        engine_config(),
        Duration::from_millis(200),
        place,
    )
    .unwrap_err();
    assert!(
        matches!(&error, SetupError::Handshake { detail } if detail.contains("earlier session")),
        "{error}"
    );
    session(32);
}

/// `progress_waiting`, the round a spinning caller makes: idle rounds that
/// reuse an earlier clock still see an arrival at once, and still notice
/// a silent peer within its timeout (the clock is read again every few
/// rounds, and on a fresh round).
#[test]
fn rounds_that_reuse_the_clock_see_arrivals_and_a_silent_peer() {
    let config = EngineConfig {
        mtu: 4096,
        peer_timeout: Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let len = (256 << 10) + barlink_transport::ring::CONTROL_LEN;
    let (window_a, window_b) = (HeapWindow::new(len).unwrap(), HeapWindow::new(len).unwrap());
    let (window_a, window_b) = (Arc::new(window_a), Arc::new(window_b));
    let geometry = Geometry::for_window(len, config.mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let mut a = RingLink::<_>::new(window_a.clone(), window_b.clone(), config.clone(), 1).unwrap();
    let mut b = RingLink::<_>::new(window_b, window_a, config, 2).unwrap();
    // The two learn each other's session.
    for _ in 0..100 {
        a.progress().unwrap();
        b.progress().unwrap();
    }
    assert!(a.engine().is_connected() && b.engine().is_connected());
    for _ in 0..20 {
        b.progress_waiting(false, true).unwrap();
    }
    a.send(vec![7u8; 100]).unwrap();
    a.progress().unwrap();
    assert!(
        b.progress_waiting(false, true).unwrap(),
        "an idle round with an old clock still takes the arrival"
    );
    assert_eq!(b.take_delivery().map(|d| d.len()), Some(100));
    // A falls silent: B, spinning, reports it within the timeout and a
    // margin, not only when its caller reads the clock.
    let started = Instant::now();
    let lost = loop {
        b.progress_waiting(false, false).unwrap();
        if b.check_open().is_err() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a silent peer went unnoticed"
        );
        std::hint::spin_loop();
    };
    assert!(
        lost >= Duration::from_millis(150) && lost < Duration::from_millis(700),
        "{lost:?}"
    );
}

/// A caller that lends targets takes its messages in them: a round that
/// has used every target lent leaves the next message in the ring rather
/// than beginning it in a buffer of the link's (to be copied out again),
/// so a stream lands whole in targets lent a few at a time.
#[test]
fn a_round_leaves_the_message_after_the_last_lent_target_in_the_ring() {
    let (mut a, mut b) = thread_links(
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        Arc::new(HeapWindow::new(1 << 20).unwrap()),
        |w| w,
        |w| w,
    );
    a.send_blocking(b"hello".to_vec(), TIMEOUT).unwrap();
    answer_until_delivered(&mut a, &mut b);
    let messages: Vec<Vec<u8>> = (0..12u64)
        .map(|i| {
            let mut data = vec![0u8; 3000 + 50 * i as usize];
            SplitMix64::new(i).fill(&mut data);
            data
        })
        .collect();
    for data in &messages {
        a.send_blocking(data.clone(), TIMEOUT).unwrap();
    }
    a.push(TIMEOUT).unwrap();
    let mut next = 0;
    for lent in [3, 9] {
        for _ in 0..lent {
            b.post_recv(Box::new(vec![0u8; 4096]));
        }
        b.progress().unwrap();
        for _ in 0..lent {
            let got = b.take_delivery();
            let Some(Delivery::Landed { recv, len, .. }) = got else {
                panic!("message {next} did not land in its target: {got:?}");
            };
            assert!(recv.into_target().bytes_mut()[..len] == messages[next][..]);
            next += 1;
        }
        assert!(b.take_delivery().is_none(), "more than the targets taken");
        assert!(!b.engine().holds_unreceived(), "the next message was begun");
    }
}

/// Drives `a` and `b` until `b` has a message delivered, and takes it.
fn answer_until_delivered<W: Window>(a: &mut RingLink<W>, b: &mut RingLink<W>) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        a.progress().unwrap();
        if b.try_recv_delivery().unwrap().is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "nothing arrived");
    }
}
