//! A simulated medium for driving two engines against each other, with
//! seeded faults, in simulated time.
//!
//! This is how the engine is tested without hardware (property tests, fuzz
//! targets) and how its cost is measured without a medium in the way
//! (benchmarks). Every run is a function of its seed: a failing case replays
//! exactly. Faults are applied per packet, in the spirit of smoltcp's
//! `FaultInjector`: loss, a flipped bit anywhere in header or payload,
//! truncation (a torn write), duplication, and reordering by extra delay.
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::engine::{ConfigError, Engine, EngineConfig, Event, LinkError};
use crate::rng::SplitMix64;
use crate::time::Time;

/// Per-packet fault probabilities and delays of one direction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// The packet vanishes.
    pub loss: f64,
    /// One random bit of the packet (header or payload) flips.
    pub corrupt: f64,
    /// The packet is cut short at a random length (a torn write).
    pub truncate: f64,
    /// The packet arrives twice.
    pub duplicate: f64,
    /// The packet is held back by up to `reorder_delay` extra, so that later
    /// packets overtake it.
    pub reorder: f64,
    /// Base one-way latency.
    pub latency: Duration,
    /// Longest extra delay of a reordered packet.
    pub reorder_delay: Duration,
}

impl Faults {
    /// No faults and no latency.
    pub fn none() -> Self {
        Faults::default()
    }

    /// Whether this medium keeps packets in order (no reordering), as rings
    /// and RDMA RC queue pairs do.
    pub fn keeps_order(&self) -> bool {
        self.reorder == 0.0 && self.duplicate == 0.0
    }
}

/// What a channel did to the packets it carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Packets offered to the channel.
    pub offered: u64,
    /// Dropped.
    pub lost: u64,
    /// Had a bit flipped.
    pub corrupted: u64,
    /// Cut short.
    pub truncated: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Held back so later packets overtook them.
    pub reordered: u64,
}

/// A packet on its way: `(arrival, order, buffer, length)`.
type Scheduled = (Time, u64, Vec<u8>, usize);

/// Changes a packet before the channel's faults apply (see [`SimPair::tamper`]).
pub type Tamper = fn(&mut Vec<u8>);

/// One direction of the medium.
#[derive(Debug)]
pub struct Channel {
    faults: Faults,
    /// `(arrival, order, buffer, length)`: buffers keep their full size so
    /// that reusing one never zeroes it again.
    in_flight: BinaryHeap<Reverse<Scheduled>>,
    /// Tie-breaker that keeps equal arrival times in sending order.
    order: u64,
    spare: Vec<Vec<u8>>,
    counts: FaultCounts,
}

impl Channel {
    /// A channel that applies `faults`.
    pub fn new(faults: Faults) -> Self {
        Channel {
            faults,
            in_flight: BinaryHeap::new(),
            order: 0,
            spare: Vec::new(),
            counts: FaultCounts::default(),
        }
    }

    /// What the channel has done so far.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }

    /// Changes the faults from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// Packets still on their way.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// A buffer of at least `len` bytes to write a packet into. Its
    /// contents are whatever a recycled packet left there: it is not
    /// zeroed, because writing a packet overwrites what it uses, and zeroing
    /// a 64 KiB buffer per packet would cost more than the protocol being
    /// measured.
    pub fn take_buffer(&mut self, len: usize) -> Vec<u8> {
        let mut buf = self.spare.pop().unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf
    }

    /// Returns a delivered packet's buffer for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        // Enough for a full window of packets in flight, so that steady
        // state allocates nothing.
        if self.spare.len() < 4096 {
            self.spare.push(buf);
        }
    }

    /// Puts the packet in the first `len` bytes of `packet` on the channel
    /// at `now`, applying faults.
    pub fn send(&mut self, now: Time, mut packet: Vec<u8>, mut len: usize, rng: &mut SplitMix64) {
        self.counts.offered += 1;
        let faults = &self.faults;
        if rng.chance(faults.loss) {
            self.counts.lost += 1;
            self.recycle(packet);
            return;
        }
        if rng.chance(faults.corrupt) && len > 0 {
            let bit = rng.below(len as u64 * 8);
            packet[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.counts.corrupted += 1;
        }
        if rng.chance(faults.truncate) && len > 0 {
            len = rng.below(len as u64) as usize;
            self.counts.truncated += 1;
        }
        let mut arrival = now + faults.latency;
        if rng.chance(faults.reorder) {
            let extra = rng.below(faults.reorder_delay.as_nanos().max(1) as u64);
            arrival += Duration::from_nanos(extra);
            self.counts.reordered += 1;
        }
        if rng.chance(faults.duplicate) {
            self.counts.duplicated += 1;
            let copy = packet[..len].to_vec();
            let later = arrival + Duration::from_nanos(rng.below(1000) + 1);
            self.push(later, copy, len);
        }
        self.push(arrival, packet, len);
    }

    fn push(&mut self, arrival: Time, packet: Vec<u8>, len: usize) {
        self.order += 1;
        self.in_flight
            .push(Reverse((arrival, self.order, packet, len)));
    }

    /// The next packet that has arrived by `now`: its buffer and its length
    /// (the buffer may be longer; give it back with [`Channel::recycle`]).
    pub fn receive(&mut self, now: Time) -> Option<(Vec<u8>, usize)> {
        match self.in_flight.peek() {
            Some(Reverse((arrival, ..))) if *arrival <= now => self
                .in_flight
                .pop()
                .map(|Reverse((_, _, packet, len))| (packet, len)),
            _ => None,
        }
    }

    /// When the next packet arrives.
    pub fn next_arrival(&self) -> Option<Time> {
        self.in_flight.peek().map(|Reverse((arrival, ..))| *arrival)
    }

    /// Drops everything on the way (a peer that died with packets in flight).
    pub fn clear(&mut self) {
        self.in_flight.clear();
    }
}

/// Which engine of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairSide {
    /// The first engine.
    A,
    /// The second engine.
    B,
}

/// Two engines joined by two channels, in simulated time.
///
/// [`SimPair::step`] moves packets and time; the caller sends messages and
/// takes events between steps through the public fields.
#[derive(Debug)]
pub struct SimPair<B = Vec<u8>> {
    /// Simulated now.
    pub now: Time,
    /// The first engine.
    pub a: Engine<B>,
    /// The second engine.
    pub b: Engine<B>,
    /// Packets from `a` to `b`.
    pub a_to_b: Channel,
    /// Packets from `b` to `a`.
    pub b_to_a: Channel,
    /// When false, `a` is not driven and packets to it vanish (a dead peer).
    pub a_alive: bool,
    /// When false, `b` is not driven and packets to it vanish.
    pub b_alive: bool,
    rng: SplitMix64,
    /// Packet errors the engines returned, per side (for assertions).
    pub packet_errors: [u64; 2],
    /// A function applied to every packet a side sends before the channel's
    /// faults: targeted corruption for tests ("every data packet from A").
    pub tamper: [Option<Tamper>; 2],
    /// How packets are handed to the receiving engine.
    pub receive_path: ReceivePath,
}

/// How a simulated medium hands a packet to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReceivePath {
    /// The whole packet at once ([`Engine::handle_packet`]).
    #[default]
    Contiguous,
    /// The header, then the payload copied out of the medium piece by
    /// piece, as a ring link does ([`Engine::handle_packet_from`]).
    FromMedium,
}

impl<B: AsRef<[u8]>> SimPair<B> {
    /// Two engines (epochs 1 and 2) created at time zero.
    pub fn new(
        config_a: EngineConfig,
        config_b: EngineConfig,
        faults_a_to_b: Faults,
        faults_b_to_a: Faults,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let now = Time::ZERO;
        Ok(SimPair {
            now,
            a: Engine::new(config_a, 1, now)?,
            b: Engine::new(config_b, 2, now)?,
            a_to_b: Channel::new(faults_a_to_b),
            b_to_a: Channel::new(faults_b_to_a),
            a_alive: true,
            b_alive: true,
            rng: SplitMix64::new(seed),
            packet_errors: [0; 2],
            tamper: [None; 2],
            receive_path: ReceivePath::Contiguous,
        })
    }

    /// The pair's generator, for workloads that should follow the seed too.
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }

    /// Replaces one side with a fresh engine (a restarted process), keeping
    /// what is on the wire.
    pub fn restart(
        &mut self,
        side: PairSide,
        config: EngineConfig,
        epoch: u32,
    ) -> Result<(), ConfigError> {
        let engine = Engine::new(config, epoch, self.now)?;
        match side {
            PairSide::A => {
                self.a = engine;
                self.a_alive = true;
            }
            PairSide::B => {
                self.b = engine;
                self.b_alive = true;
            }
        }
        Ok(())
    }

    /// Moves every packet the engines want to send onto the channels and
    /// delivers every packet that has arrived; if nothing moved, advances
    /// time to the next arrival or timer. Returns false when nothing will
    /// ever happen again (both sides closed or dead, channels empty).
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        if self.a_alive {
            moved |= transmit_all(
                &mut self.a,
                self.now,
                &mut self.a_to_b,
                &mut self.rng,
                self.tamper[0],
            );
        }
        if self.b_alive {
            moved |= transmit_all(
                &mut self.b,
                self.now,
                &mut self.b_to_a,
                &mut self.rng,
                self.tamper[1],
            );
        }
        moved |= deliver_all(
            &mut self.b,
            self.b_alive,
            self.now,
            &mut self.a_to_b,
            &mut self.packet_errors[1],
            self.receive_path,
        );
        moved |= deliver_all(
            &mut self.a,
            self.a_alive,
            self.now,
            &mut self.b_to_a,
            &mut self.packet_errors[0],
            self.receive_path,
        );
        if moved {
            return true;
        }
        let next = [
            self.a_to_b.next_arrival(),
            self.b_to_a.next_arrival(),
            self.a_alive.then(|| self.a.poll_timeout()).flatten(),
            self.b_alive.then(|| self.b.poll_timeout()).flatten(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else {
            return false;
        };
        // Always move forward, so a timer that is due but has nothing to do
        // cannot spin the loop.
        self.now = next.max(self.now + Duration::from_nanos(1));
        if self.a_alive {
            self.a.handle_timeout(self.now);
        }
        if self.b_alive {
            self.b.handle_timeout(self.now);
        }
        true
    }
}

/// Why [`SimPair::transfer`] stopped before every message was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// One side's link ended.
    Closed(LinkError),
    /// A message failed on the sending side.
    SendFailed(LinkError),
    /// Nothing more could happen (both sides idle with work outstanding).
    Stuck,
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferError::Closed(error) => write!(f, "link closed: {error}"),
            TransferError::SendFailed(error) => write!(f, "send failed: {error}"),
            TransferError::Stuck => write!(f, "transfer stuck: no progress possible"),
        }
    }
}

impl std::error::Error for TransferError {}

impl<B: AsRef<[u8]> + Clone> SimPair<B> {
    /// Sends `count` copies of `message` from A to B (a clone each: use a
    /// shared buffer type such as `Arc<[u8]>` to send without copying) and
    /// runs until A has every one acknowledged, showing each message B
    /// delivers to `on_delivered` (its buffer then goes back to B for
    /// reuse). Other events are consumed.
    pub fn transfer(
        &mut self,
        message: &B,
        count: usize,
        mut on_delivered: impl FnMut(&[u8]),
    ) -> Result<(), TransferError> {
        let mut queued = 0;
        let mut completed = 0;
        while completed < count {
            while queued < count && self.a.send(message.clone()).is_ok() {
                queued += 1;
            }
            if !self.step() {
                return Err(TransferError::Stuck);
            }
            while let Some(event) = self.b.poll_event() {
                match event {
                    Event::Message { data, .. } => {
                        on_delivered(&data);
                        self.b.recycle_buffer(data);
                    }
                    Event::Closed { reason } => return Err(TransferError::Closed(reason)),
                    _ => {}
                }
            }
            while let Some(event) = self.a.poll_event() {
                match event {
                    Event::SendComplete { .. } => completed += 1,
                    Event::SendFailed { error, .. } => {
                        return Err(TransferError::SendFailed(error));
                    }
                    Event::Closed { reason } => return Err(TransferError::Closed(reason)),
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// Bound on packets one engine may emit in one step; a correct engine is
/// limited by its window long before this.
const MAX_PACKETS_PER_STEP: usize = 1 << 16;

fn transmit_all<B: AsRef<[u8]>>(
    engine: &mut Engine<B>,
    now: Time,
    channel: &mut Channel,
    rng: &mut SplitMix64,
    tamper: Option<Tamper>,
) -> bool {
    let mut sent = 0;
    let mtu = engine.config().mtu;
    while sent < MAX_PACKETS_PER_STEP {
        let mut buf = channel.take_buffer(mtu);
        match engine.poll_transmit(now, &mut buf) {
            Some(mut len) => {
                if let Some(tamper) = tamper {
                    buf.truncate(len);
                    tamper(&mut buf);
                    len = buf.len();
                }
                channel.send(now, buf, len, rng);
                sent += 1;
            }
            None => {
                channel.recycle(buf);
                break;
            }
        }
    }
    sent > 0
}

fn deliver_all<B: AsRef<[u8]>>(
    engine: &mut Engine<B>,
    alive: bool,
    now: Time,
    channel: &mut Channel,
    errors: &mut u64,
    path: ReceivePath,
) -> bool {
    let mut delivered = false;
    while let Some((packet, len)) = channel.receive(now) {
        delivered = true;
        if alive && hand_over(engine, now, &packet[..len], path).is_err() {
            *errors += 1;
        }
        channel.recycle(packet);
    }
    delivered
}

/// Gives one received packet to `engine` the way `path` says.
pub fn hand_over<B: AsRef<[u8]>>(
    engine: &mut Engine<B>,
    now: Time,
    packet: &[u8],
    path: ReceivePath,
) -> Result<(), crate::engine::PacketError> {
    match path {
        ReceivePath::Contiguous => engine.handle_packet(now, packet),
        ReceivePath::FromMedium => {
            let header = &packet[..packet.len().min(crate::wire::HEADER_LEN)];
            let payload = &packet[header.len()..];
            // The engine asks only for bytes within what the header claims,
            // which it checked against `payload.len()`.
            let verdict = engine.handle_packet_from(
                now,
                header,
                payload.len(),
                |offset, dst, crc, _message_len| {
                    dst.copy_from_slice(&payload[offset..offset + dst.len()]);
                    if let Some(crc) = crc {
                        crc.update(dst);
                    }
                    Ok::<(), std::convert::Infallible>(())
                },
            );
            match verdict {
                Ok(result) => result,
                Err(never) => match never {},
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_reproducible_and_spread() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let hits = (0..100_000).filter(|_| a.chance(0.25)).count();
        assert!((23_000..27_000).contains(&hits), "{hits}");
        assert!((0..10_000).all(|_| a.below(7) < 7));
        assert!(!a.chance(0.0));
    }

    #[test]
    fn channel_applies_each_fault() {
        let mut rng = SplitMix64::new(1);
        let mut channel = Channel::new(Faults {
            loss: 0.1,
            corrupt: 0.1,
            truncate: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            latency: Duration::from_micros(5),
            reorder_delay: Duration::from_micros(50),
        });
        for i in 0..10_000u32 {
            channel.send(Time::ZERO, i.to_le_bytes().repeat(4), 16, &mut rng);
        }
        let counts = channel.counts().clone();
        for (name, count) in [
            ("lost", counts.lost),
            ("corrupted", counts.corrupted),
            ("truncated", counts.truncated),
            ("duplicated", counts.duplicated),
            ("reordered", counts.reordered),
        ] {
            assert!((700..1300).contains(&count), "{name}: {count}");
        }
        assert_eq!(
            channel.receive(Time::ZERO),
            None,
            "latency holds packets back"
        );
        let mut arrived = 0;
        while channel.receive(Time::from_nanos(1_000_000)).is_some() {
            arrived += 1;
        }
        assert_eq!(arrived, 10_000 - counts.lost + counts.duplicated);
    }
}
