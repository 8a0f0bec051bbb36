//! Receiving into memory the caller lends (`Engine::post_recv`): a message
//! lands in the first posted target it fits, nothing else in it changes,
//! and a target taken back is never touched again while its message still
//! arrives, intact and in order. A target that names its message
//! (`RecvTarget::message`) takes that one only, so one passed by leaves the
//! later ones in step.

mod common;

use barlink_transport::sim::{PairSide, ReceivePath};
use barlink_transport::wire::{HEADER_LEN, Packet, WireError};
use barlink_transport::{
    Delivery, Engine, EngineConfig, Event, MessageId, PacketError, PostId, RecvTarget,
};
use common::{connected_pair, faulty_pair, first_message, next_delivery, payloads};

const FILL: u8 = 0xa5;

fn config(send_window: u32) -> EngineConfig {
    EngineConfig {
        mtu: 1024,
        send_window,
        ..EngineConfig::default()
    }
}

fn target(len: usize) -> Box<dyn RecvTarget> {
    Box::new(vec![FILL; len])
}

fn bytes(target: Box<dyn RecvTarget>) -> Vec<u8> {
    let mut target = target;
    target.bytes_mut().to_vec()
}

fn landed(delivery: Delivery) -> (Vec<u8>, usize) {
    match delivery {
        Delivery::Landed { recv, len, .. } => (bytes(recv.into_target()), len),
        Delivery::Message { data, .. } => {
            panic!("{} bytes arrived in an engine buffer", data.len())
        }
    }
}

fn in_buffer(delivery: Delivery) -> Vec<u8> {
    match delivery {
        Delivery::Message { data, .. } => data,
        Delivery::Landed { len, .. } => panic!("{len} bytes landed in a posted target"),
    }
}

#[test]
fn a_message_lands_in_the_posted_target_and_nothing_past_it_changes() {
    for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
        let mut pair = connected_pair(config(64));
        pair.receive_path = path;
        let message = payloads(&[7_000], 1).remove(0);
        pair.b.post_recv(target(10_000));
        assert_eq!(pair.b.posted_recvs(), 1);
        pair.a.send(message.clone()).unwrap();
        let (target, len) = landed(next_delivery(&mut pair));
        assert_eq!(len, message.len(), "{path:?}");
        assert!(target[..len] == message[..], "{path:?}: contents differ");
        assert!(
            target[len..].iter().all(|&b| b == FILL),
            "{path:?}: bytes past the message changed"
        );
        assert_eq!(pair.b.posted_recvs(), 0);
        assert_eq!(pair.b.stats().messages_delivered, 1);
        assert_eq!(pair.b.stats().messages_landed, 1);
    }
}

#[test]
fn targets_are_taken_in_order_one_per_message() {
    let mut pair = connected_pair(config(64));
    let messages = payloads(&[3_000, 0, 2_500], 2);
    for len in [3_000, 100, 4_000] {
        pair.b.post_recv(target(len));
    }
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    for (index, message) in messages.iter().enumerate() {
        let (target, len) = landed(next_delivery(&mut pair));
        assert_eq!(len, message.len(), "message {index}");
        assert!(target[..len] == message[..], "message {index}");
        assert_eq!(
            target.len(),
            [3_000, 100, 4_000][index],
            "message {index} in its own target"
        );
    }
}

#[test]
fn a_message_too_large_for_the_first_target_arrives_in_a_buffer_and_the_target_waits() {
    let mut pair = connected_pair(config(64));
    let messages = payloads(&[5_000, 50], 3);
    pair.b.post_recv(target(100));
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    assert_eq!(in_buffer(next_delivery(&mut pair)), messages[0]);
    let (target, len) = landed(next_delivery(&mut pair));
    assert_eq!(&target[..len], &messages[1][..]);
}

/// A message half assembled in a target moves to an engine buffer when the
/// target is taken back, and still arrives whole.
#[test]
fn a_target_taken_back_mid_message_hands_the_message_to_an_engine_buffer() {
    for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
        // Four packets per round trip: the message is under way for a while.
        let mut pair = connected_pair(config(4));
        pair.receive_path = path;
        let message = payloads(&[20_000], 4).remove(0);
        let id = pair.b.post_recv(target(32_768));
        pair.a.send(message.clone()).unwrap();
        pair.step();
        assert!(pair.b.poll_delivery().is_none(), "{path:?}: not yet whole");
        let back = pair.b.unpost_recv(id).expect("still posted");
        assert_eq!(back.id(), id);
        assert_eq!(pair.b.posted_recvs(), 0);
        assert!(pair.b.unpost_recv(id).is_none(), "taken back once");
        assert_eq!(
            in_buffer(next_delivery(&mut pair)),
            message,
            "{path:?}: the message arrived whole in an engine buffer"
        );
    }
}

/// A message that landed and was not taken yet is copied out when its
/// target is taken back, and stays first in line.
#[test]
fn a_landed_message_taken_back_unread_is_copied_and_keeps_its_place() {
    let mut pair = connected_pair(config(64));
    let messages = payloads(&[1_500, 700], 5);
    let id = pair.b.post_recv(target(2_000));
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    for _ in 0..100 {
        pair.step();
    }
    assert!(pair.b.unpost_recv(id).is_some());
    assert_eq!(in_buffer(next_delivery(&mut pair)), messages[0]);
    assert_eq!(in_buffer(next_delivery(&mut pair)), messages[1]);
}

/// `poll_event` hands a landed message over as `Event::Landed`;
/// `poll_message` copies it (for callers that never post).
#[test]
fn landed_messages_come_through_every_polling_call() {
    let mut pair = connected_pair(config(64));
    let messages = payloads(&[900, 1_100], 6);
    pair.b.post_recv(target(1_000));
    pair.b.post_recv(target(2_000));
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    for _ in 0..100 {
        pair.step();
    }
    let event = std::iter::from_fn(|| pair.b.poll_event())
        .find(|event| matches!(event, Event::Landed { .. } | Event::Message { .. }));
    let Some(Event::Landed { len, recv, .. }) = event else {
        panic!("the first message landed: {event:?}");
    };
    assert_eq!(bytes(recv.into_target())[..len], messages[0][..]);
    let (_, data) = poll_message(&mut pair.b);
    assert_eq!(data, messages[1]);
}

fn poll_message(engine: &mut Engine) -> (u64, Vec<u8>) {
    let (id, data) = engine.poll_message().expect("a message is ready");
    (id.0, data)
}

/// Feeds `packet` to `engine` as a ring link does (`handle_packet_from`:
/// the payload copied to where the engine places it, its CRC taken as it
/// lands).
fn feed_from_medium(
    engine: &mut Engine,
    now: barlink_transport::Time,
    packet: &[u8],
) -> Result<(), PacketError> {
    let (header, payload) = packet.split_at(HEADER_LEN);
    engine
        .handle_packet_from::<()>(
            now,
            header,
            payload.len(),
            |offset, dst, crc, _message_len| {
                dst.copy_from_slice(&payload[offset..offset + dst.len()]);
                if let Some(crc) = crc {
                    crc.update(dst);
                }
                Ok(())
            },
        )
        .expect("the closure never fails")
}

#[test]
fn a_target_staged_by_a_corrupt_header_goes_back_when_the_real_message_does_not_fit_it() {
    // A first fragment whose length fields were corrupted to claim a
    // message the posted target fits: the receiver stages the target for
    // it and copies the payload there before the CRC fails. The real
    // packet then starts a 2,000-byte message the 1,000-byte target cannot
    // hold: it must be assembled in an engine buffer, and the target stay
    // first in line for the next message.
    let mut pair = connected_pair(config(64));
    let now = pair.now;
    pair.b.post_recv(target(1000));
    let sizes = [2000, 500];
    let sent = payloads(&sizes, 11);
    pair.a.send(sent[0].clone()).unwrap();
    let mut packets = Vec::new();
    let mut buf = vec![0u8; 1024];
    while let Some(len) = pair.a.poll_transmit(now, &mut buf) {
        packets.push(buf[..len].to_vec());
    }
    assert_eq!(packets.len(), 3, "2,000 bytes in packets of 944");
    let mut corrupt = packets[0].clone();
    let mut header = Packet::new_unchecked(&mut corrupt[..]);
    header.set_msg_len(944);
    header.set_frag_count(1);
    let refused = feed_from_medium(&mut pair.b, now, &corrupt);
    assert!(
        matches!(refused, Err(PacketError::Wire(WireError::BadCrc { .. }))),
        "the altered header must pass the header checks (so the target is staged) and fail \
         its CRC: {refused:?}"
    );
    for packet in &packets {
        feed_from_medium(&mut pair.b, now, packet).unwrap();
    }
    assert_eq!(in_buffer(next_delivery(&mut pair)), sent[0]);
    assert_eq!(pair.b.posted_recvs(), 1, "the target is still lent");
    pair.a.send(sent[1].clone()).unwrap();
    let (landed_bytes, len) = landed(next_delivery(&mut pair));
    assert_eq!(&landed_bytes[..len], &sent[1][..]);
}

/// A target that names the one message it takes.
struct Named {
    id: MessageId,
    bytes: Vec<u8>,
}

impl RecvTarget for Named {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    fn message(&self) -> Option<MessageId> {
        Some(self.id)
    }
}

fn named(id: MessageId, len: usize) -> Box<dyn RecvTarget> {
    Box::new(Named {
        id,
        bytes: vec![FILL; len],
    })
}

/// A message that began before the targets were posted passes its own by:
/// an unnamed target then takes the next message that starts, every later
/// one shifted onto the target before its own; named targets wait for
/// their own, so the later messages land where they were meant to.
#[test]
fn a_message_begun_before_its_named_target_leaves_the_later_ones_in_step() {
    for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
        for naming in [false, true] {
            // Four packets a round trip: the first message is under way
            // for a while.
            let mut pair = connected_pair(config(4));
            pair.receive_path = path;
            let first = first_message(&mut pair);
            let messages = payloads(&[20_000, 3_000, 3_000], 13);
            pair.a.send(messages[0].clone()).unwrap();
            pair.step();
            assert!(pair.b.poll_delivery().is_none(), "not yet whole");
            let posts: Vec<PostId> = (0..3)
                .map(|k| {
                    pair.b.post_recv(if naming {
                        named(MessageId(first.0 + k), 20_000)
                    } else {
                        target(20_000)
                    })
                })
                .collect();
            for message in &messages[1..] {
                pair.a.send(message.clone()).unwrap();
            }
            assert_eq!(in_buffer(next_delivery(&mut pair)), messages[0]);
            for (k, message) in messages.iter().enumerate().skip(1) {
                let Delivery::Landed { recv, len, .. } = next_delivery(&mut pair) else {
                    panic!("{path:?} naming {naming}: message {k} did not land");
                };
                let meant = if naming { posts[k] } else { posts[k - 1] };
                assert_eq!(recv.id(), meant, "{path:?} naming {naming}: message {k}");
                assert!(bytes(recv.into_target())[..len] == message[..]);
            }
            let left = if naming { posts[0] } else { posts[2] };
            assert!(pair.b.unpost_recv(left).is_some(), "still posted");
            assert_eq!(pair.b.posted_recvs(), 0);
        }
    }
}

/// Under every fault, with half the targets posted only while the first
/// messages arrive: every message arrives once, intact and in order, and
/// each one that landed did so in the target naming it.
#[test]
fn named_targets_take_only_their_own_message_under_every_fault() {
    let mut landed_in_all = 0;
    for seed in 0..6 {
        for path in [ReceivePath::Contiguous, ReceivePath::FromMedium] {
            let mut pair = faulty_pair(seed, path, config(16));
            let first = first_message(&mut pair);
            let sizes: Vec<usize> = (0..40).map(|i| 1 + (i * 733) % 5_000).collect();
            let messages = payloads(&sizes, seed);
            let name = |index: usize| MessageId(first.0 + index as u64);
            let mut posts: Vec<PostId> = (0..20)
                .map(|index| pair.b.post_recv(named(name(index), 5_000)))
                .collect();
            for message in &messages {
                pair.a.send(message.clone()).unwrap();
            }
            for (index, message) in messages.iter().enumerate() {
                if index < 20 {
                    posts.push(pair.b.post_recv(named(name(index + 20), 5_000)));
                }
                let delivery = next_delivery(&mut pair);
                assert_eq!(delivery.id(), name(index), "seed {seed} {path:?}: in order");
                match delivery {
                    Delivery::Landed { recv, len, .. } => {
                        assert_eq!(recv.id(), posts[index], "seed {seed} {path:?}: its own");
                        assert!(bytes(recv.into_target())[..len] == message[..]);
                        landed_in_all += 1;
                    }
                    Delivery::Message { data, .. } => {
                        // It began before its target could take it (posted
                        // late, or the message began ahead of a gap).
                        assert!(data == *message, "seed {seed} {path:?}: message {index}");
                        assert!(pair.b.unpost_recv(posts[index]).is_some(), "still posted");
                    }
                }
            }
            assert_eq!(pair.b.posted_recvs(), 0, "seed {seed} {path:?}");
            let counts = pair.a_to_b.counts().clone();
            assert!(counts.lost > 0, "seed {seed}: the faults ran ({counts:?})");
        }
    }
    assert!(
        landed_in_all > 200,
        "messages landed in their targets: {landed_in_all} of 480"
    );
}

/// A peer restart numbers messages anew: a target naming a message of the
/// old session takes none of the new one's, even one of the same number.
#[test]
fn after_a_peer_restart_no_named_target_takes_a_message() {
    let mut pair = connected_pair(config(4));
    let first = first_message(&mut pair);
    let post = pair.b.post_recv(named(first, 5_000));
    pair.restart(PairSide::A, config(4), 7).unwrap();
    let messages = payloads(&[3_000, 3_000], 14);
    for message in &messages {
        pair.a.send(message.clone()).unwrap();
    }
    for message in &messages {
        assert_eq!(&in_buffer(next_delivery(&mut pair)), message);
    }
    assert!(pair.b.stats().peer_restarts >= 1);
    assert!(pair.b.unpost_recv(post).is_some(), "still posted");
}
