//! The sending half: the send queue, fragmentation, the sliding window,
//! acknowledgement processing and retransmission.
//!
//! Messages are kept as the caller's buffers (`B`) until every fragment is
//! acknowledged; a retransmission re-reads the fragment's range of that
//! buffer, so the engine never makes a second copy of a payload. (A caller
//! may swap a buffer for a copy of just its end, once [`Sender::needed_from`]
//! says the engine reads no more before it: see [`Sender::payload`].)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use super::config::EngineConfig;
use super::error::{LinkError, PacketError};
use super::serial::serial_lt;
use super::stats::Stats;
use crate::time::Time;
use crate::wire::Fragment;

/// Why a packet is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetransmitCause {
    Nak,
    Timeout,
    Sack,
}

/// A message from `send` until its last fragment is acknowledged.
#[derive(Debug)]
pub(super) struct OutMessage<B> {
    pub(super) id: u64,
    pub(super) buf: B,
    len: u64,
    frag_count: u32,
    /// Next fragment to transmit for the first time.
    next_frag: u32,
    /// Ask for an acknowledgement on the packet before its tail (see
    /// [`Sender::ack_before_tail`]).
    ack_before_tail: bool,
}

/// A data packet sent and not yet cumulatively acknowledged.
#[derive(Debug, Clone)]
struct InFlight {
    msg_id: u64,
    frag_index: u32,
    /// Serial of this packet's latest transmission.
    last_xmit: u32,
    last_sent: Time,
    /// When the latest transmission times out.
    deadline: Time,
    transmissions: u32,
    /// The peer reported it received (selective ack): never resend it.
    sacked: bool,
    /// Waiting in `retransmit_queue`.
    queued: bool,
}

/// What the engine should put in the next data packet.
#[derive(Debug, Clone, Copy)]
pub(super) struct DataPacket {
    pub(super) seq: u64,
    pub(super) fragment: Fragment,
    pub(super) retransmission: bool,
    /// Ask the receiver to acknowledge at once: the sender is about to wait.
    pub(super) ack_requested: bool,
}

/// A data packet chosen to go now, with its payload.
pub(super) struct DataTransmission<'a> {
    pub(super) packet: DataPacket,
    pub(super) payload: &'a [u8],
}

/// `duration` in nanoseconds, saturating.
fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// RFC 6298 round-trip estimation, with Karn's rule applied by the caller
/// (only packets sent once are sampled).
///
/// The averages are kept in nanoseconds as integers: `Duration`'s
/// multiplications and divisions normalize seconds and nanoseconds with
/// divisions of their own, and this runs for every acknowledgement.
#[derive(Debug, Clone)]
struct RttEstimator {
    /// Smoothed round trip and its variation, in nanoseconds.
    smoothed_ns: Option<u64>,
    variation_ns: u64,
    /// The retransmission timeout, in nanoseconds (every packet sent takes
    /// its deadline from it).
    rto_ns: u64,
}

impl RttEstimator {
    fn new(initial_rto: Duration) -> Self {
        RttEstimator {
            smoothed_ns: None,
            variation_ns: 0,
            rto_ns: duration_ns(initial_rto),
        }
    }

    fn sample(&mut self, rtt: Duration, config: &EngineConfig) {
        // Round trips past 2^64 ns (584 years) are clamped; the sums below
        // stay far from overflow for anything up to `max_rto`'s scale.
        let rtt = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX / 16);
        let smoothed = match self.smoothed_ns {
            None => {
                self.variation_ns = rtt / 2;
                rtt
            }
            Some(srtt) => {
                let deviation = srtt.abs_diff(rtt);
                self.variation_ns = self
                    .variation_ns
                    .saturating_mul(3)
                    .saturating_add(deviation)
                    / 4;
                srtt.saturating_mul(7).saturating_add(rtt) / 8
            }
        };
        self.smoothed_ns = Some(smoothed);
        let rto_ns = smoothed.saturating_add(self.variation_ns.saturating_mul(4).max(1_000));
        // The config was validated: min_rto <= max_rto.
        self.rto_ns = rto_ns.clamp(duration_ns(config.min_rto), duration_ns(config.max_rto));
    }

    /// A retransmission timer fired: the timeout doubles until a packet
    /// sent once is acknowledged and gives a fresh sample (RFC 6298 5.5).
    /// Without it, a timeout set below the path's round trip would fire
    /// for every packet, and Karn's rule (no samples from retransmitted
    /// packets) would keep it there.
    fn back_off(&mut self, config: &EngineConfig) {
        self.rto_ns = self
            .rto_ns
            .saturating_mul(2)
            .min(duration_ns(config.max_rto));
    }

    /// The timeout for a packet's `transmissions`-th transmission: doubled
    /// for each earlier one, up to `max_rto`.
    fn backed_off(&self, transmissions: u32, config: &EngineConfig) -> u64 {
        let doublings = transmissions.saturating_sub(1).min(20);
        self.rto_ns
            .saturating_mul(1 << doublings)
            .min(duration_ns(config.max_rto))
    }

    /// When a packet sent at `now` for the `transmissions`-th time times
    /// out (in integer nanoseconds: this runs for every packet sent).
    #[inline]
    fn deadline(&self, now: Time, transmissions: u32, config: &EngineConfig) -> Time {
        Time::from_nanos(
            now.as_nanos()
                .saturating_add(self.backed_off(transmissions, config)),
        )
    }
}

#[derive(Debug)]
pub(super) struct Sender<B> {
    payload_size: u32,
    /// Unacknowledged messages in id order; ids are contiguous.
    outbox: VecDeque<OutMessage<B>>,
    /// Index in `outbox` of the first message with fragments never sent.
    unstarted: usize,
    next_msg_id: u64,
    /// Entry `i` is sequence number `base_seq + i`.
    in_flight: VecDeque<InFlight>,
    base_seq: u64,
    next_seq: u64,
    retransmit_queue: VecDeque<(u64, RetransmitCause)>,
    /// Retransmission deadlines `(when, seq, xmit)`; an entry whose packet
    /// was acknowledged or sent again since is stale and skipped, and the
    /// heap is rebuilt when stale entries outnumber live ones.
    timers: BinaryHeap<Reverse<(Time, u64, u32)>>,
    /// The peer accepts sequence numbers below this.
    credit_limit: u64,
    rtt: RttEstimator,
    stalled: bool,
}

impl<B: AsRef<[u8]>> Sender<B> {
    pub(super) fn new(config: &EngineConfig) -> Self {
        Sender {
            payload_size: config.max_payload_len(),
            outbox: VecDeque::new(),
            unstarted: 0,
            next_msg_id: 0,
            in_flight: VecDeque::new(),
            base_seq: 0,
            next_seq: 0,
            retransmit_queue: VecDeque::new(),
            timers: BinaryHeap::new(),
            credit_limit: 0,
            rtt: RttEstimator::new(config.initial_rto),
            stalled: false,
        }
    }

    /// Queues a message; the caller has checked its length and the limits.
    pub(super) fn enqueue(&mut self, buf: B) -> u64 {
        let len = buf.as_ref().len() as u64;
        let payload_size = u64::from(self.payload_size);
        // Most messages are one packet: no division for them.
        let frag_count = if len <= payload_size {
            1
        } else {
            len.div_ceil(payload_size)
        };
        let id = self.next_msg_id;
        self.next_msg_id += 1;
        self.outbox.push_back(OutMessage {
            id,
            buf,
            len,
            // The caller checked len <= max_message_len, which validate()
            // bounded to u32::MAX fragments.
            frag_count: u32::try_from(frag_count).expect("fragment count checked by config"),
            next_frag: 0,
            ack_before_tail: false,
        });
        id
    }

    pub(super) fn queued_messages(&self) -> usize {
        self.outbox.len()
    }

    pub(super) fn packets_in_flight(&self) -> u64 {
        self.next_seq - self.base_seq
    }

    pub(super) fn is_idle(&self) -> bool {
        self.outbox.is_empty()
    }

    pub(super) fn has_unsent(&self) -> bool {
        self.has_new_data()
    }

    fn has_new_data(&self) -> bool {
        self.unstarted < self.outbox.len()
    }

    fn may_send_new(&self, config: &EngineConfig) -> bool {
        self.packets_in_flight() < u64::from(config.send_window)
            && self.next_seq < self.credit_limit
    }

    /// Whether `next_packet` would produce a packet now.
    pub(super) fn wants_to_send(&self, config: &EngineConfig) -> bool {
        !self.retransmit_queue.is_empty() || (self.has_new_data() && self.may_send_new(config))
    }

    /// The next data packet to send and its payload, read from the caller's
    /// buffer: the one step a transmission takes through the sender (stall
    /// accounting, choice of packet, its timer, its bytes).
    #[inline]
    pub(super) fn next_transmission(
        &mut self,
        now: Time,
        xmit: u32,
        config: &EngineConfig,
        stats: &mut Stats,
    ) -> Option<DataTransmission<'_>> {
        self.note_if_blocked(config, stats);
        let packet = self.next_packet(now, xmit, config, stats)?;
        let payload = self.payload(&packet.fragment);
        Some(DataTransmission { packet, payload })
    }

    /// Counts the start of a stall: data waiting, but the window is full or
    /// the peer's credit is spent.
    fn note_if_blocked(&mut self, config: &EngineConfig, stats: &mut Stats) {
        if self.has_new_data() && !self.may_send_new(config) && !self.stalled {
            self.stalled = true;
            stats.credit_stalls += 1;
        }
    }

    /// Picks the next data packet: a queued retransmission first, then the
    /// next new fragment if the window and the peer's credit allow.
    fn next_packet(
        &mut self,
        now: Time,
        xmit: u32,
        config: &EngineConfig,
        stats: &mut Stats,
    ) -> Option<DataPacket> {
        while let Some((seq, cause)) = self.retransmit_queue.pop_front() {
            let Some(index) = seq.checked_sub(self.base_seq) else {
                continue; // acknowledged meanwhile
            };
            let Some(entry) = self.in_flight.get_mut(index as usize) else {
                continue;
            };
            entry.queued = false;
            if entry.sacked {
                continue;
            }
            match cause {
                RetransmitCause::Nak => stats.retransmits_nak += 1,
                RetransmitCause::Timeout => stats.retransmits_timeout += 1,
                RetransmitCause::Sack => stats.retransmits_sack += 1,
            }
            entry.last_xmit = xmit;
            entry.last_sent = now;
            entry.transmissions += 1;
            entry.deadline = self.rtt.deadline(now, entry.transmissions, config);
            let (msg_id, frag_index, deadline) = (entry.msg_id, entry.frag_index, entry.deadline);
            self.push_timer(deadline, seq, xmit);
            return Some(DataPacket {
                seq,
                fragment: self.fragment_of(msg_id, frag_index),
                retransmission: true,
                ack_requested: true,
            });
        }
        if !self.has_new_data() || !self.may_send_new(config) {
            return None;
        }
        self.stalled = false;
        let message = &mut self.outbox[self.unstarted];
        let frag_index = message.next_frag;
        message.next_frag += 1;
        let msg_id = message.id;
        let ack_before_tail = message.ack_before_tail;
        if message.next_frag == message.frag_count {
            self.unstarted += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let deadline = self.rtt.deadline(now, 1, config);
        self.in_flight.push_back(InFlight {
            msg_id,
            frag_index,
            last_xmit: xmit,
            last_sent: now,
            deadline,
            transmissions: 1,
            sacked: false,
            queued: false,
        });
        self.push_timer(deadline, seq, xmit);
        let about_to_wait = !self.has_new_data() || !self.may_send_new(config);
        let fragment = self.fragment_of(msg_id, frag_index);
        let before_tail = ack_before_tail
            && Some(frag_index) == before_tail_index(fragment.msg_len, self.payload_size);
        Some(DataPacket {
            seq,
            fragment,
            retransmission: false,
            ack_requested: about_to_wait || before_tail,
        })
    }

    /// Adds a retransmission deadline. Entries go stale when their packet is
    /// acknowledged; when stale ones dominate (acks outrun the timers, as
    /// they do on a fast medium), the heap is rebuilt from the live packets
    /// so that it stays proportional to the window.
    fn push_timer(&mut self, deadline: Time, seq: u64, xmit: u32) {
        self.timers.push(Reverse((deadline, seq, xmit)));
        if self.timers.len() > 2 * self.in_flight.len() + 64 {
            let base_seq = self.base_seq;
            self.timers = self
                .in_flight
                .iter()
                .enumerate()
                .filter(|(_, entry)| !entry.sacked && !entry.queued)
                .map(|(offset, entry)| {
                    Reverse((entry.deadline, base_seq + offset as u64, entry.last_xmit))
                })
                .collect();
        }
    }

    fn message(&self, msg_id: u64) -> &OutMessage<B> {
        let front = self
            .outbox
            .front()
            .expect("in-flight packets belong to queued messages");
        &self.outbox[(msg_id - front.id) as usize]
    }

    fn fragment_of(&self, msg_id: u64, index: u32) -> Fragment {
        let message = self.message(msg_id);
        Fragment {
            msg_id,
            msg_len: message.len,
            index,
            count: message.frag_count,
        }
    }

    /// Makes queued message `msg_id` ask for an acknowledgement on the
    /// packet before its tail ([`before_tail_index`]) too, if that
    /// packet has not gone out yet; whether it will.
    pub(super) fn ack_before_tail(&mut self, msg_id: u64) -> bool {
        let payload_size = self.payload_size;
        let Some(front) = self.outbox.front().map(|message| message.id) else {
            return false;
        };
        let Some(message) = msg_id
            .checked_sub(front)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.outbox.get_mut(at))
        else {
            return false;
        };
        let due = before_tail_index(message.len, payload_size)
            .is_some_and(|index| message.next_frag <= index);
        message.ack_before_tail = due;
        due
    }

    /// The offset of the first byte of message `msg_id` that this side may
    /// still read: that of its first fragment not yet sent or sent and not
    /// cumulatively acknowledged (a fragment the peer reported out of
    /// order counts as needed). `None` once the message is not queued
    /// (acknowledged, or failed).
    pub(super) fn needed_from(&self, msg_id: u64) -> Option<u64> {
        let front = self.outbox.front()?.id;
        let message = self
            .outbox
            .get(usize::try_from(msg_id.checked_sub(front)?).ok()?)?;
        // In-flight packets are in sequence order, and a message's
        // fragments are first sent in index order, so its first in-flight
        // entry holds its lowest unacknowledged fragment.
        let first = self
            .in_flight
            .iter()
            .find(|entry| entry.msg_id >= msg_id)
            .filter(|entry| entry.msg_id == msg_id)
            .map_or(message.next_frag, |entry| entry.frag_index);
        Some((u64::from(first) * u64::from(self.payload_size)).min(message.len))
    }

    /// The bytes of one fragment, read from the message's buffer. A buffer
    /// shorter than its message holds the message's last bytes only: the
    /// caller let go of a prefix that [`Sender::needed_from`] said this
    /// side no longer reads.
    fn payload(&self, fragment: &Fragment) -> &[u8] {
        let message = self.message(fragment.msg_id);
        let bytes = message.buf.as_ref();
        let dropped = message
            .len
            .checked_sub(bytes.len() as u64)
            .expect("a message's buffer never grows");
        let start = u64::from(fragment.index) * u64::from(self.payload_size);
        let end = (start + u64::from(self.payload_size)).min(message.len);
        // Never a byte the buffer let go of: a message sent wrong is worse
        // than a link stopped by the panic.
        assert!(
            start >= dropped,
            "fragment {} of message {} starts at byte {start}, before byte {dropped} where its buffer now begins",
            fragment.index,
            fragment.msg_id,
        );
        &bytes[(start - dropped) as usize..(end - dropped) as usize]
    }

    /// Applies the acknowledgement fields of a packet the peer sent to this
    /// session. Completed messages are handed to `completed` in order.
    pub(super) fn on_ack(
        &mut self,
        now: Time,
        ack: u64,
        sack: u64,
        credit: u32,
        config: &EngineConfig,
        mut completed: impl FnMut(OutMessage<B>),
    ) -> Result<(), PacketError> {
        if ack > self.next_seq {
            return Err(PacketError::AckBeyondSent {
                ack,
                next_seq: self.next_seq,
            });
        }
        if ack < self.base_seq {
            // Overtaken by a later acknowledgement (reordering): nothing new,
            // and its credit is older than what we hold.
            return Ok(());
        }
        // The receiver never takes back an edge it offered, so the largest
        // one seen holds (a reordered older ack may carry a smaller one).
        self.credit_limit = self.credit_limit.max(ack.saturating_add(u64::from(credit)));
        let mut newest_covered: Option<u32> = None;
        let mut rtt_sample = None;
        while self.base_seq < ack {
            let entry = self
                .in_flight
                .pop_front()
                .expect("in-flight entry per unacked seq");
            self.base_seq += 1;
            if !entry.sacked {
                newest_covered = Some(serial_max(newest_covered, entry.last_xmit));
                if entry.transmissions == 1 {
                    rtt_sample = Some(now.saturating_duration_since(entry.last_sent));
                }
            }
            let message = self.outbox.front().expect("acked packet has a message");
            if entry.frag_index + 1 == message.frag_count {
                let message = self.outbox.pop_front().expect("checked above");
                self.unstarted -= 1;
                completed(message);
            }
        }
        if let Some(rtt) = rtt_sample {
            self.rtt.sample(rtt, config);
        }
        if self.in_flight.is_empty() {
            // Every timer is stale now: drop them in place (keeping the
            // heap's memory) rather than let them pile up until a rebuild.
            self.timers.clear();
        }
        let mut highest_sacked = ack;
        // Only the set bits: the common SACK is empty or nearly so.
        let mut bits = sack;
        while bits != 0 {
            let bit = u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            let seq = ack + 1 + bit;
            if seq >= self.next_seq {
                break; // the peer claims packets never sent; ignore the rest
            }
            highest_sacked = seq;
            let entry = &mut self.in_flight[(seq - self.base_seq) as usize];
            if !entry.sacked {
                entry.sacked = true;
                newest_covered = Some(serial_max(newest_covered, entry.last_xmit));
            }
        }
        // Packets sent before one that arrived, and still missing, were lost
        // or corrupted on a medium that keeps order (rings, RDMA RC): resend
        // them without waiting for the timer. The oldest outstanding packet
        // is the first candidate; if it was sent after everything just
        // acknowledged, so was the rest, and there is nothing to scan.
        let front_is_older = |newest: u32| {
            self.in_flight
                .front()
                .is_some_and(|entry| serial_lt(entry.last_xmit, newest))
        };
        if let Some(newest) = newest_covered
            && (sack != 0 || front_is_older(newest))
        {
            let end = if sack != 0 {
                (highest_sacked - self.base_seq) as usize
            } else {
                self.in_flight.len()
            };
            for (offset, entry) in self.in_flight.iter_mut().take(end).enumerate() {
                if !entry.sacked && !entry.queued && serial_lt(entry.last_xmit, newest) {
                    entry.queued = true;
                    self.retransmit_queue
                        .push_back((self.base_seq + offset as u64, RetransmitCause::Sack));
                }
            }
        }
        Ok(())
    }

    /// The peer received transmission `corrupt_xmit` corrupt: resend it if
    /// it was a data packet still unacknowledged (a retransmission since has
    /// another serial, so a late NAK resends nothing twice).
    pub(super) fn on_nak(
        &mut self,
        corrupt_xmit: u32,
        config: &EngineConfig,
    ) -> Result<(), LinkError> {
        let base_seq = self.base_seq;
        let Some((offset, entry)) = self
            .in_flight
            .iter_mut()
            .enumerate()
            .find(|(_, entry)| entry.last_xmit == corrupt_xmit)
        else {
            return Ok(());
        };
        if entry.sacked || entry.queued {
            return Ok(());
        }
        let seq = base_seq + offset as u64;
        if entry.transmissions >= config.max_transmissions {
            return Err(LinkError::RetransmitLimit {
                msg_id: entry.msg_id,
                seq,
                transmissions: entry.transmissions,
            });
        }
        entry.queued = true;
        self.retransmit_queue.push_back((seq, RetransmitCause::Nak));
        Ok(())
    }

    /// Queues packets whose acknowledgement is overdue. Fails when one has
    /// been sent `max_transmissions` times without getting through.
    pub(super) fn on_timeout(&mut self, now: Time, config: &EngineConfig) -> Result<(), LinkError> {
        let mut fired = false;
        while let Some(&Reverse((deadline, seq, xmit))) = self.timers.peek() {
            if deadline > now {
                break;
            }
            self.timers.pop();
            let Some(index) = seq.checked_sub(self.base_seq) else {
                continue;
            };
            let Some(entry) = self.in_flight.get_mut(index as usize) else {
                continue;
            };
            if entry.last_xmit != xmit || entry.sacked || entry.queued {
                continue;
            }
            if entry.transmissions >= config.max_transmissions {
                return Err(LinkError::RetransmitLimit {
                    msg_id: entry.msg_id,
                    seq,
                    transmissions: entry.transmissions,
                });
            }
            entry.queued = true;
            tracing::debug!(
                seq,
                transmissions = entry.transmissions,
                rto_us = self.rtt.rto_ns / 1000,
                "retransmission timer fired"
            );
            self.retransmit_queue
                .push_back((seq, RetransmitCause::Timeout));
            fired = true;
        }
        if fired {
            // Once per expiry, however many packets it covered.
            self.rtt.back_off(config);
        }
        Ok(())
    }

    /// The earliest retransmission deadline (possibly of a stale entry,
    /// which only makes the caller wake early).
    pub(super) fn next_deadline(&self) -> Option<Time> {
        self.timers
            .peek()
            .map(|Reverse((deadline, _, _))| *deadline)
    }

    /// Ends the session: every unacknowledged message is handed back, and
    /// the sequence space starts again for the next session.
    pub(super) fn drain_all(&mut self) -> VecDeque<OutMessage<B>> {
        let messages = std::mem::take(&mut self.outbox);
        self.unstarted = 0;
        self.in_flight.clear();
        self.base_seq = 0;
        self.next_seq = 0;
        self.retransmit_queue.clear();
        self.timers.clear();
        self.credit_limit = 0;
        self.stalled = false;
        messages
    }
}

fn serial_max(current: Option<u32>, candidate: u32) -> u32 {
    match current {
        Some(current) if !serial_lt(current, candidate) => current,
        _ => candidate,
    }
}

/// The fragment of a message of `len` bytes (`payload_size` a fragment)
/// whose packet asks for an acknowledgement when [`Sender::ack_before_tail`]
/// asked: the last one that ends a full payload or more before the
/// message's end, so that what stays unacknowledged after it is one full
/// fragment and the short one after it, if any. `None` for messages under
/// two full fragments. The receiver knows such a packet by it.
pub(super) fn before_tail_index(len: u64, payload_size: u32) -> Option<u32> {
    let full = len / u64::from(payload_size);
    full.checked_sub(2)
        .and_then(|index| u32::try_from(index).ok())
}
