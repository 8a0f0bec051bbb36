//! [`Region`]: the lifetime of a mapping this crate made — a BAR mapped
//! through VFIO or sysfs, or anonymous memory handed to a device for DMA —
//! and nothing else.
//!
//! Every access to the memory goes through the transport's
//! [`DeviceMemory`] (`window::mapping`, the workspace's one module with
//! pointers into mapped memory): checked copies, index atomics with device
//! semantics, exact-width register accesses. What stays here is what only
//! this crate can do, and is `unsafe` because it hands addresses to the
//! kernel: `munmap` when the region drops, and `VFIO_IOMMU_MAP_DMA` of a
//! range of it.

use std::any::Any;
use std::fmt;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use barlink_transport::window::{DeviceAccess, DeviceMemory};

use super::{Errno, Prot, VfioSys};

/// Whatever must stay alive while a region is mapped (the device, or the
/// `resourceN` file) and is released only after the `munmap`.
pub(crate) type Owner = Arc<dyn Any + Send + Sync>;

/// A mapped region, unmapped (through the same [`VfioSys`]) when dropped.
///
/// Public only so that sealed traits can name it; every method is
/// crate-private.
pub struct Region {
    memory: DeviceMemory,
    base: NonNull<u8>,
    len: usize,
    prot: Prot,
    sys: Arc<dyn VfioSys>,
    /// The descriptor mapped, if any; open while the region is (its owner
    /// keeps it).
    fd: Option<RawFd>,
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

// SAFETY: `base` is only an address kept for `munmap` and DMA mapping; it
// is never dereferenced here. The memory is reached only through
// `DeviceMemory`, whose accessors are valid from any thread.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` hands out nothing but those accessors.
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
        let access = DeviceAccess {
            read: prot.read,
            write: prot.write,
        };
        // SAFETY: `mmap` just mapped `len` bytes at `base` with `prot`; they
        // stay mapped until `drop` below, which runs only after the
        // `DeviceMemory` (a field of this value) can no longer be used, and
        // no reference into them is formed anywhere.
        let memory = unsafe { DeviceMemory::new(base, len, access) };
        Ok(Region {
            memory,
            base,
            len,
            prot,
            sys,
            fd,
            _owner: owner,
        })
    }

    /// The memory, through the transport's checked accessors.
    pub(crate) fn memory(&self) -> &DeviceMemory {
        &self.memory
    }

    /// The system-call layer it was mapped through.
    pub(crate) fn sys(&self) -> &Arc<dyn VfioSys> {
        &self.sys
    }

    /// The descriptor it maps (`None` for anonymous memory).
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd
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
    /// a number, never dereferenced).
    pub(crate) fn address_of(&self, offset: usize) -> u64 {
        self.base.as_ptr() as u64 + offset as u64
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
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(Errno(libc::EINVAL)),
        }
        // SAFETY: the range lies inside this live mapping (checked); the
        // caller holds an `Arc<Region>` until it unmaps the IOVA range, so
        // the memory stays mapped as long as the device can reach it; Rust
        // code reaches it only through `DeviceMemory`'s accessors.
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
        // touches it after this (the `DeviceMemory` goes with this value).
        let result = unsafe { self.sys.munmap(self.base, self.len) };
        // munmap of our own mapping fails only through a bug (or a mock told
        // to); leaking it is the only safe response.
        let _ = result;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use barlink_transport::window::{Window, WindowError};

    use super::*;
    use crate::sys::mock::MockSys;

    fn region(len: usize, prot: Prot) -> (Arc<MockSys>, Region) {
        let sys = Arc::new(MockSys::new());
        let region = Region::map(sys.clone(), None, len, 0, prot, None).unwrap();
        (sys, region)
    }

    #[test]
    fn accesses_go_through_device_memory_and_drop_unmaps() {
        let (sys, region) = region(4096, Prot::READ_WRITE);
        let memory = region.memory();
        memory.write(10, &[1, 2, 3]).unwrap();
        let mut back = [0u8; 3];
        memory.read(10, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
        assert!(matches!(
            memory.write(4095, &[0, 0]),
            Err(WindowError::OutOfBounds { .. })
        ));
        memory.store_u64(8, 7, Ordering::SeqCst).unwrap();
        assert_eq!(memory.load_u64(8, Ordering::Acquire), Ok(7));
        memory.write_u32(16, 0xdead_beef).unwrap();
        assert_eq!(memory.read_u32(16), Ok(0xdead_beef));
        assert_eq!(region.address_of(16), region.address_of(0) + 16);
        drop(region);
        assert_eq!(sys.live_mappings(), 0);
        assert_eq!(sys.ops(), ["mmap", "munmap"]);
    }

    #[test]
    fn the_mapping_protection_is_what_device_memory_enforces() {
        let (_sys, region) = region(
            4096,
            Prot {
                read: true,
                write: false,
            },
        );
        assert_eq!(
            region.memory().access(),
            DeviceAccess {
                read: true,
                write: false
            }
        );
        assert!(matches!(
            region.memory().write(0, &[1]),
            Err(WindowError::Unsupported { .. })
        ));
    }

    #[test]
    fn dma_mapping_refuses_a_range_outside_the_region() {
        let sys = Arc::new(MockSys::new());
        let region = Arc::new(Region::map(sys, None, 4096, 0, Prot::READ_WRITE, None).unwrap());
        assert_eq!(region.map_dma(3, 4000, 200, 0, 0), Err(Errno(libc::EINVAL)));
        assert_eq!(
            region.map_dma(3, usize::MAX, 2, 0, 0),
            Err(Errno(libc::EINVAL))
        );
    }
}
