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

use crate::engine::Engine;
use crate::time::Time;

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

    /// Hands every packet that has arrived to `engine` (through
    /// [`Engine::handle_packet_from`], so the payload is copied once, with
    /// its CRC) and frees what they occupied. Returns how many packets were
    /// handed over. Bytes a peer wrote are untrusted: lengths go through
    /// the engine's checks against the room actually there.
    fn receive<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
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
}
