//! Regression tests from the first protocol review: each test replays the
//! sequence of events that exposed a finding (named in its comment) and
//! asserts the behaviour of the fix. They failed on the engine as reviewed.

mod common;

use std::time::Duration;

use barlink_transport::sim::{Faults, PairSide, SimPair};
use barlink_transport::wire::{Fragment, PacketKind, Repr};
use barlink_transport::{EngineConfig, PacketError, Time};
use common::{SideLog, connected_pair, drain_events, forged, payloads};

fn config() -> EngineConfig {
    EngineConfig {
        mtu: 1024,
        ..EngineConfig::default()
    }
}

fn from_b(kind: PacketKind, epoch: u32, peer_epoch: u32) -> Repr {
    Repr {
        kind,
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

/// F1. The receive window shrinks when a message completes: fragments of
/// the message being assembled advance `ack` without using credit, then the
/// whole message's fragment count is charged at once. Credit already granted
/// is taken back, an honest sender's packets are dropped as OutsideWindow,
/// and if the receiving application is slow (here: does not poll for the
/// test's duration) the sender retransmits them into a closed window until
/// RetransmitLimit tears the link down, instead of simply stalling.
///
/// recv_window 16, mtu 1024 (944-byte payloads): message 0 has 40
/// fragments, message 1 has 8. A sends 0..15, B acks (16, credit 16); A
/// sends 16..31, B acks (32, credit 16), so A may send up to 47; A sends
/// 32..39 (end of message 0) and 40..47 (message 1). When B consumes 39,
/// message 0 completes, 40 packets are charged, credit drops to 0 and the
/// window ends at 40: 40..47 are rejected.
#[test]
fn f1_completing_a_message_shrinks_granted_credit() {
    let config = EngineConfig {
        recv_window: 16,
        ..config()
    };
    let mut pair: SimPair = SimPair::new(
        config.clone(),
        config.clone(),
        Faults::none(),
        Faults::none(),
        8,
    )
    .unwrap();
    let payload = config.max_payload_len() as usize;
    for message in payloads(&[payload * 40, payload * 8], 8) {
        pair.a.send(message).unwrap();
    }
    // B's application does not poll for 60 s (a slow consumer): A must stall
    // on credit, not fail.
    let mut a_log = SideLog::default();
    while pair.now < Time::ZERO + Duration::from_secs(60) && a_log.closed.is_none() {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
    }
    let violations = pair.b.stats().credit_violations;
    assert!(
        a_log.closed.is_none(),
        "A closed the link ({:?}) because B did not poll; B counted {violations} credit violations by an honest A",
        a_log.closed
    );
    assert_eq!(
        violations, 0,
        "an honest sender overran the credit B granted"
    );
}

/// F2. NAK ping-pong: every packet that fails parsing is NAKed, and a NAK
/// can itself arrive corrupt, which is NAKed in turn. On a path that
/// corrupts everything both ways (or two sides that reject each other's
/// packets structurally: version, magic, MTU), one hello starts an endless
/// NAK exchange. At zero latency the simulator never advances time, so the
/// peer-loss timer never fires: a livelock. (On real media the storm runs at
/// one packet per round trip per side until peer_timeout.)
#[test]
fn f2_naks_of_naks_livelock_at_zero_latency() {
    let mut pair: SimPair =
        SimPair::new(config(), config(), Faults::none(), Faults::none(), 20).unwrap();
    // Flip a CRC bit of every packet either side sends.
    pair.tamper = [
        Some(|p: &mut Vec<u8>| p[77] ^= 1),
        Some(|p: &mut Vec<u8>| p[77] ^= 1),
    ];
    let mut steps = 0u64;
    while steps < 200_000 && !(pair.a.is_closed() && pair.b.is_closed()) {
        pair.step();
        steps += 1;
    }
    assert!(
        pair.a.is_closed() && pair.b.is_closed(),
        "after {steps} steps simulated time is {:?}, A sent {} packets ({} NAKs), and neither side has given up",
        pair.now,
        pair.a.stats().packets_sent,
        pair.a.stats().naks_sent
    );
}

/// F3a. Epoch comparison at distance 2^31: `serial_lt` is false both ways,
/// and `check_peer_epoch` treats "not older" as a restart. After B's epoch
/// goes 2 -> 2+2^31, a late packet of epoch 2 is taken as ANOTHER restart,
/// the receiver is reset, and that old packet's data (here a late
/// retransmission of message 0, already delivered) is delivered again.
#[test]
fn f3a_epoch_at_half_range_redelivers_old_session_data() {
    let mut pair = connected_pair(config());
    let now = pair.now;
    let old_data = Repr {
        kind: PacketKind::Data,
        seq: 0,
        fragment: Some(Fragment {
            msg_id: 0,
            msg_len: 3,
            index: 0,
            count: 1,
        }),
        payload_len: 3,
        ..from_b(PacketKind::Data, 2, 1)
    };
    // Session with B at epoch 2 delivers message 0.
    pair.a
        .handle_packet(now, &forged(old_data, b"old"))
        .unwrap();
    // B restarts with epoch 2 + 2^31 (serial-newer: not lt, not equal).
    // Exactly half the number space away is not "newer": it is refused.
    let hello = from_b(PacketKind::Heartbeat, 2 + (1 << 31), 0);
    let refused = pair.a.handle_packet(now, &forged(hello, &[]));
    assert!(
        matches!(refused, Err(PacketError::StaleEpoch { .. })),
        "{refused:?}"
    );
    // A late duplicate of epoch 2's message 0 arrives.
    let late = pair.a.handle_packet(now, &forged(old_data, b"old"));
    let mut log = SideLog::default();
    drain_events(&mut pair.a, now, &mut log);
    assert_eq!(
        log.delivered.len(),
        1,
        "message 0 of the old session delivered twice (late packet returned {late:?}, restarts {:?})",
        log.restarts
    );
    assert!(
        late.is_ok(),
        "still the current session: a duplicate, dropped quietly: {late:?}"
    );
    assert!(log.restarts.is_empty());
}

/// F3b. Serial order is not transitive: epochs that each are "newer" than
/// the one before (as `Engine::new` asks) can make an incarnation two
/// restarts back look newer than the current one. 2 -> 0x6000_0002 ->
/// 0xC000_0002: a late packet of epoch 2 at a peer that knows 0xC000_0002 is
/// taken as a restart and its data is delivered into the "new" session.
#[test]
fn f3b_non_transitive_epochs_accept_an_old_session() {
    let mut pair = connected_pair(config());
    let now = pair.now;
    for epoch in [0x6000_0002u32, 0xC000_0002] {
        let hello = from_b(PacketKind::Heartbeat, epoch, 0);
        pair.a.handle_packet(now, &forged(hello, &[])).unwrap();
    }
    let old_data = Repr {
        kind: PacketKind::Data,
        fragment: Some(Fragment {
            msg_id: 0,
            msg_len: 3,
            index: 0,
            count: 1,
        }),
        payload_len: 3,
        ..from_b(PacketKind::Data, 2, 1)
    };
    let late = pair.a.handle_packet(now, &forged(old_data, b"old"));
    let mut log = SideLog::default();
    drain_events(&mut pair.a, now, &mut log);
    assert!(
        log.delivered.is_empty(),
        "data of epoch 2 delivered after the peer moved on to 0xC000_0002 (returned {late:?}, restarts {:x?})",
        log.restarts
    );
}

/// F4. A fresh engine learns the peer's epoch from ANY intact packet,
/// including a leftover addressed to an earlier incarnation of this side.
/// Both sides restart (A 1->3, B 2->5) while B's epoch-2 packets are still
/// on the wire (or in the ring). A3 learns "B is epoch 2" from a leftover,
/// then sees epoch 5 and reports PeerRestarted: the message A3 queued at
/// start fails with PeerRestarted although its session never existed.
#[test]
fn f4_fresh_engine_learns_a_stale_epoch_and_fails_its_first_sends() {
    let faults = Faults {
        latency: Duration::from_micros(20),
        ..Faults::none()
    };
    let mut pair: SimPair = SimPair::new(config(), config(), faults.clone(), faults, 21).unwrap();
    // Keep B busy sending to A so that B's packets are in flight.
    for message in payloads(&[50_000; 4], 21) {
        pair.b.send(message).unwrap();
    }
    while pair.a.stats().payload_bytes_received < 20_000 || pair.b_to_a.in_flight() == 0 {
        pair.step();
        while pair.a.poll_event().is_some() {}
        while pair.b.poll_event().is_some() {}
    }
    assert!(pair.b_to_a.in_flight() > 0, "B's packets are on the wire");
    pair.a_to_b.clear(); // nothing of A1 reaches B5
    pair.restart(PairSide::A, config(), 3).unwrap();
    pair.restart(PairSide::B, config(), 5).unwrap();
    pair.a.send(vec![7; 1000]).unwrap();
    let mut a_log = SideLog::default();
    while pair.now < Time::ZERO + Duration::from_secs(5) && a_log.resolved() == 0 {
        pair.step();
        drain_events(&mut pair.a, pair.now, &mut a_log);
        while pair.b.poll_event().is_some() {}
    }
    assert!(
        a_log.failed.is_empty() && a_log.restarts.is_empty(),
        "fresh A3: restarts {:?}, failed {:?}",
        a_log.restarts,
        a_log.failed
    );
    assert_eq!(a_log.completed.len(), 1);
}

/// F5. One 64 KiB data packet claiming a message of `max_message_len`
/// (64 TiB here) made the receiver reserve that much at once, and the
/// process aborted, from peer-controlled bytes. Now memory follows the data
/// actually received.
#[test]
fn f5_a_hostile_message_length_costs_only_what_arrived() {
    let config = EngineConfig {
        mtu: 1 << 20,
        max_message_len: 1 << 46,
        ..EngineConfig::default()
    };
    let mut pair: SimPair =
        SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 22).unwrap();
    for _ in 0..20 {
        pair.step();
    }
    assert!(pair.a.is_connected());
    let payload = vec![0u8; 1 << 16];
    let first = Repr {
        kind: PacketKind::Data,
        seq: 0,
        credit: 16,
        fragment: Some(Fragment {
            msg_id: 0,
            msg_len: 1 << 46,
            index: 0,
            count: 1 << 30, // 2^30 fragments of 2^16 bytes
        }),
        payload_len: 1 << 16,
        ..from_b(PacketKind::Data, 2, 1)
    };
    pair.a
        .handle_packet(pair.now, &forged(first, &payload))
        .unwrap();
    let held = pair.a.buffered_bytes();
    assert!(
        held <= 64 << 16,
        "{held} bytes reserved for one 64 KiB fragment"
    );
}
