//! Zero-copy sends through the C ABI (`barlink_post_send_buffer` from a
//! registered buffer): each completes once, after the peer has it; a
//! buffer is refused once deregistered; a lost peer fails what is in
//! flight and gives the memory back.

use std::ptr;

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

use support::{default_config, expect, last_error, pair, recv, send, unwritten_completions};

#[test]
fn posted_zero_copy_sends_complete_once() {
    let (a, b) = pair(None);
    let blocks = 64usize;
    let block = 65536usize;
    let memory: Vec<u8> = (0..blocks * block).map(|i| (i * 31 / 7) as u8).collect();
    let buffer = register(&memory);
    let receiver = std::thread::spawn({
        let b = b as usize;
        move || {
            let b = b as *mut barlink_link;
            let mut got = Vec::new();
            let mut buf = vec![0u8; block];
            for _ in 0..blocks {
                let (status, len) = recv(b, &mut buf, 10_000);
                assert_eq!(status, BARLINK_OK, "{}", last_error());
                got.extend_from_slice(&buf[..len]);
            }
            // The last receive left its acknowledgement for b's next
            // round; a receiving process would go on driving its link.
            assert_eq!(barlink_progress(b), BARLINK_OK);
            got
        }
    });
    let mut requests = Vec::new();
    for i in 0..blocks {
        let mut request = 0;
        // SAFETY: valid out-pointer; the range is registered.
        let status = unsafe {
            barlink_post_send_buffer(a, buffer, i * block, block, i as u64 + 100, &mut request)
        };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        assert_ne!(request, 0);
        requests.push(request);
    }
    // Out of range, and deregistration while in flight.
    let mut request = 0;
    // SAFETY: valid out-pointer.
    let status =
        unsafe { barlink_post_send_buffer(a, buffer, blocks * block - 10, 11, 0, &mut request) };
    expect(
        status,
        BARLINK_INVALID_ARGUMENT,
        "outside the registered buffer",
    );
    // SAFETY: overflowing offset + len.
    let status = unsafe { barlink_post_send_buffer(a, buffer, usize::MAX, 2, 0, &mut request) };
    expect(status, BARLINK_INVALID_ARGUMENT, "outside");
    // The last post has not been acknowledged: that needs a round of
    // progress on `a` after the peer's, and nothing has driven `a` since.
    let status = barlink_deregister_buffer(buffer);
    expect(status, BARLINK_BUSY, "in flight");
    // The first by wait, the rest by poll.
    assert_eq!(
        barlink_wait(a, requests[0], 10_000),
        BARLINK_OK,
        "{}",
        last_error()
    );
    expect(
        barlink_test(a, requests[0]),
        BARLINK_INVALID_ARGUMENT,
        "already reported",
    );
    expect(barlink_test(a, 0), BARLINK_INVALID_ARGUMENT, "unknown");
    let mut seen = vec![requests[0]];
    let mut completions = unwritten_completions(8);
    let start = std::time::Instant::now();
    while seen.len() < blocks {
        let mut count = 0;
        // SAFETY: the array holds 8 completions; count is writable.
        let status = unsafe { barlink_poll(a, completions.as_mut_ptr(), 8, &mut count) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        for completion in &completions[..count] {
            assert_eq!(completion.status, BARLINK_OK);
            assert_eq!(completion.bytes, block as u64);
            let index = requests
                .iter()
                .position(|&r| r == completion.request)
                .unwrap();
            assert_eq!(completion.user_tag, index as u64 + 100);
            seen.push(completion.request);
        }
        assert!(start.elapsed().as_secs() < 20, "completions did not come");
    }
    seen.sort();
    assert_eq!(seen, requests);
    // Poll with no room: progress only; NULL array with max > 0 refused.
    let mut count = 1;
    // SAFETY: max 0 with NULL array is allowed.
    let status = unsafe { barlink_poll(a, ptr::null_mut(), 0, &mut count) };
    assert_eq!(status, BARLINK_OK);
    assert_eq!(count, 0);
    // SAFETY: refused before any write.
    let status = unsafe { barlink_poll(a, ptr::null_mut(), 4, &mut count) };
    expect(status, BARLINK_INVALID_ARGUMENT, "completions is NULL");
    let got = receiver.join().unwrap();
    assert!(got == memory, "payload differs");
    assert_eq!(
        barlink_deregister_buffer(buffer),
        BARLINK_OK,
        "{}",
        last_error()
    );
    check_sender_stats(a, b, blocks, block);
    assert_eq!(barlink_flush(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

#[test]
fn zero_copy_posts_wait_for_the_peer_and_refuse_a_deregistered_buffer() {
    let (a, b) = pair(None);
    let first = vec![5u8; 4096];
    let buffer = register(&first);
    let mut buf = vec![0u8; 4096];
    for tag in 0..4 {
        let mut request = 0;
        // SAFETY: valid out-pointer; the range is registered.
        let status = unsafe { barlink_post_send_buffer(a, buffer, 0, 4096, tag, &mut request) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        arrives_and_completes(a, b, request, &mut buf);
    }
    assert_eq!(
        barlink_deregister_buffer(buffer),
        BARLINK_OK,
        "{}",
        last_error()
    );
    // This thread looked the buffer up for every post: after
    // deregistration its handle is refused all the same.
    let mut request = 0;
    // SAFETY: valid out-pointer; the handle is checked, not dereferenced.
    let status = unsafe { barlink_post_send_buffer(a, buffer, 0, 1, 0, &mut request) };
    expect(status, BARLINK_INVALID_HANDLE, "already closed");
    // A post after others completed is pending until the peer has it.
    let more = vec![9u8; 4096];
    let buffer = register(&more);
    // SAFETY: valid out-pointer; the range is registered.
    let status = unsafe { barlink_post_send_buffer(a, buffer, 0, 4096, 7, &mut request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(
        barlink_test(a, request),
        BARLINK_PENDING,
        "{}",
        last_error()
    );
    arrives_and_completes(a, b, request, &mut buf);
    assert_eq!(buf, more);
    assert_eq!(
        barlink_deregister_buffer(buffer),
        BARLINK_OK,
        "{}",
        last_error()
    );
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A zero-copy send's buffer is let go of once the peer acknowledged
/// it, also when the acknowledgement came with a message a receive in
/// place took and the next receive on the link waits: deregistration
/// does not wait for that receive to end.
#[test]
fn an_acknowledged_buffer_is_let_go_while_a_receive_waits() {
    let (a, b) = pair(None);
    let memory = vec![3u8; 4096];
    let buffer = register(&memory);
    let mut request = 0;
    // SAFETY: valid out-pointer; the range is registered.
    let status = unsafe { barlink_post_send_buffer(a, buffer, 0, 4096, 1, &mut request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    // b takes it and answers: the acknowledgement goes with the answer.
    let mut buf = vec![0u8; 4096];
    let (status, len) = recv(b, &mut buf, 5000);
    assert_eq!((status, len), (BARLINK_OK, 4096), "{}", last_error());
    assert_eq!(send(b, b"answer"), BARLINK_OK);
    let waiter = std::thread::spawn({
        let a = a as usize;
        move || {
            let a = a as *mut barlink_link;
            let mut message = barlink_message {
                data: ptr::null(),
                len: 0,
                id: 0,
            };
            let mut lengths = Vec::new();
            for _ in 0..2 {
                // SAFETY: message is readable and writable.
                let status = unsafe { barlink_release_and_recv_message(a, &mut message, 20_000) };
                lengths.push((status, message.len));
            }
            lengths
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match barlink_deregister_buffer(buffer) {
            BARLINK_OK => break,
            status => {
                expect(status, BARLINK_BUSY, "in flight");
                assert!(
                    std::time::Instant::now() < deadline,
                    "the acknowledged buffer was held while a receive waited"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    assert!(!waiter.is_finished(), "the second receive still waits");
    assert_eq!(send(b, b"done"), BARLINK_OK);
    let lengths = waiter.join().unwrap();
    assert_eq!(
        lengths,
        [(BARLINK_OK, 6), (BARLINK_OK, 4)],
        "{}",
        last_error()
    );
    // Closing gives back the message the waiter holds.
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// The counters after `posted_zero_copy_sends_complete_once`, and a
/// shorter (older) stats struct filled only as far as it reaches.
fn check_sender_stats(a: *mut barlink_link, b: *mut barlink_link, blocks: usize, block: usize) {
    let mut stats = barlink_stats {
        struct_size: std::mem::size_of::<barlink_stats>() as u32,
        ..Default::default()
    };
    // SAFETY: stats is a full struct.
    assert_eq!(unsafe { barlink_get_stats(a, &mut stats) }, BARLINK_OK);
    assert_eq!(stats.messages_sent, blocks as u64);
    assert_eq!(stats.message_bytes_sent, (blocks * block) as u64);
    assert_eq!(stats.requests_in_flight, 0);
    assert_eq!(
        stats.struct_size as usize,
        std::mem::size_of::<barlink_stats>()
    );
    // Over shared memory a registered range goes into the ring in the copy
    // the CRC takes; only an RDMA adapter reads it in place (the guest's
    // kv_transfer test counts those).
    assert_eq!(
        (stats.packets_sent_in_place, stats.bytes_sent_in_place),
        (0, 0)
    );
    // An older, shorter stats struct gets only what it has room for.
    let mut short = [u64::MAX; 3];
    short[0] = 16;
    // SAFETY: short holds 24 writable bytes; struct_size says 16.
    let status = unsafe { barlink_get_stats(b, short.as_mut_ptr().cast()) };
    assert_eq!(status, BARLINK_OK);
    assert_eq!(short[0] & 0xffff_ffff, 16);
    assert_eq!(short[2], u64::MAX, "wrote past struct_size");
}

#[test]
fn peer_loss_fails_posted_sends_and_releases_memory() {
    let mut config = default_config();
    config.peer_timeout_ms = 300;
    let (a, b) = pair(Some(&config));
    // The peer goes silent: its handle is never driven again.
    let _ = b;
    let memory = vec![1u8; 1 << 20];
    let buffer = register(&memory);
    let mut last = 0;
    for i in 0..16 {
        // SAFETY: valid out-pointer; registered range.
        let status =
            unsafe { barlink_post_send_buffer(a, buffer, i * 65536, 65536, i as u64, &mut last) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
    }
    let status = barlink_wait(a, last, 10_000);
    expect(status, BARLINK_PEER_LOST, "peer lost");
    // The link ended: every payload was let go, so deregistration works.
    assert_eq!(
        barlink_deregister_buffer(buffer),
        BARLINK_OK,
        "{}",
        last_error()
    );
    let mut buf = [0u8; 4];
    let (status, _) = recv(a, &mut buf, 0);
    expect(status, BARLINK_PEER_LOST, "peer lost");
    expect(send(a, b"x"), BARLINK_PEER_LOST, "peer lost");
    assert_eq!(barlink_close(a, 100), BARLINK_OK);
    let _ = barlink_close(b, 0);
}

/// `b` receives the message of `a`'s posted send `request` into `buf`,
/// and `a` takes its completion once `b`'s acknowledgement went out.
fn arrives_and_completes(a: *mut barlink_link, b: *mut barlink_link, request: u64, buf: &mut [u8]) {
    let (status, len) = recv(b, buf, 10_000);
    assert_eq!((status, len), (BARLINK_OK, buf.len()), "{}", last_error());
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(
        barlink_wait(a, request, 10_000),
        BARLINK_OK,
        "{}",
        last_error()
    );
}

/// A link whose sends the CPU reads (shared memory here) needs no device
/// registration: registering a buffer with it answers at once, and the
/// handles are checked as everywhere else.
#[test]
fn registering_a_buffer_with_a_ring_link_answers_at_once_and_checks_handles() {
    let (a, b) = pair(None);
    let memory = vec![3u8; 8192];
    let buffer = register(&memory);
    assert_eq!(
        barlink_link_register_buffer(a, buffer),
        BARLINK_OK,
        "{}",
        last_error()
    );
    assert_eq!(barlink_link_register_buffer(b, buffer), BARLINK_OK);
    // Asked again, the same answer.
    assert_eq!(barlink_link_register_buffer(a, buffer), BARLINK_OK);
    // Swapped and null handles.
    let swapped =
        barlink_link_register_buffer(buffer.cast::<barlink_link>(), a.cast::<barlink_buffer>());
    expect(
        swapped,
        BARLINK_INVALID_HANDLE,
        "a buffer handle was passed",
    );
    let null_buffer = barlink_link_register_buffer(a, ptr::null_mut());
    expect(null_buffer, BARLINK_INVALID_HANDLE, "buffer handle is NULL");
    let null_link = barlink_link_register_buffer(ptr::null_mut(), buffer);
    expect(null_link, BARLINK_INVALID_HANDLE, "link handle is NULL");
    // Sends from it still go and arrive.
    let mut request = 0;
    let mut buf = vec![0u8; 8192];
    // SAFETY: valid out-pointer; the range is registered.
    let status = unsafe { barlink_post_send_buffer(a, buffer, 0, 8192, 1, &mut request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    arrives_and_completes(a, b, request, &mut buf);
    assert_eq!(buf, memory);
    assert_eq!(barlink_deregister_buffer(buffer), BARLINK_OK);
    let deregistered = barlink_link_register_buffer(a, buffer);
    expect(
        deregistered,
        BARLINK_INVALID_HANDLE,
        "buffer handle was already closed",
    );
    // A live buffer on a closed link.
    let live = register(&memory);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    let closed = barlink_link_register_buffer(a, live);
    expect(
        closed,
        BARLINK_INVALID_HANDLE,
        "link handle was already closed",
    );
    assert_eq!(barlink_deregister_buffer(live), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// Registers `memory`, which the test keeps alive and unmodified until it
/// deregisters it.
fn register(memory: &[u8]) -> *mut barlink_buffer {
    let mut buffer = ptr::null_mut();
    // SAFETY: a readable range and a writable out-pointer; the caller keeps
    // the range valid and unmodified while it is registered.
    let status =
        unsafe { barlink_register_buffer(memory.as_ptr().cast(), memory.len(), &mut buffer) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    buffer
}
