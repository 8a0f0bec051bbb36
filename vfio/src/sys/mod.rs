//! The system-call layer under VFIO and BAR windows: one trait,
//! [`VfioSys`], with a method per VFIO ioctl and per memory call, so that
//! everything above it is plain safe code that a test can run against
//! [`mock::MockSys`] instead of the kernel (the shape rust-vmm's
//! `vfio-ioctls` uses).
//!
//! [`LinuxSys`] is the real implementation over `libc` (and `rustix::mm`
//! for mmap, as the transport maps its windows). The structures, flags and
//! capability ids of `<linux/vfio.h>` come from `vfio-bindings` (rust-vmm's
//! bindgen output, committed in that crate: no build step); the ioctl
//! numbers, which bindgen cannot translate from the header's `_IO` macros,
//! are computed here from its `VFIO_TYPE` and `VFIO_BASE`.
//!
//! File descriptors cross this layer as plain [`RawFd`] numbers, owned by the
//! handles above (which close them through [`VfioSys::close`], so that a
//! mock sees every close and its order). Failures are an [`Errno`], which
//! is `Copy + Eq` so errors built from it can be matched in tests.

pub mod mock;
pub mod region;

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::mem::offset_of;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use rustix::mm::{self, MapFlags, ProtFlags};
use vfio_bindings::bindings::vfio;
use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_info_cap_header, vfio_iommu_type1_dma_map,
    vfio_iommu_type1_dma_unmap, vfio_iommu_type1_info, vfio_region_info,
    vfio_region_info_cap_sparse_mmap, vfio_region_sparse_mmap_area,
};

/// A failed system call's `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's current `errno`.
    pub fn last() -> Errno {
        Errno(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Whether this is a refusal for lack of privilege (`EACCES`, `EPERM`).
    pub fn is_permission(self) -> bool {
        self.0 == libc::EACCES || self.0 == libc::EPERM
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        io::Error::from_raw_os_error(self.0).fmt(f)
    }
}

/// Result of a system call.
pub type SysResult<T> = Result<T, Errno>;

/// `VFIO_API_VERSION`: the only API version there has ever been.
pub const VFIO_API_VERSION: i32 = vfio::VFIO_API_VERSION as i32;
/// `VFIO_TYPE1_IOMMU`.
pub const VFIO_TYPE1_IOMMU: u32 = vfio::VFIO_TYPE1_IOMMU;
/// `VFIO_TYPE1v2_IOMMU` (preferred: stricter unmap semantics).
pub const VFIO_TYPE1V2_IOMMU: u32 = vfio::VFIO_TYPE1v2_IOMMU;
/// `VFIO_NOIOMMU_IOMMU` (unsafe no-IOMMU mode; barlink never selects it).
pub const VFIO_NOIOMMU_IOMMU: u32 = vfio::VFIO_NOIOMMU_IOMMU;

/// `VFIO_GROUP_FLAGS_VIABLE`: every device of the group is bound to a VFIO
/// driver (or to none).
pub const GROUP_FLAGS_VIABLE: u32 = vfio::VFIO_GROUP_FLAGS_VIABLE;
/// `VFIO_GROUP_FLAGS_CONTAINER_SET`.
pub const GROUP_FLAGS_CONTAINER_SET: u32 = vfio::VFIO_GROUP_FLAGS_CONTAINER_SET;

/// `VFIO_DEVICE_FLAGS_RESET`.
pub const DEVICE_FLAGS_RESET: u32 = vfio::VFIO_DEVICE_FLAGS_RESET;
/// `VFIO_DEVICE_FLAGS_PCI`.
pub const DEVICE_FLAGS_PCI: u32 = vfio::VFIO_DEVICE_FLAGS_PCI;

/// `VFIO_REGION_INFO_FLAG_READ`.
pub const REGION_FLAG_READ: u32 = vfio::VFIO_REGION_INFO_FLAG_READ;
/// `VFIO_REGION_INFO_FLAG_WRITE`.
pub const REGION_FLAG_WRITE: u32 = vfio::VFIO_REGION_INFO_FLAG_WRITE;
/// `VFIO_REGION_INFO_FLAG_MMAP`.
pub const REGION_FLAG_MMAP: u32 = vfio::VFIO_REGION_INFO_FLAG_MMAP;
/// `VFIO_REGION_INFO_FLAG_CAPS`.
pub const REGION_FLAG_CAPS: u32 = vfio::VFIO_REGION_INFO_FLAG_CAPS;

/// `VFIO_DMA_MAP_FLAG_READ`: the device may read the memory.
pub const DMA_MAP_FLAG_READ: u32 = vfio::VFIO_DMA_MAP_FLAG_READ;
/// `VFIO_DMA_MAP_FLAG_WRITE`: the device may write the memory.
pub const DMA_MAP_FLAG_WRITE: u32 = vfio::VFIO_DMA_MAP_FLAG_WRITE;

/// `VFIO_IOMMU_INFO_PGSIZES`: `iova_pgsizes` is valid.
pub const IOMMU_INFO_PGSIZES: u32 = vfio::VFIO_IOMMU_INFO_PGSIZES;

/// Region indices of a vfio-pci device.
pub mod region_index {
    use vfio_bindings::bindings::vfio;

    /// BAR 0 (BARs 1–5 follow).
    pub const BAR0: u32 = vfio::VFIO_PCI_BAR0_REGION_INDEX;
    /// BAR 2: the shared memory of an ivshmem device.
    pub const BAR2: u32 = vfio::VFIO_PCI_BAR2_REGION_INDEX;
    /// BAR 5, the last.
    pub const BAR5: u32 = vfio::VFIO_PCI_BAR5_REGION_INDEX;
    /// The expansion ROM.
    pub const ROM: u32 = vfio::VFIO_PCI_ROM_REGION_INDEX;
    /// PCI configuration space (read and written with pread/pwrite).
    pub const CONFIG: u32 = vfio::VFIO_PCI_CONFIG_REGION_INDEX;
    /// Legacy VGA ranges.
    pub const VGA: u32 = vfio::VFIO_PCI_VGA_REGION_INDEX;
}

/// A region's description, as `VFIO_DEVICE_GET_REGION_INFO` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawRegionInfo {
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// The region index asked for.
    pub index: u32,
    /// Size in bytes (0: the device has nothing at this index).
    pub size: u64,
    /// Offset of the region in the device file (for mmap, pread, pwrite).
    pub offset: u64,
    /// `VFIO_REGION_INFO_CAP_SPARSE_MMAP` areas (offset, size) relative to
    /// the region, when only those parts may be mmapped.
    pub sparse_areas: Option<Vec<(u64, u64)>>,
    /// Why the region's capability chain could not be read, when it could
    /// not: then which parts may be mmapped is unknown.
    pub caps_unreadable: Option<String>,
}

/// `VFIO_DEVICE_GET_INFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawDeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// Number of regions (9 for vfio-pci, more with device-specific ones).
    pub num_regions: u32,
    /// Number of interrupt indices.
    pub num_irqs: u32,
}

/// `VFIO_IOMMU_GET_INFO` (type1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawIommuInfo {
    /// `VFIO_IOMMU_INFO_*`.
    pub flags: u32,
    /// Bitmap of the page sizes the IOMMU can map.
    pub iova_pgsizes: u64,
}

/// Memory protection of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prot {
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
}

impl Prot {
    /// Read and write.
    pub const READ_WRITE: Prot = Prot {
        read: true,
        write: true,
    };
}

/// Every system call the VFIO and BAR-window code makes.
///
/// Implementations: [`LinuxSys`] (the kernel) and [`mock::MockSys`] (tests).
/// Methods that hand memory to the kernel or a device are `unsafe`; their
/// callers (the crate's mapping module) state why each call is sound.
pub trait VfioSys: Send + Sync + fmt::Debug {
    /// Opens `path` read-write, close-on-exec.
    fn open(&self, path: &Path) -> SysResult<RawFd>;
    /// Closes a descriptor this layer returned.
    fn close(&self, fd: RawFd);
    /// The size of an open file (`fstat`), e.g. a sysfs `resourceN`.
    fn file_size(&self, fd: RawFd) -> SysResult<u64>;
    /// Locks bytes `offset..offset + len` of an open file for writing, for
    /// as long as the descriptor stays open (an open file description
    /// lock, `F_OFD_SETLK`): another open of the file, in this process or
    /// another, that holds any of those bytes makes it fail with `EAGAIN`
    /// or `EACCES`, without waiting.
    fn lock_range(&self, fd: RawFd, offset: u64, len: u64) -> SysResult<()>;

    /// `VFIO_GET_API_VERSION` on a container.
    fn get_api_version(&self, container: RawFd) -> SysResult<i32>;
    /// `VFIO_CHECK_EXTENSION` on a container: whether an IOMMU type exists.
    fn check_extension(&self, container: RawFd, extension: u32) -> SysResult<bool>;
    /// `VFIO_SET_IOMMU`.
    fn set_iommu(&self, container: RawFd, iommu_type: u32) -> SysResult<()>;
    /// `VFIO_IOMMU_GET_INFO`.
    fn iommu_get_info(&self, container: RawFd) -> SysResult<RawIommuInfo>;
    /// `VFIO_IOMMU_MAP_DMA`: lets devices of the container reach `size`
    /// bytes at `vaddr` of this process at I/O virtual address `iova`.
    ///
    /// # Safety
    /// `vaddr..vaddr + size` must be memory of this process that stays
    /// mapped until [`unmap_dma`](VfioSys::unmap_dma) of the same range,
    /// and that Rust code reaches only through volatile/atomic accessors
    /// (a device may write it at any time).
    unsafe fn map_dma(
        &self,
        container: RawFd,
        vaddr: u64,
        iova: u64,
        size: u64,
        flags: u32,
    ) -> SysResult<()>;
    /// `VFIO_IOMMU_UNMAP_DMA`; returns the bytes unmapped.
    fn unmap_dma(&self, container: RawFd, iova: u64, size: u64) -> SysResult<u64>;

    /// `VFIO_GROUP_GET_STATUS`: `VFIO_GROUP_FLAGS_*`.
    fn group_get_status(&self, group: RawFd) -> SysResult<u32>;
    /// `VFIO_GROUP_SET_CONTAINER`.
    fn group_set_container(&self, group: RawFd, container: RawFd) -> SysResult<()>;
    /// `VFIO_GROUP_UNSET_CONTAINER`.
    fn group_unset_container(&self, group: RawFd) -> SysResult<()>;
    /// `VFIO_GROUP_GET_DEVICE_FD` for the device named `name` (its address).
    fn group_get_device_fd(&self, group: RawFd, name: &CStr) -> SysResult<RawFd>;

    /// `VFIO_DEVICE_GET_INFO`.
    fn device_get_info(&self, device: RawFd) -> SysResult<RawDeviceInfo>;
    /// `VFIO_DEVICE_GET_REGION_INFO`, capabilities included.
    fn device_get_region_info(&self, device: RawFd, index: u32) -> SysResult<RawRegionInfo>;
    /// `VFIO_DEVICE_RESET`.
    fn device_reset(&self, device: RawFd) -> SysResult<()>;

    /// `pread` at an absolute file offset.
    fn pread(&self, fd: RawFd, buf: &mut [u8], offset: u64) -> SysResult<usize>;
    /// `pwrite` at an absolute file offset.
    fn pwrite(&self, fd: RawFd, buf: &[u8], offset: u64) -> SysResult<usize>;

    /// `mmap(MAP_SHARED)` of `len` bytes of `fd` at `offset`, or with `fd`
    /// `None`, `len` bytes of fresh anonymous memory (zeroed). The kernel
    /// chooses the address.
    fn mmap(
        &self,
        fd: Option<RawFd>,
        len: usize,
        offset: u64,
        prot: Prot,
    ) -> SysResult<NonNull<u8>>;
    /// `munmap`.
    ///
    /// # Safety
    /// `addr`/`len` must be exactly a mapping that [`mmap`](VfioSys::mmap)
    /// of this implementation returned, not unmapped before, and nothing
    /// may access it afterwards.
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> SysResult<()>;
}

/// The system's page size (what mmap offsets, DMA addresses and lengths
/// must be multiples of).
pub fn page_size() -> usize {
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// The real system calls, over `libc` and `rustix::mm`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSys;

// ioctl numbers: _IO(VFIO_TYPE, VFIO_BASE + n). _IO has no direction or
// size bits, so the number is (type << 8) | nr.
const fn vfio_io(n: u32) -> u64 {
    ((vfio::VFIO_TYPE as u64) << 8) | (vfio::VFIO_BASE + n) as u64
}
const VFIO_GET_API_VERSION: u64 = vfio_io(0);
const VFIO_CHECK_EXTENSION: u64 = vfio_io(1);
const VFIO_SET_IOMMU: u64 = vfio_io(2);
const VFIO_GROUP_GET_STATUS: u64 = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: u64 = vfio_io(4);
const VFIO_GROUP_UNSET_CONTAINER: u64 = vfio_io(5);
const VFIO_GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
const VFIO_DEVICE_GET_INFO: u64 = vfio_io(7);
const VFIO_DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
const VFIO_DEVICE_RESET: u64 = vfio_io(11);
const VFIO_IOMMU_GET_INFO: u64 = vfio_io(12);
const VFIO_IOMMU_MAP_DMA: u64 = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: u64 = vfio_io(14);

/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`, as the `u16` id of a capability
/// header.
const REGION_CAP_SPARSE_MMAP: u16 = vfio::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16;

/// `argsz` of a structure (all are a few dozen bytes).
fn argsz<T>() -> u32 {
    size_of::<T>() as u32
}

/// `argsz` for `VFIO_DEVICE_GET_INFO` and `VFIO_IOMMU_GET_INFO`: the
/// structure up to `cap_offset`, the version without a capability chain,
/// since barlink reads none of their capabilities (the kernel then writes
/// no more than this).
const DEVICE_INFO_ARGSZ: u32 = offset_of!(vfio_device_info, cap_offset) as u32;
const IOMMU_INFO_ARGSZ: u32 = offset_of!(vfio_iommu_type1_info, cap_offset) as u32;

/// An ioctl whose argument is an integer (or nothing).
fn ioctl_value(fd: RawFd, request: u64, value: libc::c_ulong) -> SysResult<libc::c_int> {
    // SAFETY: the VFIO requests passed here take their argument by value
    // (an integer), so the kernel dereferences no pointer of ours.
    let ret = unsafe { libc::ioctl(fd, request as _, value) };
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

/// An ioctl whose argument is a pointer to `arg`, which the kernel reads and
/// may write (never beyond `size_of::<T>()`, which `argsz` tells it).
fn ioctl_ptr<T>(fd: RawFd, request: u64, arg: &mut T) -> SysResult<libc::c_int> {
    // SAFETY: `arg` is a live, exclusive, properly aligned value of exactly
    // the type `request` expects (a `#[repr(C)]` struct whose leading
    // `argsz` field, set by the caller, bounds what the kernel reads and
    // writes, or a plain `i32` for VFIO_GROUP_SET_CONTAINER); no pointer to
    // it outlives the call.
    let ret = unsafe { libc::ioctl(fd, request as _, arg as *mut T) };
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

impl VfioSys for LinuxSys {
    fn open(&self, path: &Path) -> SysResult<RawFd> {
        let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: `path` is a NUL-terminated string that lives across the
        // call; `open` reads nothing else of ours.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 { Err(Errno::last()) } else { Ok(fd) }
    }

    fn close(&self, fd: RawFd) {
        // SAFETY: the handles above call this exactly once for a descriptor
        // this layer opened and they own; closing it affects nothing else.
        unsafe { libc::close(fd) };
    }

    fn lock_range(&self, fd: RawFd, offset: u64, len: u64) -> SysResult<()> {
        let start = libc::off_t::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        let len = libc::off_t::try_from(len).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: all-zero bytes are a valid `flock` (integers only); the
        // fields that matter are set below, and `l_pid` must stay 0 for an
        // open file description lock.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = start;
        lock.l_len = len;
        // SAFETY: `lock` is a valid `flock` that lives across the call;
        // `F_OFD_SETLK` reads it and never blocks.
        let ret = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &lock as *const libc::flock) };
        if ret < 0 { Err(Errno::last()) } else { Ok(()) }
    }

    fn file_size(&self, fd: RawFd) -> SysResult<u64> {
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `stat` is a writable buffer of the right type and size;
        // `fstat` fills it on success, and it is read only then.
        let ret = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
        if ret < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `fstat` succeeded, so it initialized the whole structure.
        let stat = unsafe { stat.assume_init() };
        Ok(stat.st_size as u64)
    }

    fn get_api_version(&self, container: RawFd) -> SysResult<i32> {
        ioctl_value(container, VFIO_GET_API_VERSION, 0)
    }

    fn check_extension(&self, container: RawFd, extension: u32) -> SysResult<bool> {
        ioctl_value(container, VFIO_CHECK_EXTENSION, extension.into()).map(|r| r > 0)
    }

    fn set_iommu(&self, container: RawFd, iommu_type: u32) -> SysResult<()> {
        ioctl_value(container, VFIO_SET_IOMMU, iommu_type.into()).map(drop)
    }

    fn iommu_get_info(&self, container: RawFd) -> SysResult<RawIommuInfo> {
        let mut info = vfio_iommu_type1_info {
            argsz: IOMMU_INFO_ARGSZ,
            ..Default::default()
        };
        ioctl_ptr(container, VFIO_IOMMU_GET_INFO, &mut info)?;
        Ok(RawIommuInfo {
            flags: info.flags,
            iova_pgsizes: info.iova_pgsizes,
        })
    }

    unsafe fn map_dma(
        &self,
        container: RawFd,
        vaddr: u64,
        iova: u64,
        size: u64,
        flags: u32,
    ) -> SysResult<()> {
        let mut map = vfio_iommu_type1_dma_map {
            argsz: argsz::<vfio_iommu_type1_dma_map>(),
            flags,
            vaddr,
            iova,
            size,
        };
        // The memory's lifetime is the caller's obligation (see the trait).
        ioctl_ptr(container, VFIO_IOMMU_MAP_DMA, &mut map).map(drop)
    }

    fn unmap_dma(&self, container: RawFd, iova: u64, size: u64) -> SysResult<u64> {
        let mut unmap = vfio_iommu_type1_dma_unmap {
            argsz: argsz::<vfio_iommu_type1_dma_unmap>(),
            flags: 0,
            iova,
            size,
            ..Default::default()
        };
        ioctl_ptr(container, VFIO_IOMMU_UNMAP_DMA, &mut unmap)?;
        Ok(unmap.size)
    }

    fn group_get_status(&self, group: RawFd) -> SysResult<u32> {
        let mut status = vfio_group_status {
            argsz: argsz::<vfio_group_status>(),
            flags: 0,
        };
        ioctl_ptr(group, VFIO_GROUP_GET_STATUS, &mut status)?;
        Ok(status.flags)
    }

    fn group_set_container(&self, group: RawFd, container: RawFd) -> SysResult<()> {
        let mut container = container;
        ioctl_ptr(group, VFIO_GROUP_SET_CONTAINER, &mut container).map(drop)
    }

    fn group_unset_container(&self, group: RawFd) -> SysResult<()> {
        ioctl_value(group, VFIO_GROUP_UNSET_CONTAINER, 0).map(drop)
    }

    fn group_get_device_fd(&self, group: RawFd, name: &CStr) -> SysResult<RawFd> {
        // SAFETY: `name` is a NUL-terminated string that outlives the call;
        // the kernel only reads it.
        let fd = unsafe { libc::ioctl(group, VFIO_GROUP_GET_DEVICE_FD as _, name.as_ptr()) };
        if fd < 0 { Err(Errno::last()) } else { Ok(fd) }
    }

    fn device_get_info(&self, device: RawFd) -> SysResult<RawDeviceInfo> {
        let mut info = vfio_device_info {
            argsz: DEVICE_INFO_ARGSZ,
            ..Default::default()
        };
        ioctl_ptr(device, VFIO_DEVICE_GET_INFO, &mut info)?;
        Ok(RawDeviceInfo {
            flags: info.flags,
            num_regions: info.num_regions,
            num_irqs: info.num_irqs,
        })
    }

    fn device_get_region_info(&self, device: RawFd, index: u32) -> SysResult<RawRegionInfo> {
        let mut info = vfio_region_info {
            argsz: argsz::<vfio_region_info>(),
            index,
            ..Default::default()
        };
        ioctl_ptr(device, VFIO_DEVICE_GET_REGION_INFO, &mut info)?;
        let mut raw = RawRegionInfo {
            flags: info.flags,
            index,
            size: info.size,
            offset: info.offset,
            sparse_areas: None,
            caps_unreadable: None,
        };
        let base = size_of::<vfio_region_info>();
        if info.flags & REGION_FLAG_CAPS != 0 && info.argsz as usize > base {
            // The capability chain follows the structure: ask again with
            // room for it (u64 words keep the buffer aligned).
            let words = (info.argsz as usize).div_ceil(8).min(1 << 16);
            let mut buf = vec![0u64; words];
            let header = vfio_region_info {
                argsz: (words * 8) as u32,
                index,
                ..Default::default()
            };
            let head_ptr = buf.as_mut_ptr().cast::<vfio_region_info>();
            // SAFETY: `buf` holds at least `base` bytes (argsz > base) and is
            // 8-byte aligned, as `vfio_region_info` needs.
            unsafe { head_ptr.write(header) };
            // SAFETY: `buf` is `argsz` bytes long, live and exclusive for
            // the call; the kernel writes at most `argsz` bytes into it.
            let ret =
                unsafe { libc::ioctl(device, VFIO_DEVICE_GET_REGION_INFO as _, buf.as_mut_ptr()) };
            if ret == 0 {
                let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                match parse_sparse_mmap(&bytes) {
                    Ok(areas) => raw.sparse_areas = areas,
                    Err(reason) => raw.caps_unreadable = Some(reason.to_string()),
                }
            } else {
                raw.caps_unreadable = Some(format!(
                    "VFIO_DEVICE_GET_REGION_INFO with room for the chain failed: {}",
                    Errno::last()
                ));
            }
        }
        Ok(raw)
    }

    fn device_reset(&self, device: RawFd) -> SysResult<()> {
        ioctl_value(device, VFIO_DEVICE_RESET, 0).map(drop)
    }

    fn pread(&self, fd: RawFd, buf: &mut [u8], offset: u64) -> SysResult<usize> {
        // SAFETY: `buf` is a live, exclusive buffer of `buf.len()` bytes.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset as i64) };
        if n < 0 {
            Err(Errno::last())
        } else {
            Ok(n as usize)
        }
    }

    fn pwrite(&self, fd: RawFd, buf: &[u8], offset: u64) -> SysResult<usize> {
        // SAFETY: `buf` is a live buffer of `buf.len()` bytes, only read.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), offset as i64) };
        if n < 0 {
            Err(Errno::last())
        } else {
            Ok(n as usize)
        }
    }

    fn mmap(
        &self,
        fd: Option<RawFd>,
        len: usize,
        offset: u64,
        prot: Prot,
    ) -> SysResult<NonNull<u8>> {
        if len == 0 {
            return Err(Errno(libc::EINVAL));
        }
        let mut bits = ProtFlags::empty();
        if prot.read {
            bits |= ProtFlags::READ;
        }
        if prot.write {
            bits |= ProtFlags::WRITE;
        }
        let addr = match fd {
            Some(fd) => {
                // The kernel's file offset (off_t) is signed.
                if i64::try_from(offset).is_err() {
                    return Err(Errno(libc::EOVERFLOW));
                }
                // SAFETY: the handles above keep `fd` open across this call
                // (they own it and close it only after the mapping is gone).
                let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                // SAFETY: a null hint lets the kernel pick an address, so no
                // existing mapping is replaced; the new mapping is owned by
                // the caller, who unmaps it exactly once.
                unsafe {
                    mm::mmap(
                        std::ptr::null_mut(),
                        len,
                        bits,
                        MapFlags::SHARED,
                        fd,
                        offset,
                    )
                }
            }
            // SAFETY: as above, with no file behind the mapping.
            None => unsafe {
                mm::mmap_anonymous(std::ptr::null_mut(), len, bits, MapFlags::SHARED)
            },
        }
        .map_err(|errno| Errno(errno.raw_os_error()))?;
        NonNull::new(addr.cast::<u8>()).ok_or(Errno(libc::EFAULT))
    }

    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> SysResult<()> {
        // SAFETY: the caller guarantees `addr`/`len` is exactly one live
        // mapping from `mmap`, never accessed again.
        unsafe { mm::munmap(addr.as_ptr().cast(), len) }
            .map_err(|errno| Errno(errno.raw_os_error()))
    }
}

/// The sparse-mmap areas (`VFIO_REGION_INFO_CAP_SPARSE_MMAP`) in a
/// region's capability chain (`bytes`: the `vfio_region_info` the kernel
/// filled, chain included). Every offset comes from the kernel but is still
/// bounds-checked. `Ok(None)` when the chain has no such capability (all of
/// the region may be mmapped), `Err` when the chain cannot be followed — an
/// offset outside the buffer, or more links than any kernel writes — since
/// then nobody knows which parts may be mmapped, and treating the region as
/// whole would map an MSI-X table the kernel meant to keep out.
fn parse_sparse_mmap(bytes: &[u8]) -> Result<Option<Vec<(u64, u64)>>, &'static str> {
    const OUTSIDE: &str = "the capability chain points outside what the kernel returned";
    fn array_at<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], &'static str> {
        at.checked_add(N)
            .and_then(|end| bytes.get(at..end))
            .and_then(|b| b.try_into().ok())
            .ok_or(OUTSIDE)
    }
    let u16_at = |at| array_at(bytes, at).map(u16::from_ne_bytes);
    let u32_at = |at| array_at(bytes, at).map(u32::from_ne_bytes);
    let u64_at = |at| array_at(bytes, at).map(u64::from_ne_bytes);
    let mut next = u32_at(offset_of!(vfio_region_info, cap_offset))? as usize;
    let mut hops = 0;
    while next != 0 {
        hops += 1;
        if hops > 64 {
            return Err("the capability chain has more than 64 links (a loop?)");
        }
        let id = u16_at(next + offset_of!(vfio_info_cap_header, id))?;
        if id == REGION_CAP_SPARSE_MMAP {
            let count = u32_at(next + offset_of!(vfio_region_info_cap_sparse_mmap, nr_areas))?;
            let count = count as usize;
            if count > 64 {
                return Err("the sparse-mmap capability lists more than 64 areas");
            }
            let mut areas = Vec::with_capacity(count);
            let first = next + offset_of!(vfio_region_info_cap_sparse_mmap, areas);
            for i in 0..count {
                let at = first + i * size_of::<vfio_region_sparse_mmap_area>();
                let offset = u64_at(at + offset_of!(vfio_region_sparse_mmap_area, offset))?;
                let size = u64_at(at + offset_of!(vfio_region_sparse_mmap_area, size))?;
                areas.push((offset, size));
            }
            return Ok(Some(areas));
        }
        next = u32_at(next + offset_of!(vfio_info_cap_header, next))? as usize;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_vfio_h() {
        // Values from <linux/vfio.h> on x86_64.
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(VFIO_DEVICE_RESET, 0x3b6f);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
    }

    #[test]
    fn ioctl_structures_have_the_header_sizes() {
        // What each ioctl is passed, and the size `<linux/vfio.h>` gives its
        // structure (argsz tells the kernel which version of it we pass).
        assert_eq!(size_of::<vfio_group_status>(), 8); // VFIO_GROUP_GET_STATUS
        assert_eq!(size_of::<vfio_device_info>(), 24); // VFIO_DEVICE_GET_INFO
        assert_eq!(size_of::<vfio_region_info>(), 32); // VFIO_DEVICE_GET_REGION_INFO
        assert_eq!(size_of::<vfio_iommu_type1_info>(), 24); // VFIO_IOMMU_GET_INFO
        assert_eq!(size_of::<vfio_iommu_type1_dma_map>(), 32); // VFIO_IOMMU_MAP_DMA
        assert_eq!(size_of::<vfio_iommu_type1_dma_unmap>(), 24); // VFIO_IOMMU_UNMAP_DMA
        assert_eq!(size_of::<RawFd>(), 4); // VFIO_GROUP_SET_CONTAINER: an int
        // The sparse-mmap capability the chain is decoded with.
        assert_eq!(size_of::<vfio_info_cap_header>(), 8);
        assert_eq!(size_of::<vfio_region_info_cap_sparse_mmap>(), 16);
        assert_eq!(size_of::<vfio_region_sparse_mmap_area>(), 16);
        // The two info calls pass the version without a capability chain.
        assert_eq!(DEVICE_INFO_ARGSZ, 16);
        assert_eq!(IOMMU_INFO_ARGSZ, 16);
    }

    #[test]
    fn sparse_mmap_capability_is_parsed_and_bounded() {
        let mut buf = vec![0u8; 32 + 16 + 32];
        buf[12..16].copy_from_slice(&32u32.to_ne_bytes()); // cap_offset
        buf[32..34].copy_from_slice(&REGION_CAP_SPARSE_MMAP.to_ne_bytes());
        buf[40..44].copy_from_slice(&2u32.to_ne_bytes()); // two areas
        buf[48..56].copy_from_slice(&0u64.to_ne_bytes());
        buf[56..64].copy_from_slice(&0x1000u64.to_ne_bytes());
        buf[64..72].copy_from_slice(&0x3000u64.to_ne_bytes());
        buf[72..80].copy_from_slice(&0x1000u64.to_ne_bytes());
        assert_eq!(
            parse_sparse_mmap(&buf),
            Ok(Some(vec![(0, 0x1000), (0x3000, 0x1000)]))
        );
        // An area list running past the buffer is not followed.
        buf[40..44].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse_sparse_mmap(&buf).is_err());
        buf[40..44].copy_from_slice(&2u32.to_ne_bytes());
        // A chain without the capability: all of the region may be mapped.
        buf[32..34].copy_from_slice(&(REGION_CAP_SPARSE_MMAP + 1).to_ne_bytes());
        assert_eq!(parse_sparse_mmap(&buf), Ok(None));
        // A chain that points outside the buffer, or into itself, cannot be
        // followed: which parts may be mapped is unknown (an error, not
        // "all of it").
        buf[12..16].copy_from_slice(&4000u32.to_ne_bytes());
        assert!(parse_sparse_mmap(&buf).is_err());
        buf[12..16].copy_from_slice(&32u32.to_ne_bytes());
        buf[36..40].copy_from_slice(&32u32.to_ne_bytes()); // next: itself
        assert!(parse_sparse_mmap(&buf).unwrap_err().contains("loop"));
        // No chain at all.
        buf[12..16].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(parse_sparse_mmap(&buf), Ok(None));
    }

    #[test]
    fn page_size_is_a_power_of_two() {
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
    }

    #[test]
    fn opening_a_missing_node_gives_its_errno() {
        let error = LinuxSys
            .open(Path::new("/nonexistent/barlink/vfio"))
            .unwrap_err();
        assert_eq!(error, Errno(libc::ENOENT));
    }
}
