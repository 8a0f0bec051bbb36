//! What a link's packets travel over: the [`Medium`] trait.
//!
//! A [`super::Link`] is an engine plus a medium. The engine decides what to
//! send and what arrived is valid; the medium moves packet bytes. The ring
//! in a pair of memory windows ([`super::RingMedium`]) is one medium; RDMA
//! WRITE with immediate into a peer's registered ring (`barlink-rdma`) is
//! another. Everything above the medium — blocking calls with timeouts,
//! idle spinning, events, close — is shared.
#![forbid(unsafe_code)]

use std::fmt;

use std::time::Duration;

use crate::engine::Engine;
use crate::time::Time;

/// The longest a medium goes without storing its index words again: what
/// a publication the peer missed (a corrupt or lost index store) costs at
/// most. Two stores into the peer's line a millisecond are nothing beside
/// the traffic, and an unchanged word wakes no waiting peer.
pub const REPUBLISH_EVERY: Duration = Duration::from_millis(1);

/// When a medium next stores its index words again, moved or not, so that
/// a store of its own that the peer missed is repaired: every
/// [`REPUBLISH_EVERY`], or the heartbeat interval if that is shorter.
/// Its deadline is what [`Medium::poll_timeout`] returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct RepeatTimer {
    at: Option<Time>,
}

impl RepeatTimer {
    /// Whether the repeat is due at `now`; when it is (or on the first
    /// call, which only arms the timer) the next one is set.
    #[inline]
    pub fn due(&mut self, now: Time, heartbeat: Duration) -> bool {
        let due = self.at.is_some_and(|at| now >= at);
        if due || self.at.is_none() {
            self.at = Some(now + REPUBLISH_EVERY.min(heartbeat));
        }
        due
    }

    /// When the next repeat is due, once armed.
    pub fn deadline(&self) -> Option<Time> {
        self.at
    }
}

/// A medium's failure: the link stops and reports it as
/// [`super::IoError::Medium`] from then on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediumError {
    detail: String,
}

impl MediumError {
    /// An error whose text says what failed and what to check.
    pub fn new(detail: impl fmt::Display) -> Self {
        MediumError {
            detail: detail.to_string(),
        }
    }

    /// The text.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for MediumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for MediumError {}

/// What a medium did about index words (a ring's head and consumed words,
/// an RDMA region's credit word) that it could not act on: each is a
/// missed update, repaired by the peer's next publication.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Index words that failed their check (corrupted on the way or in
    /// memory).
    pub corrupt: u64,
    /// Index words that passed their check but could not be true (behind
    /// what was seen, or beyond what the ring holds): late or replayed
    /// stores.
    pub implausible: u64,
    /// This side's own index words stored again unchanged, so that a
    /// publication the peer missed is repaired within the repeat interval.
    pub republished: u64,
}

impl IndexStats {
    /// Index updates not acted on, for whatever reason.
    pub fn missed(&self) -> u64 {
        self.corrupt + self.implausible
    }

    /// Counts a missed update.
    pub fn record(&mut self, miss: &crate::ring::MissedUpdate) {
        match miss {
            crate::ring::MissedUpdate::Corrupt { .. } => self.corrupt += 1,
            crate::ring::MissedUpdate::Implausible { .. } => self.implausible += 1,
        }
    }

    /// The sum of two sides' counts.
    pub fn plus(self, other: IndexStats) -> IndexStats {
        IndexStats {
            corrupt: self.corrupt + other.corrupt,
            implausible: self.implausible + other.implausible,
            republished: self.republished + other.republished,
        }
    }
}

/// How far one [`Medium::receive`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// Every packet that has arrived (on a ring, up to the message after
    /// the last target the caller lent, when it lent some: see
    /// `RingMedium::receive`).
    All,
    /// Up to the packet that makes one more message ready to deliver: the
    /// caller waits for a message, and the packets behind it stay in the
    /// medium until the next round (a medium may take small messages in a
    /// batch, where a round costs more than they do). A large message
    /// read ahead takes a buffer of its own while the caller still holds
    /// the one before, so a stream of them cycles through two buffers or
    /// more where one would do (the caller's, given back before it asks
    /// for the next). A medium that cannot leave packets where they are
    /// (a byte stream already read) may hand over more.
    FirstMessage,
}

/// Moves an engine's packets to the peer and the peer's packets to the
/// engine. One round of a link calls [`Medium::activity`], then (unless the
/// round can be skipped) [`Medium::receive`] and [`Medium::transmit`].
pub trait Medium {
    /// A cheap observation that changes whenever a packet may have arrived
    /// or room to transmit may have freed up (a ring: its head and the
    /// peer's consumed count). A link whose last round moved nothing skips
    /// the next one while this is unchanged and no engine timer is due, so
    /// a waiting caller spins on this alone. A medium with no cheap test
    /// may return a value that changes every call. It is called first in
    /// every round, so `receive` and `transmit` of the same round may act
    /// on what it observed.
    fn activity(&mut self) -> Result<[u64; 2], MediumError>;

    /// Hands the packets that have arrived to `engine` (through
    /// [`Engine::handle_packet_from`], so the payload is copied once, with
    /// its CRC) and frees what they occupied: all of them, or as `intake`
    /// allows. Returns how many packets were handed over. Bytes a peer
    /// wrote are untrusted: lengths go through the engine's checks against
    /// the room actually there.
    fn receive<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
        intake: Intake,
    ) -> Result<usize, MediumError>;

    /// Takes packets from [`Engine::poll_transmit_with`] while the medium
    /// has room for one more, and sends them. Returns how many were sent.
    fn transmit<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError>;

    /// The largest packet, header included, one transmission carries: the
    /// engine's MTU (which includes the header) must fit.
    fn max_packet(&self) -> usize;

    /// When the medium next needs a round even if nothing arrives (to
    /// store its index words again, see [`IndexStats::republished`]): a
    /// link that skips idle rounds runs one by then. `None`: never.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    /// What the medium did about index words it could not act on.
    fn index_stats(&self) -> IndexStats {
        IndexStats::default()
    }
}
