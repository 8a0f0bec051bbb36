//! The RDMA link: an engine's packets travel as RDMA WRITE with immediate
//! into the peer's registered receive ring.
//!
//! [`RdmaMedium`] implements [`Medium`] over any [`PacketQueue`] — the few
//! verbs operations the link needs. Two queues implement it: the real
//! verbs queue pair (`verbs_queue`) and an in-process software pair
//! ([`crate::loopback`]) with injected faults, so the whole link runs in
//! tests on any host.
//!
//! # Layout of a receive region (registered by its owner, written by its peer)
//! ```text
//!  0                 CONTROL_LEN                 CONTROL_LEN + slots·slot_size
//!  ├─ credit word ──┬─ slot 0 ─┬─ slot 1 ─┬ … ┬─ slot N-1 ─┤
//!  │ u64 at 0: how  │ packet   │          │   │            │
//!  │ many of OUR    │ written  │          │   │            │
//!  │ packets the    │ by the   │          │   │            │
//!  │ peer consumed  │ peer     │          │   │            │
//! ```
//! The sender writes its `k`-th packet (from its own registered staging
//! slot `k % N`) into the peer's slot `k % N` with RDMA WRITE WITH IMM,
//! `imm = k mod 2³²`. The receiver learns of it from the receive
//! completion, never by looking at memory: RDMA does not order the
//! placement of a write's bytes, the completion is what makes them
//! visible. It checks the completion (`imm` must be the next count, the
//! length must fit a slot), hands the slot to the engine, reposts a
//! zero-length receive, and from time to time writes how many packets it
//! has consumed into the sender's credit word (an 8-byte RDMA WRITE,
//! inline where the device allows; see [`encode_credit`] for its format),
//! and again every millisecond even when the count has not moved, so that
//! a credit write that was lost or corrupted (a missed update, counted in
//! [`IndexStats`], never acted on) costs the sender at most that.
//! The sender may have at most `N`
//! packets unconsumed; a staging slot is reused only after the peer
//! consumed the packet written from it, which implies the write that read
//! it completed.
//!
//! A packet whose payload lies in [`SendMemory`](crate::SendMemory) goes
//! out in place where the queue can read it there: only the header is
//! written into the staging slot, and the write gathers the payload from
//! the program's memory, which the write holds until it completes (a
//! resend can still be queued when the first copy is acknowledged).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;

use barlink_transport::engine::{Engine, EngineConfig, Transmit};
use barlink_transport::link::{
    IndexStats, Intake, Link, Medium, MediumError, RepeatTimer, SetupError,
};
use barlink_transport::ring::{IndexKind, advance_index, decode_index, encode_index};
use barlink_transport::time::Time;
use barlink_transport::window::{Window, WindowError};
use barlink_transport::wire::HEADER_LEN;

use crate::verbs::Sge;
use crate::verbs::send_memory::Hold;
pub use crate::wc_status::WcStatus;

/// Bytes before the first slot of a receive region: the credit word (u64
/// at offset 0, written by the peer) in a cache line of its own.
pub const CONTROL_LEN: usize = 64;
/// Offset of the credit word in a receive region.
pub const CREDIT_OFFSET: usize = 0;
/// Slot sizes are multiples of a cache line.
pub const SLOT_ALIGN: usize = 64;
/// Most slots a ring may have (the hello refuses more).
pub const MAX_SLOTS: u32 = 1 << 16;
/// Payloads shorter than this are copied into the staging slot even when
/// they lie in send memory: a copy of a few cache lines costs less than
/// the adapter's second read (a gather entry of its own) for them.
pub const IN_PLACE_FROM: usize = 4096;

/// The credit word as the receiver writes it: the consumed count modulo
/// 2³² and a CRC-32C of it, the ring's index word format
/// ([`encode_index`] with [`IndexKind::Credit`]).
///
/// Why checked: the word is placed by the peer's adapter, and nothing
/// guarantees that an 8-byte RDMA WRITE lands in one piece — soft-RoCE
/// copies it with the kernel's `memcpy` (byte by byte under emulation),
/// and a device may split it — nor that it lands intact on a flaky path.
/// A load that races the placement can see some bytes of the old count and
/// some of the new; such a word, like a corrupted one, fails its check, and
/// the sender keeps its last credit until a good word is there. 32 bits
/// suffice: at most [`MAX_SLOTS`] packets are ever unconsumed, so the
/// sender extends the count from what it knew.
pub fn encode_credit(consumed: u64) -> u64 {
    encode_index(IndexKind::Credit, consumed)
}

/// The consumed count (modulo 2³²) in a credit word, or `None` when it
/// fails its check: a word read while the adapter was still placing it, or
/// garbage. See [`encode_credit`].
pub fn decode_credit(word: u64) -> Option<u32> {
    decode_index(IndexKind::Credit, word)
}

/// The shape of a receive ring: `slots` slots of `slot_size` bytes after
/// [`CONTROL_LEN`] bytes of control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    /// Number of slots (2..=[`MAX_SLOTS`]).
    pub slots: u32,
    /// Bytes per slot: a multiple of [`SLOT_ALIGN`] that holds a whole
    /// packet, header included.
    pub slot_size: u32,
}

impl RingShape {
    /// A ring of `slots` slots for packets of up to `mtu` bytes (the
    /// engine's MTU, header included).
    pub fn for_mtu(slots: u32, mtu: usize) -> Result<RingShape, LinkSetupError> {
        let slot_size = mtu.max(HEADER_LEN).div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let shape = RingShape {
            slots,
            slot_size: u32::try_from(slot_size).map_err(|_| LinkSetupError::Shape {
                detail: format!("slot size {slot_size} does not fit in 32 bits"),
            })?,
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Checks the shape (one read from a peer's hello is untrusted).
    pub fn validate(&self) -> Result<(), LinkSetupError> {
        if !(2..=MAX_SLOTS).contains(&self.slots) {
            return Err(LinkSetupError::Shape {
                detail: format!("{} slots (need 2..={MAX_SLOTS})", self.slots),
            });
        }
        let size = self.slot_size as usize;
        if size < HEADER_LEN || !size.is_multiple_of(SLOT_ALIGN) {
            return Err(LinkSetupError::Shape {
                detail: format!(
                    "slot size {size} (need a multiple of {SLOT_ALIGN} of at least {HEADER_LEN})"
                ),
            });
        }
        Ok(())
    }

    /// Bytes of the whole receive region: control block and slots.
    pub fn region_len(&self) -> usize {
        CONTROL_LEN + self.slots_len()
    }

    /// Bytes of the slots alone (the size of a staging area for this ring).
    pub fn slots_len(&self) -> usize {
        self.slots as usize * self.slot_size as usize
    }

    /// Offset of slot `index % slots` in the receive region.
    pub fn slot_offset(&self, count: u64) -> usize {
        CONTROL_LEN + self.staging_offset(count)
    }

    /// Offset of staging slot `count % slots` in a staging area.
    pub fn staging_offset(&self, count: u64) -> usize {
        (count % u64::from(self.slots)) as usize * self.slot_size as usize
    }
}

/// One work completion, as the link needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id (send side: the link's running WR count).
    pub wr_id: u64,
    /// Whether it succeeded.
    pub status: WcStatus,
    /// The adapter's vendor error code (diagnostics only).
    pub vendor_err: u32,
    /// Receive side: bytes the peer's write placed.
    pub byte_len: u32,
    /// Receive side: the immediate data, if the completion carries one.
    pub imm: Option<u32>,
}

/// A failure of a queue operation itself (posting, polling), not of a
/// work request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueError {
    /// Posting a work request failed.
    Post {
        operation: &'static str,
        detail: String,
    },
    /// Polling a completion queue failed.
    Poll { queue: &'static str, detail: String },
    /// A registered region could not be accessed.
    Window(WindowError),
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::Post { operation, detail } => write!(f, "posting {operation}: {detail}"),
            QueueError::Poll { queue, detail } => {
                write!(f, "polling the {queue} completion queue: {detail}")
            }
            QueueError::Window(error) => write!(f, "registered memory: {error}"),
        }
    }
}

impl std::error::Error for QueueError {}

impl From<WindowError> for QueueError {
    fn from(error: WindowError) -> Self {
        QueueError::Window(error)
    }
}

/// The verbs operations an RDMA link needs, over one connected reliable
/// queue pair whose peer's ring address and keys are known.
///
/// Offsets are relative to the regions: `local_offset` into
/// [`PacketQueue::staging`], `remote_offset` into the peer's receive
/// region (the implementation adds the peer's address and rkey).
pub trait PacketQueue {
    /// A registered memory region, reached only through [`Window`]
    /// accessors (the adapter may write it at any time).
    type Region: Window;

    /// This side's receive region: credit word and slots that the peer
    /// writes. Read only through the window's accessors.
    fn receive_region(&self) -> &Self::Region;

    /// This side's staging area: where a packet is put together before
    /// the adapter reads it for an RDMA WRITE.
    fn staging(&self) -> &Self::Region;

    /// Most work requests that may be outstanding on the send queue.
    fn send_queue_depth(&self) -> usize;

    /// Posts RDMA WRITE WITH IMM of `len` bytes at `local_offset` of the
    /// staging area to `remote_offset` of the peer's receive region.
    /// Unsignaled unless `signaled`.
    fn post_write_imm(
        &mut self,
        wr_id: u64,
        local_offset: usize,
        len: usize,
        remote_offset: usize,
        imm: u32,
        signaled: bool,
    ) -> Result<(), QueueError>;

    /// Where the adapter can read `payload` in place: it lies in
    /// [`SendMemory`](crate::SendMemory) that this queue's device has
    /// registered (or registers now). `None`, the default: it is copied
    /// into the staging area.
    fn in_place(&self, _payload: &[u8]) -> Option<InPlace> {
        None
    }

    /// Posts `write` (RDMA WRITE WITH IMM) of `header_len` bytes of the
    /// staging area followed by `payload`, read in place through `source`
    /// (what [`PacketQueue::in_place`] returned for it). `payload` stays
    /// unchanged until the request completes.
    fn post_write_imm_in_place(
        &mut self,
        _write: PacketWrite,
        _header_len: usize,
        _payload: &[u8],
        _source: InPlace,
    ) -> Result<(), QueueError> {
        Err(QueueError::Post {
            operation: "an RDMA WRITE WITH IMM in place",
            detail: "this queue sends from its staging area only".to_string(),
        })
    }

    /// Posts an RDMA WRITE of `value` (8 bytes, little-endian; already in
    /// the format of [`encode_credit`]) into the peer's credit word.
    /// Unsignaled unless `signaled`. The bytes must be captured by the time
    /// this returns (inline data, or a source that stays unchanged until the
    /// request completes).
    fn post_credit(&mut self, wr_id: u64, value: u64, signaled: bool) -> Result<(), QueueError>;

    /// Posts `count` zero-length receives (each consumed by one write with
    /// immediate from the peer).
    fn post_recvs(&mut self, count: usize) -> Result<(), QueueError>;

    /// Appends the send queue's completions (signaled work requests, and
    /// failed ones) to `out`.
    fn poll_send(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError>;

    /// Appends the receive queue's completions to `out`, in order.
    fn poll_recv(&mut self, out: &mut VecDeque<Completion>) -> Result<(), QueueError>;
}

/// One packet's RDMA WRITE WITH IMM: the request's id, where its bytes
/// start in the staging area and land in the peer's receive region, its
/// immediate (the packet's count), and whether it is signaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketWrite {
    pub wr_id: u64,
    pub local_offset: usize,
    pub remote_offset: usize,
    pub imm: u32,
    pub signaled: bool,
}

/// A payload the adapter reads in place, from [`PacketQueue::in_place`]:
/// the gather entry naming it, and what the write that names it holds
/// until it completes (the memory and its registration).
#[derive(Debug, Default)]
pub struct InPlace {
    pub(crate) sge: Option<Sge>,
    pub(crate) hold: Option<Hold>,
}

/// Why a link could not be put together.
#[derive(Debug)]
#[non_exhaustive]
pub enum LinkSetupError {
    /// The engine refused its configuration, or the medium.
    Link(SetupError),
    /// A ring shape is unusable.
    Shape { detail: String },
    /// A region is smaller than its ring.
    RegionTooSmall {
        region: &'static str,
        len: usize,
        needed: usize,
    },
    /// The peer's slots cannot hold this side's packets.
    SlotsTooSmall { slot_size: u32, mtu: usize },
    /// Posting the first receives failed.
    Queue(QueueError),
}

impl fmt::Display for LinkSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkSetupError::Shape { detail } => write!(f, "unusable ring: {detail}"),
            LinkSetupError::RegionTooSmall {
                region,
                len,
                needed,
            } => write!(
                f,
                "the {region} region has {len} bytes but the ring needs {needed}"
            ),
            LinkSetupError::SlotsTooSmall { slot_size, mtu } => write!(
                f,
                "the peer's slots hold {slot_size} bytes but this side's MTU is {mtu}: use the same MTU on both sides"
            ),
            LinkSetupError::Queue(error) => error.fmt(f),
            LinkSetupError::Link(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LinkSetupError {}

impl From<SetupError> for LinkSetupError {
    fn from(error: SetupError) -> Self {
        LinkSetupError::Link(error)
    }
}

/// An engine whose packets travel as RDMA WRITE WITH IMM: the whole
/// message API of [`Link`] (`send`, `send_blocking`, `recv`, `try_recv`,
/// `flush`, `close`, `progress`) over a [`PacketQueue`].
pub type RdmaLink<Q, B = Vec<u8>> = Link<RdmaMedium<Q>, B>;

/// Binds an engine to a connected queue: `local` is this side's receive
/// ring, `remote` the peer's (from its hello), `epoch` this side's session
/// (+1 per restart). For message buffers other than `Vec<u8>`, bind an
/// [`RdmaMedium`] with [`Link::with_medium`].
pub fn rdma_link<Q: PacketQueue, B: AsRef<[u8]>>(
    queue: Q,
    local: RingShape,
    remote: RingShape,
    config: EngineConfig,
    epoch: u32,
) -> Result<RdmaLink<Q, B>, LinkSetupError> {
    let medium = RdmaMedium::new(queue, local, remote, config.mtu)?;
    Ok(Link::with_medium(medium, config, epoch)?)
}

/// What the medium itself did, beside the engine's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaStats {
    /// RDMA WRITE WITH IMM posted (one per packet).
    pub writes_posted: u64,
    /// Of those, writes whose payload the adapter read in place from send
    /// memory (nothing copied into the staging area).
    pub writes_in_place: u64,
    /// Payload bytes the adapter read in place.
    pub bytes_in_place: u64,
    /// Credit writes posted.
    pub credit_writes: u64,
    /// Receive completions taken (one per packet that arrived).
    pub recv_completions: u64,
    /// Send completions taken.
    pub send_completions: u64,
    /// Packets whose write placed fewer bytes than a header.
    pub short_writes: u64,
    /// Rounds in which the sender had a packet but the peer's ring was full.
    pub ring_full: u64,
    /// Rounds in which the sender had a packet but the send queue was full.
    pub send_queue_full: u64,
    /// Credit words not acted on (failing their check: half placed or
    /// corrupted; or implausible), and this side's repeated credit writes.
    pub index: IndexStats,
}

/// The RDMA medium: packets as RDMA WRITE WITH IMM into the peer's ring,
/// arrivals from receive completions, credit from the peer's RDMA WRITE
/// of its consumed count.
#[derive(Debug)]
pub struct RdmaMedium<Q: PacketQueue> {
    queue: Q,
    /// This side's receive ring.
    local: RingShape,
    /// The peer's receive ring (and the shape of this side's staging).
    remote: RingShape,
    /// Receive completions taken but not handed to the engine yet.
    pending: VecDeque<Completion>,
    send_completions: Vec<Completion>,
    /// Packets handed to the engine (= consumed slots of the own ring).
    received: u64,
    /// The consumed count last written to the peer.
    credit_sent: u64,
    /// Consumed slots after which a credit write goes out regardless.
    credit_every: u64,
    /// Packets written into the peer's ring.
    sent: u64,
    /// The peer's consumed count of those, as last read.
    credit: u64,
    /// The credit word last decided on (each is checked once).
    credit_word_applied: u64,
    /// When the consumed count is next written again, moved or not.
    credit_repeat: RepeatTimer,
    /// Work requests posted on the send queue.
    wr_posted: u64,
    /// Work requests known complete (through the last signaled one seen).
    wr_done: u64,
    /// Every `signal_every`-th work request is signaled.
    signal_every: u64,
    sq_depth: u64,
    stats: RdmaStats,
}

impl<Q: PacketQueue> RdmaMedium<Q> {
    /// Binds a connected queue: `local` is the shape of this side's
    /// receive region, `remote` the peer's (from its hello). Posts one
    /// receive per local slot. `mtu` is the engine's.
    pub fn new(
        mut queue: Q,
        local: RingShape,
        remote: RingShape,
        mtu: usize,
    ) -> Result<Self, LinkSetupError> {
        local.validate()?;
        remote.validate()?;
        if (remote.slot_size as usize) < mtu {
            return Err(LinkSetupError::SlotsTooSmall {
                slot_size: remote.slot_size,
                mtu,
            });
        }
        for (region, len, needed) in [
            ("receive", queue.receive_region().len(), local.region_len()),
            ("staging", queue.staging().len(), remote.slots_len()),
        ] {
            if len < needed {
                return Err(LinkSetupError::RegionTooSmall {
                    region,
                    len,
                    needed,
                });
            }
        }
        let sq_depth = queue.send_queue_depth() as u64;
        if sq_depth < 4 {
            return Err(LinkSetupError::Shape {
                detail: format!("send queue depth {sq_depth} (need at least 4)"),
            });
        }
        queue
            .post_recvs(local.slots as usize)
            .map_err(LinkSetupError::Queue)?;
        // The peer writes the credit word only after packets of ours
        // arrived, so it is still ours to lay out: a zero that passes its
        // check, not raw zeroes that would read as a corrupt word.
        queue
            .receive_region()
            .store_u64(CREDIT_OFFSET, encode_credit(0), Ordering::Release)
            .map_err(|e| LinkSetupError::Queue(QueueError::Window(e)))?;
        Ok(RdmaMedium {
            queue,
            local,
            remote,
            pending: VecDeque::with_capacity(local.slots as usize),
            send_completions: Vec::new(),
            received: 0,
            credit_sent: 0,
            credit_every: u64::from(local.slots / 4).max(1),
            sent: 0,
            credit: 0,
            credit_word_applied: encode_credit(0),
            credit_repeat: RepeatTimer::default(),
            wr_posted: 0,
            wr_done: 0,
            // Every ((depth - 1) / 4)-th request is signaled, so among the at
            // most depth - 1 data writes (or depth requests) outstanding at
            // least one is: a full send queue always has a completion coming.
            signal_every: ((sq_depth - 1) / 4).max(1),
            sq_depth,
            stats: RdmaStats::default(),
        })
    }

    /// The queue (for diagnostics).
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// The medium's counters.
    pub fn stats(&self) -> &RdmaStats {
        &self.stats
    }

    /// (own ring, peer's ring).
    pub fn shapes(&self) -> (RingShape, RingShape) {
        (self.local, self.remote)
    }

    /// Takes every completion that is there: receive completions are
    /// queued (a receive reposted for each), send completions advance the
    /// count of finished work requests; a failed one ends the link.
    fn reap(&mut self) -> Result<(), MediumError> {
        let before = self.pending.len();
        self.queue
            .poll_recv(&mut self.pending)
            .map_err(MediumError::new)?;
        let arrived = self.pending.len() - before;
        if arrived > 0 {
            self.stats.recv_completions += arrived as u64;
            // A receive is consumed per arrival: give it back at once, so
            // the peer's next write (allowed by credit) finds one.
            self.queue.post_recvs(arrived).map_err(MediumError::new)?;
        }
        self.send_completions.clear();
        self.queue
            .poll_send(&mut self.send_completions)
            .map_err(MediumError::new)?;
        for completion in &self.send_completions {
            self.stats.send_completions += 1;
            if completion.status != WcStatus::Success {
                return Err(MediumError::new(format_args!(
                    "RDMA write {} to the peer failed: {} (vendor error {:#x}): {}",
                    completion.wr_id,
                    completion.status.name(),
                    completion.vendor_err,
                    completion.status.what_to_check()
                )));
            }
            if completion.wr_id >= self.wr_posted {
                return Err(MediumError::new(format_args!(
                    "a send completion names work request {} but only {} were posted: the adapter or its driver is broken",
                    completion.wr_id, self.wr_posted
                )));
            }
            // Requests complete in order: this one and all before it are done.
            self.wr_done = self.wr_done.max(completion.wr_id + 1);
        }
        Ok(())
    }

    /// Reads the peer's consumed count from the credit word and checks it,
    /// once per word: one that fails its check (half placed, or corrupted)
    /// or whose count is behind the last credit or beyond the packets sent
    /// is a missed update — counted, and the last credit stands until the
    /// peer's next (or repeated) write.
    fn read_credit(&mut self) -> Result<u64, MediumError> {
        let word = self
            .queue
            .receive_region()
            .load_u64(CREDIT_OFFSET, Ordering::Acquire)
            .map_err(|e| MediumError::new(format_args!("reading the credit word: {e}")))?;
        if word == self.credit_word_applied {
            return Ok(self.credit);
        }
        self.credit_word_applied = word;
        let room = self.sent - self.credit;
        match advance_index(IndexKind::Credit, word, self.credit, room) {
            Ok(credit) => self.credit = credit,
            Err(miss) => self.stats.index.record(&miss),
        }
        Ok(self.credit)
    }

    /// Writes the consumed count again if the interval is up, whether or
    /// not it moved: a credit write of ours the peer missed is repaired by
    /// this.
    fn republish_credit_if_due(
        &mut self,
        now: Time,
        heartbeat: std::time::Duration,
    ) -> Result<(), MediumError> {
        if self.credit_repeat.due(now, heartbeat) && self.credit_room() {
            self.post_credit()?;
            self.stats.index.republished += 1;
        }
        Ok(())
    }

    fn post_credit(&mut self) -> Result<(), MediumError> {
        let wr_id = self.wr_posted;
        let signaled = wr_id % self.signal_every == self.signal_every - 1;
        self.queue
            .post_credit(wr_id, encode_credit(self.received), signaled)
            .map_err(MediumError::new)?;
        self.wr_posted += 1;
        self.credit_sent = self.received;
        self.stats.credit_writes += 1;
        Ok(())
    }

    /// Whether the send queue has room for one more data write, keeping
    /// one place for a credit write.
    fn send_queue_room(&self) -> bool {
        self.wr_posted - self.wr_done < self.sq_depth - 1
    }

    /// Whether the send queue has room for a credit write.
    fn credit_room(&self) -> bool {
        self.wr_posted - self.wr_done < self.sq_depth
    }
}

fn staging_error(error: WindowError) -> MediumError {
    MediumError::new(format_args!("writing a staging slot: {error}"))
}

/// A packet put together in its staging slot (payload copied and
/// checksummed in one pass, header last) and written from there.
fn write_copied<Q: PacketQueue>(
    queue: &mut Q,
    transmit: &Transmit<'_>,
    write: PacketWrite,
) -> Result<(), MediumError> {
    let staging = queue.staging();
    let payload_at = write.local_offset + HEADER_LEN;
    let crc = if transmit.has_crc() {
        let mut crc = transmit.crc_of_header();
        staging
            .write_crc(payload_at, transmit.payload(), &mut crc)
            .map_err(staging_error)?;
        crc.finish()
    } else {
        staging
            .write(payload_at, transmit.payload())
            .map_err(staging_error)?;
        0
    };
    staging
        .write(write.local_offset, &transmit.header_with_crc(crc))
        .map_err(staging_error)?;
    queue
        .post_write_imm(
            write.wr_id,
            write.local_offset,
            transmit.len(),
            write.remote_offset,
            write.imm,
            write.signaled,
        )
        .map_err(MediumError::new)
}

/// A packet whose payload the adapter reads in place: the payload is read
/// once, for its CRC, only the header goes into the staging slot, and the
/// write gathers the two. Its payload's length, for the counters.
fn write_in_place<Q: PacketQueue>(
    queue: &mut Q,
    transmit: &Transmit<'_>,
    write: PacketWrite,
    source: InPlace,
) -> Result<Option<usize>, MediumError> {
    let payload = transmit.payload();
    let crc = transmit.has_crc().then(|| {
        let mut crc = transmit.crc_of_header();
        crc.update(payload);
        crc.finish()
    });
    queue
        .staging()
        .write(
            write.local_offset,
            &transmit.header_with_crc(crc.unwrap_or(0)),
        )
        .map_err(staging_error)?;
    // Signaled: its completion lets go of the program's memory
    // (`SendMemory::in_flight`) at once, not a few writes later.
    let write = PacketWrite {
        signaled: true,
        ..write
    };
    queue
        .post_write_imm_in_place(write, HEADER_LEN, payload, source)
        .map_err(MediumError::new)?;
    Ok(Some(payload.len()))
}

impl<Q: PacketQueue> Medium for RdmaMedium<Q> {
    fn activity(&mut self) -> Result<[u64; 2], MediumError> {
        self.reap()?;
        let credit = self.read_credit()?;
        Ok([
            self.stats.recv_completions,
            credit.wrapping_add(self.wr_done),
        ])
    }

    fn receive<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
        _intake: Intake,
    ) -> Result<usize, MediumError> {
        // Everything that completed is handed over, whatever `_intake`
        // asks. Stopping at a message would work here too (the rest stay
        // queued for the next round), but RDMA runs only in the guest,
        // where its speed cannot be measured.
        self.reap()?;
        let mut handled = 0;
        let slot_size = self.local.slot_size as usize;
        while let Some(completion) = self.pending.pop_front() {
            if completion.status != WcStatus::Success {
                return Err(MediumError::new(format_args!(
                    "a receive failed: {} (vendor error {:#x}): {}",
                    completion.status.name(),
                    completion.vendor_err,
                    completion.status.what_to_check()
                )));
            }
            // The immediate and the length come from the peer: checked
            // before they are used.
            let expected = self.received as u32;
            match completion.imm {
                Some(imm) if imm == expected => {}
                Some(imm) => {
                    return Err(MediumError::new(format_args!(
                        "a write arrived as packet {imm} where packet {expected} was due: the peer broke the ring protocol (or is not a barlink link)"
                    )));
                }
                None => {
                    return Err(MediumError::new(
                        "a receive completed without immediate data: the peer sends something other than RDMA WRITE WITH IMM",
                    ));
                }
            }
            let len = completion.byte_len as usize;
            if len > slot_size {
                return Err(MediumError::new(format_args!(
                    "the peer wrote {len} bytes into a {slot_size}-byte slot: the peer broke the ring protocol"
                )));
            }
            let slot = self.local.slot_offset(self.received);
            let region = self.queue.receive_region();
            let mut header = [0u8; HEADER_LEN];
            let header_len = len.min(HEADER_LEN);
            if header_len < HEADER_LEN {
                self.stats.short_writes += 1;
            }
            region
                .read(slot, &mut header[..header_len])
                .map_err(|e| MediumError::new(format_args!("reading a slot: {e}")))?;
            // The payload goes from the slot straight into its message,
            // with its CRC; the header's lengths are checked by the engine
            // against what the write placed. Rejected packets are counted
            // by the engine (and NAKed).
            let room = len - header_len;
            let _verdict = engine
                .handle_packet_from(
                    now,
                    &header[..header_len],
                    room,
                    |offset, dst, crc, _message_len| {
                        let at = slot + HEADER_LEN + offset;
                        match crc {
                            Some(crc) => region.read_crc(at, dst, crc),
                            None => region.read(at, dst),
                        }
                    },
                )
                .map_err(|e| MediumError::new(format_args!("reading a slot: {e}")))?;
            self.received += 1;
            handled += 1;
            if self.received - self.credit_sent >= self.credit_every && self.credit_room() {
                self.post_credit()?;
            }
        }
        // Idle: report what was consumed since the last credit write, so a
        // sender waiting for room does not wait for a quarter ring.
        if handled == 0 && self.received > self.credit_sent && self.credit_room() {
            self.post_credit()?;
        }
        Ok(handled)
    }

    fn transmit<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        self.reap()?;
        let credit = self.read_credit()?;
        self.republish_credit_if_due(now, engine.config().heartbeat_interval)?;
        let slots = u64::from(self.remote.slots);
        let mut count = 0;
        loop {
            if self.sent - credit >= slots {
                if engine.wants_transmit(now) {
                    self.stats.ring_full += 1;
                }
                break;
            }
            if !self.send_queue_room() {
                if engine.wants_transmit(now) {
                    self.stats.send_queue_full += 1;
                }
                break;
            }
            let write = PacketWrite {
                wr_id: self.wr_posted,
                local_offset: self.remote.staging_offset(self.sent),
                remote_offset: self.remote.slot_offset(self.sent),
                imm: self.sent as u32,
                signaled: self.wr_posted % self.signal_every == self.signal_every - 1,
            };
            let queue = &mut self.queue;
            let written = engine.poll_transmit_with(now, |transmit| {
                let payload = transmit.payload();
                match (payload.len() >= IN_PLACE_FROM)
                    .then(|| queue.in_place(payload))
                    .flatten()
                {
                    Some(source) => write_in_place(queue, transmit, write, source),
                    None => write_copied(queue, transmit, write).map(|()| None),
                }
            });
            match written {
                None => break,
                Some(Err(error)) => return Err(error),
                Some(Ok(None)) => {}
                Some(Ok(Some(in_place))) => {
                    self.stats.writes_in_place += 1;
                    self.stats.bytes_in_place += in_place as u64;
                }
            }
            self.wr_posted += 1;
            self.sent += 1;
            self.stats.writes_posted += 1;
            count += 1;
        }
        Ok(count)
    }

    fn max_packet(&self) -> usize {
        self.remote.slot_size as usize
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.credit_repeat.deadline()
    }

    fn index_stats(&self) -> IndexStats {
        self.stats.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a load sees while an adapter copies `new` over `old` byte by
    /// byte in address order (up or down), stopped after `placed` bytes.
    fn torn(old: u64, new: u64, placed: usize, upwards: bool) -> u64 {
        let (old, new) = (old.to_le_bytes(), new.to_le_bytes());
        let mut seen = old;
        for i in 0..placed {
            let at = if upwards { i } else { 7 - i };
            seen[at] = new[at];
        }
        u64::from_le_bytes(seen)
    }

    #[test]
    fn a_credit_word_torn_by_an_ordered_copy_is_recognised() {
        let counts = [
            0u64,
            1,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xff_ffff,
            0xffff_ffff,
            0x1_0000_0000,
            0x1_2345_6789,
        ];
        for &old in &counts {
            for step in [1u64, 2, 255, 256, 65_536] {
                let new = old + step;
                let (w_old, w_new) = (encode_credit(old), encode_credit(new));
                assert_eq!(decode_credit(w_old), Some(old as u32));
                assert_eq!(decode_credit(w_new), Some(new as u32));
                for placed in 0..=8 {
                    for upwards in [true, false] {
                        let seen = torn(w_old, w_new, placed, upwards);
                        // Either a whole value (the old or the new one) or
                        // recognisably torn: never a third count.
                        match decode_credit(seen) {
                            None => {}
                            Some(c) => assert!(
                                c == old as u32 || c == new as u32,
                                "{old:#x} -> {new:#x}, {placed} bytes placed \
                                 (upwards {upwards}): read as {c:#x}"
                            ),
                        }
                    }
                }
            }
        }
    }
}
