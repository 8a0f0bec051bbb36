//! Scenario tests of two engines over the simulated medium: each names one
//! behaviour of the protocol and checks it happens, and only it.

mod common;

use std::time::Duration;

use barlink_transport::engine::{MAX_MTU, MIN_MTU};
use barlink_transport::sim::{Faults, PairSide, SimPair};
use barlink_transport::wire::{self, Packet, PacketKind, Repr};
use barlink_transport::{Engine, EngineConfig, Event, LinkError, PacketError, SendError, Time};
use common::{
    Cuttable, SideLog, assert_delivery_is_exact, connected_pair, drain_events, exchange, forged,
    payloads,
};

fn config() -> EngineConfig {
    EngineConfig {
        mtu: 1024,
        ..EngineConfig::default()
    }
}

fn pair(faults: Faults, seed: u64) -> SimPair {
    SimPair::new(config(), config(), faults.clone(), faults, seed).unwrap()
}

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn messages_of_every_shape_arrive_intact_in_order() {
    let sizes = [0, 1, 943, 944, 945, 1888, 1889, 10_000, 65_536, 3];
    let mut pair = pair(Faults::none(), 1);
    let out = exchange(&mut pair, payloads(&sizes, 1), payloads(&sizes, 2), LIMIT);
    assert_eq!(out.a.completed.len(), sizes.len());
    assert_eq!(out.b.completed.len(), sizes.len());
    assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
    assert_delivery_is_exact(&out.sent_b, &out.a.delivered, &out.b.completed);
    assert_eq!(out.b.delivered.len(), sizes.len());
    assert_eq!(
        pair.a.stats().retransmits(),
        0,
        "a clean medium needs no retransmission"
    );
    assert_eq!(pair.a.stats().messages_sent, sizes.len() as u64);
    assert_eq!(pair.b.stats().messages_delivered, sizes.len() as u64);
    assert_eq!(out.a.connected, 1);
}

#[test]
fn fragments_are_mtu_sized() {
    let mut pair = pair(Faults::none(), 2);
    let payload = config().max_payload_len() as usize;
    let out = exchange(&mut pair, payloads(&[payload * 3 + 1], 3), vec![], LIMIT);
    assert_eq!(out.b.delivered.len(), 1);
    assert_eq!(pair.a.stats().data_packets_sent, 4);
    assert_eq!(pair.a.stats().payload_bytes_sent, (payload * 3 + 1) as u64);
}

#[test]
fn one_corrupt_packet_is_naked_and_resent_at_once() {
    // Corrupt exactly the fifth packet A sends (after the handshake).
    let mut pair = pair(Faults::none(), 3);
    let messages = payloads(&[20_000], 4);
    let id = pair.a.send(messages[0].clone()).unwrap();
    let mut sent_by_a = 0;
    let mut log = SideLog::default();
    let mut a_log = SideLog::default();
    let mut buf = vec![0u8; config().mtu];
    while a_log.completed.is_empty() && pair.now < Time::ZERO + LIMIT {
        while let Some(len) = pair.a.poll_transmit(pair.now, &mut buf) {
            sent_by_a += 1;
            if sent_by_a == 5 {
                buf[wire::HEADER_LEN + 10] ^= 0x04;
            }
            let copy = buf[..len].to_vec();
            let _ = pair.b.handle_packet(pair.now, &copy);
            while let Some(len) = pair.b.poll_transmit(pair.now, &mut buf) {
                let copy = buf[..len].to_vec();
                let _ = pair.a.handle_packet(pair.now, &copy);
            }
        }
        drain_events(&mut pair.b, pair.now, &mut log);
        // Taking a message releases the acknowledgement B held for a reply.
        while let Some(len) = pair.b.poll_transmit(pair.now, &mut buf) {
            let copy = buf[..len].to_vec();
            let _ = pair.a.handle_packet(pair.now, &copy);
        }
        drain_events(&mut pair.a, pair.now, &mut a_log);
        pair.now += Duration::from_micros(10);
        pair.a.handle_timeout(pair.now);
        pair.b.handle_timeout(pair.now);
    }
    assert_eq!(a_log.completed, vec![id.0]);
    assert_eq!(log.delivered.len(), 1);
    assert!(log.delivered[0].1 == messages[0]);
    assert_eq!(pair.b.stats().crc_failures, 1);
    assert_eq!(pair.b.stats().naks_sent, 1);
    assert_eq!(pair.a.stats().naks_received, 1);
    assert_eq!(pair.a.stats().retransmits_nak, 1);
    assert_eq!(
        pair.a.stats().retransmits_timeout,
        0,
        "the NAK made the timer unnecessary"
    );
    assert!(
        pair.now < Time::ZERO + config().initial_rto,
        "recovered before any timeout could fire"
    );
}

#[test]
fn lost_packets_are_recovered_by_sack_or_timeout() {
    let faults = Faults {
        loss: 0.1,
        ..Faults::none()
    };
    let mut pair = pair(faults, 5);
    let out = exchange(&mut pair, payloads(&[100_000; 10], 5), vec![], LIMIT);
    assert_eq!(out.a.completed.len(), 10, "{:?}", out.a.failed);
    assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
    let stats = pair.a.stats();
    assert!(stats.retransmits_sack > 0, "{stats:?}");
    assert!(pair.b.stats().out_of_order > 0);
}

#[test]
fn duplicates_are_suppressed() {
    let faults = Faults {
        duplicate: 0.3,
        ..Faults::none()
    };
    let mut pair = pair(faults, 6);
    let out = exchange(&mut pair, payloads(&[5000; 20], 6), vec![], LIMIT);
    assert_eq!(out.b.delivered.len(), 20);
    assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
    assert!(
        pair.b.stats().duplicates > 0,
        "{:?} {:?}",
        pair.b.stats(),
        pair.a_to_b.counts()
    );
}

#[test]
fn a_message_of_one_gibibyte_arrives_intact() {
    const GIB: usize = 1 << 30;
    let config = EngineConfig {
        mtu: 1 << 20,
        max_message_len: GIB as u64,
        send_window: 64,
        recv_window: 64,
        ..EngineConfig::default()
    };
    let mut pair = SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 7).unwrap();
    // memset-speed fill, with a distinct marker in every fragment so that a
    // misplaced or repeated fragment cannot compare equal.
    let mut message = vec![0x5Au8; GIB];
    for (index, chunk) in message.chunks_mut(1 << 20).enumerate() {
        chunk[..8].copy_from_slice(&(index as u64).to_le_bytes());
    }
    let expected_crc = barlink_transport::crc::crc32c(&message);
    pair.a.send(message).unwrap();
    let mut a_log = SideLog::default();
    let mut b_log = SideLog::default();
    while a_log.completed.is_empty() && pair.step() {
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut b_log);
    }
    assert_eq!(a_log.completed, vec![0]);
    assert_eq!(b_log.delivered.len(), 1);
    let delivered = &b_log.delivered[0].1;
    assert_eq!(delivered.len(), GIB);
    assert_eq!(barlink_transport::crc::crc32c(delivered), expected_crc);
}

#[test]
fn a_slow_receiver_stalls_the_sender_and_bounds_memory() {
    let config = EngineConfig {
        recv_window: 16,
        ..config()
    };
    let mut pair = SimPair::new(
        config.clone(),
        config.clone(),
        Faults::none(),
        Faults::none(),
        8,
    )
    .unwrap();
    for message in payloads(&[3000; 50], 8) {
        pair.a.send(message).unwrap();
    }
    // B never takes its events: after the credit runs out, A must stop.
    for _ in 0..10_000 {
        pair.step();
    }
    let bound = 16 * config.mtu + 3000;
    assert!(
        pair.b.buffered_bytes() <= bound,
        "{} bytes held, bound {bound}",
        pair.b.buffered_bytes()
    );
    assert!(pair.a.stats().credit_stalls > 0);
    assert_eq!(
        pair.b.stats().credit_violations,
        0,
        "A respected the credit"
    );
    assert!(pair.a.queued_messages() > 0, "A is still waiting");
    // Taking the events frees the credit and everything flows.
    let mut a_log = SideLog::default();
    let mut b_log = SideLog::default();
    while a_log.completed.len() < 50 && pair.step() {
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut b_log);
    }
    assert_eq!(b_log.delivered.len(), 50);
}

#[test]
fn a_dead_peer_is_reported_within_the_deadline() {
    let mut pair = pair(Faults::none(), 9);
    let out = exchange(&mut pair, payloads(&[1000], 9), vec![], LIMIT);
    assert_eq!(out.a.completed.len(), 1);
    // B dies (SIGKILL): it neither sends nor receives from now on.
    pair.b_alive = false;
    pair.b_to_a.clear();
    let died_at = pair.now;
    pair.a.send(vec![1; 5000]).unwrap();
    let mut log = SideLog::default();
    while log.closed.is_none() && pair.step() {
        drain_events(&mut pair.a, pair.now, &mut log);
    }
    let (when, reason) = log.closed.expect("peer loss reported");
    let deadline = died_at + config().peer_timeout;
    assert!(
        when <= deadline,
        "reported at {when:?}, deadline {deadline:?}"
    );
    assert!(matches!(reason, LinkError::PeerLost { .. }), "{reason:?}");
    assert_eq!(log.failed.len(), 1, "the unacknowledged message failed");
    assert!(matches!(log.failed[0].1, LinkError::PeerLost { .. }));
    assert!(reason.to_string().contains("peer lost"));
    // The engine is finished: no timers, no packets, no sends.
    assert_eq!(pair.a.poll_timeout(), None);
    assert!(matches!(pair.a.send(vec![1]), Err(SendError::Closed(_))));
}

#[test]
fn a_peer_that_never_appears_is_reported_too() {
    let mut pair = pair(Faults::none(), 10);
    pair.b_alive = false;
    let mut log = SideLog::default();
    while log.closed.is_none() && pair.step() {
        drain_events(&mut pair.a, pair.now, &mut log);
    }
    let (when, reason) = log.closed.unwrap();
    assert_eq!(when, Time::ZERO + config().peer_timeout);
    assert!(matches!(reason, LinkError::PeerLost { .. }));
    assert!(
        pair.a.stats().heartbeats_sent > 10,
        "hellos repeated while waiting"
    );
}

/// A sends a large message; mid-way A restarts (new epoch) and sends a
/// different one. B must deliver the new message alone: nothing of the old
/// one, and never a mix of the two.
#[test]
fn a_sender_restart_mid_message_never_delivers_a_mixed_message() {
    let config = EngineConfig {
        send_window: 8,
        ..config()
    };
    let mut pair = SimPair::new(
        config.clone(),
        config.clone(),
        Faults::none(),
        Faults::none(),
        11,
    )
    .unwrap();
    let old = vec![0xAA; 200_000];
    let new = vec![0xBB; 200_000];
    pair.a.send(old).unwrap();
    let mut b_log = SideLog::default();
    // Run until B has part of the old message.
    while pair.b.stats().payload_bytes_received < 50_000 {
        pair.step();
        drain_events(&mut pair.b, pair.now, &mut b_log);
    }
    assert!(b_log.delivered.is_empty());
    pair.restart(PairSide::A, config, 5).unwrap();
    pair.a.send(new.clone()).unwrap();
    let mut a_log = SideLog::default();
    while a_log.completed.is_empty() && pair.now < Time::ZERO + LIMIT {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut b_log);
    }
    assert_eq!(b_log.restarts, vec![(1, 5)]);
    assert_eq!(b_log.delivered.len(), 1, "only the new message");
    assert!(
        b_log.delivered[0].1 == new,
        "delivered bytes are the new message, unmixed"
    );
    assert!(pair.b.stats().stale > 0 || pair.b.stats().payload_bytes_received > 0);
}

/// B restarts while A has messages in flight: A's messages fail with a
/// clear error, and A then talks to the new B without old data reaching it.
#[test]
fn a_receiver_restart_fails_unconfirmed_sends_and_starts_clean() {
    let mut pair = pair(Faults::none(), 12);
    for message in payloads(&[100_000; 3], 12) {
        pair.a.send(message).unwrap();
    }
    let mut a_log = SideLog::default();
    let mut b_log = SideLog::default();
    while pair.b.stats().payload_bytes_received < 150_000 {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut b_log);
    }
    pair.restart(PairSide::B, config(), 9).unwrap();
    let mut new_b_log = SideLog::default();
    let fresh = payloads(&[7777], 13);
    let mut sent_fresh = false;
    while pair.now < Time::ZERO + LIMIT {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut new_b_log);
        if !a_log.restarts.is_empty() && !sent_fresh {
            pair.a.send(fresh[0].clone()).unwrap();
            sent_fresh = true;
        }
        if new_b_log.delivered.len() == 1 {
            break;
        }
    }
    assert_eq!(a_log.restarts, vec![(2, 9)]);
    assert!(!a_log.failed.is_empty());
    for (_, error) in &a_log.failed {
        assert_eq!(
            *error,
            LinkError::PeerRestarted {
                old_epoch: 2,
                new_epoch: 9
            }
        );
    }
    assert_eq!(a_log.completed.len() + a_log.failed.len(), 3);
    assert_eq!(new_b_log.delivered.len(), 1);
    assert!(
        new_b_log.delivered[0].1 == fresh[0],
        "the new B got only the new message"
    );
}

#[test]
fn a_path_that_corrupts_every_data_packet_ends_with_a_retransmit_limit() {
    let config = EngineConfig {
        max_transmissions: 5,
        ..config()
    };
    let mut pair =
        SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 13).unwrap();
    // Every data packet from A arrives with a flipped payload bit; its
    // control packets pass, so A knows B is alive: the path is bad, not the
    // peer.
    pair.tamper[0] = Some(|packet: &mut Vec<u8>| {
        if packet[wire::field::KIND] == PacketKind::Data as u8 {
            let last = packet.len() - 1;
            packet[last] ^= 0x80;
        }
    });
    let out = exchange(&mut pair, payloads(&[100], 14), vec![], LIMIT);
    let (_, reason) = out.a.closed.expect("link ended");
    assert!(
        matches!(
            reason,
            LinkError::RetransmitLimit {
                transmissions: 5,
                ..
            }
        ),
        "{reason:?}"
    );
    assert!(reason.to_string().contains("sent 5 times"));
    assert_eq!(out.a.failed.len(), 1);
    assert!(out.b.delivered.is_empty());
    assert_eq!(pair.b.stats().crc_failures, 5);
    assert_eq!(
        pair.a.stats().retransmits_nak,
        4,
        "each corruption NAKed, each NAK answered"
    );
    // A told B it gave up, rather than leave B to time out.
    assert_eq!(out.b.closed.map(|(_, r)| r), Some(LinkError::PeerClosed));
}

#[test]
fn a_path_broken_one_way_is_reported_as_peer_loss_on_both_sides() {
    let mut pair = pair(Faults::none(), 19);
    // Nothing from A reaches B; B's hellos reach A, but never show that B
    // hears A. Neither side may wait forever.
    pair.tamper[0] = Some(|packet: &mut Vec<u8>| packet[0] ^= 0xFF);
    let out = exchange(&mut pair, payloads(&[100], 19), vec![], LIMIT);
    for (side, log) in [("A", &out.a), ("B", &out.b)] {
        let (when, reason) = log
            .closed
            .clone()
            .unwrap_or_else(|| panic!("{side} never gave up"));
        assert!(
            matches!(reason, LinkError::PeerLost { .. }),
            "{side}: {reason:?}"
        );
        assert!(
            when <= Time::ZERO + config().peer_timeout,
            "{side} at {when:?}"
        );
    }
    assert_eq!(out.a.failed.len(), 1);
    assert!(
        pair.a.stats().packets_sent < 1000,
        "no packet storm: {:?}",
        pair.a.stats()
    );
}

#[test]
fn orderly_close_finishes_sending_then_tells_the_peer() {
    let mut pair = pair(Faults::none(), 15);
    for message in payloads(&[30_000; 3], 15) {
        pair.a.send(message).unwrap();
    }
    pair.a.close();
    assert!(matches!(pair.a.send(vec![0]), Err(SendError::Closed(_))));
    let mut a_log = SideLog::default();
    let mut b_log = SideLog::default();
    while pair.step() {
        drain_events(&mut pair.a, pair.now, &mut a_log);
        drain_events(&mut pair.b, pair.now, &mut b_log);
        if b_log.closed.is_some() {
            break;
        }
    }
    assert_eq!(a_log.completed.len(), 3);
    assert_eq!(b_log.delivered.len(), 3);
    assert_eq!(a_log.closed.map(|(_, r)| r), Some(LinkError::LocalClose));
    assert_eq!(b_log.closed.map(|(_, r)| r), Some(LinkError::PeerClosed));
}

/// A heartbeat as B (epoch 2) would send it to A; tests change its fields
/// and forge it, to probe A's stateful checks.
fn heartbeat_from_b(epoch: u32, peer_epoch: u32) -> Repr {
    Repr {
        kind: PacketKind::Heartbeat,
        flags: 0,
        epoch,
        peer_epoch,
        seq: 0,
        ack: 0,
        sack: 0,
        credit: 16,
        xmit: 1000,
        fragment: None,
        payload_len: 0,
    }
}

#[test]
fn stale_and_misaddressed_packets_are_dropped_with_their_reason() {
    let mut pair = connected_pair(config());
    // B is epoch 2. A packet "from B" at epoch 1 predates it.
    let now = pair.now;
    let stale = forged(heartbeat_from_b(1, 1), &[]);
    assert_eq!(
        pair.a.handle_packet(now, &stale),
        Err(PacketError::StaleEpoch {
            epoch: 1,
            current: 2
        })
    );
    // Data addressed to an earlier epoch of A is not A's to deliver.
    let data = Repr {
        kind: PacketKind::Data,
        fragment: Some(wire::Fragment {
            msg_id: 0,
            msg_len: 3,
            index: 0,
            count: 1,
        }),
        payload_len: 3,
        ..heartbeat_from_b(2, 77)
    };
    assert_eq!(
        pair.a.handle_packet(now, &forged(data, b"abc")),
        Err(PacketError::Misaddressed {
            addressed_to: 77,
            mine: 1
        })
    );
    assert!(pair.a.stats().stale >= 2);
    assert!(
        std::iter::from_fn(|| pair.a.poll_event()).all(|e| !matches!(e, Event::Message { .. }))
    );
}

#[test]
fn acknowledging_unsent_packets_is_rejected() {
    let mut pair = connected_pair(config());
    let bogus = Repr {
        ack: 1_000_000,
        ..heartbeat_from_b(2, 1)
    };
    assert_eq!(
        pair.a.handle_packet(pair.now, &forged(bogus, &[])),
        Err(PacketError::AckBeyondSent {
            ack: 1_000_000,
            next_seq: 0
        })
    );
}

#[test]
fn data_beyond_the_granted_credit_is_dropped() {
    let mut pair = connected_pair(config());
    let window = config().recv_window as u64;
    let data = Repr {
        kind: PacketKind::Data,
        seq: window + 5,
        fragment: Some(wire::Fragment {
            msg_id: 0,
            msg_len: 1,
            index: 0,
            count: 1,
        }),
        payload_len: 1,
        ..heartbeat_from_b(2, 1)
    };
    assert_eq!(
        pair.a.handle_packet(pair.now, &forged(data, b"x")),
        Err(PacketError::OutsideWindow {
            seq: window + 5,
            window_start: 0,
            window_end: window
        })
    );
    assert_eq!(pair.a.stats().credit_violations, 1);
    assert_eq!(pair.a.buffered_bytes(), 0);
}

#[test]
fn contradictory_fragments_end_the_link_with_a_violation() {
    let mut pair = connected_pair(config());
    let first = Repr {
        kind: PacketKind::Data,
        seq: 0,
        fragment: Some(wire::Fragment {
            msg_id: 0,
            msg_len: 10,
            index: 0,
            count: 2,
        }),
        payload_len: 5,
        ..heartbeat_from_b(2, 1)
    };
    pair.a
        .handle_packet(pair.now, &forged(first, b"hello"))
        .unwrap();
    // The second fragment claims another message.
    let second = Repr {
        seq: 1,
        fragment: Some(wire::Fragment {
            msg_id: 1,
            msg_len: 10,
            index: 1,
            count: 2,
        }),
        ..first
    };
    let result = pair.a.handle_packet(pair.now, &forged(second, b"world"));
    assert!(
        matches!(result, Err(PacketError::Violation { seq: 1, .. })),
        "{result:?}"
    );
    let mut log = SideLog::default();
    drain_events(&mut pair.a, pair.now, &mut log);
    assert!(log.delivered.is_empty());
    assert!(matches!(
        log.closed,
        Some((_, LinkError::ProtocolViolation { seq: 1, .. }))
    ));
    // A tells B it hung up.
    let mut buf = vec![0; config().mtu];
    let len = pair.a.poll_transmit(pair.now, &mut buf).unwrap();
    let packet = Packet::new_checked(&buf[..len]).unwrap();
    assert_eq!(packet.kind_byte(), PacketKind::Close as u8);
}

#[test]
fn send_refusals_return_the_buffer() {
    let config = EngineConfig {
        send_queue_limit: 2,
        max_message_len: 100,
        ..config()
    };
    let mut engine: Engine = Engine::new(config, 1, Time::ZERO).unwrap();
    match engine.send(vec![0; 101]) {
        Err(SendError::TooLong {
            buf,
            len: 101,
            max: 100,
        }) => assert_eq!(buf.len(), 101),
        other => panic!("{other:?}"),
    }
    engine.send(vec![1]).unwrap();
    engine.send(vec![2]).unwrap();
    let refused = engine.send(vec![3]).unwrap_err();
    assert!(refused.to_string().contains("queue full"));
    assert_eq!(refused.into_buf(), vec![3]);
}

#[test]
fn epoch_zero_and_bad_configs_are_refused() {
    assert!(Engine::<Vec<u8>>::new(config(), 0, Time::ZERO).is_err());
    for mtu in [MIN_MTU - 1, MAX_MTU + 1] {
        let config = EngineConfig { mtu, ..config() };
        assert!(Engine::<Vec<u8>>::new(config, 1, Time::ZERO).is_err());
    }
}

#[test]
fn mtu_extremes_work() {
    for mtu in [MIN_MTU, 64 << 10, 1 << 20] {
        let config = EngineConfig {
            mtu,
            ..EngineConfig::default()
        };
        let mut pair =
            SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 17).unwrap();
        let out = exchange(
            &mut pair,
            payloads(&[0, 1, 5000, 2 << 20], 17),
            vec![],
            LIMIT,
        );
        assert_eq!(out.a.completed.len(), 4, "mtu {mtu}");
        assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
    }
}

#[test]
fn an_idle_link_stays_up_on_heartbeats() {
    let mut pair = pair(Faults::none(), 18);
    let mut a_log = SideLog::default();
    while pair.now < Time::ZERO + Duration::from_secs(30) {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
    }
    assert!(a_log.closed.is_none());
    let heartbeats = pair.a.stats().heartbeats_sent;
    // One per heartbeat interval, give or take the start.
    assert!((250..=320).contains(&heartbeats), "{heartbeats}");
}

/// Moves every packet `from` wants to send into `to`; returns their kinds.
fn flush_one_way(from: &mut Engine, to: &mut Engine, now: Time) -> Vec<PacketKind> {
    let mut buf = vec![0u8; config().mtu];
    let mut kinds = vec![];
    while let Some(len) = from.poll_transmit(now, &mut buf) {
        kinds.push(
            Repr::parse(
                &Packet::new_unchecked(&buf[..len]),
                &config().parse_limits(),
            )
            .unwrap()
            .kind,
        );
        let _ = to.handle_packet(now, &buf[..len]);
    }
    kinds
}

/// Connects a pair and lets the handshake settle.
fn settled_pair() -> SimPair {
    settled(pair(Faults::none(), 11))
}

/// Lets `pair`'s handshake settle.
fn settled(mut pair: SimPair) -> SimPair {
    for _ in 0..4 {
        flush_one_way(&mut pair.a, &mut pair.b, pair.now);
        flush_one_way(&mut pair.b, &mut pair.a, pair.now);
        pair.now += Duration::from_micros(1);
    }
    while pair.a.poll_event().is_some() {}
    while pair.b.poll_event().is_some() {}
    pair
}

#[test]
fn a_reply_carries_the_acknowledgement_of_its_request() {
    reply_carries_the_acknowledgement(settled_pair());
}

#[test]
fn a_reply_carries_the_acknowledgement_with_a_window_of_four_packets() {
    // Its acknowledgement threshold is 1: the request's one packet may
    // still wait for the reply.
    let small = EngineConfig {
        recv_window: 4,
        send_window: 4,
        ..config()
    };
    assert_eq!(small.ack_threshold(), 1);
    let pair = SimPair::new(small.clone(), small, Faults::none(), Faults::none(), 12).unwrap();
    reply_carries_the_acknowledgement(settled(pair));
}

fn reply_carries_the_acknowledgement(mut pair: SimPair) {
    let id = pair.a.send(b"request".to_vec()).unwrap();
    assert_eq!(
        flush_one_way(&mut pair.a, &mut pair.b, pair.now),
        vec![PacketKind::Data]
    );
    // B holds the acknowledgement A asked for while the request waits for
    // B's caller, who may answer at once.
    assert!(flush_one_way(&mut pair.b, &mut pair.a, pair.now).is_empty());
    let Some(Event::Message { data, .. }) = pair.b.poll_event() else {
        panic!("the request was delivered");
    };
    assert_eq!(data, b"request");
    pair.b.send(b"reply".to_vec()).unwrap();
    assert_eq!(
        flush_one_way(&mut pair.b, &mut pair.a, pair.now),
        vec![PacketKind::Data]
    );
    let mut completed = false;
    while let Some(event) = pair.a.poll_event() {
        completed |= matches!(event, Event::SendComplete { id: done, .. } if done == id);
    }
    assert!(
        completed,
        "the reply acknowledged the request: two packets, not four"
    );
}

#[test]
fn an_acknowledgement_of_a_gap_is_not_held_for_an_answer() {
    let mut pair = settled_pair();
    pair.a.send(b"first".to_vec()).unwrap();
    assert_eq!(
        flush_one_way(&mut pair.a, &mut pair.b, pair.now),
        vec![PacketKind::Data]
    );
    // B holds the first message's acknowledgement for an answer.
    assert!(flush_one_way(&mut pair.b, &mut pair.a, pair.now).is_empty());
    // The second message's packet is lost, the third's arrives: B tells
    // A about the gap at once, though the first still waits for B's caller.
    pair.a.send(b"second".to_vec()).unwrap();
    pair.a.send(b"third".to_vec()).unwrap();
    let mut buf = vec![0u8; config().mtu];
    let lost = pair
        .a
        .poll_transmit(pair.now, &mut buf)
        .expect("the second");
    assert!(lost > 0);
    let len = pair.a.poll_transmit(pair.now, &mut buf).expect("the third");
    let _ = pair.b.handle_packet(pair.now, &buf[..len]);
    assert_eq!(
        flush_one_way(&mut pair.b, &mut pair.a, pair.now),
        vec![PacketKind::Ack]
    );
}

#[test]
fn a_held_acknowledgement_goes_out_by_the_ack_deadline() {
    let mut pair = settled_pair();
    pair.a.send(b"request".to_vec()).unwrap();
    flush_one_way(&mut pair.a, &mut pair.b, pair.now);
    assert!(flush_one_way(&mut pair.b, &mut pair.a, pair.now).is_empty());
    // B's caller does not take the message: the hold ends at the deadline.
    let deadline = pair
        .b
        .poll_timeout()
        .expect("B has the ack deadline pending");
    assert!(deadline <= pair.now + config().ack_delay);
    pair.now = deadline;
    pair.b.handle_timeout(pair.now);
    assert_eq!(
        flush_one_way(&mut pair.b, &mut pair.a, pair.now),
        vec![PacketKind::Ack]
    );
    assert!(matches!(
        pair.a.poll_event(),
        Some(Event::SendComplete { .. })
    ));
}

/// A path whose round trip (60 ms) is longer than the first retransmission
/// timeout (20 ms): the timer fires, backs off and stays backed off until a
/// packet sent once is acknowledged, so after a few spurious
/// retransmissions the timeout sits above the round trip. Without the
/// backoff every packet would be sent twice: Karn's rule takes no samples
/// from retransmitted packets, so the timeout would never learn.
#[test]
fn a_round_trip_longer_than_the_first_timeout_stops_causing_retransmissions() {
    let faults = Faults {
        latency: Duration::from_millis(30),
        ..Faults::none()
    };
    let mut pair = pair(faults, 7);
    let message = vec![0x42u8; 100];
    for _ in 0..40 {
        pair.transfer(&message, 1, |data| assert_eq!(data, &message[..]))
            .unwrap();
    }
    let stats = pair.a.stats().clone();
    assert!(
        stats.retransmits_timeout <= 4,
        "timer retransmissions did not stop: {stats:?}"
    );
    assert_eq!(pair.b.stats().messages_delivered, 40);
}

#[test]
fn only_data_for_the_caller_counts_as_unreceived() {
    let mut pair = connected_pair(config());
    assert!(!pair.b.holds_unreceived());
    for message in [b"hello".to_vec(), Vec::new()] {
        pair.a.send(message).unwrap();
        for _ in 0..100 {
            if pair.b.messages_ready() > 0 {
                break;
            }
            pair.step();
        }
        assert!(pair.b.holds_unreceived(), "a delivered message is data");
        let (_, data) = pair.b.poll_message().unwrap();
        assert!(!pair.b.holds_unreceived());
        pair.b.recycle_buffer(data);
    }
    pair.b.recycle_buffer(vec![0; 4096]);
    assert!(pair.b.buffered_bytes() > 0, "spares count as buffered");
    assert!(!pair.b.holds_unreceived(), "but a spare is not data");
}

/// Sends a message from A (asking for an acknowledgement before its tail
/// with `before_tail`), hands B the packets up to `last` (by index), and
/// returns A's packets, the id, and whether B owed an acknowledgement
/// asked for mid-message after each one.
fn long_message_in_parts<B: AsRef<[u8]> + std::fmt::Debug>(
    pair: &mut SimPair<B>,
    message: B,
    before_tail: bool,
    last: usize,
) -> (Vec<Vec<u8>>, barlink_transport::MessageId, Vec<bool>) {
    let id = pair.a.send(message).unwrap();
    if before_tail {
        assert!(pair.a.ack_before_tail(id));
    }
    let mut packets = Vec::new();
    let mut out = vec![0u8; pair.a.config().mtu];
    while let Some(len) = pair.a.poll_transmit(pair.now, &mut out) {
        packets.push(out[..len].to_vec());
    }
    let mut owed = Vec::new();
    for packet in &packets[..=last] {
        pair.b.handle_packet(pair.now, packet).unwrap();
        owed.push(pair.b.before_tail_ack_due(pair.now));
    }
    (packets, id, owed)
}

#[test]
fn a_long_message_asks_for_an_acknowledgement_a_full_packet_before_its_end() {
    let payload = config().max_payload_len() as usize;
    let len = payload * 8 + 100;
    for (before_tail, asked) in [(false, vec![8]), (true, vec![6, 8])] {
        let mut pair = pair(Faults::none(), 21);
        for _ in 0..20 {
            pair.step();
        }
        let (packets, id, _) = long_message_in_parts(&mut pair, vec![7u8; len], before_tail, 0);
        assert_eq!(packets.len(), 9);
        let flagged: Vec<usize> = packets
            .iter()
            .enumerate()
            .filter(|(_, bytes)| {
                Packet::new_checked(&bytes[..]).unwrap().flags() & wire::flags::ACK_REQUESTED != 0
            })
            .map(|(index, _)| index)
            .collect();
        assert_eq!(flagged, asked);
        assert_eq!(pair.a.needed_from(id), Some(0), "nothing acknowledged yet");
    }
    // Too late once that packet went out; not for a message under two
    // full packets.
    let mut pair = pair(Faults::none(), 23);
    for _ in 0..20 {
        pair.step();
    }
    let (_, id, _) = long_message_in_parts(&mut pair, vec![7u8; len], false, 0);
    assert!(!pair.a.ack_before_tail(id));
    let short = pair.a.send(vec![7u8; payload * 2 - 1]).unwrap();
    assert!(!pair.a.ack_before_tail(short));
    let two = pair.a.send(vec![7u8; payload * 2]).unwrap();
    assert!(pair.a.ack_before_tail(two));
}

#[test]
fn a_buffer_cut_to_the_unacknowledged_tail_is_read_as_the_messages_end() {
    let config = config();
    let payload = config.max_payload_len() as usize;
    let len = payload * 8 + 100;
    let mut pair: SimPair<Cuttable> =
        SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 22).unwrap();
    for _ in 0..20 {
        pair.step();
    }
    let bytes: Vec<u8> = (0..len).map(|at| (at * 7 + at / 251) as u8).collect();
    let message = Cuttable::new(bytes.clone());
    // B gets the packets up to the one that asks for an acknowledgement
    // before the tail; the last two are lost.
    let (_, id, owed) = long_message_in_parts(&mut pair, message.clone(), true, 6);
    assert_eq!(owed, [false, false, false, false, false, false, true]);
    let mut out = vec![0u8; pair.b.config().mtu];
    let len_ack = pair
        .b
        .poll_transmit(pair.now, &mut out)
        .expect("B acknowledges at once");
    assert!(!pair.b.before_tail_ack_due(pair.now));
    pair.a.handle_packet(pair.now, &out[..len_ack]).unwrap();
    let from = pair.a.needed_from(id).unwrap();
    assert_eq!(
        from,
        (payload * 7) as u64,
        "the last full packet and the short one"
    );
    // A lets go of the rest: what it sends again comes from the tail.
    message.cut(from as usize);
    let mut log = SideLog::default();
    let mut b_log = SideLog::default();
    for _ in 0..10_000 {
        if !b_log.delivered.is_empty() && !log.completed.is_empty() {
            break;
        }
        assert!(pair.step(), "the pair stalled");
        while let Some(event) = pair.a.poll_event() {
            if let Event::SendComplete { id, .. } = event {
                log.completed.push(id.0);
            }
        }
        while let Some(delivery) = pair.b.poll_delivery() {
            if let barlink_transport::Delivery::Message { id, data } = delivery {
                b_log.delivered.push((id.0, data));
            }
        }
    }
    assert_eq!(b_log.delivered, [(id.0, bytes)], "intact");
    assert_eq!(log.completed, [id.0]);
    assert_eq!(pair.a.needed_from(id), None, "acknowledged");
    assert_eq!(
        pair.a.stats().retransmits(),
        2,
        "the two lost packets, from the tail"
    );
}
