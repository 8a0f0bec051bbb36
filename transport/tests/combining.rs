//! Combining targets (`RecvTarget::combines`): a posted target that folds
//! the one message it names into what it holds. Every byte of that message
//! is folded exactly once, only after its packet's CRC passed, whatever the
//! medium loses, corrupts, cuts, repeats or reorders; other messages pass
//! it by; taken back, it is never touched again; a peer restart leaves it
//! to no message of the new session.
//!
//! The targets here fold by XOR, so a byte folded twice cancels out and a
//! byte missed or folded unchecked shows in the result.

mod common;

use std::sync::{Arc, Mutex};

use barlink_transport::sim::{PairSide, ReceivePath};
use barlink_transport::{Delivery, Engine, EngineConfig, MessageId, PostId, RecvTarget};
use common::{connected_pair, faulty_pair, first_message, next_delivery, payloads};

const FILL: u8 = 0x5a;

fn config(send_window: u32) -> EngineConfig {
    EngineConfig {
        mtu: 1024,
        send_window,
        ..EngineConfig::default()
    }
}

/// What a target folded: its running XOR and how far it got.
#[derive(Debug)]
struct Folded {
    state: Vec<u8>,
    next: usize,
}

/// Folds message `id` by XOR into `folded`; its own bytes (what the
/// engine could write into) stay `FILL`.
struct XorTarget {
    id: MessageId,
    untouched: Vec<u8>,
    folded: Arc<Mutex<Folded>>,
}

impl RecvTarget for XorTarget {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.untouched
    }

    fn combines(&self) -> Option<MessageId> {
        Some(self.id)
    }

    fn combine(&mut self, at: usize, bytes: &[u8]) {
        let mut folded = self.folded.lock().unwrap();
        assert_eq!(at, folded.next, "pieces come in order, each once");
        for (state, byte) in folded.state[at..at + bytes.len()].iter_mut().zip(bytes) {
            *state ^= byte;
        }
        folded.next += bytes.len();
    }
}

/// A combining target for message `id` of `len` bytes whose state starts
/// as `initial`.
fn xor_target(id: MessageId, initial: &[u8]) -> (Box<dyn RecvTarget>, Arc<Mutex<Folded>>) {
    let folded = Arc::new(Mutex::new(Folded {
        state: initial.to_vec(),
        next: 0,
    }));
    let target = XorTarget {
        id,
        untouched: vec![FILL; initial.len()],
        folded: Arc::clone(&folded),
    };
    (Box::new(target), folded)
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(a, b)| a ^ b).collect()
}

fn untouched(recv: barlink_transport::PostedRecv) -> bool {
    let mut target = recv.into_target();
    target.bytes_mut().iter().all(|&b| b == FILL)
}

#[test]
fn every_byte_is_folded_once_and_only_once_checked_under_every_fault() {
    let mut landed_in_all = 0;
    for seed in 0..6 {
        for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
            let mut pair = faulty_pair(seed, path, config(16));
            let first = first_message(&mut pair);
            let sizes: Vec<usize> = (0..40).map(|i| 1 + (i * 733) % 5_000).collect();
            let messages = payloads(&sizes, seed);
            let initial = payloads(&sizes, seed + 100);
            let mut targets: Vec<(PostId, Arc<Mutex<Folded>>)> = Vec::new();
            // Half posted before anything is sent, half while the first
            // half arrives: some messages begin before their target.
            for (index, initial) in initial.iter().enumerate().take(20) {
                let (target, folded) = xor_target(MessageId(first.0 + index as u64), initial);
                targets.push((pair.b.post_recv(target), folded));
            }
            for message in &messages {
                pair.a.send(message.clone()).unwrap();
            }
            let mut results = Vec::new();
            for (index, message) in messages.iter().enumerate() {
                if index < 20 {
                    let late = index + 20;
                    let (target, folded) =
                        xor_target(MessageId(first.0 + late as u64), &initial[late]);
                    targets.push((pair.b.post_recv(target), folded));
                }
                let delivery = next_delivery(&mut pair);
                assert_eq!(delivery.id().0, first.0 + index as u64);
                let (post, folded) = &targets[index];
                match delivery {
                    Delivery::Landed { recv, len, .. } => {
                        assert_eq!(recv.id(), *post, "seed {seed} {path:?}: its own target");
                        assert_eq!(len, message.len());
                        assert!(untouched(recv), "seed {seed}: nothing written into it");
                        landed_in_all += 1;
                    }
                    Delivery::Message { data, .. } => {
                        // It began before its target could take it: the
                        // target was never touched and comes back.
                        assert_eq!(&data, message);
                        let recv = pair.b.unpost_recv(*post).expect("still posted");
                        assert!(untouched(recv));
                        let mut folded = folded.lock().unwrap();
                        assert_eq!(folded.next, 0, "seed {seed}: folded and passed by");
                        folded.state = xor(&folded.state, &data);
                    }
                }
                results.push(folded.lock().unwrap().state.clone());
            }
            for (index, result) in results.iter().enumerate() {
                assert_eq!(
                    *result,
                    xor(&initial[index], &messages[index]),
                    "seed {seed} {path:?}: message {index} folded once, every byte"
                );
            }
            let counts = pair.a_to_b.counts().clone();
            assert!(counts.lost > 0, "seed {seed}: the faults ran ({counts:?})");
        }
    }
    // The rest began ahead of a gap or before their target was posted
    // (half of them are posted late on purpose); the seeds are fixed.
    assert!(
        landed_in_all > 80,
        "messages folded straight in: {landed_in_all} of 480"
    );
}

#[test]
fn a_combining_target_lets_other_messages_pass_and_waits_for_its_own() {
    let mut pair = connected_pair(config(64));
    let first = first_message(&mut pair);
    let messages = payloads(&[3_000, 3_000], 7);
    let (target, folded) = xor_target(MessageId(first.0 + 1), &[0; 3_000]);
    let post = pair.b.post_recv(target);
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    match next_delivery(&mut pair) {
        Delivery::Message { data, .. } => assert_eq!(data, messages[0]),
        Delivery::Landed { .. } => panic!("the first message took a target naming the second"),
    }
    match next_delivery(&mut pair) {
        Delivery::Landed { recv, len, .. } => {
            assert_eq!((recv.id(), len), (post, 3_000));
            assert!(untouched(recv));
        }
        Delivery::Message { .. } => panic!("the second message passed its own target by"),
    }
    assert_eq!(folded.lock().unwrap().state, messages[1]);
    let stats = pair.b.stats();
    assert_eq!((stats.messages_landed, stats.messages_combined), (1, 1));
}

#[test]
fn a_combining_target_taken_back_midway_is_left_alone_and_its_message_dropped() {
    for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
        // Four packets a round trip: the message is under way for a while.
        let mut pair = connected_pair(config(4));
        pair.receive_path = path;
        let first = first_message(&mut pair);
        let messages = payloads(&[20_000, 500], 8);
        let (target, folded) = xor_target(first, &[0; 20_000]);
        let post = pair.b.post_recv(target);
        pair.a.send(messages[0].clone()).unwrap();
        while folded.lock().unwrap().next == 0 {
            assert!(pair.step());
        }
        assert!(pair.b.poll_delivery().is_none(), "{path:?}: not yet whole");
        let recv = pair.b.unpost_recv(post).expect("still lent");
        assert!(untouched(recv));
        let at_unpost = folded.lock().unwrap().next;
        assert!(at_unpost < 20_000);
        assert_eq!(pair.b.next_message_id(), Some(MessageId(first.0 + 1)));
        pair.a.send(messages[1].clone()).unwrap();
        match next_delivery(&mut pair) {
            Delivery::Message { id, data } => {
                assert_eq!((id.0, &data), (first.0 + 1, &messages[1]), "{path:?}");
            }
            Delivery::Landed { .. } => panic!("no target is lent"),
        }
        assert_eq!(
            folded.lock().unwrap().next,
            at_unpost,
            "never touched again"
        );
        assert_eq!(pair.b.posted_recvs(), 0);
    }
}

#[test]
fn a_combined_message_taken_back_unread_is_not_delivered_again() {
    let mut pair = connected_pair(config(64));
    let first = first_message(&mut pair);
    let messages = payloads(&[1_500, 700], 9);
    let (target, folded) = xor_target(first, &[0; 1_500]);
    let post = pair.b.post_recv(target);
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    for _ in 0..100 {
        pair.step();
    }
    assert_eq!(pair.b.next_message_id(), Some(first));
    let recv = pair.b.unpost_recv(post).expect("delivered, not taken");
    assert!(untouched(recv));
    assert_eq!(folded.lock().unwrap().state, messages[0]);
    match next_delivery(&mut pair) {
        Delivery::Message { id, data } => {
            assert_eq!((id.0, data), (first.0 + 1, messages[1].clone()))
        }
        Delivery::Landed { .. } => panic!("no target is lent"),
    }
    assert_eq!(
        pair.b.stats().messages_delivered,
        3,
        "each message handed over once"
    );
}

#[test]
fn after_a_peer_restart_no_combining_target_takes_a_message() {
    let mut pair = connected_pair(config(4));
    let first = first_message(&mut pair);
    let messages = payloads(&[20_000, 3_000, 3_000], 10);
    // One target half folded when the peer restarts, one not yet reached:
    // the new session's ids start again from 0, so they name messages
    // of the new session too.
    let (target, midway) = xor_target(first, &[0; 20_000]);
    let midway_post = pair.b.post_recv(target);
    let (target, ahead) = xor_target(MessageId(0), &[0; 3_000]);
    let ahead_post = pair.b.post_recv(target);
    pair.a.send(messages[0].clone()).unwrap();
    while midway.lock().unwrap().next == 0 {
        assert!(pair.step());
    }
    let at_restart = midway.lock().unwrap().next;
    pair.restart(PairSide::A, config(4), 7).unwrap();
    for message in &messages[1..] {
        pair.a.send(message.clone()).unwrap();
    }
    for message in &messages[1..] {
        match next_delivery(&mut pair) {
            Delivery::Message { data, .. } => assert_eq!(&data, message),
            Delivery::Landed { .. } => panic!("a message of the new session took an old target"),
        }
    }
    assert_eq!(midway.lock().unwrap().next, at_restart);
    assert_eq!(ahead.lock().unwrap().next, 0);
    assert!(pair.b.stats().peer_restarts >= 1);
    assert!(untouched(pair.b.unpost_recv(midway_post).expect("posted")));
    assert!(untouched(pair.b.unpost_recv(ahead_post).expect("posted")));
}

#[test]
fn the_next_message_id_is_the_oldest_not_taken() {
    let mut pair = connected_pair(config(64));
    let first = first_message(&mut pair);
    for message in payloads(&[100, 200, 300], 12) {
        pair.a.send(message).unwrap();
    }
    for _ in 0..100 {
        pair.step();
    }
    for offset in 0..3 {
        assert_eq!(pair.b.next_message_id(), Some(MessageId(first.0 + offset)));
        next_delivery(&mut pair);
    }
    assert_eq!(pair.b.next_message_id(), Some(MessageId(first.0 + 3)));
    let _: &Engine = &pair.b;
}
