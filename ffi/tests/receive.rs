//! Receiving through the C ABI: in place (`barlink_recv_message`, held
//! until released once, or given back with the next receive by
//! `barlink_release_and_recv_message`), posted receives cancelled (`barlink_cancel`) or
//! waited for one by one (`barlink_wait_completion`), and the engine's
//! flow control kept (a receiver that takes nothing
//! holds its sender back).

use std::ptr;

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

use support::{
    completions, default_config, drive, expect, last_error, pair, poll, post_recv, recv, send,
};

fn recv_message(link: *mut barlink_link, timeout_ms: u32) -> (barlink_status, barlink_message) {
    let mut message = barlink_message {
        data: std::ptr::dangling(),
        len: 99,
        id: 99,
    };
    // SAFETY: message is writable.
    let status = unsafe { barlink_recv_message(link, &mut message, timeout_ms) };
    (status, message)
}

/// The bytes of a message received in place.
fn held_bytes(message: &barlink_message) -> Vec<u8> {
    // SAFETY: barlink lent `len` readable bytes at `data` until the
    // message is released, which the caller does only after this copy.
    unsafe { std::slice::from_raw_parts(message.data.cast::<u8>(), message.len) }.to_vec()
}

fn stats(link: *mut barlink_link) -> barlink_stats {
    let mut stats = barlink_stats {
        struct_size: std::mem::size_of::<barlink_stats>() as u32,
        ..barlink_stats::default()
    };
    // SAFETY: a valid stats struct.
    assert_eq!(unsafe { barlink_get_stats(link, &mut stats) }, BARLINK_OK);
    stats
}

fn held_count(link: *mut barlink_link) -> u64 {
    stats(link).messages_held
}

/// Messages received in place are barlink's buffers, intact, held until
/// released once; releasing anything else is refused; a timeout zeroes
/// the message; posted receives come first.
#[test]
fn messages_received_in_place_are_held_until_released_once() {
    let (a, b) = pair(None);
    let driver = drive(a);
    let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let sent: [&[u8]; 3] = [b"x", &big, b""];
    for data in sent {
        assert_eq!(send(a, data), BARLINK_OK);
    }
    let mut held = Vec::new();
    for data in sent {
        let (status, message) = recv_message(b, 5000);
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        assert!(!message.data.is_null());
        assert_eq!(held_bytes(&message), data);
        held.push(message);
    }
    assert_eq!(held_count(b), 3);
    let (status, message) = recv_message(b, 10);
    expect(status, BARLINK_TIMEOUT, "timed out");
    assert!(message.data.is_null() && message.len == 0 && message.id == 0);
    // SAFETY: every pointer is NULL on purpose or valid.
    unsafe {
        expect(
            barlink_release_message(b, ptr::null()),
            BARLINK_INVALID_ARGUMENT,
            "message is NULL",
        );
        expect(
            barlink_release_message(a, &held[1]),
            BARLINK_INVALID_ARGUMENT,
            "not held from this link",
        );
        let changed = barlink_message {
            len: held[1].len - 1,
            ..held[1]
        };
        expect(
            barlink_release_message(b, &changed),
            BARLINK_INVALID_ARGUMENT,
            "not held from this link",
        );
        expect(
            barlink_recv_message(b, ptr::null_mut(), 0),
            BARLINK_INVALID_ARGUMENT,
            "message is NULL",
        );
        for message in &held {
            assert_eq!(barlink_release_message(b, message), BARLINK_OK);
        }
        expect(
            barlink_release_message(b, &held[0]),
            BARLINK_INVALID_ARGUMENT,
            "released already",
        );
    }
    assert_eq!(held_count(b), 0);
    // A posted receive takes the next message first.
    let mut buf = [0u8; 16];
    post_recv(b, &mut buf, 7);
    let (status, _) = recv_message(b, 0);
    expect(status, BARLINK_BUSY, "before barlink_recv_message");
    assert_eq!(send(a, b"posted"), BARLINK_OK);
    let done = completions(b, 1);
    assert_eq!((done[0].status, done[0].bytes), (BARLINK_OK, 6));
    assert_eq!(&buf[..6], b"posted");
    // Held when the link closes: closing releases it.
    assert_eq!(send(a, b"kept"), BARLINK_OK);
    let (status, message) = recv_message(b, 5000);
    assert_eq!(
        (status, held_bytes(&message)),
        (BARLINK_OK, b"kept".to_vec())
    );
    drop(driver);
    // b's last receive left its acknowledgement for b's next round, as
    // the Rust link does: one round sends it, or a's close would wait.
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A receiver that gives each message back with its next receive holds
/// one at a time; a message not this link's is refused, left as it was,
/// and nothing is received; any other failure leaves the message zeroed,
/// given back.
#[test]
fn each_receive_gives_the_last_message_back() {
    let (a, b) = pair(None);
    let driver = drive(a);
    let sent: Vec<Vec<u8>> = (0..20u8).map(|n| vec![n; 1 + 997 * n as usize]).collect();
    for data in &sent {
        assert_eq!(send(a, data), BARLINK_OK);
    }
    let next = |link, message: *mut barlink_message, timeout_ms| {
        // SAFETY: message is NULL on purpose, or readable and writable.
        unsafe { barlink_release_and_recv_message(link, message, timeout_ms) }
    };
    let mut message = barlink_message {
        data: ptr::null(),
        len: 0,
        id: 0,
    };
    for data in &sent[..10] {
        assert_eq!(next(b, &mut message, 5000), BARLINK_OK, "{}", last_error());
        assert_eq!(&held_bytes(&message), data);
        assert_eq!(held_count(b), 1);
    }
    // Refused: another link's (none of a's), changed, NULL. Nothing is
    // received meanwhile, and the message stays held.
    let kept = message;
    let mut changed = barlink_message {
        len: kept.len + 1,
        ..kept
    };
    expect(
        next(b, &mut changed, 5000),
        BARLINK_INVALID_ARGUMENT,
        "not held from this link",
    );
    assert_eq!(
        (changed.data, changed.len, changed.id),
        (kept.data, kept.len + 1, kept.id),
        "a refused message is left as it was"
    );
    let mut foreign = kept;
    expect(
        next(a, &mut foreign, 0),
        BARLINK_INVALID_ARGUMENT,
        "not held from this link",
    );
    assert_eq!(
        foreign.id, kept.id,
        "another link's message is left as it was"
    );
    expect(
        next(b, ptr::null_mut(), 0),
        BARLINK_INVALID_ARGUMENT,
        "message is NULL",
    );
    assert_eq!(held_count(b), 1);
    // The plain calls mix with it: released by id, received next in line.
    // SAFETY: kept was lent by b and not released.
    assert_eq!(unsafe { barlink_release_message(b, &kept) }, BARLINK_OK);
    let (status, plain) = recv_message(b, 5000);
    assert_eq!((status, held_bytes(&plain)), (BARLINK_OK, sent[10].clone()));
    message = plain;
    for data in &sent[11..] {
        assert_eq!(next(b, &mut message, 5000), BARLINK_OK, "{}", last_error());
        assert_eq!(&held_bytes(&message), data);
    }
    assert_eq!(held_count(b), 1);
    // Nothing more: the last is given back, the message zeroed, and a
    // zeroed message gives nothing back.
    expect(next(b, &mut message, 10), BARLINK_TIMEOUT, "timed out");
    assert!(message.data.is_null() && message.len == 0 && message.id == 0);
    assert_eq!(held_count(b), 0);
    expect(next(b, &mut message, 0), BARLINK_TIMEOUT, "timed out");
    drop(driver);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
    expect(next(b, &mut message, 0), BARLINK_INVALID_HANDLE, "closed");
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
}

/// A side that drives its link but receives nothing holds the sender
/// back: the messages it has not taken keep the credit they took, so the
/// sender completes about a window of them and no more, and nothing queues
/// on the receiving side without bound. Everything then arrives, in order.
#[test]
fn a_receiver_that_takes_nothing_holds_the_sender_back() {
    const MESSAGES: usize = 300;
    const SIZE: usize = 64 << 10;
    let (a, b) = pair(None);
    // The receiver's calls drive its link, but none takes a message.
    let receiver = drive(b);
    let data = vec![0x5au8; SIZE];
    let mut posted = 0;
    let mut completed = 0;
    let mut done = vec![
        barlink_completion {
            request: 0,
            user_tag: 0,
            bytes: 0,
            status: BARLINK_OK,
            reserved: 0,
        };
        64
    ];
    let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while std::time::Instant::now() < until {
        let mut request = 0;
        if posted < MESSAGES {
            // SAFETY: data is a live slice; request is writable.
            let status = unsafe {
                barlink_post_send(a, data.as_ptr().cast(), SIZE, posted as u64, &mut request)
            };
            if status == BARLINK_OK {
                posted += 1;
            } else {
                assert_eq!(status, BARLINK_WOULD_BLOCK, "{}", last_error());
            }
        }
        let mut got = 0;
        // SAFETY: done is writable for its length; got is writable.
        let status = unsafe { barlink_poll(a, done.as_mut_ptr(), done.len(), &mut got) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        completed += got;
    }
    // About a window: the ring's 4 MiB of 128 KiB packets, and what the
    // receiving engine holds.
    assert!(
        completed < 100,
        "{completed} of {posted} posted messages completed while the receiver took none"
    );
    drop(receiver);
    let mut buf = vec![0u8; SIZE];
    for index in 0..MESSAGES {
        if index == posted {
            assert_eq!(send(a, &data), BARLINK_OK, "{}", last_error());
            posted += 1;
        }
        let driver = drive(a);
        let (status, len) = recv(b, &mut buf, 5000);
        drop(driver);
        assert_eq!((status, len), (BARLINK_OK, SIZE), "message {index}");
        assert!(buf == data, "message {index} differs");
    }
    // The last receive returned as soon as its message was there, and its
    // acknowledgement goes with b's next round (docs/FFI.md, "Threads and
    // progress"): a's orderly close waits for b to be driven.
    let driver = drive(b);
    assert_eq!(barlink_close(a, 2000), BARLINK_OK, "{}", last_error());
    drop(driver);
    assert_eq!(barlink_close(b, 2000), BARLINK_OK);
}

/// A cancelled receive completes with `BARLINK_CANCELED` and is never
/// written; the receives posted after it take the messages in turn; one
/// that completed before the cancel is left as it is; and ids that are
/// not pending receives are refused.
#[test]
fn a_cancelled_receive_is_left_alone_and_the_next_takes_its_message() {
    let (a, b) = pair(None);
    let mut first = vec![0u8; 4096];
    let mut middle = vec![0xeeu8; 4096];
    let mut last = vec![0u8; 4096];
    let requests = [
        post_recv(b, &mut first, 1),
        post_recv(b, &mut middle, 2),
        post_recv(b, &mut last, 3),
    ];
    assert_eq!(
        barlink_cancel(b, requests[1]),
        BARLINK_OK,
        "{}",
        last_error()
    );
    let driver = drive(a);
    assert_eq!(send(a, b"one"), BARLINK_OK);
    assert_eq!(send(a, b"two"), BARLINK_OK);
    let done = completions(b, 3);
    let by_request = |r: u64| *done.iter().find(|c| c.request == r).unwrap();
    assert_eq!(by_request(requests[1]).status, BARLINK_CANCELED);
    assert_eq!(by_request(requests[1]).bytes, 0);
    assert_eq!(by_request(requests[1]).user_tag, 2);
    assert_eq!(
        (
            by_request(requests[0]).status,
            by_request(requests[0]).bytes
        ),
        (BARLINK_OK, 3)
    );
    assert_eq!(
        (
            by_request(requests[2]).status,
            by_request(requests[2]).bytes
        ),
        (BARLINK_OK, 3)
    );
    assert_eq!(&first[..3], b"one");
    assert_eq!(&last[..3], b"two");
    assert!(
        middle.iter().all(|&byte| byte == 0xee),
        "a cancelled buffer was written"
    );
    // Reported already, never posted, or a send's: refused.
    expect(
        barlink_cancel(b, requests[1]),
        BARLINK_INVALID_ARGUMENT,
        "no posted receive",
    );
    expect(
        barlink_cancel(b, 1u64 << 63 | 999),
        BARLINK_INVALID_ARGUMENT,
        "no posted receive",
    );
    expect(
        barlink_cancel(b, 1),
        BARLINK_INVALID_ARGUMENT,
        "only receives",
    );
    expect(
        barlink_cancel(ptr::null_mut(), requests[0]),
        BARLINK_INVALID_HANDLE,
        "",
    );
    // Completed before the cancel, not reported yet: left as it is.
    let received = || stats(b).messages_received;
    let mut three = vec![0u8; 64];
    let request = post_recv(b, &mut three, 4);
    let before = received();
    assert_eq!(send(a, b"three"), BARLINK_OK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while received() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "\"three\" did not arrive"
        );
        assert_eq!(barlink_progress(b), BARLINK_OK);
    }
    assert_eq!(barlink_cancel(b, request), BARLINK_OK, "{}", last_error());
    assert_eq!(
        barlink_wait(b, request, 5000),
        BARLINK_OK,
        "{}",
        last_error()
    );
    assert_eq!(&three[..5], b"three");
    drop(driver);
    // Reported as cancelled also once the link has ended since.
    let mut late = vec![0u8; 64];
    let request = post_recv(b, &mut late, 6);
    assert_eq!(barlink_cancel(b, request), BARLINK_OK, "{}", last_error());
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while barlink_progress(b) == BARLINK_OK {
        assert!(
            std::time::Instant::now() < deadline,
            "b did not see the close"
        );
    }
    expect(
        barlink_wait(b, request, 1000),
        BARLINK_CANCELED,
        "cancelled",
    );
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A message twice the ring, half of it landed in a posted receive when
/// that is cancelled: the rest arrives, the whole message is received
/// intact, and the cancelled buffer is not written again.
#[test]
fn a_message_landing_in_a_cancelled_receive_arrives_whole_elsewhere() {
    let (a, b) = pair(None);
    let long: Vec<u8> = (0..8usize << 20)
        .map(|i| (i * 31 + i / 4096) as u8)
        .collect();
    let mut lent = vec![0u8; long.len()];
    let request = post_recv(b, &mut lent, 5);
    let mut send_request = 0;
    // SAFETY: valid data and out-pointer; the copy is taken before return.
    let status =
        unsafe { barlink_post_send(a, long.as_ptr().cast(), long.len(), 0, &mut send_request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(barlink_progress(b), BARLINK_OK);
    expect(barlink_test(b, request), BARLINK_PENDING, "not completed");
    let landed = lent.iter().filter(|&&byte| byte != 0).count();
    assert!(landed > 0, "nothing had landed in the posted buffer yet");
    assert_eq!(barlink_cancel(b, request), BARLINK_OK, "{}", last_error());
    let before = lent.clone();
    let cancelled = completions(b, 1);
    assert_eq!(
        (cancelled[0].request, cancelled[0].status),
        (request, BARLINK_CANCELED)
    );
    let driver = drive(a);
    let mut whole = vec![0u8; long.len()];
    assert_eq!(recv(b, &mut whole, 10_000), (BARLINK_OK, long.len()));
    assert!(whole == long, "the message arrived changed");
    assert!(
        lent == before,
        "the cancelled buffer was written after the cancel"
    );
    assert_eq!(stats(b).messages_landed, 0, "it was copied, not landed");
    drop(driver);
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// `messages_landed` counts the receives whose message was assembled in
/// their own buffer (posted before it came, or a `barlink_recv` waiting
/// for it), not one copied in because it had arrived first.
#[test]
fn only_messages_assembled_in_their_buffer_count_as_landed() {
    let (a, b) = pair(None);
    let mut first = vec![0u8; 4096];
    let mut second = vec![0u8; 4096];
    post_recv(b, &mut first, 1);
    post_recv(b, &mut second, 2);
    let driver = drive(a);
    assert_eq!(send(a, b"first"), BARLINK_OK);
    assert_eq!(send(a, b"second"), BARLINK_OK);
    let done = completions(b, 2);
    assert!(done.iter().all(|c| c.status == BARLINK_OK), "{done:?}");
    assert_eq!((&first[..5], &second[..6]), (&b"first"[..], &b"second"[..]));
    assert_eq!(stats(b).messages_landed, 2);
    // Whole in barlink's memory before a buffer was there: copied in.
    let before = stats(b).messages_received;
    assert_eq!(send(a, b"early"), BARLINK_OK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stats(b).messages_received == before {
        assert!(
            std::time::Instant::now() < deadline,
            "\"early\" did not arrive"
        );
        assert_eq!(barlink_progress(b), BARLINK_OK);
    }
    let mut buf = vec![0u8; 64];
    assert_eq!(recv(b, &mut buf, 5000), (BARLINK_OK, 5));
    assert_eq!(&buf[..5], b"early");
    assert_eq!(stats(b).messages_landed, 2);
    // A blocking receive lends its buffer while it waits: the message
    // sent meanwhile lands there.
    drop(driver);
    let sender = a as usize;
    let late = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let status = send(sender as *mut barlink_link, b"late");
        // The peer's acknowledgement needs a round of this side too.
        let _ = barlink_flush(sender as *mut barlink_link, 5000);
        status
    });
    assert_eq!(recv(b, &mut buf, 5000), (BARLINK_OK, 4));
    assert_eq!(late.join().unwrap(), BARLINK_OK);
    assert_eq!(&buf[..4], b"late");
    let counted = stats(b);
    assert_eq!((counted.messages_landed, counted.messages_received), (3, 4));
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A message that began arriving before any receive was posted is copied
/// into its receive's buffer; the receives posted behind it still take
/// their own messages in place (each buffer names the message it takes),
/// rather than the next message landing in the first buffer, out of turn.
#[test]
fn receives_posted_behind_a_message_already_arriving_take_their_own_in_place() {
    let (a, b) = pair(None);
    let long: Vec<u8> = (0..8usize << 20)
        .map(|i| (i * 13 + i / 999) as u8)
        .collect();
    let mut request = 0;
    // SAFETY: valid data and out-pointer; the copy is taken before return.
    let status = unsafe { barlink_post_send(a, long.as_ptr().cast(), long.len(), 0, &mut request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert!(stats(b).messages_received == 0, "not whole yet");
    let mut whole = vec![0u8; long.len()];
    let mut one = vec![0u8; 64];
    let mut two = vec![0u8; 64];
    post_recv(b, &mut whole, 0);
    post_recv(b, &mut one, 1);
    post_recv(b, &mut two, 2);
    let driver = drive(a);
    assert_eq!(send(a, b"one"), BARLINK_OK);
    assert_eq!(send(a, b"two"), BARLINK_OK);
    let done = completions(b, 3);
    assert!(done.iter().all(|c| c.status == BARLINK_OK), "{done:?}");
    assert!(whole == long, "the long message arrived changed");
    assert_eq!((&one[..3], &two[..3]), (&b"one"[..], &b"two"[..]));
    assert_eq!(
        stats(b).messages_landed,
        2,
        "the two behind it landed in place"
    );
    drop(driver);
    // b's last receive left its acknowledgement for b's next round: one
    // round sends it, or a's close would wait for it.
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// Receives that name their messages stay in step when one in the line
/// is too small (its message goes to the next) or is cancelled: each of
/// the rest completes with the message that is its turn.
#[test]
fn a_receive_too_small_or_cancelled_leaves_the_rest_in_step() {
    let (a, b) = pair(None);
    let driver = drive(a);
    // A first message, so that the receives posted next name theirs.
    let mut hello = vec![0u8; 16];
    post_recv(b, &mut hello, 0);
    assert_eq!(send(a, b"hello"), BARLINK_OK);
    assert_eq!(completions(b, 1)[0].status, BARLINK_OK);
    let mut small = vec![0u8; 2];
    let mut first = vec![0u8; 64];
    let mut cancelled = vec![0xeeu8; 64];
    let mut second = vec![0u8; 64];
    let requests = [
        post_recv(b, &mut small, 1),
        post_recv(b, &mut first, 2),
        post_recv(b, &mut cancelled, 3),
        post_recv(b, &mut second, 4),
    ];
    assert_eq!(
        barlink_cancel(b, requests[2]),
        BARLINK_OK,
        "{}",
        last_error()
    );
    assert_eq!(send(a, b"first!"), BARLINK_OK);
    assert_eq!(send(a, b"second"), BARLINK_OK);
    let done = completions(b, 4);
    let by_request = |r: u64| *done.iter().find(|c| c.request == r).unwrap();
    let outcome = |r: u64| (by_request(r).status, by_request(r).bytes);
    assert_eq!(outcome(requests[0]), (BARLINK_BUFFER_TOO_SMALL, 6));
    assert_eq!(outcome(requests[1]), (BARLINK_OK, 6));
    assert_eq!(outcome(requests[2]), (BARLINK_CANCELED, 0));
    assert_eq!(outcome(requests[3]), (BARLINK_OK, 6));
    assert_eq!(
        (&first[..6], &second[..6]),
        (&b"first!"[..], &b"second"[..])
    );
    assert!(
        cancelled.iter().all(|&byte| byte == 0xee),
        "written after the cancel"
    );
    drop(driver);
    // b's last receive left its acknowledgement for b's next round: one
    // round sends it, or a's close would wait for it.
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// `barlink_wait_completion` for one request.
fn wait_completion(
    link: *mut barlink_link,
    request: u64,
    timeout_ms: u32,
) -> (barlink_status, barlink_completion) {
    let mut completion = barlink_completion {
        request: 99,
        user_tag: 99,
        bytes: 99,
        status: BARLINK_INTERNAL,
        reserved: 99,
    };
    // SAFETY: completion is writable.
    let status = unsafe { barlink_wait_completion(link, request, timeout_ms, &mut completion) };
    (status, completion)
}

/// A wait for one posted request fills its completion as a poll would (a
/// receive's length, a too-small receive's needed length, a send's tag),
/// returns what `barlink_wait` returns, and says "not reported" with
/// request 0 when the wait timed out or was refused.
#[test]
fn a_wait_for_one_request_fills_its_completion() {
    let (a, b) = pair(None);
    let driver = drive(a);
    let mut small = vec![0u8; 2];
    let mut first = vec![0u8; 64];
    let requests = [post_recv(b, &mut small, 1), post_recv(b, &mut first, 2)];
    let unreported = |status| barlink_completion {
        request: 0,
        user_tag: 0,
        bytes: 0,
        status,
        reserved: 0,
    };
    let (status, completion) = wait_completion(b, requests[1], 0);
    assert_eq!(
        (status, completion),
        (BARLINK_TIMEOUT, unreported(BARLINK_TIMEOUT))
    );
    assert_eq!(send(a, b"first!"), BARLINK_OK);
    let (status, completion) = wait_completion(b, requests[0], 5000);
    expect(status, BARLINK_BUFFER_TOO_SMALL, "6 bytes");
    assert_eq!(
        (completion.request, completion.user_tag, completion.bytes),
        (requests[0], 1, 6)
    );
    assert_eq!(completion.status, BARLINK_BUFFER_TOO_SMALL);
    let (status, completion) = wait_completion(b, requests[1], 5000);
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(
        completion,
        barlink_completion {
            request: requests[1],
            user_tag: 2,
            bytes: 6,
            status: BARLINK_OK,
            reserved: 0,
        }
    );
    assert_eq!(&first[..6], b"first!");
    // Reported already, never posted, no link, nowhere to write: refused.
    let (status, completion) = wait_completion(b, requests[1], 0);
    expect(status, BARLINK_INVALID_ARGUMENT, "already reported");
    assert_eq!(completion, unreported(BARLINK_INVALID_ARGUMENT));
    let (status, completion) = wait_completion(ptr::null_mut(), requests[1], 0);
    assert_eq!(
        (status, completion),
        (BARLINK_INVALID_HANDLE, unreported(BARLINK_INVALID_HANDLE))
    );
    // SAFETY: a NULL completion is refused before anything is written.
    let status = unsafe { barlink_wait_completion(b, requests[1], 0, ptr::null_mut()) };
    expect(status, BARLINK_INVALID_ARGUMENT, "completion");
    drop(driver);
    // A posted send: its tag and length once the peer acknowledged it.
    let mut request = 0;
    // SAFETY: valid data and out-pointer; the copy is taken before return.
    let status = unsafe { barlink_post_send(b, b"back".as_ptr().cast(), 4, 9, &mut request) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    let mut back = [0u8; 8];
    assert_eq!(recv(a, &mut back, 5000), (BARLINK_OK, 4));
    assert_eq!(barlink_progress(a), BARLINK_OK);
    let (status, completion) = wait_completion(b, request, 5000);
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(
        (completion.request, completion.user_tag, completion.bytes),
        (request, 9, 4)
    );
    assert_eq!(barlink_progress(b), BARLINK_OK);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A posted send's completion is reported once, by a call after the
/// blocking receive of the answer that acknowledged it (a receive that has
/// its message may leave the rest of its step to the next call).
#[test]
fn completions_that_come_with_a_received_message_are_reported_later() {
    let (a, b) = pair(None);
    for round in 0..3u64 {
        let question = format!("question {round}");
        let mut request = 0;
        // SAFETY: the bytes are readable for the call; request is writable.
        let status = unsafe {
            barlink_post_send(
                a,
                question.as_ptr().cast(),
                question.len(),
                round + 10,
                &mut request,
            )
        };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        let mut buf = vec![0u8; 32];
        let (status, len) = recv(b, &mut buf, 5000);
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        assert_eq!(&buf[..len], question.as_bytes());
        assert_eq!(send(b, b"answer"), BARLINK_OK);
        let (status, len) = recv(a, &mut buf, 5000);
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        assert_eq!(&buf[..len], b"answer");
        // b's answer carried the acknowledgement; a driver covers one that
        // went on its own.
        let driver = drive(b);
        let got = completions(a, 1);
        drop(driver);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].request, got[0].user_tag, got[0].status),
            (request, round + 10, BARLINK_OK)
        );
        assert!(poll(a).is_empty(), "reported once");
    }
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// A receive in place that waits keeps the link's lock across its idle
/// rounds, but lets another thread's calls on the link in: sends on the
/// waiting side go out at their usual pace, and a close ends the wait.
#[test]
fn a_waiting_receive_in_place_lets_other_calls_in() {
    let (a, b) = pair(None);
    let waiter = std::thread::spawn({
        let b = b as usize;
        move || {
            let (status, message) = recv_message(b as *mut barlink_link, 20_000);
            let bytes = (status == BARLINK_OK).then(|| held_bytes(&message));
            if status == BARLINK_OK {
                // SAFETY: lent by this link and not released yet.
                let released = unsafe { barlink_release_message(b as *mut barlink_link, &message) };
                assert_eq!(released, BARLINK_OK, "{}", last_error());
            }
            (status, bytes, last_error())
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    // b sends while its other thread waits in barlink_recv_message; a
    // takes each as it comes.
    let start = std::time::Instant::now();
    let mut slowest = std::time::Duration::ZERO;
    let mut buf = [0u8; 16];
    for i in 0..200u32 {
        let sent = std::time::Instant::now();
        assert_eq!(send(b, &i.to_le_bytes()), BARLINK_OK, "{}", last_error());
        slowest = slowest.max(sent.elapsed());
        let (status, len) = recv(a, &mut buf, 5000);
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        assert_eq!(&buf[..len], &i.to_le_bytes());
    }
    // Generous for a shared 2-core VM; a wait that kept the lock to
    // itself would hold the sends for the whole 20 s (the library's unit
    // test shows the waiters' count letting calls in).
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "200 round trips took {:?} (slowest send {slowest:?})",
        start.elapsed()
    );
    // The waiting receive still gets its message.
    assert_eq!(send(a, b"for the waiter"), BARLINK_OK, "{}", last_error());
    let (status, bytes, message) = waiter.join().unwrap();
    assert_eq!(status, BARLINK_OK, "{message}");
    assert_eq!(bytes.as_deref(), Some(&b"for the waiter"[..]));
    assert_eq!(held_count(b), 0);

    // A close from another thread ends a waiting receive at once.
    let waiter = std::thread::spawn({
        let b = b as usize;
        move || {
            let started = std::time::Instant::now();
            let (status, _) = recv_message(b as *mut barlink_link, 20_000);
            (status, started.elapsed(), last_error())
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
    let (status, waited, message) = waiter.join().unwrap();
    assert_eq!(status, BARLINK_CLOSED, "{message}");
    assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
}

/// The blocking send's direct way keeps the bookkeeping of the general
/// one: copies come back for reuse and leave the send queue's bytes (a
/// limit of a few messages' copies holds for 500 sends), the statistics
/// count every message, and a flush sees them all acknowledged.
#[test]
fn blocking_sends_in_a_row_are_counted_and_acknowledged() {
    let mut config = default_config();
    config.send_queue_bytes = 64;
    let (a, b) = pair(Some(&config));
    const MESSAGES: u64 = 500;
    let receiver = std::thread::spawn({
        let b = b as usize;
        move || {
            for i in 0..MESSAGES {
                let (status, message) = recv_message(b as *mut barlink_link, 5000);
                assert_eq!(status, BARLINK_OK, "{}", last_error());
                assert_eq!(held_bytes(&message), i.to_le_bytes());
                // SAFETY: lent by this link and not released yet.
                let released = unsafe { barlink_release_message(b as *mut barlink_link, &message) };
                assert_eq!(released, BARLINK_OK, "{}", last_error());
            }
        }
    });
    // Progress is the caller's: b's last acknowledgements go out while a
    // driver calls it once its receiver is done (and meanwhile its calls
    // wait for the lock the waiting receive holds, which lets them in).
    let driver = drive(b);
    for i in 0..MESSAGES {
        assert_eq!(send(a, &i.to_le_bytes()), BARLINK_OK, "{}", last_error());
    }
    // Messages queued beyond the window go out while a's caller drives it.
    assert_eq!(barlink_flush(a, 5000), BARLINK_OK, "{}", last_error());
    receiver.join().unwrap();
    drop(driver);
    let sent = stats(a);
    assert_eq!(sent.messages_sent, MESSAGES);
    assert_eq!(sent.message_bytes_sent, MESSAGES * 8);
    assert_eq!(sent.messages_copied, MESSAGES);
    let received = stats(b);
    assert_eq!(received.messages_received, MESSAGES);
    assert_eq!(received.message_bytes_received, MESSAGES * 8);
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}
