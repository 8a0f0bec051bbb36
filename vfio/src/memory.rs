//! [`Region`]: the only code in this crate that holds a raw pointer into
//! mapped memory — a BAR mapped through VFIO or sysfs, or anonymous memory
//! handed to a device for DMA — and so, with [`crate::sys`], the only code
//! allowed `unsafe`.
//!
//! It mirrors the transport's private `window::mapping` module (which this
//! crate cannot reach): every accessor checks its range before forming a
//! pointer, data moves by `ptr::copy_nonoverlapping` (wide stores that
//! write-combining merges into bursts), ring indices by 64-bit atomics, and
//! device registers by exact-width volatile accesses. No reference into the
//! region is ever handed out: a device or another process may write it at
//! any moment, which Rust references cannot describe.
//!
//! Differences for device memory: `fetch_add` is refused (PCIe carries no
//! read-modify-write a CPU can issue to a peer BAR), a `SeqCst` store is a
//! `Release` store followed by a full fence (not `xchg`, a locked
//! read-modify-write on uncached memory), and a read-only region refuses
//! writes instead of faulting.

use std::any::Any;
use std::fmt;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use barlink_transport::window::WindowError;

use crate::sys::{Errno, Prot, VfioSys};

/// Whatever must stay alive while a region is mapped (the device, or the
/// `resourceN` file) and is released only after the `munmap`.
pub(crate) type Owner = Arc<dyn Any + Send + Sync>;

/// A mapped region, unmapped (through the same [`VfioSys`]) when dropped.
///
/// Public only so that sealed traits can name it; this module is private,
/// and every method is crate-private.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    prot: Prot,
    sys: Arc<dyn VfioSys>,
    /// Dropped after the `munmap` in `drop` (fields drop after the body).
    _owner: Option<Owner>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("prot", &self.prot)
            .finish_non_exhaustive()
    }
}

// SAFETY: a `Region` owns its mapping exclusively (unmapped only in
// `drop`); every access is a raw-pointer copy, a volatile access or an
// atomic, all valid from any thread; no reference into it is handed out.
unsafe impl Send for Region {}
// SAFETY: as above; concurrent use from several threads is what the
// accessors are for.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes of `fd` at `offset` (shared), or anonymous zeroed
    /// memory when `fd` is `None`, keeping `owner` alive until unmapped.
    pub(crate) fn map(
        sys: Arc<dyn VfioSys>,
        fd: Option<RawFd>,
        len: usize,
        offset: u64,
        prot: Prot,
        owner: Option<Owner>,
    ) -> Result<Region, Errno> {
        let base = sys.mmap(fd, len, offset, prot)?;
        Ok(Region {
            base,
            len,
            prot,
            sys,
            _owner: owner,
        })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Protection it was mapped with.
    pub(crate) fn prot(&self) -> Prot {
        self.prot
    }

    /// The virtual address of byte `offset` (for DMA mapping and messages;
    /// never dereferenced outside this module).
    pub(crate) fn address_of(&self, offset: usize) -> u64 {
        self.base.as_ptr() as u64 + offset as u64
    }

    fn check_write(&self) -> Result<(), WindowError> {
        if self.prot.write {
            Ok(())
        } else {
            Err(WindowError::Unsupported {
                operation: "write",
                reason: "the region is mapped read-only (its VFIO flags lack WRITE)",
            })
        }
    }

    fn check_read(&self) -> Result<(), WindowError> {
        if self.prot.read {
            Ok(())
        } else {
            Err(WindowError::Unsupported {
                operation: "read",
                reason: "the region is mapped write-only (its VFIO flags lack READ)",
            })
        }
    }

    /// Copies `src` to `offset`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        check_range(offset, src.len(), self.len)?;
        self.check_write()?;
        // SAFETY: `offset + src.len() <= self.len` (checked, no overflow), so
        // the destination is inside the live, writable mapping; `src` is a
        // Rust slice elsewhere, so the ranges cannot overlap.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len)?;
        self.check_read()?;
        // SAFETY: the source range is inside the live, readable mapping
        // (checked); `dst` is an exclusive Rust slice, so no overlap.
        unsafe {
            ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// A pointer to the `size`-byte word at `offset`, checked for range and
    /// alignment.
    fn word(&self, offset: usize, size: usize) -> Result<*mut u8, WindowError> {
        check_range(offset, size, self.len)?;
        // SAFETY: `offset + size <= self.len` (checked above), so the
        // pointer stays inside the live mapping.
        let word = unsafe { self.base.as_ptr().add(offset) };
        if !(word as usize).is_multiple_of(size) {
            return Err(WindowError::Misaligned {
                offset,
                align: size,
            });
        }
        Ok(word)
    }

    /// Atomic load of the u64 at `offset`.
    pub(crate) fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        if !matches!(
            order,
            Ordering::Relaxed | Ordering::Acquire | Ordering::SeqCst
        ) {
            return Err(WindowError::InvalidOrdering {
                operation: "load",
                ordering: order,
            });
        }
        self.check_read()?;
        let word = self.word(offset, 8)?.cast::<u64>();
        // SAFETY: in bounds and 8-byte aligned (checked by `word`); the
        // mapping outlives the call; index words are only ever accessed
        // atomically, and concurrent writers (other processes, devices) are
        // what `AtomicU64` permits.
        let atomic = unsafe { AtomicU64::from_ptr(word) };
        Ok(atomic.load(order))
    }

    /// Atomic store of the u64 at `offset`.
    pub(crate) fn store_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<(), WindowError> {
        let (store_order, fence_after) = match order {
            Ordering::Relaxed => (Ordering::Relaxed, false),
            Ordering::Release => (Ordering::Release, false),
            // Not `xchg`: a locked read-modify-write on uncached device
            // memory. A release store plus a full fence orders the same.
            Ordering::SeqCst => (Ordering::Release, true),
            _ => {
                return Err(WindowError::InvalidOrdering {
                    operation: "store",
                    ordering: order,
                });
            }
        };
        self.check_write()?;
        let word = self.word(offset, 8)?.cast::<u64>();
        // SAFETY: as in `load_u64`.
        let atomic = unsafe { AtomicU64::from_ptr(word) };
        atomic.store(value, store_order);
        if fence_after {
            fence(Ordering::SeqCst);
        }
        Ok(())
    }

    /// Volatile 32-bit read of a device register at `offset`.
    pub(crate) fn read_u32(&self, offset: usize) -> Result<u32, WindowError> {
        self.check_read()?;
        let word = self.word(offset, 4)?.cast::<u32>();
        // SAFETY: in bounds and 4-byte aligned (checked by `word`) inside
        // the live mapping; a volatile access of exactly this width is what
        // a device register needs.
        Ok(unsafe { ptr::read_volatile(word) })
    }

    /// Volatile 32-bit write of a device register at `offset`.
    pub(crate) fn write_u32(&self, offset: usize, value: u32) -> Result<(), WindowError> {
        self.check_write()?;
        let word = self.word(offset, 4)?.cast::<u32>();
        // SAFETY: as in `read_u32`.
        unsafe { ptr::write_volatile(word, value) };
        Ok(())
    }

    /// Volatile 64-bit read of a device register at `offset`.
    pub(crate) fn read_u64(&self, offset: usize) -> Result<u64, WindowError> {
        self.check_read()?;
        let word = self.word(offset, 8)?.cast::<u64>();
        // SAFETY: in bounds and 8-byte aligned (checked by `word`).
        Ok(unsafe { ptr::read_volatile(word) })
    }

    /// Volatile 64-bit write of a device register at `offset`.
    pub(crate) fn write_u64(&self, offset: usize, value: u64) -> Result<(), WindowError> {
        self.check_write()?;
        let word = self.word(offset, 8)?.cast::<u64>();
        // SAFETY: in bounds and 8-byte aligned (checked by `word`).
        unsafe { ptr::write_volatile(word, value) };
        Ok(())
    }

    /// `VFIO_IOMMU_MAP_DMA` of `len` bytes at `offset` of this region.
    ///
    /// The caller keeps an `Arc` of this region in the returned mapping's
    /// owner until it has unmapped the IOVA range, so the memory outlives
    /// every device access.
    pub(crate) fn map_dma(
        self: &Arc<Self>,
        container: RawFd,
        offset: usize,
        len: usize,
        iova: u64,
        flags: u32,
    ) -> Result<(), Errno> {
        check_range(offset, len, self.len).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: the range lies inside this live mapping (checked); the
        // caller holds an `Arc<Region>` until it unmaps the IOVA range, so
        // the memory stays mapped as long as the device can reach it; Rust
        // code reaches it only through this module's raw accessors.
        unsafe {
            self.sys
                .map_dma(container, self.address_of(offset), iova, len as u64, flags)
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` is exactly the mapping made in `map`, owned
        // by this value alone; no reference into it exists, and nothing
        // touches it after this.
        let result = unsafe { self.sys.munmap(self.base, self.len) };
        // munmap of our own mapping fails only through a bug (or a mock told
        // to); leaking it is the only safe response.
        let _ = result;
    }
}

/// Checks that `offset..offset + len` lies within `window_len` bytes without
/// overflow (the transport's range check, which is private to it).
pub(crate) fn check_range(offset: usize, len: usize, window_len: usize) -> Result<(), WindowError> {
    match offset.checked_add(len) {
        Some(end) if end <= window_len => Ok(()),
        _ => Err(WindowError::OutOfBounds {
            offset,
            len,
            window_len,
        }),
    }
}

/// Orders every earlier store, including write-combined ones, before every
/// later store (`sfence` on x86_64).
#[inline]
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has; it
        // takes no operands and touches no memory.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mock::MockSys;

    fn region(len: usize, prot: Prot) -> (Arc<MockSys>, Region) {
        let sys = Arc::new(MockSys::new());
        let region = Region::map(sys.clone(), None, len, 0, prot, None).unwrap();
        (sys, region)
    }

    #[test]
    fn accessors_check_range_alignment_and_ordering() {
        let (sys, region) = region(4096, Prot::READ_WRITE);
        region.write(10, &[1, 2, 3]).unwrap();
        let mut back = [0u8; 3];
        region.read(10, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
        assert!(matches!(
            region.write(4095, &[0, 0]),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(matches!(
            region.read(usize::MAX, &mut back),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(matches!(
            region.load_u64(4, Ordering::Acquire),
            Err(WindowError::Misaligned {
                offset: 4,
                align: 8
            })
        ));
        assert!(matches!(
            region.store_u64(8, 1, Ordering::Acquire),
            Err(WindowError::InvalidOrdering { .. })
        ));
        region.store_u64(8, 7, Ordering::SeqCst).unwrap();
        assert_eq!(region.load_u64(8, Ordering::Acquire), Ok(7));
        region.write_u32(16, 0xdead_beef).unwrap();
        assert_eq!(region.read_u32(16), Ok(0xdead_beef));
        region.write_u64(24, u64::MAX).unwrap();
        assert_eq!(region.read_u64(24), Ok(u64::MAX));
        assert!(region.read_u32(18).is_err());
        drop(region);
        assert_eq!(sys.live_mappings(), 0);
        assert_eq!(sys.ops(), ["mmap", "munmap"]);
    }

    #[test]
    fn a_read_only_region_refuses_writes() {
        let (_sys, region) = region(
            4096,
            Prot {
                read: true,
                write: false,
            },
        );
        assert!(matches!(
            region.write(0, &[1]),
            Err(WindowError::Unsupported { .. })
        ));
        assert!(region.store_u64(0, 1, Ordering::Release).is_err());
        assert!(region.write_u32(0, 1).is_err());
        let mut byte = [9u8];
        region.read(0, &mut byte).unwrap();
        assert_eq!(byte, [0]);
    }
}
