//! A ring survives its indices being corrupted: a head or consumed word
//! that fails its check, or cannot be true, is a missed update (counted,
//! ignored, repaired by the peer's next or repeated publication), and a
//! scribble over the rest of a control block changes nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use barlink_transport::EngineConfig;
use barlink_transport::link::{IndexStats, RingLink, init_ring};
use barlink_transport::ring::{CONTROL_LEN, Geometry, offset};
use barlink_transport::window::{
    FaultConfig, FaultWindow, HeapWindow, ScribbleConfig, Scribbler, ShmOptions, ShmWindow, Window,
};

mod common;
use common::ring_links::{engine_config, stream, thread_links};

/// Timers so long that nothing but a repeated index publication can
/// repair a missed one within the tests' patience: no retransmission, no
/// heartbeat.
fn patient_config() -> EngineConfig {
    EngineConfig {
        initial_rto: Duration::from_secs(20),
        min_rto: Duration::from_secs(20),
        max_rto: Duration::from_secs(20),
        heartbeat_interval: Duration::from_secs(20),
        peer_timeout: Duration::from_secs(60),
        ..engine_config()
    }
}

type HeapLink = RingLink<Arc<HeapWindow>>;

/// Two links over heap windows, driven from one thread; the windows are
/// returned so that a test can scribble over them.
fn heap_pair(
    config: EngineConfig,
    window_len: usize,
) -> (HeapLink, HeapLink, [Arc<HeapWindow>; 2]) {
    let window_a = Arc::new(HeapWindow::new(window_len).unwrap());
    let window_b = Arc::new(HeapWindow::new(window_len).unwrap());
    let geometry = Geometry::for_window(window_len, config.mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let a = RingLink::new(window_a.clone(), window_b.clone(), config.clone(), 1).unwrap();
    let b = RingLink::new(window_b.clone(), window_a.clone(), config, 1).unwrap();
    (a, b, [window_a, window_b])
}

/// Drives both links until `b` delivers a message, for at most `within`.
fn deliver(a: &mut HeapLink, b: &mut HeapLink, within: Duration) -> Option<Vec<u8>> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        a.progress().expect("a's link stays up");
        if let Some(data) = b.try_recv().expect("b's link stays up") {
            return Some(data);
        }
    }
    None
}

#[test]
fn a_scribbled_control_block_is_ignored_and_the_link_goes_on() {
    let (mut a, mut b, [window_a, window_b]) = heap_pair(engine_config(), 1 << 20);
    a.send_blocking(b"before".to_vec(), Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        deliver(&mut a, &mut b, Duration::from_secs(5)).as_deref(),
        Some(&b"before"[..])
    );
    // Garbage over both index words of both windows and over the identity
    // line (magic, geometry, generation) of both.
    for window in [&window_a, &window_b] {
        window.write(offset::MAGIC, &[0xA5; offset::HEAD]).unwrap();
        window
            .store_u64(offset::HEAD, 0xdead_beef_0bad_f00d, Ordering::Release)
            .unwrap();
        window
            .store_u64(offset::CONSUMED, u64::MAX, Ordering::Release)
            .unwrap();
    }
    for index in 0..200u32 {
        let data = index.to_le_bytes().repeat(100 + index as usize);
        a.send_blocking(data.clone(), Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            deliver(&mut a, &mut b, Duration::from_secs(5)),
            Some(data),
            "message {index}"
        );
    }
    let missed = a.index_stats().plus(b.index_stats());
    assert!(
        missed.corrupt >= 2,
        "b saw the corrupt head, a the corrupt consumed word: {missed:?}"
    );
}

/// A message each way, and both sides driven until every acknowledgement
/// is in: after this neither side has anything to send of its own accord
/// (no heartbeat for 20 s with [`patient_config`]).
fn settle(a: &mut HeapLink, b: &mut HeapLink) {
    a.send(b"hello".to_vec()).unwrap();
    assert!(deliver(a, b, Duration::from_secs(5)).is_some());
    b.send(b"hello back".to_vec()).unwrap();
    assert!(deliver(b, a, Duration::from_secs(5)).is_some());
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        a.progress().unwrap();
        b.progress().unwrap();
    }
    assert_eq!(a.completed(), 1);
    assert_eq!(b.completed(), 1);
}

#[test]
fn a_missed_head_is_repaired_by_its_repetition() {
    let (mut a, mut b, [_, window_b]) = heap_pair(patient_config(), 1 << 20);
    settle(&mut a, &mut b);
    let sent_before = a.engine().stats().packets_sent;
    a.send(b"lost doorbell".to_vec()).unwrap();
    a.progress().unwrap();
    assert_eq!(a.engine().stats().packets_sent, sent_before + 1);
    // The head store that announced it is lost: the word reads garbage.
    window_b
        .store_u64(offset::HEAD, 0x0123_4567_89ab_cdef, Ordering::Release)
        .unwrap();
    assert_eq!(b.try_recv().unwrap(), None, "nothing announced");
    assert_eq!(b.index_stats().corrupt, 1);
    // No retransmission and no heartbeat for 20 s: only a's repetition of
    // its head can announce the packet.
    let got = deliver(&mut a, &mut b, Duration::from_secs(5));
    assert_eq!(got.as_deref(), Some(&b"lost doorbell"[..]));
    assert_eq!(a.engine().stats().packets_sent, sent_before + 1);
    assert!(a.index_stats().republished >= 1);
}

#[test]
fn a_missed_consumed_count_is_repaired_by_its_repetition() {
    // A ring of 4 slots: a fills it, b drains it, and the consumed count
    // that would free it is lost before a reads it.
    let config = patient_config();
    let window_len = CONTROL_LEN + 4 * Geometry::slot_size_for(config.mtu);
    let (mut a, mut b, [window_a, _]) = heap_pair(config, window_len);
    settle(&mut a, &mut b);
    let messages: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 3000]).collect();
    for data in &messages[..4] {
        a.send(data.clone()).unwrap();
    }
    a.push(Duration::from_secs(5)).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut drained = 0;
    while drained < 4 && Instant::now() < until {
        if let Some(data) = b.try_recv().unwrap() {
            assert!(data == messages[drained], "message {drained}");
            drained += 1;
        }
    }
    assert_eq!(drained, 4);
    b.progress().unwrap();
    window_a
        .store_u64(offset::CONSUMED, !0x77, Ordering::Release)
        .unwrap();
    for (index, data) in messages.iter().enumerate().skip(4) {
        a.send(data.clone()).unwrap();
        let got = deliver(&mut a, &mut b, Duration::from_secs(5));
        assert!(
            got.as_ref() == Some(data),
            "message {index}: a {:?}, b {:?}",
            a.index_stats(),
            b.index_stats()
        );
    }
    assert_eq!(a.index_stats().corrupt, 1, "{:?}", a.index_stats());
    assert!(b.index_stats().republished >= 1);
    assert_eq!(a.engine().stats().retransmits(), 0);
}

#[test]
fn faulted_index_stores_lose_nothing() {
    // Every write is faulted, index stores included, and often: one in ten
    // flipped, one in twenty lost, one in twenty landing late.
    let faults = FaultConfig::none()
        .with_bit_flip(0.1)
        .with_drop(0.05)
        .with_stall(0.05, 3);
    let faulty = |seed: u64| {
        let faults = faults.clone();
        move |w: Arc<dyn Window>| -> Arc<dyn Window> { Arc::new(FaultWindow::new(w, faults, seed)) }
    };
    let window_a: Arc<dyn Window> = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b: Arc<dyn Window> = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let (a, b) = thread_links(window_a, window_b, faulty(3), faulty(4));
    let (a, b) = stream(a, b, 3000, 5);
    let missed = a.index_stats().plus(b.index_stats());
    assert!(missed.corrupt > 0, "{missed:?}");
}

/// What a co-tenant does to a live link, as a test: a thread with
/// its own mapping of the rings' memfds writes random bytes at random
/// offsets, control blocks included, while messages flow one way (and
/// acknowledgements the other) and are checked. Every message arrives once, intact, in order; the link
/// never fails.
#[test]
fn a_co_tenant_scribbling_over_live_windows_loses_nothing() {
    let len = (1 << 20) + CONTROL_LEN;
    let options = ShmOptions::default();
    let window_a = ShmWindow::create_memfd("scribbled-a", len, &options).unwrap();
    let window_b = ShmWindow::create_memfd("scribbled-b", len, &options).unwrap();
    let second_mapping = |w: &ShmWindow| -> Arc<dyn Window> {
        Arc::new(ShmWindow::from_fd(w.fd().try_clone_to_owned().unwrap()).unwrap())
    };
    let tenant_view = vec![second_mapping(&window_a), second_mapping(&window_b)];
    let (a, b) = thread_links(Arc::new(window_a), Arc::new(window_b), |w| w, |w| w);
    let scribbler = Scribbler::start(
        tenant_view,
        ScribbleConfig {
            writes_per_second: 2000.0,
            control_share: 0.2,
            index_share: 0.1,
            seed: 0x5C41_BB1E,
        },
    );
    let (a, b) = stream(a, b, 4000, 6);
    let scribbled = scribbler.stop();
    let missed: IndexStats = a.index_stats().plus(b.index_stats());
    let caught = b.engine().stats().crc_failures + b.engine().stats().malformed;
    eprintln!("{scribbled:?}: {caught} corrupt packets caught, {missed:?}");
    assert!(scribbled.onto_index > 0, "{scribbled:?}");
    assert!(missed.missed() > 0, "index words were hit: {missed:?}");
}

/// A scribbler at a slow rate still stops at once when asked.
#[test]
fn a_slow_scribbler_stops_at_once() {
    let window: Arc<dyn Window> = Arc::new(HeapWindow::new(1 << 16).unwrap());
    let scribbler = Scribbler::start(
        vec![window],
        ScribbleConfig {
            writes_per_second: 0.1,
            control_share: 0.5,
            index_share: 0.5,
            seed: 1,
        },
    );
    std::thread::sleep(Duration::from_millis(50));
    let asked = Instant::now();
    let scribbled = scribbler.stop();
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        scribbled.writes, 1,
        "one write at the start, the next 10 s away"
    );
}
