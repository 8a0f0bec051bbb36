//! Copying sends (`barlink_send`, `barlink_post_send`) of long messages,
//! whose copies are made outside the link's lock while a progress thread
//! moves the link: each call has its copy before it returns, and every
//! message arrives whole and in order.

use barlink_c::barlink_status::*;
use barlink_c::*;

mod support;

use support::{completions, last_error, pair, recv};

/// Message `index`'s bytes: its length and contents differ from its
/// neighbours', so a copy taken late, twice or from the wrong call shows;
/// five lengths take turns, so acknowledged copies are filled again.
fn message(index: usize) -> Vec<u8> {
    let len = (64 << 10) + (index * 3 % 5) * 4093;
    (0..len)
        .map(|at| (at as u64).wrapping_mul(31).wrapping_add(index as u64 * 7) as u8)
        .collect()
}

#[test]
fn long_copying_sends_with_a_progress_thread_keep_every_byte() {
    const MESSAGES: usize = 48;
    let config = barlink_config {
        struct_size: std::mem::size_of::<barlink_config>() as u32,
        flags: BARLINK_CONFIG_PROGRESS_THREAD,
        ..barlink_config::default()
    };
    let (a, b) = pair(Some(&config));
    let receiver = {
        let b = b as usize;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
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
    let mut buffer = vec![0u8; 1 << 20];
    let mut posted = 0;
    for index in 0..MESSAGES {
        let bytes = message(index);
        buffer[..bytes.len()].copy_from_slice(&bytes);
        let data = buffer.as_ptr().cast();
        if index % 2 == 0 {
            let mut request = 0;
            // SAFETY: `buffer` holds `bytes.len()` readable bytes; the
            // out-pointer is writable.
            let status = unsafe { barlink_post_send(a, data, bytes.len(), 0, &mut request) };
            assert_eq!(status, BARLINK_OK, "{}", last_error());
            posted += 1;
        } else {
            // SAFETY: as above.
            let status = unsafe { barlink_send(a, data, bytes.len(), 10_000) };
            assert_eq!(status, BARLINK_OK, "{}", last_error());
        }
        buffer.fill(0xee);
    }
    let done = completions(a, posted);
    assert!(done.iter().all(|c| c.status == BARLINK_OK), "{done:?}");
    receiver.join().unwrap();
    assert_eq!(barlink_close(a, 2000), BARLINK_OK);
    assert_eq!(barlink_close(b, 2000), BARLINK_OK);
}
