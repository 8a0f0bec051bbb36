//! Ring links between threads over memory windows: two links, and a
//! seeded stream of messages that the receiver checks one by one.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::EngineConfig;
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::{HeapWindow, Window};

pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Message `index` of a seeded stream: its length and bytes follow from
/// (seed, index), so the receiver can check each without a copy.
pub fn message(seed: u64, index: u64, max_len: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = match rng.below(10) {
        0 => 0,
        1..=5 => rng.below(256) as usize,
        6..=8 => rng.below(16 << 10) as usize,
        _ => rng.below(max_len as u64) as usize,
    };
    let mut data = vec![0; len];
    rng.fill(&mut data);
    data
}

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        mtu: 4096,
        peer_timeout: Duration::from_secs(5),
        ..EngineConfig::default()
    }
}

/// Two heap windows with rings, and the two links over them.
pub fn thread_links<W: Window + Clone>(
    window_a: W,
    window_b: W,
    a_writes: impl FnOnce(W) -> W,
    b_writes: impl FnOnce(W) -> W,
) -> (RingLink<W>, RingLink<W>) {
    let geometry = Geometry::for_window(window_a.len(), engine_config().mtu).unwrap();
    init_ring(&window_a, geometry, 1).unwrap();
    init_ring(&window_b, geometry, 1).unwrap();
    let a = RingLink::<_>::new(
        window_a.clone(),
        a_writes(window_b.clone()),
        engine_config(),
        1,
    )
    .unwrap();
    let b = RingLink::<_>::new(window_b, b_writes(window_a), engine_config(), 1).unwrap();
    (a, b)
}

/// Sends `count` seeded messages from `sender` while `receiver` (on another
/// thread) checks each, in order.
pub fn stream<W: Window + 'static>(
    mut sender: RingLink<W>,
    mut receiver: RingLink<W>,
    count: u64,
    seed: u64,
) -> (RingLink<W>, RingLink<W>) {
    let reader = thread::spawn(move || {
        for index in 0..count {
            let got = receiver
                .recv(TIMEOUT)
                .unwrap_or_else(|e| panic!("message {index}: {e}"));
            assert!(
                got == message(seed, index, 200_000),
                "message {index} differs"
            );
            receiver.recycle(got);
        }
        // Stay up until the sender has its acknowledgements.
        answer_for(&mut receiver, Duration::from_millis(500));
        receiver
    });
    for index in 0..count {
        sender
            .send_blocking(message(seed, index, 200_000), TIMEOUT)
            .unwrap();
    }
    sender.flush(TIMEOUT).unwrap();
    let receiver = reader.join().expect("receiver thread");
    assert_eq!(sender.completed(), count);
    (sender, receiver)
}

/// Keeps `link` answering for `linger` (the peer gets its last
/// acknowledgements).
pub fn answer_for<W: Window>(link: &mut RingLink<W>, how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        link.progress().unwrap();
    }
}

/// Two ring links over heap windows, driven by the calling thread, with
/// their session up (a first message from `a` has reached `b`), so that
/// `a` can fill `b`'s ring before `b` receives.
pub fn linked_in_one_thread() -> (RingLink<Arc<HeapWindow>>, RingLink<Arc<HeapWindow>>) {
    let window_a = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(1 << 20).unwrap());
    let (mut a, mut b) = thread_links(window_a, window_b, |w| w, |w| w);
    a.send_blocking(vec![7u8; 8], TIMEOUT).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while b.try_recv().unwrap().is_none() {
        a.progress().unwrap();
        assert!(Instant::now() < deadline, "the session did not come up");
    }
    (a, b)
}
