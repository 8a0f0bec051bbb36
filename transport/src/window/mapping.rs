//! [`Mapping`]: the only code in the transport that holds a raw pointer into
//! a window's memory, and so the only module (with nothing else) allowed
//! `unsafe`.
//!
//! It owns a region — an `mmap` of a shared file or a page-aligned heap
//! allocation — or borrows one that another crate mapped ([`RawWindow`]
//! over host memory, [`DeviceMemory`] over a BAR or DMA memory), and offers
//! checked accessors over it: bulk copies in and out, 64-bit atomic loads,
//! stores and adds, and, for device memory, exact-width register accesses. Every accessor checks its
//! range (and, for atomics, alignment and ordering) before it forms a
//! pointer, so offsets that a peer wrote can be passed straight in.
//!
//! No reference into the region ever leaves this module. The memory may be
//! written at any moment by another process or a device, which Rust's
//! reference rules cannot describe; the only references formed here are
//! short-lived `&AtomicU64`, which permit concurrent modification.
//!
//! Bulk copies use wide vector loads and stores ([`copy_bytes`]), which on
//! write-combined PCIe memory the CPU combines into full-line bursts; a
//! volatile byte loop would issue one PCIe write per byte. On AMD CPUs,
//! copies of 512 bytes or more are 32-byte AVX2 moves, not glibc's
//! `memcpy`: its `rep movsb` there runs many times slower when the
//! destination sits a few bytes above the source modulo 4 KiB, which ring
//! slots and message buffers hit or miss by chance of placement
//! (docs/ARCHITECTURE.md, design change 18). Elsewhere `memcpy` is as fast
//! or faster (design change 23).
//!
//! A bulk read that races a peer's write may see a mix of old and new
//! bytes — which the packet CRC exists to catch. As in `vm-memory`, such a
//! race with another process is outside what the compiler can observe; the
//! window's users keep to the ring protocol (data, fence, release index;
//! acquire index, data) so that within one process it never happens.

use std::alloc::{self, Layout};
use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mm::{self, Advice, MapFlags, ProtFlags};

use super::{WindowError, check_range};
use crate::crc::Crc32c;

/// Heap windows are page-aligned, like mappings, so that alignment rules
/// (atomic indices, cache lines, future DMA) are the same for every kind.
const HEAP_ALIGN: usize = 4096;

/// How a region is given back when its [`Mapping`] drops.
#[derive(Debug)]
enum Release {
    /// `munmap` this many bytes (the length that was mapped).
    Unmap { mapped_len: usize },
    /// Return the allocation to the global allocator.
    Dealloc { layout: Layout },
    /// Nothing: the memory belongs to someone else ([`RawWindow`]).
    Borrowed,
}

/// A region of memory, owned, reachable only through checked accessors.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
    release: Release,
}

// SAFETY: `Mapping` owns its region exclusively (it is unmapped or freed only
// in `drop`), or, for a `RawWindow`, its creator vouched that the region
// outlives it; all access goes through raw-pointer copies and atomics that
// are valid from any thread, and no reference to the region is ever handed
// out.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access from several threads is exactly what the
// accessors are for (atomics for indices, copies for data the ring protocol
// keeps from racing within this process).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A zeroed, page-aligned heap region of `len` bytes.
    pub(crate) fn zeroed_heap(len: usize) -> Result<Mapping, WindowError> {
        if len == 0 {
            return Err(WindowError::InvalidLength {
                len,
                reason: "a window must have at least one byte",
            });
        }
        let layout =
            Layout::from_size_align(len, HEAP_ALIGN).map_err(|_| WindowError::InvalidLength {
                len,
                reason: "larger than the address space allows",
            })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or(WindowError::AllocationFailed { len })?;
        Ok(Mapping {
            base,
            len,
            release: Release::Dealloc { layout },
        })
    }

    /// Maps the first `len` bytes of `fd` shared, readable and writable.
    ///
    /// The caller has checked that the file is at least `len` bytes long:
    /// touching a page past its end raises SIGBUS. (A file that a peer
    /// shrinks later has the same effect, which is why memfd windows are
    /// sealed against shrinking.)
    pub(crate) fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::INVAL.raw_os_error(),
            ));
        }
        // SAFETY: a null hint lets the kernel choose an address, so no
        // existing mapping of this process is replaced; `fd` is open for the
        // duration of the call (it is borrowed); the new mapping is owned by
        // the returned `Mapping` alone and unmapped only in its `drop`.
        let raw = unsafe {
            mm::mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Mapping {
            base,
            len,
            release: Release::Unmap { mapped_len: len },
        })
    }

    /// Asks the kernel to back the region with transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`). Advice only: the kernel may not comply.
    pub(crate) fn advise_huge_pages(&self) -> io::Result<()> {
        // SAFETY: the range is exactly this mapping, which is live; the
        // advice changes how the kernel backs the pages, never their
        // contents or validity.
        unsafe { mm::madvise(self.base.as_ptr().cast(), self.len, Advice::LinuxHugepage) }?;
        Ok(())
    }

    /// The region's length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` into the region at `offset`.
    #[inline]
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: `offset + src.len() <= self.len` without overflow (checked
        // above), so the destination lies within the live region; `src` is a
        // separate Rust slice, so the two cannot overlap.
        unsafe { copy_bytes(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`, feeding it into `crc` in
    /// the same pass.
    #[inline]
    pub(crate) fn write_crc(
        &self,
        offset: usize,
        src: &[u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: the destination range lies within the live region
        // (checked above) and cannot overlap `src`, a separate Rust slice.
        unsafe { crc.copy_into(src, self.base.as_ptr().add(offset)) };
        Ok(())
    }

    /// Copies bytes at `offset` out of the region into `dst`, feeding them
    /// (as they landed in `dst`) into `crc` in the same pass.
    #[inline]
    pub(crate) fn read_crc(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the source range lies within the live region (checked
        // above); `dst` is an exclusive Rust slice, so they cannot overlap.
        unsafe { crc.copy_from(self.base.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// [`Mapping::read_crc`] for a destination nobody will read soon:
    /// its lines written around the cache where that is faster.
    pub(crate) fn read_crc_streaming(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: as in `read_crc`.
        unsafe { crc.copy_from_streaming(self.base.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// [`Mapping::read`] for a destination nobody will read soon.
    pub(crate) fn read_streaming(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: as in `read`.
        unsafe {
            copy_bytes_streaming(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies bytes at `offset` out of the region into `dst`.
    #[inline]
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the source range lies within the live region (checked
        // above); `dst` is an exclusive Rust slice, so the two cannot
        // overlap.
        unsafe { copy_bytes(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Starts taking the cache lines of `offset..offset + len` (clipped to
    /// the region) for this core, in the state a write needs, where the
    /// CPU has `prefetchw`; elsewhere does nothing.
    #[inline]
    pub(crate) fn prefetch_for_write(&self, offset: usize, len: usize) {
        if !crate::cpu::has_prefetchw() {
            return;
        }
        let end = offset.saturating_add(len).min(self.len);
        let mut at = offset;
        while at < end {
            // SAFETY: `at < self.len`: the address is inside the live
            // region; the CPU has `prefetchw` (checked above).
            unsafe { prefetch_line_for_write(self.base.as_ptr().add(at).cast_const()) };
            at += 64;
        }
    }

    /// Starts fetching the cache lines of `offset..offset + len` (clipped
    /// to the region) into this core's cache.
    #[inline]
    pub(crate) fn prefetch(&self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.len);
        let mut at = offset;
        while at < end {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `at < self.len`: the address is inside the live
            // region; a prefetch reads nothing the program can observe and
            // never faults.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T0>(self.base.as_ptr().add(at).cast_const().cast());
            }
            at += 64;
        }
    }

    /// The 8-byte word at `offset`, checked for range and alignment.
    #[inline]
    fn word(&self, offset: usize) -> Result<*mut u64, WindowError> {
        check_range(offset, size_of::<u64>(), self.len)?;
        // SAFETY: `offset + 8 <= self.len` (checked above), so the pointer
        // stays within the live region.
        let word = unsafe { self.base.as_ptr().add(offset) }.cast::<u64>();
        if !word.is_aligned() {
            return Err(WindowError::Misaligned {
                offset,
                align: align_of::<AtomicU64>(),
            });
        }
        Ok(word)
    }

    /// An atomic load of the word at `offset`.
    #[inline]
    pub(crate) fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        check_load_ordering(order)?;
        let word = self.word(offset)?;
        // SAFETY: `word` is in bounds and 8-byte aligned (checked by
        // `word`); the region outlives this call; every access this module
        // makes to an index word is atomic, and concurrent writers (threads
        // or other processes) are what `AtomicU64` permits.
        let atomic = unsafe { AtomicU64::from_ptr(word) };
        Ok(atomic.load(order))
    }

    /// An atomic store to the word at `offset`.
    #[inline]
    pub(crate) fn store_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<(), WindowError> {
        check_store_ordering(order)?;
        let word = self.word(offset)?;
        // SAFETY: as in `load_u64`.
        let atomic = unsafe { AtomicU64::from_ptr(word) };
        atomic.store(value, order);
        Ok(())
    }

    /// An atomic add to the word at `offset`; returns the previous value.
    pub(crate) fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        let word = self.word(offset)?;
        // SAFETY: as in `load_u64`.
        let atomic = unsafe { AtomicU64::from_ptr(word) };
        Ok(atomic.fetch_add(value, order))
    }
}

/// A window over memory that something else owns and keeps mapped: the
/// checked accessors of the transport's own windows (copies with a fused
/// CRC, 64-bit atomics) for a region another crate mapped its own way — an
/// RDMA-registered buffer, for one. Dropping it releases nothing.
#[derive(Debug)]
pub struct RawWindow {
    mapping: Mapping,
}

impl RawWindow {
    /// A window over the `len` bytes at `base`, which must be ordinary
    /// write-back memory: its [`store_fence`](super::Window::store_fence)
    /// is a compiler fence only, which does not
    /// drain write-combining buffers. A device BAR mapped write-combining
    /// needs a window whose fence is `sfence` (the trait's default).
    ///
    /// # Safety
    /// `base..base + len` must be readable and writable memory that stays
    /// mapped for as long as the returned window lives, and nothing may
    /// form a Rust reference (`&[u8]`, `&mut [u8]`) into it meanwhile;
    /// others (threads, processes, devices) may write it at any time, which
    /// the accessors allow for.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> RawWindow {
        RawWindow {
            mapping: Mapping {
                base,
                len,
                release: Release::Borrowed,
            },
        }
    }
}

super::window_over_mapping!(RawWindow);

/// What a device region may be used for: the protection it was mapped with
/// (a VFIO region's READ/WRITE flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAccess {
    /// Loads and copies out are allowed.
    pub read: bool,
    /// Stores and copies in are allowed.
    pub write: bool,
}

/// A window over device memory that something else mapped and keeps
/// mapped: a PCI BAR (through VFIO or a sysfs `resourceN[_wc]` file, maybe
/// write-combining or uncached), or memory a device reaches by DMA.
///
/// The same checked copies as every window, and what device memory needs
/// on top: the store fence is a real `sfence` (write-combined stores must
/// land before the index that publishes them); a `SeqCst` store is a
/// `Release` store and a full fence, not a locked read-modify-write on
/// uncached memory; `fetch_add` is refused (PCIe carries no
/// read-modify-write a CPU can issue to a peer BAR); a region mapped
/// without read or write access refuses those accesses instead of
/// faulting; and device registers get exact-width volatile accesses.
/// Dropping it releases nothing: its creator unmaps the memory afterwards.
#[derive(Debug)]
pub struct DeviceMemory {
    mapping: Mapping,
    access: DeviceAccess,
}

impl DeviceMemory {
    /// Device memory of `len` bytes at `base`, mapped with `access`.
    ///
    /// # Safety
    /// `base..base + len` must stay mapped, with at least the accesses
    /// `access` allows, for as long as the returned value lives, and
    /// nothing may form a Rust reference into it meanwhile; devices and
    /// other processes may write it at any time, which the accessors allow
    /// for.
    pub unsafe fn new(base: NonNull<u8>, len: usize, access: DeviceAccess) -> DeviceMemory {
        DeviceMemory {
            mapping: Mapping {
                base,
                len,
                release: Release::Borrowed,
            },
            access,
        }
    }

    /// The accesses the region allows.
    pub fn access(&self) -> DeviceAccess {
        self.access
    }

    /// The virtual address of byte `offset` (`offset <= len`), for DMA
    /// mapping; a number, never a reference.
    pub fn address_of(&self, offset: usize) -> Result<u64, WindowError> {
        check_range(offset, 0, self.mapping.len)?;
        Ok(self.mapping.base.as_ptr() as u64 + offset as u64)
    }

    fn check_write(&self) -> Result<(), WindowError> {
        if self.access.write {
            Ok(())
        } else {
            Err(WindowError::Unsupported {
                operation: "write",
                reason: "the region is mapped read-only (its VFIO flags lack WRITE)",
            })
        }
    }

    fn check_read(&self) -> Result<(), WindowError> {
        if self.access.read {
            Ok(())
        } else {
            Err(WindowError::Unsupported {
                operation: "read",
                reason: "the region is mapped write-only (its VFIO flags lack READ)",
            })
        }
    }

    /// A pointer to the `size`-byte register at `offset`, checked for range
    /// and alignment.
    fn register(&self, offset: usize, size: usize) -> Result<*mut u8, WindowError> {
        check_range(offset, size, self.mapping.len)?;
        // SAFETY: `offset + size <= len` (checked above), so the pointer
        // stays inside the live mapping.
        let register = unsafe { self.mapping.base.as_ptr().add(offset) };
        if !(register as usize).is_multiple_of(size) {
            return Err(WindowError::Misaligned {
                offset,
                align: size,
            });
        }
        Ok(register)
    }

    /// A volatile 32-bit read of the device register at `offset`.
    pub fn read_u32(&self, offset: usize) -> Result<u32, WindowError> {
        self.check_read()?;
        let register = self.register(offset, 4)?.cast::<u32>();
        // SAFETY: in bounds and 4-byte aligned (checked by `register`)
        // inside the live mapping; a volatile access of exactly this width
        // is what a device register needs.
        Ok(unsafe { ptr::read_volatile(register) })
    }

    /// A volatile 32-bit write of the device register at `offset`.
    pub fn write_u32(&self, offset: usize, value: u32) -> Result<(), WindowError> {
        self.check_write()?;
        let register = self.register(offset, 4)?.cast::<u32>();
        // SAFETY: as in `read_u32`.
        unsafe { ptr::write_volatile(register, value) };
        Ok(())
    }

    /// A volatile 64-bit read of the device register at `offset`.
    pub fn read_u64(&self, offset: usize) -> Result<u64, WindowError> {
        self.check_read()?;
        let register = self.register(offset, 8)?.cast::<u64>();
        // SAFETY: in bounds and 8-byte aligned (checked by `register`).
        Ok(unsafe { ptr::read_volatile(register) })
    }

    /// A volatile 64-bit write of the device register at `offset`.
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), WindowError> {
        self.check_write()?;
        let register = self.register(offset, 8)?.cast::<u64>();
        // SAFETY: in bounds and 8-byte aligned (checked by `register`).
        unsafe { ptr::write_volatile(register, value) };
        Ok(())
    }
}

impl super::Window for DeviceMemory {
    fn len(&self) -> usize {
        self.mapping.len()
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.check_write()?;
        self.mapping.write(offset, src)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.check_read()?;
        self.mapping.read(offset, dst)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        check_load_ordering(order)?;
        self.check_read()?;
        self.mapping.load_u64(offset, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        check_store_ordering(order)?;
        self.check_write()?;
        // Not `xchg`, a locked read-modify-write on uncached memory: a
        // Release store and a full fence order the same.
        let (store_order, fence_after) = match order {
            Ordering::SeqCst => (Ordering::Release, true),
            other => (other, false),
        };
        self.mapping.store_u64(offset, value, store_order)?;
        if fence_after {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        Ok(())
    }

    fn fetch_add_u64(
        &self,
        _offset: usize,
        _value: u64,
        _order: Ordering,
    ) -> Result<u64, WindowError> {
        Err(WindowError::Unsupported {
            operation: "fetch_add_u64",
            reason: "PCIe carries no read-modify-write a CPU can issue to a BAR: keep each \
                     index single-writer and use plain stores",
        })
    }

    fn store_fence(&self) {
        store_fence();
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self.release {
            Release::Unmap { mapped_len } => {
                // SAFETY: `base..base + mapped_len` is exactly the mapping
                // made in `map_shared`, owned by this value alone, and no
                // reference into it exists (none is ever handed out).
                let result = unsafe { mm::munmap(self.base.as_ptr().cast(), mapped_len) };
                // munmap of a range we mapped cannot fail short of a kernel
                // bug; leaking the mapping is the only safe response anyway.
                debug_assert!(result.is_ok(), "munmap failed: {result:?}");
            }
            Release::Dealloc { layout } => {
                // SAFETY: `base` came from `alloc_zeroed(layout)` in
                // `zeroed_heap` and is freed only here.
                unsafe { alloc::dealloc(self.base.as_ptr(), layout) };
            }
            Release::Borrowed => {}
        }
    }
}

/// Loads can be Relaxed, Acquire or SeqCst (the standard library panics on
/// the others; a window returns an error instead).
#[inline]
fn check_load_ordering(order: Ordering) -> Result<(), WindowError> {
    match order {
        Ordering::Relaxed | Ordering::Acquire | Ordering::SeqCst => Ok(()),
        _ => Err(WindowError::InvalidOrdering {
            operation: "load",
            ordering: order,
        }),
    }
}

/// Stores can be Relaxed, Release or SeqCst.
#[inline]
pub(super) fn check_store_ordering(order: Ordering) -> Result<(), WindowError> {
    match order {
        Ordering::Relaxed | Ordering::Release | Ordering::SeqCst => Ok(()),
        _ => Err(WindowError::InvalidOrdering {
            operation: "store",
            ordering: order,
        }),
    }
}

/// The kernel behind [`copy_bytes`] for long copies on this CPU, for
/// reports.
pub fn copy_kernel() -> &'static str {
    if avx2_copies() {
        "avx2 32-byte moves"
    } else {
        "memcpy"
    }
}

/// Whether long copies take [`copy_avx2`] rather than `memcpy`: on AMD CPUs
/// with AVX2, whose `memcpy` falls off a cliff at some placements (design
/// change 18; on Zen 4 a milder one, design change 35). Elsewhere
/// `memcpy` measured as fast or faster at every size and placement tried
/// (design change 23). A `portable` limit ([`crate::cpu::IsaLimit`]) keeps
/// them off too. Checked once.
#[inline]
fn avx2_copies() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2_COPIES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2_COPIES.get_or_init(|| {
            crate::cpu::is_amd()
                && crate::cpu::isa_limit() >= crate::cpu::IsaLimit::Avx2
                && std::arch::is_x86_feature_detected!("avx2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Takes the cache line holding `line` for this core, in the state a write
/// needs (`prefetchw`): a hint that changes nothing the program can observe
/// and never faults, whatever the address. Does nothing off x86-64.
///
/// # Safety
/// The CPU must have `prefetchw` ([`crate::cpu::has_prefetchw`]).
#[inline]
pub(crate) unsafe fn prefetch_line_for_write(line: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked that the CPU has the instruction; it
    // reads and writes nothing the program can observe.
    unsafe {
        std::arch::asm!(
            "prefetchw [{line}]",
            line = in(reg) line,
            options(nostack, preserves_flags, readonly),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// Copies below this many bytes go to `memcpy`, whose small-size paths
/// are as good as any and which has no placement cliff there.
const VECTOR_COPY_MIN: usize = 512;

/// Copies `len` bytes from `src` to `dst` (see the module documentation for
/// why not always `memcpy`).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes; the ranges do not
/// overlap.
#[inline]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= VECTOR_COPY_MIN && avx2_copies() {
        // SAFETY: AVX2 is present (checked by `avx2_copies`); the ranges
        // are the caller's contract.
        unsafe { copy_avx2(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(src, dst, len) };
}

/// [`copy_bytes`] with 32-byte loads and stores, 128 bytes a round; the
/// last partial round through `memcpy`.
///
/// # Safety
/// The CPU has AVX2; otherwise as [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{_mm256_loadu_si256, _mm256_storeu_si256};
    let mut at = 0;
    while at + 128 <= len {
        // SAFETY: `at + 128 <= len`: all four loads and stores are inside
        // the caller's ranges; unaligned accesses are allowed.
        unsafe {
            let block = [
                _mm256_loadu_si256(src.add(at).cast()),
                _mm256_loadu_si256(src.add(at + 32).cast()),
                _mm256_loadu_si256(src.add(at + 64).cast()),
                _mm256_loadu_si256(src.add(at + 96).cast()),
            ];
            for (index, vector) in block.into_iter().enumerate() {
                _mm256_storeu_si256(dst.add(at + 32 * index).cast(), vector);
            }
        }
        at += 128;
    }
    // SAFETY: the remaining `len - at` bytes of both ranges.
    unsafe { ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
}

/// [`copy_bytes`] for a destination nobody will read soon (a large
/// message landing): where [`streams_large_copies`](crate::crc::streams_large_copies),
/// whole 64-byte lines of `dst` are written by non-temporal stores, then
/// fenced, so the copy is ordered before later stores as `copy_bytes` is.
///
/// # Safety
/// As [`copy_bytes`].
pub(crate) unsafe fn copy_bytes_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if crate::crc::streams_large_copies() {
        let head = dst.align_offset(64).min(len);
        // SAFETY: the caller's ranges, split at `head <= len`; the CPU has
        // AVX-512F (the 512-bit kernels' check).
        unsafe {
            copy_bytes(src, dst, head);
            copy_avx512_streaming(src.add(head), dst.add(head), len - head);
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { copy_bytes(src, dst, len) };
}

/// 256-byte rounds by non-temporal stores, the rest (under 256 bytes)
/// through [`copy_bytes`]; a store fence at the end.
///
/// # Safety
/// The CPU has AVX-512F; `dst` is 64-byte aligned; otherwise as
/// [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_avx512_streaming(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{_mm_sfence, _mm512_loadu_si512, _mm512_stream_si512};
    let mut at = 0;
    while at + 256 <= len {
        // SAFETY: `at + 256 <= len`: all four loads and stores are inside
        // the caller's ranges; `dst + at` is 64-byte aligned (contract).
        unsafe {
            let block = [
                _mm512_loadu_si512(src.add(at).cast()),
                _mm512_loadu_si512(src.add(at + 64).cast()),
                _mm512_loadu_si512(src.add(at + 128).cast()),
                _mm512_loadu_si512(src.add(at + 192).cast()),
            ];
            for (index, line) in block.into_iter().enumerate() {
                _mm512_stream_si512(dst.add(at + 64 * index).cast(), line);
            }
        }
        at += 256;
    }
    // SAFETY: the remaining `len - at` bytes of both ranges; the fence
    // orders the non-temporal stores before every later store.
    unsafe {
        copy_bytes(src.add(at), dst.add(at), len - at);
        _mm_sfence();
    }
}

/// [`Window::store_fence`](super::Window::store_fence) for a mapping of
/// ordinary write-back host memory, written with ordinary stores only (no
/// write-combining, no non-temporal stores: `copy_bytes` and the CRC
/// kernels use neither when they write into a window; the streaming
/// copies out of one write caller memory and fence themselves). There,
/// the `Release` store of the index that follows already orders every
/// earlier store before it (on x86 every
/// store is ordered; elsewhere `Release` does it), so only the compiler
/// must not move stores across this point.
///
/// An `sfence` here would add to every small message's latency (design
/// change 21): it waits for the stores before it, whose cache lines the
/// peer holds.
#[inline]
pub(crate) fn host_store_fence() {
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// Orders every store before it, including write-combined and
/// non-temporal ones, before every store after it: the default for a
/// window that may be device memory.
///
/// See [`Window::store_fence`](super::Window::store_fence) for why the ring
/// needs this on top of a Release store.
#[inline]
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has; it
        // has no operands and touches no memory.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Elsewhere (aarch64: `dmb ish`), a sequentially consistent fence is
        // the strongest portable barrier; device-memory barriers (`dmb
        // oshst`) belong with the BAR windows that need them.
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Window;

    /// Device memory over a heap region that `backing` keeps alive.
    fn device_memory(backing: &Mapping, access: DeviceAccess) -> DeviceMemory {
        // SAFETY: the caller keeps `backing` alive (and reference-free)
        // for as long as the returned value is used.
        unsafe { DeviceMemory::new(backing.base, backing.len, access) }
    }

    const READ_WRITE: DeviceAccess = DeviceAccess {
        read: true,
        write: true,
    };

    /// The hints clip their ranges to the region: ranges that run past its
    /// end, start at it, or would overflow the address arithmetic are
    /// taken without a fault, and nothing they touch changes.
    #[test]
    fn prefetch_hints_clip_to_the_region_and_change_nothing() {
        let window = crate::window::HeapWindow::new(4096).unwrap();
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        window.write(0, &pattern).unwrap();
        for (offset, len) in [(0, 256), (4000, 256), (4096, 64), (usize::MAX - 8, 256)] {
            window.prefetch(offset, len);
            window.prefetch_for_write(offset, len);
        }
        let mut back = vec![0u8; 4096];
        window.read(0, &mut back).unwrap();
        assert_eq!(back, pattern);
    }

    #[test]
    fn device_memory_checks_range_alignment_and_ordering() {
        let backing = Mapping::zeroed_heap(4096).unwrap();
        let memory = device_memory(&backing, READ_WRITE);
        memory.write(10, &[1, 2, 3]).unwrap();
        let mut back = [0u8; 3];
        memory.read(10, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
        assert!(matches!(
            memory.write(4095, &[0, 0]),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(matches!(
            memory.read(usize::MAX, &mut back),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(matches!(
            memory.load_u64(4, Ordering::Acquire),
            Err(WindowError::Misaligned { offset: 4, .. })
        ));
        assert!(matches!(
            memory.store_u64(8, 1, Ordering::Acquire),
            Err(WindowError::InvalidOrdering { .. })
        ));
        memory.store_u64(8, 7, Ordering::SeqCst).unwrap();
        assert_eq!(memory.load_u64(8, Ordering::Acquire), Ok(7));
        assert!(matches!(
            memory.fetch_add_u64(8, 1, Ordering::AcqRel),
            Err(WindowError::Unsupported { .. })
        ));
        memory.write_u32(16, 0xdead_beef).unwrap();
        assert_eq!(memory.read_u32(16), Ok(0xdead_beef));
        memory.write_u64(24, u64::MAX).unwrap();
        assert_eq!(memory.read_u64(24), Ok(u64::MAX));
        assert!(memory.read_u32(18).is_err());
        assert!(memory.write_u64(4096, 0).is_err());
        assert_eq!(
            memory.address_of(4096),
            Ok(backing.base.as_ptr() as u64 + 4096)
        );
        assert!(memory.address_of(4097).is_err());
    }

    #[test]
    fn read_only_device_memory_refuses_writes() {
        let backing = Mapping::zeroed_heap(4096).unwrap();
        let memory = device_memory(
            &backing,
            DeviceAccess {
                read: true,
                write: false,
            },
        );
        assert!(matches!(
            memory.write(0, &[1]),
            Err(WindowError::Unsupported { .. })
        ));
        assert!(memory.store_u64(0, 1, Ordering::Release).is_err());
        assert!(memory.write_u32(0, 1).is_err());
        let mut byte = [9u8];
        memory.read(0, &mut byte).unwrap();
        assert_eq!(byte, [0]);
        let write_only = device_memory(
            &backing,
            DeviceAccess {
                read: false,
                write: true,
            },
        );
        assert!(write_only.read(0, &mut byte).is_err());
        assert!(write_only.load_u64(0, Ordering::Acquire).is_err());
        assert!(write_only.read_u64(0).is_err());
    }

    #[test]
    fn copies_are_exact_at_every_length_and_placement() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 131 + i / 7) as u8).collect();
        for len in (0..700).chain([1023, 1024, 1025, 4095, 4096, 8191]) {
            for (src_off, dst_off) in [(0, 0), (1, 17), (16, 0), (33, 63)] {
                let mut out = vec![0xA5u8; len + 128];
                // SAFETY: both ranges lie inside their vectors, which do
                // not overlap.
                unsafe { copy_bytes(data[src_off..].as_ptr(), out[dst_off..].as_mut_ptr(), len) };
                assert_eq!(&out[dst_off..dst_off + len], &data[src_off..src_off + len]);
                assert!(
                    out[..dst_off]
                        .iter()
                        .chain(&out[dst_off + len..])
                        .all(|&b| b == 0xA5),
                    "len {len}: wrote outside"
                );
            }
        }
    }

    #[test]
    fn streaming_copies_are_exact_at_every_length_and_alignment() {
        if !crate::crc::streams_large_copies() {
            eprintln!(
                "SKIPPED window::mapping::streaming_copies_are_exact_at_every_length_and_alignment: \
                 this CPU lacks AVX-512F/VL or VPCLMULQDQ (streaming copies are plain copies here)"
            );
            return;
        }
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 131 + i / 7) as u8).collect();
        let mut out = vec![0xA5u8; 9000 + 256];
        let aligned = out.as_ptr().align_offset(64);
        for dst_off in 0..64 {
            for len in (0..700).chain([1023, 1024, 1025, 4095, 4096, 8191]) {
                let src_off = dst_off % 5;
                let at = aligned + dst_off;
                out.fill(0xA5);
                // SAFETY: both ranges lie inside their vectors, which do
                // not overlap.
                unsafe {
                    copy_bytes_streaming(data[src_off..].as_ptr(), out.as_mut_ptr().add(at), len)
                };
                assert_eq!(&out[at..at + len], &data[src_off..src_off + len]);
                assert!(
                    out[..at].iter().chain(&out[at + len..]).all(|&b| b == 0xA5),
                    "len {len} dst_off {dst_off}: wrote outside"
                );
            }
        }
    }

    #[test]
    fn heap_region_is_zeroed_and_page_aligned() {
        let map = Mapping::zeroed_heap(10_000).unwrap();
        assert_eq!(map.base.as_ptr() as usize % HEAP_ALIGN, 0);
        let mut buf = vec![0xffu8; 10_000];
        map.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn zero_and_huge_heap_lengths_are_errors() {
        assert!(matches!(
            Mapping::zeroed_heap(0),
            Err(WindowError::InvalidLength { len: 0, .. })
        ));
        assert!(matches!(
            Mapping::zeroed_heap(usize::MAX),
            Err(WindowError::InvalidLength { .. })
        ));
    }

    #[test]
    fn orderings_that_std_would_panic_on_are_errors() {
        let map = Mapping::zeroed_heap(64).unwrap();
        for bad in [Ordering::Release, Ordering::AcqRel] {
            assert!(matches!(
                map.load_u64(0, bad),
                Err(WindowError::InvalidOrdering {
                    operation: "load",
                    ..
                })
            ));
        }
        for bad in [Ordering::Acquire, Ordering::AcqRel] {
            assert!(matches!(
                map.store_u64(0, 1, bad),
                Err(WindowError::InvalidOrdering {
                    operation: "store",
                    ..
                })
            ));
        }
        assert_eq!(map.fetch_add_u64(8, 5, Ordering::AcqRel), Ok(0));
        assert_eq!(map.load_u64(8, Ordering::SeqCst), Ok(5));
    }

    #[test]
    fn word_checks_range_before_alignment_and_never_overflows() {
        let map = Mapping::zeroed_heap(64).unwrap();
        assert!(map.word(56).is_ok());
        assert!(matches!(
            map.word(60),
            Err(WindowError::OutOfBounds {
                offset: 60,
                len: 8,
                window_len: 64
            })
        ));
        assert!(matches!(
            map.word(4),
            Err(WindowError::Misaligned {
                offset: 4,
                align: 8
            })
        ));
        assert!(matches!(
            map.word(usize::MAX - 7),
            Err(WindowError::OutOfBounds { .. })
        ));
    }
}
