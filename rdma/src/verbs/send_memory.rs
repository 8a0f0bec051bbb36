//! [`SendMemory`]: memory a program sends from, which RDMA links read in
//! place. A packet whose payload lies in it goes out as one RDMA WRITE
//! WITH IMM that gathers the header from the link's staging area and the
//! payload from the program's memory: the CPU reads the payload once, for
//! its CRC, and copies nothing.
//!
//! The device registration (`ibv_reg_mr`) is made the first time a link
//! of a protection domain sends from the memory, once per domain, and
//! lives as long as the `SendMemory` (or the link): its life is the
//! program's handle, not an address. Each write that reads the memory
//! holds it (and its registration) until the write completes, and
//! [`SendMemory::in_flight`] counts those writes. A registration found by address
//! alone, as [`crate::MrCache`] finds them, could outlive the memory and
//! keep sending pages that are no longer the program's; here dropping the
//! handle is the moment no new send reads the memory in place.
//!
//! A payload that is not in send memory, or in memory the device would
//! not register, goes through the staging area as before: sending in
//! place is never required, only taken where it is there.
#![allow(unsafe_code)]

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::mr::{MemoryRegion, Sge};
use super::pd::ProtectionDomain;
use super::values::Access;
use crate::error::RdmaError;

/// Every live registration; few (a program registers its large buffers),
/// so a list.
static REGISTERED: RwLock<Vec<Arc<Entry>>> = RwLock::new(Vec::new());
/// `REGISTERED.len()`, read without the lock: a process that registers
/// nothing pays one load per packet.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A domain's registration of an entry, or why the device refused it
/// (asked once per domain, not once per packet).
type DomainRegion = (usize, Result<Arc<MemoryRegion>, RdmaError>);

pub(crate) struct Entry {
    start: usize,
    len: usize,
    /// Writes posted that read this memory and have not completed.
    in_flight: AtomicUsize,
    /// Owned memory is kept alive here (`SendMemory::new`).
    _owner: Option<Arc<[u8]>>,
    /// A dma-buf the memory maps, and the offset into it where the memory
    /// starts: devices register the dma-buf itself
    /// (`SendMemory::register_dmabuf_raw`).
    dmabuf: Option<(OwnedFd, u64)>,
    regions: Mutex<Regions>,
}

#[derive(Default)]
struct Regions {
    /// Per protection domain (keyed by its address, which cannot be reused
    /// while a region of it holds it alive).
    by_domain: Vec<DomainRegion>,
    /// The handle was dropped: a lookup that found the entry just before
    /// registers nothing more.
    dropped: bool,
}

impl Entry {
    fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.start + self.len && self.start < addr.saturating_add(len)
    }

    fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.start + self.len)
    }

    fn regions(&self) -> std::sync::MutexGuard<'_, Regions> {
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The domain's registration of the whole entry, made now if it is the
    /// first time, or why the device refused it (logged once).
    fn region_in(&self, pd: &ProtectionDomain) -> Result<Arc<MemoryRegion>, RdmaError> {
        let key = pd.identity();
        let mut regions = self.regions();
        if regions.dropped {
            return Err(RdmaError::InvalidArgument {
                what: "the send memory was dropped".into(),
            });
        }
        if let Some((_, found)) = regions.by_domain.iter().find(|(k, _)| *k == key) {
            return found.clone();
        }
        let made = match &self.dmabuf {
            // The device maps the dma-buf's pages itself and addresses them
            // at the CPU's mapping, so that payloads found by their address
            // name the same bytes.
            Some((fd, offset)) => pd.register_dmabuf(
                fd.as_fd(),
                *offset,
                self.len,
                self.start as u64,
                Access::LOCAL_READ,
            ),
            // SAFETY: `start..start + len` is memory the program keeps
            // mapped while the entry is registered and until every write
            // from it has completed (the contract of
            // `SendMemory::register_raw`, which `in_flight` lets it keep; or
            // owned by `_owner`, which every write's `Hold` keeps alive);
            // the device only reads it (LOCAL_READ), and barlink never makes
            // a Rust reference to it from this region.
            None => unsafe { pd.register_raw(self.start as *mut u8, self.len, Access::LOCAL_READ) },
        };
        let made = made.map(Arc::new).inspect_err(|error| {
            tracing::warn!(
                %error,
                device = pd.device_name(),
                bytes = self.len,
                "send memory could not be registered; its sends go through the staging area"
            );
        });
        regions.by_domain.push((key, made.clone()));
        made
    }
}

/// The entry holding `payload`, if any.
fn entry_of(payload: &[u8]) -> Option<Arc<Entry>> {
    find_entry(|entry| entry.contains(payload.as_ptr() as usize, payload.len()))
}

/// The first live entry that `which` picks.
fn find_entry(which: impl Fn(&Entry) -> bool) -> Option<Arc<Entry>> {
    if LIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    registered.iter().find(|entry| which(entry)).cloned()
}

/// What a write that reads send memory in place holds until it
/// completes: the memory (owned memory stays allocated, and
/// [`SendMemory::in_flight`] counts it) and the registration it names.
pub(crate) struct Hold {
    entry: Arc<Entry>,
    /// `None` for a queue without a device (the loopback).
    _region: Option<Arc<MemoryRegion>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.entry.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("start", &format_args!("{:#x}", self.entry.start))
            .finish_non_exhaustive()
    }
}

/// The scatter/gather entry that reads `payload` in place through the
/// domain's registration of the send memory holding it, and what the
/// write naming it holds until it completes. `None`: not in send memory,
/// or the device refused it.
pub(crate) fn in_place(pd: &ProtectionDomain, payload: &[u8]) -> Option<(Sge, Hold)> {
    if payload.is_empty() {
        return None;
    }
    let entry = entry_of(payload)?;
    let region = entry.region_in(pd).ok()?;
    let offset = payload.as_ptr() as usize - entry.start;
    let sge = region.sge(offset, payload.len()).ok()?;
    Some((sge, Hold::new(entry, Some(region))))
}

/// For a queue without a device: what a write of `payload` in place
/// holds, if it lies in send memory.
pub(crate) fn hold_without_device(payload: &[u8]) -> Option<Hold> {
    if payload.is_empty() {
        return None;
    }
    Some(Hold::new(entry_of(payload)?, None))
}

impl Hold {
    fn new(entry: Arc<Entry>, region: Option<Arc<MemoryRegion>>) -> Hold {
        entry.in_flight.fetch_add(1, Ordering::AcqRel);
        Hold {
            entry,
            _region: region,
        }
    }
}

/// Registers `memory` in `pd` now, if it is not yet, rather than at the
/// first send from it; or says why the device refuses it (asked once).
pub(crate) fn register_in(pd: &ProtectionDomain, memory: &SendMemory) -> Result<(), RdmaError> {
    memory.entry.region_in(pd).map(drop)
}

/// Drops every registration made in `pd`: its links are gone, and the
/// domain (with its device) need not stay open for memory that no link of
/// it will send from again.
pub(crate) fn forget_domain(pd: &ProtectionDomain) {
    if LIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let key = pd.identity();
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    for entry in registered.iter() {
        entry.regions().by_domain.retain(|(k, _)| *k != key);
    }
}

/// Memory that RDMA links send from in place while this handle lives (see
/// the module docs). Registering is cheap: the devices register it when
/// they first send from it.
pub struct SendMemory {
    entry: Arc<Entry>,
}

impl fmt::Debug for SendMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendMemory")
            .field("start", &format_args!("{:#x}", self.entry.start))
            .field("len", &self.entry.len)
            .field("devices", &self.registrations())
            .finish()
    }
}

impl SendMemory {
    /// Whether any of `bytes` lie in send memory, so that an RDMA link
    /// could read some of their packets in place, possibly after the write
    /// that named them was acknowledged (a resend still queued). A caller
    /// lending memory only for the length of a call keeps such bytes out
    /// of a link.
    pub fn overlaps(bytes: &[u8]) -> bool {
        !bytes.is_empty()
            && find_entry(|entry| entry.overlaps(bytes.as_ptr() as usize, bytes.len())).is_some()
    }

    /// Sends of ranges of `bytes` (as message buffers that point into it)
    /// go in place. The memory cannot change while it is shared, so any
    /// send from it reads what the caller wrote.
    pub fn new(bytes: Arc<[u8]>) -> Result<SendMemory, RdmaError> {
        let (start, len) = (bytes.as_ptr() as usize, bytes.len());
        SendMemory::insert(start, len, Some(bytes), None)
    }

    /// Registers `len` bytes at `ptr`, memory the caller owns (a C
    /// program's buffer).
    ///
    /// # Safety
    /// `ptr..ptr + len` stays mapped until this handle is dropped and every
    /// send from the range has completed (its message acknowledged, and
    /// [`SendMemory::in_flight`] at 0), and no range is modified while a
    /// send from it is in flight (its CRC was taken before the adapter
    /// reads it; a change in between is caught by the peer and sent again,
    /// changed).
    pub unsafe fn register_raw(ptr: *const u8, len: usize) -> Result<SendMemory, RdmaError> {
        SendMemory::insert(ptr as usize, len, None, None)
    }

    /// Registers `len` bytes at `ptr`, the CPU's mapping of `len` bytes at
    /// `offset` in the dma-buf behind `fd`: devices register the dma-buf
    /// (`ibv_reg_dmabuf_mr`) rather than the mapping, so that the NIC reads
    /// the exporter's memory (a GPU's) directly. A device that refuses
    /// dma-bufs (soft-RoCE does) sends through the staging area.
    ///
    /// # Safety
    /// As for [`SendMemory::register_raw`], with `ptr..ptr + len` mapping
    /// that range of the dma-buf.
    pub unsafe fn register_dmabuf_raw(
        ptr: *const u8,
        len: usize,
        fd: OwnedFd,
        offset: u64,
    ) -> Result<SendMemory, RdmaError> {
        SendMemory::insert(ptr as usize, len, None, Some((fd, offset)))
    }

    fn insert(
        start: usize,
        len: usize,
        owner: Option<Arc<[u8]>>,
        dmabuf: Option<(OwnedFd, u64)>,
    ) -> Result<SendMemory, RdmaError> {
        if len == 0 || start == 0 || start.checked_add(len).is_none() {
            return Err(RdmaError::InvalidArgument {
                what: format!("send memory of {len} bytes at {start:#x}: give a non-empty range"),
            });
        }
        let entry = Arc::new(Entry {
            start,
            len,
            _owner: owner,
            dmabuf,
            in_flight: AtomicUsize::new(0),
            regions: Mutex::new(Regions::default()),
        });
        let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
        registered.push(Arc::clone(&entry));
        LIVE.store(registered.len(), Ordering::Release);
        Ok(SendMemory { entry })
    }

    /// The first byte's address.
    pub fn as_ptr(&self) -> *const u8 {
        self.entry.start as *const u8
    }

    /// Bytes covered.
    pub fn len(&self) -> usize {
        self.entry.len
    }

    /// Whether it covers no bytes (never: registering refuses that).
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }

    /// Writes posted from it that have not completed: while there are
    /// any, the adapter may still read the memory, whatever the engine
    /// has let go of (a resend can still be queued when the first copy
    /// is acknowledged; a link's queue pair goes after its engine).
    pub fn in_flight(&self) -> usize {
        self.entry.in_flight.load(Ordering::Acquire)
    }

    /// Protection domains it is registered in now.
    pub fn registrations(&self) -> usize {
        let regions = self.entry.regions();
        regions.by_domain.iter().filter(|(_, r)| r.is_ok()).count()
    }
}

impl Drop for SendMemory {
    fn drop(&mut self) {
        let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
        registered.retain(|entry| !Arc::ptr_eq(entry, &self.entry));
        LIVE.store(registered.len(), Ordering::Release);
        drop(registered);
        // Deregistered now, unless a write still in flight holds one.
        let mut regions = self.entry.regions();
        regions.dropped = true;
        regions.by_domain.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_in_flight_keeps_owned_memory_and_is_counted() {
        let bytes: Arc<[u8]> = vec![7u8; 8192].into();
        let memory = SendMemory::new(bytes.clone()).unwrap();
        assert!(hold_without_device(&[0u8; 16]).is_none());
        let hold = hold_without_device(&bytes[100..5000]).unwrap();
        assert_eq!(memory.in_flight(), 1);
        drop(memory);
        // Not send memory any more, but the write's bytes stay allocated.
        assert!(hold_without_device(&bytes[100..5000]).is_none());
        assert_eq!(Arc::strong_count(&bytes), 2);
        drop(hold);
        assert_eq!(Arc::strong_count(&bytes), 1);
    }

    /// A range that only overlaps send memory still has packets an adapter
    /// would read in place: `overlaps` says so where `entry_of` (a whole
    /// payload inside) does not.
    #[test]
    fn ranges_overlapping_send_memory_are_told_apart_from_ranges_inside() {
        let bytes = vec![3u8; 4096];
        // SAFETY: `bytes` outlives the registration and no send reads it.
        let memory = unsafe { SendMemory::register_raw(bytes[1000..2000].as_ptr(), 1000) }.unwrap();
        assert!(SendMemory::overlaps(&bytes[1000..2000]));
        assert!(SendMemory::overlaps(&bytes[1500..3000]), "runs off the end");
        assert!(SendMemory::overlaps(&bytes[0..1001]), "starts before");
        assert!(SendMemory::overlaps(&bytes[..]), "spans it");
        assert!(entry_of(&bytes[1500..3000]).is_none());
        assert!(
            !SendMemory::overlaps(&bytes[2000..3000]),
            "starts at its end"
        );
        assert!(!SendMemory::overlaps(&bytes[0..1000]), "ends at its start");
        assert!(!SendMemory::overlaps(&bytes[1200..1200]), "empty");
        drop(memory);
        assert!(!SendMemory::overlaps(&bytes[1000..2000]));
    }
}
