//! Message buffers as the engine holds them: copies barlink owns, or ranges
//! of caller memory registered for zero copy.
//!
//! The engine keeps a message's buffer (`B: AsRef<[u8]>`) until the peer
//! acknowledged it or the link ended, and reads every fragment and every
//! retransmission from it. For a registered range, `B` is a pointer into the
//! caller's memory: the payload goes from there straight into the peer's
//! ring. The link hands each payload back once the engine is done with it
//! (`Link::keep_sent_buffers`): a copy goes back to the spares, and
//! dropping any other is the moment barlink stops reading that memory;
//! for a registered range, the completion reported afterwards is the
//! caller's permission to reuse it.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use barlink::rdma::SendMemory;
use barlink_transport::MessageId;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};
use crate::types::barlink_status::{
    BARLINK_BUSY, BARLINK_INVALID_HANDLE, BARLINK_NOT_AVAILABLE, BARLINK_OUT_OF_MEMORY,
};

/// Caller memory registered with `barlink_register_buffer`, or a dma-buf
/// range registered with `barlink_register_dmabuf`.
pub(crate) struct Region {
    ptr: *const u8,
    len: usize,
    /// `ptr..ptr+len` is a dma-buf's CPU mapping (`RegionState::dmabuf`).
    from_dmabuf: bool,
    state: Mutex<RegionState>,
}

#[derive(Debug, Default)]
struct RegionState {
    /// Sends posted from this region whose payload barlink still holds.
    in_flight: u64,
    /// Deregistered: no new sends.
    dead: bool,
    /// What lets RDMA links read the region in place; dropped (and the
    /// devices' registrations with it) on deregistration. Shared only with
    /// a registration in progress, which deregistration waits for.
    send_memory: Option<Arc<SendMemory>>,
    /// `barlink_link_register_buffer` calls registering it with a device
    /// now, outside this lock: deregistration is refused meanwhile.
    registering: u32,
    /// The dma-buf whose CPU mapping `ptr..ptr+len` is: unmapped at
    /// deregistration, or after it once the last CPU read open then ends
    /// (no payload from the region is left by then). Declared after the
    /// send memory, so that a region dropped whole lets that go first.
    dmabuf: Option<Arc<DmaBuf>>,
}

// SAFETY: `Region` stores the caller's address and length (or, in its
// state, the mapping of a dma-buf, `DmaBuf`, itself `Send`); it reads the memory only
// through `Payload::as_ref`, under the contract of `barlink_register_buffer`
// or `barlink_register_dmabuf` (valid and unchanged while sends are in
// flight), which does not depend on the thread. The state is behind a
// mutex.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: shared access only reads the immutable address and
// length or locks the mutex.
unsafe impl Sync for Region {}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Region {
    /// Wraps a caller's range. The caller (the extern function) has checked
    /// that `ptr` is non-null and `ptr + len` does not overflow.
    pub(crate) fn new(ptr: *const u8, len: usize) -> Region {
        // SAFETY: the contract of `barlink_register_buffer`: the memory
        // stays valid until deregistration succeeded, which is refused while
        // a send from it is in flight (until its payload is dropped, after
        // the peer acknowledged it, so after the write that read it), and
        // is not modified while a send of it is in flight. The registration
        // is dropped at deregistration (`retire`).
        let send_memory = unsafe { SendMemory::register_raw(ptr, len) }
            .ok()
            .map(Arc::new);
        Region {
            ptr,
            len,
            from_dmabuf: false,
            state: Mutex::new(RegionState {
                send_memory,
                ..RegionState::default()
            }),
        }
    }

    /// Wraps a dma-buf range mapped for the CPU.
    pub(crate) fn dmabuf(dmabuf: DmaBuf) -> Region {
        let send_memory = dmabuf.send_memory().map(Arc::new);
        Region {
            ptr: dmabuf.as_ptr(),
            len: dmabuf.len(),
            from_dmabuf: true,
            state: Mutex::new(RegionState {
                send_memory,
                dmabuf: Some(Arc::new(dmabuf)),
                ..RegionState::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RegionState> {
        // Counting cannot leave the state half-updated: ignore poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `register` on what lets RDMA links read the region in place,
    /// outside the region's lock (a device may take milliseconds to pin a
    /// large buffer, and sends from it must not wait for that);
    /// `BARLINK_INVALID_HANDLE` once it was deregistered.
    pub(crate) fn with_send_memory(
        &self,
        register: impl FnOnce(&SendMemory) -> Result<()>,
    ) -> Result<()> {
        let memory = {
            let mut state = self.state();
            if state.dead {
                return Err(Error::new(
                    BARLINK_INVALID_HANDLE,
                    "the buffer was deregistered meanwhile",
                ));
            }
            let Some(memory) = state.send_memory.clone() else {
                return Err(Error::new(
                    BARLINK_NOT_AVAILABLE,
                    "barlink could not offer this buffer to RDMA devices (a dma-buf whose descriptor could not be duplicated: too many open files?); sends from it copy through the staging area",
                ));
            };
            state.registering += 1;
            memory
        };
        /// Lets the send memory go, then ends the registration's count
        /// (also when it unwinds): a deregistration that finds the count at
        /// zero drops the last reference.
        struct Registering<'a> {
            region: &'a Region,
            memory: Option<Arc<SendMemory>>,
        }
        impl Drop for Registering<'_> {
            fn drop(&mut self) {
                self.memory = None;
                self.region.state().registering -= 1;
            }
        }
        let registering = Registering {
            region: self,
            memory: Some(memory),
        };
        register(registering.memory.as_deref().expect("set just above"))
    }

    /// Refuses deregistration while sends from it are in flight; otherwise
    /// marks it dead so that no new send starts from it.
    pub(crate) fn retire(&self) -> Result<Option<Arc<DmaBuf>>> {
        let mut state = self.state();
        if state.in_flight > 0 {
            return Err(Error::new(
                BARLINK_BUSY,
                format!(
                    "{} send(s) from this buffer are still in flight: wait for their completions (barlink_poll) first",
                    state.in_flight
                ),
            ));
        }
        // The engine lets go of a payload when its message is acknowledged,
        // but an RDMA resend of it may still be queued, and a closing link's
        // queue pair goes after its engine: the NIC reads until those end.
        if state.registering > 0 {
            return Err(Error::new(
                BARLINK_BUSY,
                "the buffer is being registered with a link's device (barlink_link_register_buffer on another thread): try again once that call returned",
            ));
        }
        let writes = state
            .send_memory
            .as_deref()
            .map_or(0, SendMemory::in_flight);
        if writes > 0 {
            return Err(Error::new(
                BARLINK_BUSY,
                format!(
                    "the NIC may still read this buffer ({writes} RDMA write(s) from it not complete): drive the link (barlink_poll) or close it, then deregister again"
                ),
            ));
        }
        state.dead = true;
        state.send_memory = None;
        // Unmapped by the caller now (outside the registry's lock), not
        // when the last reference to the region goes: threads keep the
        // regions they looked up lately.
        Ok(state.dmabuf.take())
    }

    /// A payload reading `len` bytes at `offset` of the region, counted as
    /// in flight until dropped.
    pub(crate) fn payload(
        self: &Arc<Region>,
        offset: usize,
        len: usize,
        read: Option<CpuRead>,
    ) -> Result<Payload> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len);
        if end.is_none() {
            return Err(Error::invalid(format!(
                "the range of {len} bytes at offset {offset} lies outside the registered buffer of {} bytes",
                self.len
            )));
        }
        let mut state = self.state();
        if state.dead {
            return Err(Error::new(
                BARLINK_INVALID_HANDLE,
                "the buffer handle was deregistered",
            ));
        }
        state.in_flight += 1;
        drop(state);
        Ok(Payload {
            data: Data::Registered {
                // In bounds: checked above.
                ptr: self.ptr.wrapping_add(offset),
                len,
                region: Arc::clone(self),
                read,
            },
        })
    }

    /// Opens the CPU's read of a dma-buf region for one send (none for
    /// host memory): before the link is locked, as the exporter may first
    /// wait for the writes it has pending.
    pub(crate) fn begin_cpu_read(&self) -> Result<Option<CpuRead>> {
        if !self.from_dmabuf {
            return Ok(None);
        }
        let dmabuf = match &self.state().dmabuf {
            Some(dmabuf) => Arc::clone(dmabuf),
            None => {
                return Err(Error::new(
                    BARLINK_INVALID_HANDLE,
                    "the buffer handle was deregistered",
                ));
            }
        };
        dmabuf.begin_read()?;
        Ok(Some(CpuRead { dmabuf }))
    }
}

/// A CPU read of a dma-buf region, open while a send's payload may be read
/// (retransmissions read it again): ended when dropped, with the payload
/// or on a failure before there was one.
#[derive(Debug)]
pub(crate) struct CpuRead {
    dmabuf: Arc<DmaBuf>,
}

impl Drop for CpuRead {
    fn drop(&mut self) {
        self.dmabuf.end_read();
    }
}

/// Copies of finished copying sends, kept to copy the next messages
/// into: an allocation per message costs page faults and zeroing by the
/// kernel above the allocator's mmap threshold (128 KiB), at every send.
///
/// A copy belongs to the payload the link holds until the link hands the
/// payload back ([`SendCopies::give_back`]); its request keeps only its
/// capacity. A link's state owns its copies: no lock, flag or shared
/// count per message, and no allocation once a copy that fits is kept;
/// small messages feel each.
#[derive(Debug, Default)]
pub(crate) struct SendCopies {
    /// Copies the link handed back, oldest first.
    spares: Vec<Vec<u8>>,
    /// Their capacities' total.
    bytes: usize,
}

/// Most spare send copies a link keeps, and most bytes in all.
const MAX_SPARE_SENDS: usize = 64;
const MAX_SPARE_SEND_BYTES: usize = 64 << 20;

impl SendCopies {
    /// A payload holding a copy of `data`, and its request's record of
    /// it. Allocation failure is an error, never an abort.
    pub(crate) fn copy(&mut self, data: &[u8]) -> Result<(Payload, PayloadSource)> {
        fill_copy(self.take(data.len()), data)
    }

    /// Whether no copy is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.spares.is_empty()
    }

    /// A spare that holds `len` bytes without growing if one is kept (the
    /// newest if it fits, else the smallest, and none more than four times
    /// too large: a copy's capacity is what counts against
    /// `send_queue_bytes`), else a new empty one. [`fill_copy`] makes it
    /// a payload, without the link's lock where the copy is long.
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        let most = len.saturating_mul(4).max(64 << 10);
        let fit = |b: &Vec<u8>| (len..=most).contains(&b.capacity());
        // Messages of one size in a row (the usual stream) find theirs last.
        let fits = match self.spares.last() {
            Some(newest) if fit(newest) => Some(self.spares.len() - 1),
            _ => self
                .spares
                .iter()
                .enumerate()
                .filter(|(_, b)| fit(b))
                .min_by_key(|(_, b)| b.capacity())
                .map(|(at, _)| at),
        };
        match fits {
            Some(at) => {
                let copy = self.spares.swap_remove(at);
                self.bytes -= copy.capacity();
                copy
            }
            None => Vec::new(),
        }
    }

    /// Puts a copy of a lent payload's bytes from offset `from` on in their
    /// place, so that the `barlink_send` that lent them may return before
    /// the peer acknowledged them; returns the copy's capacity (it counts
    /// against `send_queue_bytes` from now on), 0 if it has its copy
    /// already. `from` is where the link's engine still reads the message
    /// ([`Connection::needed_from`](barlink::connect::Connection::needed_from)):
    /// the engine reads a payload shorter than its message as the
    /// message's last bytes. The link must hold its lock, so that it reads
    /// no payload meanwhile, and the call that lent the bytes must still
    /// be in progress.
    pub(crate) fn back_up(&mut self, loan: &SendLoan, from: usize, tail_only: bool) -> Result<u64> {
        if loan.backup.get().is_some() {
            return Ok(0);
        }
        let tail = &loan.caller_bytes()[from.min(loan.len)..];
        let mut copy = self.take(tail.len());
        fill(&mut copy, tail)?;
        let capacity = copy.capacity() as u64;
        // Set once: checked above, under the link's lock.
        let _ = loan.backup.set(Backup { copy, tail_only });
        Ok(capacity)
    }

    /// A payload the link handed back (or that never went in): its copy
    /// is kept for a later send; any other is dropped, which ends
    /// barlink's reading of the memory it names.
    pub(crate) fn give_back(&mut self, mut payload: Payload) {
        if let Data::Owned(copy) = &mut payload.data {
            let copy = std::mem::take(copy);
            // A copy has nothing else to end: no drop to run.
            std::mem::forget(payload);
            self.give(copy);
        }
    }

    /// Keeps the backup copy of a finished request's lent bytes, once the
    /// link let go of them, for a later send.
    pub(crate) fn reclaim(&mut self, source: PayloadSource) {
        if let PayloadSource::Loan(loan) = source
            && let Ok(loan) = Arc::try_unwrap(loan)
            && let Some(Backup { copy, .. }) = loan.backup.into_inner()
        {
            self.give(copy);
        }
    }

    /// Keeps a copy for a later send, within the limits (the oldest go).
    fn give(&mut self, copy: Vec<u8>) {
        let capacity = copy.capacity();
        if capacity == 0 || capacity > MAX_SPARE_SEND_BYTES {
            return;
        }
        self.bytes += capacity;
        self.spares.push(copy);
        while self.spares.len() > MAX_SPARE_SENDS || self.bytes > MAX_SPARE_SEND_BYTES {
            let oldest = self.spares.remove(0);
            self.bytes -= oldest.capacity();
        }
    }
}

/// A payload holding a copy of `data` in `copy` (a buffer from
/// [`SendCopies::take`]), and its request's record of it. Allocation
/// failure is an error, never an abort. Needs no link state: a long copy
/// is made without the link's lock, so that a progress thread moves the
/// link meanwhile.
pub(crate) fn fill_copy(mut copy: Vec<u8>, data: &[u8]) -> Result<(Payload, PayloadSource)> {
    fill(&mut copy, data)?;
    let capacity = copy.capacity() as u64;
    let payload = Payload {
        data: Data::Owned(copy),
    };
    Ok((payload, PayloadSource::Copy { capacity }))
}

/// Puts `data` in `copy`, in place of what it held.
fn fill(copy: &mut Vec<u8>, data: &[u8]) -> Result<()> {
    copy.clear();
    copy.try_reserve_exact(data.len()).map_err(|_| {
        Error::new(
            BARLINK_OUT_OF_MEMORY,
            format!("cannot allocate {} bytes for the message copy", data.len()),
        )
    })?;
    copy.extend_from_slice(data);
    Ok(())
}

/// Whose memory a send's payload reads: what its request keeps of it
/// until the link hands the payload back with the message's outcome.
#[derive(Debug)]
pub(crate) enum PayloadSource {
    /// A copy barlink made, of `capacity` bytes (the payload holds it).
    Copy { capacity: u64 },
    /// A registered range of the caller's.
    Registered,
    /// The caller's bytes lent for a `barlink_send` call: the request and
    /// the payload share the loan, and the call holds a weak handle to it.
    Loan(Arc<SendLoan>),
}

impl PayloadSource {
    /// The memory a copy barlink made takes (its capacity, which counts
    /// against `send_queue_bytes`); 0 for the caller's registered memory.
    pub(crate) fn copy_bytes(&self) -> u64 {
        match self {
            PayloadSource::Copy { capacity } => *capacity,
            PayloadSource::Registered => 0,
            PayloadSource::Loan(loan) => loan
                .backup
                .get()
                .map_or(0, |backup| backup.copy.capacity() as u64),
        }
    }

    /// A loan the link read from the caller's memory to the end, copying
    /// nothing, or to its last packets, which the call copied as it
    /// returned because only they were still unacknowledged.
    pub(crate) fn was_lent(&self) -> bool {
        matches!(self, PayloadSource::Loan(loan)
            if loan.backup.get().is_none_or(|backup| backup.tail_only))
    }
}

/// The bytes of a `barlink_send` call in progress, which the link reads
/// where they are while the call waits for the peer's acknowledgement (a
/// large message's copy costs more than that wait). A call that must
/// return first puts a copy in their place ([`SendCopies::back_up`]).
pub(crate) struct SendLoan {
    ptr: *const u8,
    len: usize,
    /// The copy that replaced the caller's bytes; set at most once, by
    /// the lending call, under the link's lock.
    backup: OnceLock<Backup>,
}

/// A copy of a lent message's bytes, from where the link still read them.
struct Backup {
    copy: Vec<u8>,
    /// Its last packets only, copied because only they were still
    /// unacknowledged ([`barlink::loan::copies_tail`]): the message still
    /// counts as lent.
    tail_only: bool,
}

// SAFETY: `SendLoan` stores the caller's address and length and reads
// them only while no backup is set, which holds only during the
// `barlink_send` call that lent them (it backs them up under the link's
// lock before it returns, unless the link let go of them first): by that
// call's contract the bytes are readable then, whichever thread drives
// the link.
unsafe impl Send for SendLoan {}
// SAFETY: as for `Send`; the backup is a `OnceLock`.
unsafe impl Sync for SendLoan {}

impl fmt::Debug for SendLoan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendLoan")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("backed_up", &self.backup.get().is_some())
            .finish()
    }
}

impl SendLoan {
    /// Lends `data` (a `barlink_send` call's bytes) as a payload. The
    /// returned release is the request's share of the loan; the weak
    /// handle is the call's, to back it up ([`SendCopies::back_up`])
    /// before it returns if the link still holds the payload. The call
    /// must not return while the link holds the payload without a backup.
    pub(crate) fn new(data: &[u8]) -> (Payload, PayloadSource, Weak<SendLoan>) {
        let loan = Arc::new(SendLoan {
            ptr: data.as_ptr(),
            len: data.len(),
            backup: OnceLock::new(),
        });
        let weak = Arc::downgrade(&loan);
        let payload = Payload {
            data: Data::Loan(Arc::clone(&loan)),
        };
        (payload, PayloadSource::Loan(loan), weak)
    }

    /// The length of the lent message.
    pub(crate) fn message_len(&self) -> usize {
        self.len
    }

    /// The bytes as the link reads them: the backup once there is one
    /// (which may hold only the message's last bytes: the engine reads a
    /// payload shorter than its message as its end), else the caller's.
    fn bytes(&self) -> &[u8] {
        match self.backup.get() {
            Some(backup) => &backup.copy,
            None => self.caller_bytes(),
        }
    }

    fn caller_bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: read only before the backup is set (`bytes`) or to make
        // it (`back_up`), both during the lending `barlink_send` call, whose
        // contract makes `ptr..ptr+len` readable and unchanged for the call
        // (it came from a slice the call checked). The link reads payloads
        // only under its lock, and the call sets the backup under that lock
        // before it returns, so no read of the caller's memory outlasts it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

enum Data {
    /// A copy barlink owns (see [`SendCopies`]).
    Owned(Vec<u8>),
    Registered {
        ptr: *const u8,
        len: usize,
        region: Arc<Region>,
        /// A dma-buf's CPU read, ended with the payload.
        read: Option<CpuRead>,
    },
    /// A blocking send's bytes, read in place (see [`SendLoan`]).
    Loan(Arc<SendLoan>),
}

/// The `B` of barlink's links: what the engine holds for one message.
pub(crate) struct Payload {
    data: Data,
}

// SAFETY: the only non-Send part is the pointer into a registered region;
// reading through it is governed by the caller's registration contract,
// which holds whichever thread reads (the link is locked while it does).
unsafe impl Send for Payload {}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.data {
            Data::Owned(bytes) => write!(f, "Payload::Owned({} bytes)", bytes.len()),
            Data::Registered { ptr, len, .. } => {
                write!(f, "Payload::Registered({len} bytes at {ptr:p})")
            }
            Data::Loan(loan) => write!(f, "Payload::{loan:?}"),
        }
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        match &self.data {
            Data::Owned(bytes) => bytes,
            Data::Registered { ptr, len, .. } => {
                if *len == 0 {
                    return &[];
                }
                // SAFETY: `ptr..ptr+len` lies inside a range the caller
                // registered (checked in `Region::payload`), non-null and not
                // wrapping (checked at registration). By the contract of
                // `barlink_register_buffer` and `barlink_post_send_buffer`,
                // the caller keeps that memory valid and does not write it
                // until the completion of this send is reported, which
                // happens only after this payload is dropped. A dma-buf's
                // CPU mapping stays while the payload lives: deregistration,
                // which unmaps it, is refused while the region counts the
                // payload in flight; and the contract of
                // `barlink_register_dmabuf` keeps every writer, CPU or
                // device, off the range as long.
                unsafe { std::slice::from_raw_parts(*ptr, *len) }
            }
            Data::Loan(loan) => loan.bytes(),
        }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        if let Data::Registered { region, read, .. } = &mut self.data {
            // The CPU read ends first: a deregistration that finds nothing
            // in flight finds no read open either.
            drop(read.take());
            let mut state = region.state();
            state.in_flight = state.in_flight.saturating_sub(1);
        }
    }
}

/// A caller's receive buffer, lent to the engine as a posted receive
/// target so that a message lands in it with no copy after the checked one
/// out of the medium: the buffer of a `barlink_recv` call for the length of
/// the call, or of a `barlink_post_recv` until its completion is reported.
#[derive(Debug)]
pub(crate) struct CallerMemory {
    ptr: *mut u8,
    len: usize,
    /// The one message a posted receive's buffer takes, once the link
    /// knows the ids (`RecvTarget::message`); `None`: the next that fits.
    names: Option<MessageId>,
}

// SAFETY: only the address and length are stored; writing through them is
// governed by the contracts of `barlink_recv` and `barlink_post_recv` (the
// buffer is barlink's to write until the call returns, or the completion
// is reported), which hold whichever thread drives the link — under the
// link's lock.
unsafe impl Send for CallerMemory {}

impl CallerMemory {
    /// The caller (the extern function) has checked that `ptr` is non-null
    /// unless `len` is 0, and that `ptr + len` stays in the address space.
    pub(crate) fn new(ptr: *mut u8, len: usize) -> CallerMemory {
        CallerMemory {
            ptr,
            len,
            names: None,
        }
    }

    /// A second handle to the same buffer: one is posted to the link, the
    /// other kept to copy into once the link has given the first back.
    /// Never are both written at once: a posted receive is taken back from
    /// the link before its own handle is used.
    pub(crate) fn duplicate(&self) -> CallerMemory {
        CallerMemory {
            ptr: self.ptr,
            len: self.len,
            names: self.names,
        }
    }

    /// A second handle (see [`CallerMemory::duplicate`]) that takes only
    /// message `names`, if given.
    pub(crate) fn naming(&self, names: Option<MessageId>) -> CallerMemory {
        CallerMemory {
            names,
            ..self.duplicate()
        }
    }
}

impl barlink_transport::RecvTarget for CallerMemory {
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr..ptr+len` is the buffer of a `barlink_recv` call in
        // progress or of a `barlink_post_recv` not yet completed: non-null,
        // in the address space (checked by the caller of `new`) and, by
        // those functions' contracts, writable and not touched by the
        // caller until then. A call takes its buffer back from the link
        // before it returns (`LinkState::reclaim`); a posted receive's is
        // taken back before it completes (`recv::PostedRecvs::settle`); a
        // link that ends or closes drops every buffer it holds. Of the two
        // handles of a posted receive only one is used at a time
        // (`duplicate`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn message(&self) -> Option<MessageId> {
        self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_payload_is_in_flight_until_dropped() {
        let buf = vec![5u8; 256];
        let region = Arc::new(Region::new(buf.as_ptr(), buf.len()));
        let mut copies = SendCopies::default();
        let payload = region.payload(8, 64, None).unwrap();
        assert_eq!(payload.as_ref(), &buf[8..72]);
        let busy = region.retire().expect_err("retired with a send in flight");
        assert_eq!(busy.status, BARLINK_BUSY, "{busy:?}");
        // Handed back, it is dropped: nothing is kept of it.
        copies.give_back(payload);
        assert!(copies.is_empty());
        region.retire().unwrap();
    }

    /// A registration with a device runs outside the region's lock: sends
    /// from the region go meanwhile, deregistration waits for it, and a
    /// deregistered region is not registered.
    #[test]
    fn deregistration_waits_for_a_registration_in_progress() {
        let buf = vec![5u8; 256];
        let region = Arc::new(Region::new(buf.as_ptr(), buf.len()));
        region
            .with_send_memory(|memory| {
                assert_eq!(memory.len(), 256);
                let payload = region.payload(0, 64, None)?;
                drop(payload);
                let busy = region.retire().expect_err("retired while registering");
                assert_eq!(busy.status, BARLINK_BUSY, "{busy:?}");
                Ok(())
            })
            .unwrap();
        region.retire().unwrap();
        let gone = region
            .with_send_memory(|_| panic!("a deregistered region was offered"))
            .expect_err("registered after deregistration");
        assert_eq!(gone.status, BARLINK_INVALID_HANDLE);
    }

    #[test]
    fn send_copies_are_reused_once_handed_back_and_within_their_limits() {
        let mut copies = SendCopies::default();
        let (payload, release) = copies.copy(&[7u8; 1000]).unwrap();
        assert_eq!(payload.as_ref(), &[7u8; 1000][..]);
        assert_eq!(release.copy_bytes(), 1000);
        let first = payload.as_ref().as_ptr();
        copies.give_back(payload);
        // A later message that fits goes into the same copy.
        let (payload, release) = copies.copy(&[9u8; 600]).unwrap();
        assert_eq!(payload.as_ref(), &[9u8; 600][..]);
        assert_eq!(payload.as_ref().as_ptr(), first);
        assert_eq!(release.copy_bytes(), 1000, "its capacity counts");
        assert!(copies.is_empty());
        drop(payload);
        for _ in 0..MAX_SPARE_SENDS + 6 {
            copies.give(vec![7u8; 1000]);
        }
        assert_eq!(copies.spares.len(), MAX_SPARE_SENDS);
        copies.give(Vec::with_capacity(MAX_SPARE_SEND_BYTES + 1));
        assert!(
            copies
                .spares
                .iter()
                .all(|b| b.capacity() <= MAX_SPARE_SEND_BYTES)
        );
        // Large ones push the oldest out: never more than the byte limit.
        for _ in 0..8 {
            copies.give(Vec::with_capacity(16 << 20));
        }
        let total: usize = copies.spares.iter().map(|b| b.capacity()).sum();
        assert!(total <= MAX_SPARE_SEND_BYTES, "{total}");
        assert_eq!(copies.bytes, total, "the running total is the sum");
    }

    /// A lent payload's backup copy comes back to the spares once the
    /// request finishes; the caller's bytes are read until then.
    #[test]
    fn a_loans_backup_is_kept_once_the_request_finishes() {
        let mut copies = SendCopies::default();
        let data = vec![3u8; 5000];
        let (payload, release, weak) = SendLoan::new(&data);
        assert_eq!(payload.as_ref().as_ptr(), data.as_ptr(), "read in place");
        assert!(release.was_lent());
        let loan = weak.upgrade().unwrap();
        assert_eq!(copies.back_up(&loan, 0, false).unwrap(), 5000);
        assert_eq!(
            copies.back_up(&loan, 0, false).unwrap(),
            0,
            "backed up once"
        );
        drop(loan);
        assert_ne!(
            payload.as_ref().as_ptr(),
            data.as_ptr(),
            "the backup is read"
        );
        assert_eq!(payload.as_ref(), &data[..]);
        assert_eq!(release.copy_bytes(), 5000);
        copies.give_back(payload);
        assert!(
            copies.is_empty(),
            "a loan's payload holds no copy of its own"
        );
        copies.reclaim(release);
        assert_eq!(copies.spares.len(), 1, "the backup is kept");
    }

    /// A copy's capacity is what counts against `send_queue_bytes`: a small
    /// message takes the smallest spare that holds it, never one more than
    /// four times too large (nor 64 KiB, for small ones).
    #[test]
    fn a_small_message_does_not_take_a_large_spare() {
        let mut copies = SendCopies::default();
        for capacity in [16 << 20, 1 << 20, 300 << 10] {
            copies.give(Vec::with_capacity(capacity));
        }
        let (_payload, release) = copies.copy(&[1u8; 100]).unwrap();
        assert!(release.copy_bytes() < 64 << 10, "{}", release.copy_bytes());
        let (_payload, release) = copies.copy(&[1u8; 256 << 10]).unwrap();
        assert_eq!(release.copy_bytes(), 300 << 10, "the smallest that fits");
        let (_payload, release) = copies.copy(&[1u8; 900 << 10]).unwrap();
        assert_eq!(release.copy_bytes(), 1 << 20);
        assert_eq!(
            copies.spares.len(),
            1,
            "the 16 MiB spare waits for a large one"
        );
        let (_payload, release) = copies.copy(&[1u8; 5 << 20]).unwrap();
        assert_eq!(release.copy_bytes(), 16 << 20);
    }
}
