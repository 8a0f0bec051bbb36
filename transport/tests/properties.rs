//! Property tests: two engines through a simulated medium with seeded loss,
//! corruption (a bit flip anywhere in header or payload), truncation,
//! duplication, reordering and delay. Whatever the faults, every message is
//! delivered exactly once, byte-identical, in order — or a typed error says
//! why not.
//!
//! Case counts follow `PROPTEST_CASES` (proptest's default is 256); a
//! failing case prints its seed and replays exactly.

mod common;

use std::time::Duration;

use barlink_transport::rng::SplitMix64;
use barlink_transport::sim::{Faults, PairSide, ReceivePath, SimPair, hand_over};
use barlink_transport::wire::{self, Packet};
use barlink_transport::{Engine, EngineConfig, Event, LinkError, Time};
use common::{
    Cuttable, SideLog, assert_delivery_is_exact, drain_events, exchange, exchange_into_posted,
    payloads,
};
use proptest::prelude::*;

fn faults() -> impl Strategy<Value = Faults> {
    (
        0.0..0.2f64,
        0.0..0.2f64,
        0.0..0.05f64,
        0.0..0.2f64,
        0.0..0.3f64,
        0u64..50,
        0u64..500,
    )
        .prop_map(
            |(loss, corrupt, truncate, duplicate, reorder, latency_us, reorder_us)| Faults {
                loss,
                corrupt,
                truncate,
                duplicate,
                reorder,
                latency: Duration::from_micros(latency_us),
                reorder_delay: Duration::from_micros(reorder_us),
            },
        )
}

/// Both ways a packet reaches the engine: whole, or header first and the
/// payload copied out of the medium straight into its message.
fn receive_path() -> impl Strategy<Value = ReceivePath> {
    prop_oneof![Just(ReceivePath::Contiguous), Just(ReceivePath::FromMedium)]
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        prop::sample::select(vec![256usize, 1024, 4096, 65536]),
        2u32..64,
        2u32..64,
        1u32..16,
    )
        .prop_map(|(mtu, send_window, recv_window, ack_every)| EngineConfig {
            mtu,
            send_window,
            recv_window,
            ack_every,
            ..EngineConfig::default()
        })
}

proptest! {
    #[test]
    fn every_message_arrives_once_intact_in_order_under_any_faults(
        seed in any::<u64>(),
        faults_ab in faults(),
        faults_ba in faults(),
        config in config(),
        sizes_ab in prop::collection::vec(0usize..20_000, 0..24),
        sizes_ba in prop::collection::vec(0usize..6_000, 0..8),
        path in receive_path(),
    ) {
        let mut pair = SimPair::new(config.clone(), config, faults_ab, faults_ba, seed).unwrap();
        pair.receive_path = path;
        let out = exchange(
            &mut pair,
            payloads(&sizes_ab, seed),
            payloads(&sizes_ba, !seed),
            Duration::from_secs(600),
        );
        assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
        assert_delivery_is_exact(&out.sent_b, &out.a.delivered, &out.b.completed);
        // At these fault rates giving up is a bug, not bad luck: a packet
        // would have to fail 32 times running.
        prop_assert!(out.a.closed.is_none(), "A closed: {:?}", out.a.closed);
        prop_assert!(out.b.closed.is_none(), "B closed: {:?}", out.b.closed);
        prop_assert_eq!(out.a.completed.len(), sizes_ab.len());
        prop_assert_eq!(out.b.completed.len(), sizes_ba.len());
        prop_assert_eq!(out.b.delivered.len(), sizes_ab.len());
        prop_assert_eq!(out.a.delivered.len(), sizes_ba.len());
        // Packets were rejected only where the medium damaged them (a
        // damaged packet may also have been duplicated).
        let rejected = pair.b.stats().crc_failures + pair.b.stats().malformed;
        let damaged = pair.a_to_b.counts();
        prop_assert!(rejected <= damaged.corrupted + damaged.truncated + damaged.duplicated);
        if damaged.corrupted + damaged.truncated == 0 {
            prop_assert_eq!(rejected, 0);
        }
    }

    /// Whatever targets the receiver lends and takes back, whenever: every
    /// message arrives exactly, in a target or in an engine buffer.
    #[test]
    fn every_message_arrives_exactly_whatever_targets_the_receiver_lends(
        seed in any::<u64>(),
        faults in faults(),
        config in config(),
        sizes in prop::collection::vec(0usize..20_000, 0..24),
        max_target in 0usize..24_000,
        path in receive_path(),
    ) {
        let mut pair =
            SimPair::new(config.clone(), config, faults, Faults::none(), seed).unwrap();
        pair.receive_path = path;
        let out = exchange_into_posted(
            &mut pair,
            payloads(&sizes, seed),
            Duration::from_secs(600),
            seed,
            max_target,
        );
        assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
        prop_assert!(out.b.closed.is_none(), "B closed: {:?}", out.b.closed);
        prop_assert_eq!(out.a.completed.len(), sizes.len());
        prop_assert_eq!(out.b.delivered.len(), sizes.len());
    }

    /// A sender that cuts the buffers of messages on their way to the bytes
    /// the engine says it still reads (`Engine::needed_from`), at any
    /// moment, loses nothing whatever the faults: the engine never reads
    /// what it let go of (a read below the cut panics), and every message
    /// arrives exactly.
    #[test]
    fn a_sender_that_keeps_only_what_the_engine_still_reads_loses_nothing(
        seed in any::<u64>(),
        faults_ab in faults(),
        faults_ba in faults(),
        config in config(),
        ack_before_tail in any::<bool>(),
        sizes in prop::collection::vec(0usize..20_000, 1..16),
        path in receive_path(),
    ) {
        let mut pair: SimPair<Cuttable> =
            SimPair::new(config.clone(), config, faults_ab, faults_ba, seed).unwrap();
        pair.receive_path = path;
        let sent = payloads(&sizes, seed);
        let mut queued: Vec<(u64, Cuttable)> = Vec::new();
        let mut pending = sent.iter();
        let (mut completed, mut delivered) = (Vec::new(), Vec::new());
        let mut rng = SplitMix64::new(!seed);
        let deadline = pair.now + Duration::from_secs(600);
        while (completed.len() < sent.len() || delivered.len() < sent.len())
            && pair.now < deadline
        {
            if let Some(bytes) = pending.next() {
                let message = Cuttable::new(bytes.clone());
                let id = pair.a.send(message.clone()).unwrap();
                if ack_before_tail {
                    pair.a.ack_before_tail(id);
                }
                queued.push((id.0, message));
            }
            prop_assert!(pair.step(), "the pair stalled");
            for (id, message) in &queued {
                if !message.is_cut() && rng.next_u64().is_multiple_of(4)
                    && let Some(from) = pair.a.needed_from(barlink_transport::MessageId(*id))
                {
                    message.cut(from as usize);
                }
            }
            while let Some(event) = pair.a.poll_event() {
                match event {
                    Event::SendComplete { id, .. } => completed.push(id.0),
                    Event::SendFailed { id, error, .. } => prop_assert!(false, "{id:?} failed: {error}"),
                    Event::Closed { reason } => prop_assert!(false, "A closed: {reason}"),
                    _ => {}
                }
            }
            while let Some(event) = pair.b.poll_event() {
                match event {
                    Event::Message { data, .. } => delivered.push(data),
                    Event::Closed { reason } => prop_assert!(false, "B closed: {reason}"),
                    _ => {}
                }
            }
            queued.retain(|(id, _)| !completed.contains(id));
        }
        prop_assert_eq!(completed.len(), sent.len());
        prop_assert!(delivered == sent, "delivered differs from sent");
    }

    /// Heavy faults may end the link; then the error says why, and what was
    /// delivered is still an exact prefix.
    #[test]
    fn under_heavy_faults_the_link_delivers_exactly_or_says_why(
        seed in any::<u64>(),
        loss in 0.3..0.7f64,
        corrupt in 0.2..0.6f64,
        sizes in prop::collection::vec(0usize..5_000, 1..10),
        path in receive_path(),
    ) {
        let faults = Faults { loss, corrupt, ..Faults::none() };
        let config = EngineConfig {
            mtu: 512,
            max_transmissions: 6,
            peer_timeout: Duration::from_millis(300),
            ..EngineConfig::default()
        };
        let mut pair = SimPair::new(config.clone(), config, faults.clone(), faults, seed).unwrap();
        pair.receive_path = path;
        let out = exchange(&mut pair, payloads(&sizes, seed), vec![], Duration::from_secs(600));
        assert_delivery_is_exact(&out.sent_a, &out.b.delivered, &out.a.completed);
        prop_assert_eq!(out.a.resolved(), sizes.len(), "every send resolved one way or the other");
        if !out.a.failed.is_empty() {
            let (_, reason) = out.a.closed.clone().expect("failures come with a closed link");
            prop_assert!(matches!(
                reason,
                LinkError::RetransmitLimit { .. } | LinkError::PeerLost { .. } | LinkError::PeerClosed
            ), "{:?}", reason);
            for (_, error) in &out.a.failed {
                prop_assert_eq!(error, &reason);
            }
        }
    }

    /// A restart of the sender at a random point: the receiver delivers a
    /// prefix of the old session's messages and then the new session's, and
    /// never a message that mixes the two.
    #[test]
    fn a_restart_never_mixes_sessions(
        seed in any::<u64>(),
        restart_after_bytes in 0u64..60_000,
        loss in 0.0..0.1f64,
        corrupt in 0.0..0.1f64,
        path in receive_path(),
    ) {
        let faults = Faults { loss, corrupt, ..Faults::none() };
        let config = EngineConfig { mtu: 1024, send_window: 16, ..EngineConfig::default() };
        let mut pair = SimPair::new(config.clone(), config.clone(), faults.clone(), faults, seed).unwrap();
        pair.receive_path = path;
        // Old-session messages are all 0xAA..., new-session ones 0xBB...;
        // each has a distinct length so a mix of two shows as a wrong one.
        let old: Vec<Vec<u8>> = (0..8).map(|i| vec![0xAA; 9000 + i]).collect();
        let new: Vec<Vec<u8>> = (0..4).map(|i| vec![0xBB; 7000 + i]).collect();
        for message in &old {
            pair.a.send(message.clone()).unwrap();
        }
        let mut b_log = SideLog::default();
        let mut a_log = SideLog::default();
        while pair.b.stats().payload_bytes_received < restart_after_bytes
            && pair.now < Time::ZERO + Duration::from_secs(60)
        {
            pair.step();
            drain_events(&mut pair.b, pair.now, &mut b_log);
        }
        pair.restart(PairSide::A, config, 7).unwrap();
        for message in &new {
            pair.a.send(message.clone()).unwrap();
        }
        while a_log.completed.len() < new.len() && pair.now < Time::ZERO + Duration::from_secs(600) {
            pair.step();
            drain_events(&mut pair.a, pair.now, &mut a_log);
            drain_events(&mut pair.b, pair.now, &mut b_log);
        }
        prop_assert_eq!(a_log.completed.len(), new.len());
        let split = b_log.delivered.iter().take_while(|(_, data)| data[0] == 0xAA).count();
        for (index, (_, data)) in b_log.delivered[..split].iter().enumerate() {
            prop_assert!(data == &old[index], "old message {} mixed or misplaced", index);
        }
        let rest: Vec<&Vec<u8>> = b_log.delivered[split..].iter().map(|(_, d)| d).collect();
        prop_assert_eq!(rest.len(), new.len(), "all new messages, once");
        for (got, want) in rest.into_iter().zip(&new) {
            prop_assert!(got == want, "new message mixed or misplaced");
        }
    }

    /// A peer that only ever sends garbage — random bytes, or random bytes
    /// dressed as barlink packets with a valid magic, version and CRC —
    /// never makes the engine panic, hold memory, or deliver anything.
    #[test]
    fn a_garbage_peer_is_harmless(
        seed in any::<u64>(),
        packets in prop::collection::vec((0usize..5000, any::<bool>(), 0u8..8), 1..200),
        path in receive_path(),
    ) {
        let config = EngineConfig { mtu: 4096, ..EngineConfig::default() };
        let mut engine: Engine = Engine::new(config.clone(), 1, Time::ZERO).unwrap();
        let mut rng = SplitMix64::new(seed);
        let mut now = Time::ZERO;
        let mut out = vec![0u8; config.mtu];
        for (len, dressed, kind) in packets {
            let mut bytes = vec![0u8; len];
            rng.fill(&mut bytes);
            if dressed && len >= wire::HEADER_LEN {
                let mut packet = Packet::new_unchecked(&mut bytes[..]);
                packet.set_magic(wire::MAGIC);
                packet.set_version(wire::VERSION);
                packet.set_kind_byte(kind);
                packet.set_payload_len((len - wire::HEADER_LEN) as u32);
                packet.fill_crc();
            }
            let _ = hand_over(&mut engine, now, &bytes, path);
            while engine.poll_transmit(now, &mut out).is_some() {}
            now += Duration::from_micros(rng.below(2000));
            engine.handle_timeout(now);
            prop_assert_eq!(engine.buffered_bytes(), 0);
        }
        while let Some(event) = engine.poll_event() {
            prop_assert!(!matches!(event, Event::Message { .. }), "garbage delivered");
        }
    }
}
