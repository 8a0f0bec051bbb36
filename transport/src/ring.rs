//! The packet ring that lives in a receive window: its layout and the
//! head/consumed index protocol, as pure logic over numbers.
//!
//! Each side of a link owns one receive window. Its peer writes packets
//! into the window's slots and publishes how many it wrote (`head`); the
//! owner reads them from its own memory and tells the peer how many it has
//! consumed by writing `consumed` into the *peer's* window. So each side
//! writes only into the other's window and reads only its own: across PCIe,
//! writes are posted and fast, reads are slow round trips (push, never pull).
//!
//! ```text
//!  window of side A (A reads, B writes)        window of side B (B reads, A writes)
//!  ┌──────────────────────────────┐             ┌──────────────────────────────┐
//!  │ line 0: geometry (A, once)   │             │ line 0: geometry (B, once)   │
//!  │ line 1: head     ◄── B writes│             │ line 1: head     ◄── A writes│
//!  │ line 2: consumed ◄── B writes│ = how far B │ line 2: consumed ◄── A writes│
//!  │         (of B's window)      │   has read  │         (of A's window)      │
//!  │ slots: packets   ◄── B writes│   B's ring  │ slots: packets   ◄── A writes│
//!  └──────────────────────────────┘             └──────────────────────────────┘
//! ```
//!
//! Ordering: the producer writes a packet into slot `head % slot_count`,
//! fences (write-combined stores must land first), then stores `head + 1`
//! with Release. The consumer loads `head` with Acquire, reads the slots
//! below it, and stores its `consumed` count with Release into the peer's
//! window; the producer loads it with Acquire before reusing a slot.
//!
//! Index words check themselves. A ring in a peer's BAR receives its index
//! stores as ordinary posted writes, which a flaky path corrupts like any
//! other bytes; so each 64-bit index word carries the count modulo 2³² and
//! a CRC-32C of it ([`encode_index`]), one atomic store. A word that fails
//! its check, or whose count cannot be true now (behind what was seen,
//! beyond what the ring holds), is a [`MissedUpdate`]: the reader counts
//! it, keeps what it knew and never acts on it, and the peer's next
//! publication (or its periodic repeat) repairs it. A corrupt index is a
//! delay, never an out-of-bounds slot, and never the end of the link.
//!
//! This module holds the arithmetic, the checks, the control block's
//! encoding and the index loads and stores with the orderings the protocol
//! needs ([`load_head`], [`publish_head`], [`load_consumed`],
//! [`publish_consumed`]); the links decide when to call them. The packets
//! themselves carry their own length and CRC, so a torn slot is caught by
//! the engine like any corrupt packet.
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

use std::fmt;

use crate::sync::atomic::Ordering;
use crate::window::{Window, WindowError};
use crate::wire::HEADER_LEN;

/// Bytes of the control block at the start of every ring window: a line the
/// owner writes once (identity and geometry) and a line of indices that
/// only the peer writes, padded to 256. The owner never writes the second
/// line, so the two sides never share a written cache line; the peer's two
/// indices share one, so an owner waiting for either reads one line.
pub const CONTROL_LEN: usize = 256;
/// Slots are multiples of a cache line.
pub const SLOT_ALIGN: usize = 64;
/// Where a packet starts in its slot: this far in, its header ends on a
/// cache line, so that the payload's 64-byte stores and loads each touch
/// one line rather than two (design change 72).
pub const PACKET_AT: usize = HEADER_LEN.next_multiple_of(SLOT_ALIGN) - HEADER_LEN;
/// `b"BLRING\0\x01"` as a little-endian u64: identifies a barlink ring.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"BLRING\0\x01");
/// Layout version of the ring. 3: index words carry a check
/// ([`encode_index`]); 4: packets start [`PACKET_AT`] into their slots.
pub const RING_VERSION: u32 = 4;
/// Most slots a ring may have: an index word carries its count modulo
/// 2³², and a reader tells an update ahead from a stale one behind only
/// while a ring is under half of that.
pub const MAX_SLOTS: u32 = 1 << 30;

/// Offsets within the control block.
pub mod offset {
    /// u64 [`super::RING_MAGIC`], written by the owner.
    pub const MAGIC: usize = 0;
    /// u32 layout version, written by the owner.
    pub const VERSION: usize = 8;
    /// u32 bytes per slot.
    pub const SLOT_SIZE: usize = 12;
    /// u32 number of slots.
    pub const SLOT_COUNT: usize = 16;
    /// u64 the owner's generation: +1 each time a process attaches as owner
    /// (the engine's epoch).
    pub const GENERATION: usize = 24;
    /// u32 the owner's process id (diagnostics for stale rings). It, the
    /// magic and the version have kept their places in every layout
    /// version, so that a ring file any version left can be told stale.
    pub const OWNER_PID: usize = 32;
    /// u64 index word: packets the peer has published into this window
    /// (line 1; see [`super::encode_index`]).
    pub const HEAD: usize = 64;
    /// u64 index word: packets the peer has consumed from its own window
    /// (line 1 too: the peer writes both, and a ping-pong then moves one
    /// line, not two).
    pub const CONSUMED: usize = 72;
    /// First slot.
    pub const SLOTS: usize = super::CONTROL_LEN;
}

/// Bytes of the control block's first line, which the owner writes.
pub const IDENTITY_LEN: usize = offset::HEAD;

/// The first line of a control block: what a ring is and who owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// [`RING_MAGIC`] in a barlink ring.
    pub magic: u64,
    /// [`RING_VERSION`] in a ring of this layout.
    pub version: u32,
    /// Slots and their size, as the owner laid them out.
    pub geometry: Geometry,
    /// The owner's generation (+1 per attach).
    pub generation: u64,
    /// The owner's process id, for diagnostics.
    pub owner_pid: u32,
}

impl Identity {
    /// The line as it lies in the window, little-endian at the [`offset`]s.
    pub fn encode(&self) -> [u8; IDENTITY_LEN] {
        let mut line = [0u8; IDENTITY_LEN];
        put(&mut line, offset::MAGIC, &self.magic.to_le_bytes());
        put(&mut line, offset::VERSION, &self.version.to_le_bytes());
        put(
            &mut line,
            offset::SLOT_SIZE,
            &self.geometry.slot_size.to_le_bytes(),
        );
        put(
            &mut line,
            offset::SLOT_COUNT,
            &self.geometry.slot_count.to_le_bytes(),
        );
        put(
            &mut line,
            offset::GENERATION,
            &self.generation.to_le_bytes(),
        );
        put(&mut line, offset::OWNER_PID, &self.owner_pid.to_le_bytes());
        line
    }

    /// Reads the fields back; nothing is checked here (see
    /// [`Geometry::validate`] and the magic and version constants).
    pub fn decode(line: &[u8; IDENTITY_LEN]) -> Identity {
        Identity {
            magic: u64::from_le_bytes(field(line, offset::MAGIC)),
            version: u32::from_le_bytes(field(line, offset::VERSION)),
            geometry: Geometry {
                slot_size: u32::from_le_bytes(field(line, offset::SLOT_SIZE)),
                slot_count: u32::from_le_bytes(field(line, offset::SLOT_COUNT)),
            },
            generation: u64::from_le_bytes(field(line, offset::GENERATION)),
            owner_pid: u32::from_le_bytes(field(line, offset::OWNER_PID)),
        }
    }
}

fn put(line: &mut [u8; IDENTITY_LEN], at: usize, bytes: &[u8]) {
    line[at..at + bytes.len()].copy_from_slice(bytes);
}

fn field<const N: usize>(line: &[u8; IDENTITY_LEN], at: usize) -> [u8; N] {
    line[at..at + N]
        .try_into()
        .expect("fields lie inside the line")
}

/// Which index an index word holds. Each kind has its own check, so a word
/// that lands at the wrong place (a misdirected write) fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// A ring's head (packets published into it).
    Head,
    /// A ring's consumed count (packets read out of the peer's ring).
    Consumed,
    /// An RDMA receive region's credit word (packets consumed).
    Credit,
}

impl IndexKind {
    /// Folded into the check: distinct for each kind.
    const fn tweak(self) -> u32 {
        match self {
            IndexKind::Head => u32::from_le_bytes(*b"HEAD"),
            IndexKind::Consumed => u32::from_le_bytes(*b"CONS"),
            IndexKind::Credit => u32::from_le_bytes(*b"CRED"),
        }
    }
}

fn index_check(kind: IndexKind, count: u32) -> u32 {
    crate::crc::crc32c_of_u32(count) ^ kind.tweak()
}

/// An index word as it is stored: the count modulo 2³² in the low half, a
/// CRC-32C of those four bytes (tweaked by `kind`) in the high half.
///
/// Why a CRC: on 32 bits of data it is a bijection, so a word torn between
/// two values by a copy in address order (either direction) never passes
/// (the half that was placed no longer matches the other), and it catches
/// every error of up to seven bits, where a count stored twice or with its
/// complement misses two flips 32 bits apart. All-zero and all-one words
/// (lost or dead memory) fail it too. 32 bits of count suffice: a reader
/// extends it from what it knew, the ring holding at most [`MAX_SLOTS`].
#[inline]
pub fn encode_index(kind: IndexKind, count: u64) -> u64 {
    let count = count as u32;
    u64::from(count) | (u64::from(index_check(kind, count)) << 32)
}

/// The count (modulo 2³²) in an index word, or `None` when the word fails
/// its check (see [`encode_index`]).
pub fn decode_index(kind: IndexKind, word: u64) -> Option<u32> {
    let count = word as u32;
    (index_check(kind, count) == (word >> 32) as u32).then_some(count)
}

/// The head word in this side's window (`own`), as the peer last stored
/// it: give it to [`Consumer::on_head`]. Acquire: the slots below a head
/// that passes are then visible.
pub fn load_head<W: Window + ?Sized>(own: &W) -> Result<u64, WindowError> {
    own.load_u64(offset::HEAD, Ordering::Acquire)
}

/// Makes the packets below `head` visible to the peer. The store fence lets
/// write-combined payload stores (a BAR) land first; the Release store is
/// what orders them in the language's memory model.
pub fn publish_head<W: Window + ?Sized>(peer: &W, head: u64) -> Result<(), WindowError> {
    peer.store_fence();
    peer.store_u64(
        offset::HEAD,
        encode_index(IndexKind::Head, head),
        Ordering::Release,
    )
}

/// The consumed word in this side's window (`own`): how many of our
/// packets the peer has read out of its own window, as it reported it.
/// Give it to [`Producer::on_consumed`]. Acquire: the peer's reads of those
/// slots are then done, and the slots may be written again.
pub fn load_consumed<W: Window + ?Sized>(own: &W) -> Result<u64, WindowError> {
    own.load_u64(offset::CONSUMED, Ordering::Acquire)
}

/// Gives the slots read so far back to the peer: `consumed` goes into the
/// peer's window with Release, after this side's reads of them.
pub fn publish_consumed<W: Window + ?Sized>(peer: &W, consumed: u64) -> Result<(), WindowError> {
    peer.store_u64(
        offset::CONSUMED,
        encode_index(IndexKind::Consumed, consumed),
        Ordering::Release,
    )
}

/// An index word a reader did not act on: a missed update. The reader
/// keeps what it knew; the peer's next publication repairs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissedUpdate {
    /// The word fails its check: corrupted in memory or on its way.
    Corrupt { word: u64 },
    /// The word is whole but its count (modulo 2³²) cannot be true now:
    /// behind what was already seen (a late or replayed store) or beyond
    /// `limit`, the most the ring allows.
    Implausible { count: u32, seen: u64, limit: u64 },
}

impl fmt::Display for MissedUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissedUpdate::Corrupt { word } => {
                write!(f, "index word {word:#018x} fails its check (ignored)")
            }
            MissedUpdate::Implausible { count, seen, limit } => write!(
                f,
                "index {count} (mod 2^32) is neither {seen} nor ahead of it up to {limit} (ignored)"
            ),
        }
    }
}

/// The count an index word moves a reader's `seen` to: the word must pass
/// its check as `kind` and lie at most `room` ahead of `seen` (counts are
/// extended from `seen`, modulo 2³²). Anything else is a missed update and
/// moves nothing.
pub fn advance_index(
    kind: IndexKind,
    word: u64,
    seen: u64,
    room: u64,
) -> Result<u64, MissedUpdate> {
    let count = decode_index(kind, word).ok_or(MissedUpdate::Corrupt { word })?;
    Ok(seen + advance(count, seen, room)?)
}

/// How far `count` (modulo 2³²) is ahead of `seen`, if at most `room`.
fn advance(count: u32, seen: u64, room: u64) -> Result<u64, MissedUpdate> {
    let ahead = u64::from(count.wrapping_sub(seen as u32));
    if ahead > room {
        return Err(MissedUpdate::Implausible {
            count,
            seen,
            limit: seen + room,
        });
    }
    Ok(ahead)
}

/// The shape of a ring: how many slots of what size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per slot (a multiple of [`SLOT_ALIGN`]; a packet and its lead,
    /// [`PACKET_AT`]).
    pub slot_size: u32,
    /// Number of slots (at least 2).
    pub slot_count: u32,
}

impl Geometry {
    /// Bytes of a slot for packets of up to `mtu` bytes, each [`PACKET_AT`]
    /// into its slot, rounded up to cache lines (saturating, for an absurd
    /// `mtu`, into a size no geometry takes).
    pub const fn slot_size_for(mtu: usize) -> usize {
        mtu.saturating_add(PACKET_AT)
            .div_ceil(SLOT_ALIGN)
            .saturating_mul(SLOT_ALIGN)
    }

    /// A window that holds at least `packet_bytes` of packets in whole
    /// slots at any MTU from 4 KiB that divides them: the control block,
    /// the packets, and room for each slot's lead
    /// ([`Geometry::slot_size_for`]), so that a 4 MiB ring holds 32
    /// packets of 128 KiB, as it did before the lead.
    pub const fn window_len_for(packet_bytes: usize) -> usize {
        CONTROL_LEN + packet_bytes + packet_bytes / 4096 * SLOT_ALIGN
    }

    /// The geometry that fits `window_len` bytes with slots for packets of
    /// up to `mtu` bytes ([`Geometry::slot_size_for`]).
    pub fn for_window(window_len: usize, mtu: usize) -> Result<Geometry, RingError> {
        let slot_size = Geometry::slot_size_for(mtu);
        let available = window_len.saturating_sub(CONTROL_LEN);
        let slot_count = available / slot_size.max(1);
        if slot_count < 2 {
            return Err(RingError::WindowTooSmall {
                window_len,
                needed: slot_size.saturating_mul(2).saturating_add(CONTROL_LEN),
            });
        }
        Ok(Geometry {
            slot_size: u32::try_from(slot_size).map_err(|_| RingError::BadGeometry {
                detail: "slot size beyond 4 GiB",
            })?,
            slot_count: u32::try_from(slot_count)
                .unwrap_or(MAX_SLOTS)
                .min(MAX_SLOTS),
        })
    }

    /// Checks a geometry read from a window (written by whoever created it)
    /// against the window's real length, so that every slot offset derived
    /// from it lies inside the window.
    pub fn validate(&self, window_len: usize) -> Result<(), RingError> {
        if self.slot_size == 0 || !(self.slot_size as usize).is_multiple_of(SLOT_ALIGN) {
            return Err(RingError::BadGeometry {
                detail: "slot size is not a positive multiple of 64",
            });
        }
        if self.slot_count < 2 {
            return Err(RingError::BadGeometry {
                detail: "fewer than two slots",
            });
        }
        if self.slot_count > MAX_SLOTS {
            return Err(RingError::BadGeometry {
                detail: "more than 2^30 slots",
            });
        }
        let needed = (self.slot_size as u64)
            .checked_mul(u64::from(self.slot_count))
            .and_then(|slots| slots.checked_add(CONTROL_LEN as u64));
        match needed {
            Some(needed) if needed <= window_len as u64 => Ok(()),
            _ => Err(RingError::WindowTooSmall {
                window_len,
                needed: needed.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
            }),
        }
    }

    /// Byte offset of the slot that packet number `index` occupies.
    pub fn slot_offset(&self, index: u64) -> usize {
        self.offset_of_slot((index % u64::from(self.slot_count)) as u32)
    }

    /// Byte offset of slot `slot` (below `slot_count`).
    fn offset_of_slot(&self, slot: u32) -> usize {
        offset::SLOTS + slot as usize * self.slot_size as usize
    }

    /// The slot after `slot`, wrapping: what `slot_offset(index + 1)` needs
    /// without a division (a 64-bit `div` is some 15 cycles, on every
    /// small message's path twice).
    fn next_slot(&self, slot: u32) -> u32 {
        if slot + 1 == self.slot_count {
            0
        } else {
            slot + 1
        }
    }

    /// Total bytes the ring occupies.
    pub fn ring_len(&self) -> usize {
        CONTROL_LEN + self.slot_size as usize * self.slot_count as usize
    }
}

/// The writing end's bookkeeping for the ring in the peer's window.
#[derive(Debug, Clone)]
pub struct Producer {
    geometry: Geometry,
    /// Packets written so far (the next one goes to slot `written % count`).
    written: u64,
    /// `written % slot_count`, kept as it goes.
    slot: u32,
    /// Packets the peer reported consumed.
    consumed: u64,
}

impl Producer {
    /// A producer for a ring of this geometry, starting empty.
    pub fn new(geometry: Geometry) -> Producer {
        Producer {
            geometry,
            written: 0,
            slot: 0,
            consumed: 0,
        }
    }

    /// Slots free for writing now.
    pub fn free_slots(&self) -> u64 {
        u64::from(self.geometry.slot_count) - (self.written - self.consumed)
    }

    /// Where the next packet goes, if a slot is free.
    pub fn next_slot_offset(&self) -> Option<usize> {
        (self.free_slots() > 0).then(|| self.geometry.offset_of_slot(self.slot))
    }

    /// Records that the next packet was written; returns the new head to
    /// publish (after a store fence) with Release.
    pub fn commit(&mut self) -> u64 {
        debug_assert!(self.free_slots() > 0, "commit without a free slot");
        self.written += 1;
        self.slot = self.geometry.next_slot(self.slot);
        self.written
    }

    /// Applies the consumed word the peer stored into our window (loaded
    /// with Acquire): a word that fails its check, or whose count goes
    /// backwards or past what we wrote, is a missed update and changes
    /// nothing.
    #[inline]
    pub fn on_consumed(&mut self, word: u64) -> Result<(), MissedUpdate> {
        let count =
            decode_index(IndexKind::Consumed, word).ok_or(MissedUpdate::Corrupt { word })?;
        self.on_consumed_count(count)
    }

    /// As [`Producer::on_consumed`], for a count (modulo 2³²) that came
    /// without a check (a baseline ring that checks nothing).
    pub fn on_consumed_count(&mut self, count: u32) -> Result<(), MissedUpdate> {
        self.consumed += advance(count, self.consumed, self.written - self.consumed)?;
        Ok(())
    }

    /// Packets written so far: the head last published.
    pub fn written(&self) -> u64 {
        self.written
    }
}

/// The reading end's bookkeeping for the ring in its own window.
#[derive(Debug, Clone)]
pub struct Consumer {
    geometry: Geometry,
    /// Packets read so far.
    read: u64,
    /// `read % slot_count`, kept as it goes.
    slot: u32,
    /// The head last seen.
    head: u64,
}

impl Consumer {
    /// A consumer of a ring of this geometry, starting empty.
    pub fn new(geometry: Geometry) -> Consumer {
        Consumer {
            geometry,
            read: 0,
            slot: 0,
            head: 0,
        }
    }

    /// Applies the head word the peer stored (loaded with Acquire); returns
    /// how many packets are ready. A word that fails its check, or whose
    /// head runs backwards or further ahead than the ring holds, is a missed
    /// update and changes nothing (the packets already known stay ready).
    #[inline]
    pub fn on_head(&mut self, word: u64) -> Result<u64, MissedUpdate> {
        let room = u64::from(self.geometry.slot_count) - (self.head - self.read);
        self.head = advance_index(IndexKind::Head, word, self.head, room)?;
        Ok(self.head - self.read)
    }

    /// As [`Consumer::on_head`], for a count (modulo 2³²) that came without
    /// a check (a baseline ring that checks nothing).
    pub fn on_head_count(&mut self, count: u32) -> Result<u64, MissedUpdate> {
        let room = u64::from(self.geometry.slot_count) - (self.head - self.read);
        self.head += advance(count, self.head, room)?;
        Ok(self.head - self.read)
    }

    /// Where the next ready packet is, if one is.
    pub fn next_slot_offset(&self) -> Option<usize> {
        (self.read < self.head).then(|| self.geometry.offset_of_slot(self.slot))
    }

    /// Packets read and released so far: the consumed count to publish.
    pub fn released(&self) -> u64 {
        self.read
    }

    /// Records that the next packet was read out of its slot; returns the
    /// consumed count to publish with Release into the peer's window.
    pub fn release(&mut self) -> u64 {
        debug_assert!(self.read < self.head, "release without a ready packet");
        self.read += 1;
        self.slot = self.geometry.next_slot(self.slot);
        self.read
    }
}

/// A ring geometry that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// The window cannot hold a control block and two slots.
    WindowTooSmall { window_len: usize, needed: usize },
    /// The geometry in a control block is impossible.
    BadGeometry { detail: &'static str },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::WindowTooSmall { window_len, needed } => write!(
                f,
                "window of {window_len} bytes is too small for a ring: at least {needed} bytes are needed (a {CONTROL_LEN}-byte control block and two slots); use a larger window or a smaller MTU"
            ),
            RingError::BadGeometry { detail } => {
                write!(f, "ring control block has an impossible geometry: {detail}")
            }
        }
    }
}

impl std::error::Error for RingError {}

#[cfg(test)]
mod tests {
    use super::*;

    const GEOMETRY: Geometry = Geometry {
        slot_size: 4096,
        slot_count: 4,
    };

    #[test]
    fn the_identity_line_lies_at_the_named_offsets() {
        let identity = Identity {
            magic: RING_MAGIC,
            version: RING_VERSION,
            geometry: GEOMETRY,
            generation: 0x0102_0304_0506_0708,
            owner_pid: 4242,
        };
        let line = identity.encode();
        assert_eq!(&line[offset::MAGIC..offset::MAGIC + 8], b"BLRING\0\x01");
        assert_eq!(line[offset::VERSION], RING_VERSION as u8);
        assert_eq!(
            line[offset::SLOT_COUNT..offset::SLOT_COUNT + 4],
            GEOMETRY.slot_count.to_le_bytes()
        );
        assert_eq!(line[offset::GENERATION], 0x08);
        assert_eq!(
            line[offset::OWNER_PID..offset::OWNER_PID + 4],
            4242u32.to_le_bytes()
        );
        assert_eq!(Identity::decode(&line), identity);
    }

    #[test]
    fn geometry_fits_the_window() {
        // A packet starts PACKET_AT into its slot, so that its payload
        // starts on a cache line.
        assert_eq!((PACKET_AT + HEADER_LEN) % SLOT_ALIGN, 0);
        let geometry = Geometry::for_window(4 << 20, 4096).unwrap();
        assert_eq!(geometry.slot_size as usize, 4096 + SLOT_ALIGN);
        assert_eq!(
            geometry.slot_count as usize,
            ((4 << 20) - CONTROL_LEN) / (4096 + SLOT_ALIGN)
        );
        geometry.validate(4 << 20).unwrap();
        assert!(geometry.ring_len() <= 4 << 20);
        // Slots round up to cache lines.
        assert_eq!(Geometry::for_window(1 << 20, 1000).unwrap().slot_size, 1088);
        // An absurd MTU is refused, not wrapped into a small slot.
        assert!(Geometry::for_window(1 << 20, usize::MAX).is_err());
        // The default window holds 4 MiB of packets at every power-of-two
        // MTU, the lead notwithstanding: 32 of the default 128 KiB.
        let window = Geometry::window_len_for(4 << 20);
        assert_eq!(
            Geometry::for_window(window, 128 << 10).unwrap().slot_count,
            32
        );
        for mtu in (12..=21).map(|shift| 1usize << shift) {
            let geometry = Geometry::for_window(window, mtu).unwrap();
            assert!(geometry.slot_count as usize >= (4 << 20) / mtu, "mtu {mtu}");
            geometry.validate(window).unwrap();
        }
    }

    #[test]
    fn a_window_too_small_says_how_much_is_needed() {
        let error = Geometry::for_window(8192, 4096).unwrap_err();
        assert_eq!(
            error,
            RingError::WindowTooSmall {
                window_len: 8192,
                needed: CONTROL_LEN + 2 * (4096 + SLOT_ALIGN)
            }
        );
        assert!(error.to_string().contains("smaller MTU"));
    }

    #[test]
    fn impossible_geometries_from_a_control_block_are_rejected() {
        for (geometry, window_len) in [
            (
                Geometry {
                    slot_size: 0,
                    slot_count: 4,
                },
                1 << 20,
            ),
            (
                Geometry {
                    slot_size: 100,
                    slot_count: 4,
                },
                1 << 20,
            ),
            (
                Geometry {
                    slot_size: 64,
                    slot_count: 1,
                },
                1 << 20,
            ),
            (
                Geometry {
                    slot_size: 4096,
                    slot_count: 1000,
                },
                1 << 20,
            ),
            (
                Geometry {
                    slot_size: u32::MAX - 63,
                    slot_count: u32::MAX,
                },
                1 << 40,
            ),
        ] {
            assert!(geometry.validate(window_len).is_err(), "{geometry:?}");
        }
    }

    #[test]
    fn slots_wrap_around_the_ring() {
        assert_eq!(GEOMETRY.slot_offset(0), CONTROL_LEN);
        assert_eq!(GEOMETRY.slot_offset(3), CONTROL_LEN + 3 * 4096);
        assert_eq!(GEOMETRY.slot_offset(4), CONTROL_LEN);
        assert_eq!(GEOMETRY.slot_offset(u64::MAX), CONTROL_LEN + 3 * 4096);
    }

    fn head(count: u64) -> u64 {
        encode_index(IndexKind::Head, count)
    }

    fn consumed(count: u64) -> u64 {
        encode_index(IndexKind::Consumed, count)
    }

    /// Both ends keep their slot as they go, without a division: over
    /// several laps it is always `slot_offset` of their count.
    #[test]
    fn both_ends_follow_the_slots_around_many_laps() {
        let mut producer = Producer::new(GEOMETRY);
        let mut consumer = Consumer::new(GEOMETRY);
        for packet in 0..4 * u64::from(GEOMETRY.slot_count) + 3 {
            assert_eq!(
                producer.next_slot_offset(),
                Some(GEOMETRY.slot_offset(packet))
            );
            consumer.on_head(head(producer.commit())).unwrap();
            assert_eq!(
                consumer.next_slot_offset(),
                Some(GEOMETRY.slot_offset(packet))
            );
            producer.on_consumed(consumed(consumer.release())).unwrap();
        }
    }

    #[test]
    fn the_producer_never_overwrites_an_unconsumed_slot() {
        let mut producer = Producer::new(GEOMETRY);
        let mut offsets = vec![];
        while let Some(offset) = producer.next_slot_offset() {
            offsets.push(offset);
            producer.commit();
        }
        assert_eq!(offsets.len(), 4, "a full ring stops the producer");
        producer.on_consumed(consumed(1)).unwrap();
        assert_eq!(
            producer.next_slot_offset(),
            Some(CONTROL_LEN),
            "slot 0 is free again"
        );
        assert_eq!(producer.commit(), 5);
    }

    #[test]
    fn a_consumed_count_that_cannot_be_true_is_a_missed_update() {
        let mut producer = Producer::new(GEOMETRY);
        producer.commit();
        producer.commit();
        producer.on_consumed(consumed(2)).unwrap();
        for (word, what) in [
            (consumed(1), "backwards"),
            (consumed(3), "beyond what was written"),
            (consumed(2 + (1 << 32)), "a lap of 2^32 is the same count"),
        ] {
            let outcome = producer.on_consumed(word);
            if what.starts_with("a lap") {
                assert_eq!(outcome, Ok(()), "{what}");
            } else {
                assert!(
                    matches!(outcome, Err(MissedUpdate::Implausible { .. })),
                    "{what}: {outcome:?}"
                );
            }
        }
        assert_eq!(
            producer.on_consumed(u64::MAX),
            Err(MissedUpdate::Corrupt { word: u64::MAX })
        );
        assert_eq!(producer.free_slots(), 4, "nothing changed what it knew");
    }

    #[test]
    fn the_consumer_reads_exactly_what_was_published() {
        let mut consumer = Consumer::new(GEOMETRY);
        assert_eq!(consumer.next_slot_offset(), None);
        assert_eq!(consumer.on_head(head(3)), Ok(3));
        for expected in 1..=3 {
            assert!(consumer.next_slot_offset().is_some());
            assert_eq!(consumer.release(), expected);
        }
        assert_eq!(consumer.next_slot_offset(), None);
    }

    #[test]
    fn a_head_that_cannot_be_true_is_a_missed_update() {
        let mut consumer = Consumer::new(GEOMETRY);
        assert!(consumer.on_head(head(5)).is_err(), "more than a ring ahead");
        consumer.on_head(head(2)).unwrap();
        assert!(
            matches!(
                consumer.on_head(head(1)),
                Err(MissedUpdate::Implausible {
                    count: 1,
                    seen: 2,
                    limit: 4
                })
            ),
            "backwards"
        );
        assert_eq!(
            consumer.on_head(u64::MAX),
            Err(MissedUpdate::Corrupt { word: u64::MAX })
        );
        // What was known before stays ready.
        assert!(consumer.next_slot_offset().is_some());
        assert_eq!(consumer.on_head(head(4)), Ok(4), "a full ring is fine");
    }

    /// Every single-bit flip and every two-bit flip of a word fails its
    /// check, and so do the words lost or dead memory leaves.
    #[test]
    fn a_flipped_index_word_never_passes_its_check() {
        for count in [0u64, 1, 4095, 0xdead_beef, u64::from(u32::MAX)] {
            let word = encode_index(IndexKind::Head, count);
            assert_eq!(decode_index(IndexKind::Head, word), Some(count as u32));
            for first in 0..64 {
                let once = word ^ (1 << first);
                assert_eq!(decode_index(IndexKind::Head, once), None, "bit {first}");
                for second in first + 1..64 {
                    let twice = once ^ (1 << second);
                    assert_eq!(
                        decode_index(IndexKind::Head, twice),
                        None,
                        "bits {first} and {second}"
                    );
                }
            }
        }
        for dead in [0, u64::MAX] {
            for kind in [IndexKind::Head, IndexKind::Consumed, IndexKind::Credit] {
                assert_eq!(decode_index(kind, dead), None, "{dead:#x} as {kind:?}");
            }
        }
    }

    /// The claim behind the format: no error of up to seven bits passes.
    /// The check is affine, so an error that flips data bits `d` passes
    /// only if it also flips exactly the check bits `L(d) = check(d) ^
    /// check(0)`; `L` is a bijection, so every `d` of eight bits or more
    /// already makes eight, and those of up to six are all tried here.
    #[test]
    fn no_error_of_up_to_seven_bits_passes_the_check() {
        fn at_most_six_bits(from: u32, left: u32, d: u32, visit: &mut impl FnMut(u32)) {
            if d != 0 {
                visit(d);
            }
            if left == 0 {
                return;
            }
            for bit in from..32 {
                at_most_six_bits(bit + 1, left - 1, d | 1 << bit, visit);
            }
        }
        let zero = index_check(IndexKind::Head, 0);
        let mut lightest = u32::MAX;
        at_most_six_bits(0, 6, 0, &mut |d| {
            let weight = d.count_ones() + (index_check(IndexKind::Head, d) ^ zero).count_ones();
            lightest = lightest.min(weight);
        });
        assert!(lightest >= 8, "an error of {lightest} bits passes");
    }

    /// A word stored at the wrong index's place fails that index's check.
    #[test]
    fn an_index_word_of_another_kind_fails_the_check() {
        for count in 0..1000 {
            let word = encode_index(IndexKind::Head, count);
            assert_eq!(decode_index(IndexKind::Consumed, word), None);
            assert_eq!(decode_index(IndexKind::Credit, word), None);
        }
    }

    /// A word read while a copy in address order (either direction) was
    /// replacing one whole word with another is the old word, the new one,
    /// or fails its check: never a third count.
    #[test]
    fn a_torn_index_word_is_recognised() {
        for (old, new) in [
            (0u64, 1u64),
            (255, 256),
            (0xffff, 0x1_0000),
            (7, 0xdead_beef),
        ] {
            let (old_word, new_word) = (
                encode_index(IndexKind::Consumed, old).to_le_bytes(),
                encode_index(IndexKind::Consumed, new).to_le_bytes(),
            );
            for placed in 0..=8 {
                for upwards in [true, false] {
                    let mut seen = old_word;
                    let range = if upwards { 0..placed } else { 8 - placed..8 };
                    seen[range.clone()].copy_from_slice(&new_word[range]);
                    let decoded = decode_index(IndexKind::Consumed, u64::from_le_bytes(seen));
                    assert!(
                        decoded.is_none()
                            || decoded == Some(old as u32)
                            || decoded == Some(new as u32),
                        "{old} -> {new}, {placed} bytes placed {}: read {decoded:?}",
                        if upwards { "upwards" } else { "downwards" }
                    );
                }
            }
        }
    }

    /// Counts pass 2^32 without a hitch: the reader extends them.
    #[test]
    fn indices_carry_on_past_two_to_the_32() {
        let mut producer = Producer::new(GEOMETRY);
        let mut consumer = Consumer::new(GEOMETRY);
        producer.written = (1 << 32) - 2;
        producer.consumed = producer.written;
        consumer.head = producer.written;
        consumer.read = producer.written;
        for _ in 0..8 {
            producer.commit();
            consumer.on_head(head(producer.written())).unwrap();
            producer.on_consumed(consumed(consumer.release())).unwrap();
        }
        assert_eq!(consumer.released(), (1 << 32) + 6);
        assert_eq!(producer.free_slots(), 4);
    }

    #[test]
    fn geometries_beyond_the_slot_limit_are_refused() {
        let geometry = Geometry {
            slot_size: 64,
            slot_count: MAX_SLOTS + 1,
        };
        assert!(geometry.validate(usize::MAX).is_err());
        let clamped = Geometry::for_window(1 << 40, 64).unwrap();
        assert_eq!(clamped.slot_count, MAX_SLOTS);
    }

    #[test]
    fn producer_and_consumer_agree_on_every_slot() {
        let mut producer = Producer::new(GEOMETRY);
        let mut consumer = Consumer::new(GEOMETRY);
        for _ in 0..100 {
            let written_at = producer.next_slot_offset().unwrap();
            consumer.on_head(head(producer.commit())).unwrap();
            assert_eq!(consumer.next_slot_offset(), Some(written_at));
            producer.on_consumed(consumed(consumer.release())).unwrap();
        }
    }
}
