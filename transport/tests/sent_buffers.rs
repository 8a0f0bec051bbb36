//! A link that keeps its sent buffers (`Link::keep_sent_buffers`) hands
//! each back once the engine is done with it, with its id and outcome.

use std::time::Instant;

mod common;
use common::ring_links::{TIMEOUT, linked_in_one_thread};

/// A link asked to keep its sent buffers hands each back once the peer
/// acknowledged it, in order, with its id; one not asked drops them.
#[test]
fn acknowledged_sends_come_back_in_order_when_kept() {
    let (mut a, mut b) = linked_in_one_thread();
    let deadline = Instant::now() + TIMEOUT;
    while a.completed() < 1 {
        b.progress().unwrap();
        a.progress().unwrap();
        assert!(
            Instant::now() < deadline,
            "the first message was not acknowledged"
        );
    }
    assert!(
        !a.has_sent_back() && a.take_sent().is_none(),
        "none kept yet"
    );
    a.keep_sent_buffers();
    let mut ids = Vec::new();
    for n in 0..5u8 {
        ids.push(
            a.send_blocking(vec![n; 100 + usize::from(n)], TIMEOUT)
                .unwrap(),
        );
    }
    let mut back = Vec::new();
    while back.len() < ids.len() {
        a.progress().unwrap();
        while b.try_recv().unwrap().is_some() {}
        while let Some(sent) = a.take_sent() {
            back.push(sent);
        }
        assert!(Instant::now() < deadline, "not all acknowledged: {back:?}");
    }
    assert!(!a.has_sent_back());
    for (n, (sent, id)) in back.iter().zip(&ids).enumerate() {
        assert_eq!(sent.id, *id);
        assert!(sent.acknowledged);
        assert_eq!(sent.buf, vec![n as u8; 100 + n]);
    }
    // b never asked: what it sends is dropped once acknowledged.
    b.send_blocking(vec![1; 10], TIMEOUT).unwrap();
    while a.try_recv().unwrap().is_none() {
        b.progress().unwrap();
        assert!(Instant::now() < deadline);
    }
    while b.completed() < 1 {
        a.progress().unwrap();
        b.progress().unwrap();
        assert!(
            Instant::now() < deadline,
            "b's message was not acknowledged"
        );
    }
    assert!(!b.has_sent_back() && b.take_sent().is_none());
}
