//! Copying sends (`barlink_send`, `barlink_post_send`) of long messages,
//! whose copies are made outside the link's lock: each call has its copy
//! before it returns, every message arrives whole and in order, and calls
//! on two threads at once keep to `send_queue_bytes`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

use support::{completions, drive, last_error, pair, poll, recv};

/// Message `index`'s bytes: its length and contents differ from its
/// neighbours', so a copy taken late, twice or from the wrong call shows;
/// five lengths take turns, so acknowledged copies are filled again.
/// Posted messages (even `index`) are longer than the peer's ring, so
/// the post cannot have written all of one before it returns.
fn message(index: usize) -> Vec<u8> {
    let base = if index.is_multiple_of(2) {
        5 << 20
    } else {
        64 << 10
    };
    let len = base + (index * 3 % 5) * 4093;
    (0..len)
        .map(|at| (at as u64).wrapping_mul(31).wrapping_add(index as u64 * 7) as u8)
        .collect()
}

/// Posts `len` bytes at `data`, polling completions while the send queue
/// is full; returns how many completions it took.
fn post(link: *mut barlink_link, data: *const u8, len: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut taken = 0;
    loop {
        let mut request = 0;
        // SAFETY: `data` holds `len` readable bytes; the out-pointer is
        // writable.
        let status = unsafe { barlink_post_send(link, data.cast(), len, 0, &mut request) };
        if status == BARLINK_OK {
            return taken;
        }
        assert_eq!(status, BARLINK_WOULD_BLOCK, "{}", last_error());
        assert!(Instant::now() < deadline, "no room within 10 s");
        let done = poll(link);
        assert!(done.iter().all(|c| c.status == BARLINK_OK), "{done:?}");
        taken += done.len();
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn long_copying_sends_with_a_progress_thread_keep_every_byte() {
    const MESSAGES: usize = 16;
    let config = barlink_config {
        struct_size: std::mem::size_of::<barlink_config>() as u32,
        flags: BARLINK_CONFIG_PROGRESS_THREAD,
        ..barlink_config::default()
    };
    let (a, b) = pair(Some(&config));
    let receiver = {
        let b = b as usize;
        std::thread::spawn(move || {
            // Late, so that the posts find the peer's ring full.
            std::thread::sleep(Duration::from_millis(200));
            let mut buf = vec![0u8; 6 << 20];
            for index in 0..MESSAGES {
                let (status, len) = recv(b as *mut barlink_link, &mut buf, 10_000);
                assert_eq!(status, BARLINK_OK, "message {index}: {}", last_error());
                assert!(
                    buf[..len] == message(index)[..],
                    "message {index} ({len} bytes) arrived wrong"
                );
            }
        })
    };
    // One buffer for every call, spoilt as soon as each returns: a send
    // that read it later would deliver the spoilt bytes.
    let mut buffer = vec![0u8; 6 << 20];
    let (mut posted, mut completed) = (0, 0);
    for index in 0..MESSAGES {
        let bytes = message(index);
        buffer[..bytes.len()].copy_from_slice(&bytes);
        if index.is_multiple_of(2) {
            completed += post(a, buffer.as_ptr(), bytes.len());
            posted += 1;
        } else {
            // SAFETY: `buffer` holds `bytes.len()` readable bytes.
            let status = unsafe { barlink_send(a, buffer.as_ptr().cast(), bytes.len(), 10_000) };
            assert_eq!(status, BARLINK_OK, "{}", last_error());
        }
        buffer.fill(0xee);
    }
    let done = completions(a, posted - completed);
    assert!(done.iter().all(|c| c.status == BARLINK_OK), "{done:?}");
    receiver.join().unwrap();
    assert_eq!(barlink_close(a, 2000), BARLINK_OK);
    assert_eq!(barlink_close(b, 2000), BARLINK_OK);
}

/// Two threads post at once on a link whose peer acknowledges nothing
/// yet: the copies held may not pass `send_queue_bytes`, so one post goes
/// and the other is told to wait, in every round.
#[test]
fn posts_on_two_threads_at_once_keep_to_send_queue_bytes() {
    const LEN: usize = 700 << 10;
    let config = barlink_config {
        struct_size: std::mem::size_of::<barlink_config>() as u32,
        send_queue_bytes: 1 << 20,
        ..barlink_config::default()
    };
    for round in 0..20 {
        let (a, b) = pair(Some(&config));
        let start = Arc::new(Barrier::new(2));
        let posts: Vec<_> = (0..2)
            .map(|_| {
                let (a, start) = (a as usize, Arc::clone(&start));
                std::thread::spawn(move || {
                    let data = vec![7u8; LEN];
                    let mut request = 0;
                    start.wait();
                    // SAFETY: `data` holds LEN readable bytes; the
                    // out-pointer is writable.
                    unsafe {
                        barlink_post_send(a as *mut _, data.as_ptr().cast(), LEN, 0, &mut request)
                    }
                })
            })
            .collect();
        let statuses: Vec<_> = posts.into_iter().map(|p| p.join().unwrap()).collect();
        let went = statuses.iter().filter(|s| **s == BARLINK_OK).count();
        assert_eq!(went, 1, "round {round}: {statuses:?}");
        let mut buf = vec![0u8; LEN];
        assert_eq!(recv(b, &mut buf, 5000), (BARLINK_OK, LEN));
        // The receive keeps its acknowledgement for b's next round.
        let driver = drive(b);
        assert_eq!(completions(a, 1)[0].status, BARLINK_OK);
        drop(driver);
        assert_eq!(barlink_close(a, 2000), BARLINK_OK);
        assert_eq!(barlink_close(b, 2000), BARLINK_OK);
    }
}
