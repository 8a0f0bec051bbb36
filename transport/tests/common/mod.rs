//! Drives a simulated pair through a workload and records what each side saw.
#![allow(dead_code)] // each test binary uses a different part

pub mod ring_links;

use std::collections::VecDeque;
use std::time::Duration;

use barlink_transport::EngineConfig;
use barlink_transport::rng::SplitMix64;
use barlink_transport::sim::{Faults, ReceivePath, SimPair};
use barlink_transport::wire::Repr;
use barlink_transport::{Event, LinkError, MessageId, PostId, RecvTarget, SendError, Time};

/// Everything one side observed.
#[derive(Debug, Default)]
pub struct SideLog {
    pub delivered: Vec<(u64, Vec<u8>)>,
    pub completed: Vec<u64>,
    pub failed: Vec<(u64, LinkError)>,
    pub closed: Option<(Time, LinkError)>,
    pub restarts: Vec<(u32, u32)>,
    pub connected: u32,
    /// Delivered messages that landed in a posted target.
    pub landed: usize,
}

impl SideLog {
    pub fn resolved(&self) -> usize {
        self.completed.len() + self.failed.len()
    }
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub a: SideLog,
    pub b: SideLog,
    pub sent_a: Vec<(u64, Vec<u8>)>,
    pub sent_b: Vec<(u64, Vec<u8>)>,
    pub finished_at: Time,
}

/// Messages of the given sizes, each filled from the generator so that any
/// misplaced or mixed byte shows.
pub fn payloads(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(seed);
    sizes
        .iter()
        .map(|&size| {
            let mut buf = vec![0; size];
            rng.fill(&mut buf);
            buf
        })
        .collect()
}

pub fn drain_events(engine: &mut barlink_transport::Engine, now: Time, log: &mut SideLog) {
    while let Some(event) = engine.poll_event() {
        match event {
            Event::Connected { .. } => log.connected += 1,
            Event::Message { id, data } => {
                log.delivered.push((id.0, data.clone()));
                // Give the buffer back with its old bytes: later messages,
                // shorter or longer, are assembled over them.
                engine.recycle_buffer(data);
            }
            Event::Landed { id, recv, len } => {
                log.delivered
                    .push((id.0, recv.into_target().bytes_mut()[..len].to_vec()));
                log.landed += 1;
            }
            Event::SendComplete { id, .. } => log.completed.push(id.0),
            Event::SendFailed { id, error, .. } => log.failed.push((id.0, error)),
            Event::PeerRestarted {
                old_epoch,
                new_epoch,
            } => log.restarts.push((old_epoch, new_epoch)),
            Event::Closed { reason } => {
                assert!(log.closed.is_none(), "closed twice");
                log.closed = Some((now, reason));
            }
        }
    }
}

/// Sends `to_b` from A and `to_a` from B, concurrently, and runs until every
/// message is resolved on its sending side or `limit` of simulated time
/// passes.
pub fn exchange(
    pair: &mut SimPair,
    to_b: Vec<Vec<u8>>,
    to_a: Vec<Vec<u8>>,
    limit: Duration,
) -> Outcome {
    let mut outcome = Outcome::default();
    let (count_a, count_b) = (to_b.len(), to_a.len());
    let mut pending_a: VecDeque<Vec<u8>> = to_b.into();
    let mut pending_b: VecDeque<Vec<u8>> = to_a.into();
    let deadline = pair.now + limit;
    loop {
        offer(&mut pair.a, &mut pending_a, &mut outcome.sent_a);
        offer(&mut pair.b, &mut pending_b, &mut outcome.sent_b);
        let alive = pair.step();
        drain_events(&mut pair.a, pair.now, &mut outcome.a);
        drain_events(&mut pair.b, pair.now, &mut outcome.b);
        let done = outcome.a.resolved() == count_a && outcome.b.resolved() == count_b;
        if done || !alive || pair.now >= deadline {
            break;
        }
    }
    // Let what is still to send or on the wire (a Close, late duplicates)
    // arrive too.
    for _ in 0..10_000 {
        let quiet = pair.a_to_b.in_flight() + pair.b_to_a.in_flight() == 0
            && !pair.a.wants_transmit(pair.now)
            && !pair.b.wants_transmit(pair.now);
        if quiet || !pair.step() {
            break;
        }
        drain_events(&mut pair.a, pair.now, &mut outcome.a);
        drain_events(&mut pair.b, pair.now, &mut outcome.b);
    }
    outcome.finished_at = pair.now;
    outcome
}

/// As [`exchange`], from A to B only, while B lends targets: before each
/// step it posts, one time in two, a target of `max_target` bytes or of a
/// random length below (at most four at once), and one time in eight takes back a
/// random one of those it posted. Whatever B lends, every message must
/// arrive exactly as [`assert_delivery_is_exact`] says.
pub fn exchange_into_posted(
    pair: &mut SimPair,
    to_b: Vec<Vec<u8>>,
    limit: Duration,
    seed: u64,
    max_target: usize,
) -> Outcome {
    let mut rng = SplitMix64::new(seed);
    let mut outcome = Outcome::default();
    let count = to_b.len();
    let mut pending: VecDeque<Vec<u8>> = to_b.into();
    let mut posted: Vec<PostId> = Vec::new();
    let deadline = pair.now + limit;
    loop {
        offer(&mut pair.a, &mut pending, &mut outcome.sent_a);
        if rng.chance(0.5) && pair.b.posted_recvs() < 4 {
            let len = if rng.chance(0.5) {
                max_target
            } else {
                rng.below(max_target as u64 + 1) as usize
            };
            let target: Box<dyn RecvTarget> = Box::new(vec![0xa5u8; len]);
            posted.push(pair.b.post_recv(target));
        }
        if rng.chance(0.125) && !posted.is_empty() {
            let at = rng.below(posted.len() as u64) as usize;
            let id = posted.swap_remove(at);
            // None: already handed over with its message.
            let _ = pair.b.unpost_recv(id);
        }
        let alive = pair.step();
        drain_events(&mut pair.a, pair.now, &mut outcome.a);
        drain_events(&mut pair.b, pair.now, &mut outcome.b);
        if outcome.a.resolved() == count || !alive || pair.now >= deadline {
            break;
        }
    }
    outcome.finished_at = pair.now;
    outcome
}

fn offer(
    engine: &mut barlink_transport::Engine,
    pending: &mut VecDeque<Vec<u8>>,
    sent: &mut Vec<(u64, Vec<u8>)>,
) {
    while let Some(message) = pending.pop_front() {
        let copy = message.clone();
        match engine.send(message) {
            Ok(id) => sent.push((id.0, copy)),
            Err(SendError::QueueFull(message)) => {
                pending.push_front(message);
                return;
            }
            Err(other) => {
                // Closed: the rest cannot be sent; count them as not sent.
                let _ = other;
                pending.clear();
                return;
            }
        }
    }
}

/// The invariant that holds under any faults: what a side delivered is a
/// prefix of what its peer sent, in order, byte for byte, each once; every
/// message its peer saw completed was delivered.
pub fn assert_delivery_is_exact(
    sent: &[(u64, Vec<u8>)],
    delivered: &[(u64, Vec<u8>)],
    completed: &[u64],
) {
    assert!(
        delivered.len() <= sent.len(),
        "delivered {} messages but only {} were sent",
        delivered.len(),
        sent.len()
    );
    for (index, ((sent_id, sent_data), (got_id, got_data))) in
        sent.iter().zip(delivered).enumerate()
    {
        assert_eq!(
            sent_id, got_id,
            "message {index}: wrong id (out of order or duplicated)"
        );
        assert!(
            sent_data == got_data,
            "message {index} (id {got_id}): {} bytes sent, {} delivered, contents differ",
            sent_data.len(),
            got_data.len()
        );
    }
    for id in completed {
        assert!(
            delivered.iter().any(|(got, _)| got == id),
            "message {id} completed at the sender but was never delivered"
        );
    }
}

/// The bytes of a packet as an engine would emit it, from fields a test
/// chose (the CRC is correct, so only the engine's own checks can object).
pub fn forged(repr: Repr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit(&mut buf, payload);
    buf
}

/// Steps the pair until B has a delivery ready, and takes it.
pub fn next_delivery(pair: &mut SimPair) -> barlink_transport::Delivery {
    for _ in 0..100_000 {
        if let Some(delivery) = pair.b.poll_delivery() {
            return delivery;
        }
        assert!(pair.step(), "the pair stalled");
    }
    panic!("nothing delivered")
}

/// A fault-free pair (A at epoch 1, B at epoch 2) after the handshake, with
/// A's events taken.
pub fn connected_pair(config: EngineConfig) -> SimPair {
    let mut pair: SimPair =
        SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 16).unwrap();
    for _ in 0..20 {
        pair.step();
    }
    assert!(pair.a.is_connected() && pair.b.is_connected());
    while pair.a.poll_event().is_some() {}
    pair
}

/// Sends one message from A and takes it at B, so that B knows the ids;
/// returns the id of the next message.
pub fn first_message(pair: &mut SimPair) -> MessageId {
    assert_eq!(pair.b.next_message_id(), None, "no id before the first");
    pair.a.send(b"hello".to_vec()).unwrap();
    let id = next_delivery(pair).id();
    assert_eq!(pair.b.next_message_id(), Some(MessageId(id.0 + 1)));
    MessageId(id.0 + 1)
}

/// A pair whose medium loses, corrupts, cuts, repeats and reorders
/// packets both ways, after the handshake, with A's events taken.
pub fn faulty_pair(seed: u64, path: ReceivePath, config: EngineConfig) -> SimPair {
    let faults = Faults {
        loss: 0.03,
        corrupt: 0.04,
        truncate: 0.02,
        duplicate: 0.02,
        reorder: 0.05,
        latency: Duration::from_micros(20),
        reorder_delay: Duration::from_micros(200),
    };
    let mut pair: SimPair =
        SimPair::new(config.clone(), config, faults.clone(), faults, seed).unwrap();
    pair.receive_path = path;
    for _ in 0..200 {
        pair.step();
        if pair.a.is_connected() && pair.b.is_connected() {
            break;
        }
    }
    while pair.a.poll_event().is_some() {}
    pair
}

/// A message buffer that can be cut to its last bytes while an engine holds
/// it, as a blocking send that lent its caller's bytes cuts them to a copy
/// of what the engine still reads (`Engine::needed_from`). Clones share the
/// cut. Read before a cut, it is the whole message; after, only the bytes
/// from the cut on, so an engine that read below the cut would panic.
#[derive(Debug, Clone)]
pub struct Cuttable {
    whole: std::rc::Rc<Vec<u8>>,
    tail: std::rc::Rc<std::cell::OnceCell<Vec<u8>>>,
}

impl Cuttable {
    pub fn new(bytes: Vec<u8>) -> Cuttable {
        Cuttable {
            whole: std::rc::Rc::new(bytes),
            tail: Default::default(),
        }
    }

    /// Keeps the bytes from `from` on only (once; later cuts are ignored).
    pub fn cut(&self, from: usize) {
        let _ = self.tail.set(self.whole[from..].to_vec());
    }

    pub fn is_cut(&self) -> bool {
        self.tail.get().is_some()
    }
}

impl AsRef<[u8]> for Cuttable {
    fn as_ref(&self) -> &[u8] {
        self.tail.get().map_or(&self.whole[..], |tail| &tail[..])
    }
}
