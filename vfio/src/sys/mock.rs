//! [`MockSys`]: a [`VfioSys`] that records every call instead of making it,
//! for tests of the container/group/device sequence, failures at any step,
//! and teardown order — on any machine, without VFIO.
//!
//! Its "mappings" are zeroed heap blocks (page-aligned), so windows over
//! them can be read and written; its device config space is a 256-byte
//! array at region 7's offset. Any call can be made to fail with an errno
//! ([`MockSys::fail`]), and opens per path ([`MockSys::fail_open`]).

use std::alloc::{self, Layout};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    DEVICE_FLAGS_PCI, DEVICE_FLAGS_RESET, Errno, GROUP_FLAGS_CONTAINER_SET, GROUP_FLAGS_VIABLE,
    IOMMU_INFO_PGSIZES, Prot, REGION_FLAG_MMAP, REGION_FLAG_READ, REGION_FLAG_WRITE, RawDeviceInfo,
    RawIommuInfo, RawRegionInfo, SysResult, VFIO_API_VERSION, VFIO_TYPE1_IOMMU, VFIO_TYPE1V2_IOMMU,
    VfioSys, region_index,
};

/// Where vfio-pci puts region `index` in the device file.
pub const fn region_offset(index: u32) -> u64 {
    (index as u64) << 40
}

/// One recorded call: the operation and its arguments in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `"open"`, `"close"`, `"set_iommu"`, `"munmap"`, ...
    pub op: &'static str,
    /// The arguments that matter (paths, descriptors, offsets).
    pub detail: String,
}

/// What the mock answers, and what it has seen.
#[derive(Debug)]
pub struct MockState {
    /// Every call, in order.
    pub calls: Vec<Call>,
    /// What `VFIO_GET_API_VERSION` returns.
    pub api_version: i32,
    /// IOMMU types `VFIO_CHECK_EXTENSION` reports.
    pub extensions: Vec<u32>,
    /// `VFIO_GROUP_GET_STATUS` flags (before a container is set).
    pub group_flags: u32,
    /// Regions of every device, by index (others have size 0).
    pub regions: BTreeMap<u32, RawRegionInfo>,
    /// Device flags.
    pub device_flags: u32,
    /// Sizes `file_size` reports, by path opened.
    pub file_sizes: HashMap<PathBuf, u64>,
    /// Config space of every device.
    pub config: [u8; 256],
    /// DMA mappings in force: (iova, size, vaddr).
    pub dma: Vec<(u64, u64, u64)>,
    failures: HashMap<String, i32>,
    next_fd: RawFd,
    paths: HashMap<RawFd, PathBuf>,
    mapped: HashMap<usize, Layout>,
    /// Range locks held: (descriptor, path, start, end).
    locks: Vec<(RawFd, PathBuf, u64, u64)>,
}

/// A recording, failure-injecting stand-in for the kernel.
#[derive(Debug)]
pub struct MockSys {
    state: Mutex<MockState>,
}

impl Default for MockSys {
    fn default() -> Self {
        MockSys::new()
    }
}

impl MockSys {
    /// A mock whose VFIO works: API 0, type1 and type1v2, viable groups, a
    /// PCI device with a 16 MiB mmappable BAR 2, a 256-byte BAR 0 without
    /// mmap, and config space.
    pub fn new() -> MockSys {
        let mut regions = BTreeMap::new();
        let rw = REGION_FLAG_READ | REGION_FLAG_WRITE;
        regions.insert(
            region_index::BAR0,
            RawRegionInfo {
                flags: rw,
                index: region_index::BAR0,
                size: 256,
                offset: region_offset(region_index::BAR0),
                sparse_areas: None,
                caps_unreadable: None,
            },
        );
        regions.insert(
            region_index::BAR2,
            RawRegionInfo {
                flags: rw | REGION_FLAG_MMAP,
                index: region_index::BAR2,
                size: 16 << 20,
                offset: region_offset(region_index::BAR2),
                sparse_areas: None,
                caps_unreadable: None,
            },
        );
        regions.insert(
            region_index::CONFIG,
            RawRegionInfo {
                flags: rw,
                index: region_index::CONFIG,
                size: 256,
                offset: region_offset(region_index::CONFIG),
                sparse_areas: None,
                caps_unreadable: None,
            },
        );
        let mut config = [0u8; 256];
        config[0..2].copy_from_slice(&0x1af4u16.to_le_bytes());
        config[2..4].copy_from_slice(&0x1110u16.to_le_bytes());
        MockSys {
            state: Mutex::new(MockState {
                calls: Vec::new(),
                api_version: VFIO_API_VERSION,
                extensions: vec![VFIO_TYPE1_IOMMU, VFIO_TYPE1V2_IOMMU],
                group_flags: GROUP_FLAGS_VIABLE,
                regions,
                device_flags: DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET,
                file_sizes: HashMap::new(),
                config,
                dma: Vec::new(),
                failures: HashMap::new(),
                next_fd: 100,
                paths: HashMap::new(),
                mapped: HashMap::new(),
                locks: Vec::new(),
            }),
        }
    }

    /// The state, to configure answers or inspect what happened.
    pub fn state(&self) -> MutexGuard<'_, MockState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every later call of `op` (e.g. `"set_iommu"`) fail with `errno`.
    pub fn fail(&self, op: &str, errno: i32) {
        self.state().failures.insert(op.to_string(), errno);
    }

    /// Makes opening `path` fail with `errno`.
    pub fn fail_open(&self, path: &Path, errno: i32) {
        self.state()
            .failures
            .insert(format!("open:{}", path.display()), errno);
    }

    /// Every call so far, as `"op detail"` lines.
    pub fn calls(&self) -> Vec<String> {
        self.state()
            .calls
            .iter()
            .map(|c| {
                if c.detail.is_empty() {
                    c.op.to_string()
                } else {
                    format!("{} {}", c.op, c.detail)
                }
            })
            .collect()
    }

    /// The operations so far, in order.
    pub fn ops(&self) -> Vec<&'static str> {
        self.state().calls.iter().map(|c| c.op).collect()
    }

    /// Descriptors opened and not yet closed.
    pub fn open_fds(&self) -> Vec<PathBuf> {
        let state = self.state();
        let mut open: Vec<PathBuf> = state.paths.values().cloned().collect();
        open.sort();
        open
    }

    /// Mappings made and not yet unmapped.
    pub fn live_mappings(&self) -> usize {
        self.state().mapped.len()
    }

    /// Records a call and returns the configured failure for it, if any.
    fn enter(
        &self,
        op: &'static str,
        detail: String,
    ) -> (MutexGuard<'_, MockState>, SysResult<()>) {
        let mut state = self.state();
        state.calls.push(Call { op, detail });
        let failure = state.failures.get(op).copied();
        (state, failure.map_or(Ok(()), |e| Err(Errno(e))))
    }

    fn path_of(state: &MockState, fd: RawFd) -> String {
        state
            .paths
            .get(&fd)
            .map_or_else(|| format!("fd{fd}"), |p| p.display().to_string())
    }
}

impl VfioSys for MockSys {
    fn open(&self, path: &Path) -> SysResult<RawFd> {
        let (mut state, result) = self.enter("open", path.display().to_string());
        result?;
        if let Some(&errno) = state.failures.get(&format!("open:{}", path.display())) {
            return Err(Errno(errno));
        }
        let fd = state.next_fd;
        state.next_fd += 1;
        state.paths.insert(fd, path.to_path_buf());
        Ok(fd)
    }

    fn close(&self, fd: RawFd) {
        let mut state = self.state();
        let detail = Self::path_of(&state, fd);
        state.calls.push(Call {
            op: "close",
            detail,
        });
        let known = state.paths.remove(&fd).is_some();
        assert!(known, "close of a descriptor that is not open: {fd}");
        state.locks.retain(|lock| lock.0 != fd);
    }

    fn lock_range(&self, fd: RawFd, offset: u64, len: u64) -> SysResult<()> {
        let (mut state, result) = self.enter("lock_range", format!("{offset:#x}+{len:#x}"));
        result?;
        let path = state.paths.get(&fd).cloned().ok_or(Errno(libc::EBADF))?;
        let end = offset.checked_add(len).ok_or(Errno(libc::EINVAL))?;
        let taken = state.locks.iter().any(|(holder, held, start, stop)| {
            *holder != fd && *held == path && offset < *stop && *start < end
        });
        if taken {
            return Err(Errno(libc::EAGAIN));
        }
        state.locks.push((fd, path, offset, end));
        Ok(())
    }

    fn file_size(&self, fd: RawFd) -> SysResult<u64> {
        let (state, result) = self.enter("file_size", String::new());
        result?;
        let path = state.paths.get(&fd).ok_or(Errno(libc::EBADF))?;
        state
            .file_sizes
            .get(path)
            .copied()
            .ok_or(Errno(libc::ENOENT))
    }

    fn get_api_version(&self, _container: RawFd) -> SysResult<i32> {
        let (state, result) = self.enter("get_api_version", String::new());
        result.map(|()| state.api_version)
    }

    fn check_extension(&self, _container: RawFd, extension: u32) -> SysResult<bool> {
        let (state, result) = self.enter("check_extension", extension.to_string());
        result.map(|()| state.extensions.contains(&extension))
    }

    fn set_iommu(&self, _container: RawFd, iommu_type: u32) -> SysResult<()> {
        self.enter("set_iommu", iommu_type.to_string()).1
    }

    fn iommu_get_info(&self, _container: RawFd) -> SysResult<RawIommuInfo> {
        self.enter("iommu_get_info", String::new()).1?;
        Ok(RawIommuInfo {
            flags: IOMMU_INFO_PGSIZES,
            iova_pgsizes: 0x4000_1000, // 4 KiB and 1 GiB... as type1 reports
        })
    }

    unsafe fn map_dma(
        &self,
        _container: RawFd,
        vaddr: u64,
        iova: u64,
        size: u64,
        flags: u32,
    ) -> SysResult<()> {
        let (mut state, result) = self.enter(
            "map_dma",
            format!("iova={iova:#x} size={size:#x} flags={flags}"),
        );
        result?;
        if state
            .dma
            .iter()
            .any(|&(at, len, _)| iova < at + len && at < iova + size)
        {
            return Err(Errno(libc::EEXIST));
        }
        state.dma.push((iova, size, vaddr));
        Ok(())
    }

    fn unmap_dma(&self, _container: RawFd, iova: u64, size: u64) -> SysResult<u64> {
        let (mut state, result) = self.enter("unmap_dma", format!("iova={iova:#x} size={size:#x}"));
        result?;
        let before = state.dma.len();
        state
            .dma
            .retain(|&(at, len, _)| !(at == iova && len == size));
        Ok(if state.dma.len() < before { size } else { 0 })
    }

    fn group_get_status(&self, group: RawFd) -> SysResult<u32> {
        let detail = Self::path_of(&self.state_peek(), group);
        let (state, result) = self.enter("group_get_status", detail);
        result.map(|()| state.group_flags & !GROUP_FLAGS_CONTAINER_SET)
    }

    fn group_set_container(&self, group: RawFd, _container: RawFd) -> SysResult<()> {
        let detail = Self::path_of(&self.state_peek(), group);
        self.enter("group_set_container", detail).1
    }

    fn group_unset_container(&self, group: RawFd) -> SysResult<()> {
        let detail = Self::path_of(&self.state_peek(), group);
        self.enter("group_unset_container", detail).1
    }

    fn group_get_device_fd(&self, _group: RawFd, name: &CStr) -> SysResult<RawFd> {
        let name = name.to_string_lossy().into_owned();
        let (mut state, result) = self.enter("group_get_device_fd", name.clone());
        result?;
        let fd = state.next_fd;
        state.next_fd += 1;
        state
            .paths
            .insert(fd, PathBuf::from(format!("device:{name}")));
        Ok(fd)
    }

    fn device_get_info(&self, _device: RawFd) -> SysResult<RawDeviceInfo> {
        let (state, result) = self.enter("device_get_info", String::new());
        result?;
        Ok(RawDeviceInfo {
            flags: state.device_flags,
            num_regions: 9,
            num_irqs: 5,
        })
    }

    fn device_get_region_info(&self, _device: RawFd, index: u32) -> SysResult<RawRegionInfo> {
        let (state, result) = self.enter("device_get_region_info", index.to_string());
        result?;
        if index >= 9 {
            return Err(Errno(libc::EINVAL));
        }
        Ok(state.regions.get(&index).cloned().unwrap_or(RawRegionInfo {
            index,
            offset: region_offset(index),
            ..RawRegionInfo::default()
        }))
    }

    fn device_reset(&self, _device: RawFd) -> SysResult<()> {
        self.enter("device_reset", String::new()).1
    }

    fn pread(&self, _fd: RawFd, buf: &mut [u8], offset: u64) -> SysResult<usize> {
        let (state, result) = self.enter("pread", format!("{offset:#x}+{}", buf.len()));
        result?;
        let config = region_offset(region_index::CONFIG);
        let at = offset.checked_sub(config).ok_or(Errno(libc::EINVAL))? as usize;
        let end = at.checked_add(buf.len()).ok_or(Errno(libc::EINVAL))?;
        let src = state.config.get(at..end).ok_or(Errno(libc::EINVAL))?;
        buf.copy_from_slice(src);
        Ok(buf.len())
    }

    fn pwrite(&self, _fd: RawFd, buf: &[u8], offset: u64) -> SysResult<usize> {
        let (mut state, result) = self.enter("pwrite", format!("{offset:#x}+{}", buf.len()));
        result?;
        let config = region_offset(region_index::CONFIG);
        let at = offset.checked_sub(config).ok_or(Errno(libc::EINVAL))? as usize;
        let end = at.checked_add(buf.len()).ok_or(Errno(libc::EINVAL))?;
        let dst = state.config.get_mut(at..end).ok_or(Errno(libc::EINVAL))?;
        dst.copy_from_slice(buf);
        Ok(buf.len())
    }

    fn mmap(
        &self,
        fd: Option<RawFd>,
        len: usize,
        offset: u64,
        _prot: Prot,
    ) -> SysResult<NonNull<u8>> {
        let target = fd.map_or_else(
            || "anonymous".to_string(),
            |fd| Self::path_of(&self.state_peek(), fd),
        );
        let (mut state, result) = self.enter("mmap", format!("{target} {offset:#x}+{len:#x}"));
        result?;
        if len == 0 {
            return Err(Errno(libc::EINVAL));
        }
        let layout = Layout::from_size_align(len, 4096).map_err(|_| Errno(libc::ENOMEM))?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or(Errno(libc::ENOMEM))?;
        state.mapped.insert(base.as_ptr() as usize, layout);
        Ok(base)
    }

    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> SysResult<()> {
        let (mut state, result) = self.enter("munmap", format!("{len:#x}"));
        let layout = state
            .mapped
            .remove(&(addr.as_ptr() as usize))
            .ok_or(Errno(libc::EINVAL))?;
        assert_eq!(
            layout.size(),
            len,
            "munmap of a different length than mapped"
        );
        // SAFETY: `addr` came from `alloc_zeroed(layout)` in `mmap` and was
        // still recorded as mapped (so it is freed exactly once); the caller
        // promises no further access.
        unsafe { alloc::dealloc(addr.as_ptr(), layout) };
        // A configured failure is reported after the memory is freed, so a
        // test of the error path leaks nothing.
        result
    }
}

impl MockSys {
    /// The state without recording a call (for building details).
    fn state_peek(&self) -> MutexGuard<'_, MockState> {
        self.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the kernel's open file description locks: overlapping ranges of
    /// one file conflict between descriptors, not within one, and a close
    /// releases the descriptor's ranges.
    #[test]
    fn range_locks_conflict_between_descriptors_until_closed() {
        let sys = MockSys::new();
        let path = Path::new("/sys/bus/pci/devices/0000:00:04.0/resource2");
        let (a, b) = (sys.open(path).unwrap(), sys.open(path).unwrap());
        let other = sys.open(Path::new("/elsewhere")).unwrap();
        sys.lock_range(a, 0, 4096).unwrap();
        sys.lock_range(a, 2048, 4096).unwrap();
        assert_eq!(sys.lock_range(b, 4095, 1), Err(Errno(libc::EAGAIN)));
        sys.lock_range(b, 6144, 4096).unwrap();
        sys.lock_range(other, 0, 4096).unwrap();
        sys.close(a);
        sys.lock_range(b, 0, 4096).unwrap();
        sys.close(b);
        sys.close(other);
    }
}
