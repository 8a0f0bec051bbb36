//! [`VfioDevice`]: a PCI device opened through VFIO — its info, its regions
//! (BARs, ROM, config space), config-space access, and BARs mapped as
//! [`BarWindow`]s.

use std::ffi::CString;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;

use barlink_topology::pci::address::Bdf;

use crate::bar::{BarSource, BarWindow};
use crate::bind::{self, DeviceSpec, VFIO_PCI};
use crate::container::{Container, GroupInner};
use crate::env::VfioEnv;
use crate::error::VfioError;
use crate::sys::region::{Owner, Region};
use crate::sys::{
    DEVICE_FLAGS_PCI, DEVICE_FLAGS_RESET, Errno, Prot, REGION_FLAG_MMAP, REGION_FLAG_READ,
    REGION_FLAG_WRITE, RawDeviceInfo, RawRegionInfo, region_index,
};

/// PCI command register offset in config space.
pub const PCI_COMMAND: u64 = 0x04;
/// Command register: memory space decoding.
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: bus mastering (the device may DMA).
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;

pub(crate) struct DeviceInner {
    pub(crate) bdf: Bdf,
    pub(crate) fd: RawFd,
    info: RawDeviceInfo,
    /// Dropped after the descriptor is closed (fields drop after the body).
    pub(crate) group: Arc<GroupInner>,
}

impl fmt::Debug for DeviceInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VfioDevice")
            .field("bdf", &self.bdf)
            .field("group", &self.group.id)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        self.group.container.env.sys.close(self.fd);
    }
}

/// A region of a device as VFIO describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// The index (0–5 BARs, 6 ROM, 7 config, 8 VGA).
    pub index: u32,
    /// Size in bytes; 0 when the device has nothing here.
    pub size: u64,
    /// Offset in the device file.
    pub offset: u64,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Areas that may be mmapped, when only parts may be.
    pub sparse_areas: Option<Vec<(u64, u64)>>,
    /// Why the region's VFIO capability chain could not be read, if it
    /// could not (then which parts may be mmapped is unknown).
    pub caps_unreadable: Option<String>,
}

impl RegionInfo {
    /// Readable.
    pub fn readable(&self) -> bool {
        self.flags & REGION_FLAG_READ != 0
    }
    /// Writable.
    pub fn writable(&self) -> bool {
        self.flags & REGION_FLAG_WRITE != 0
    }
    /// Can be mmapped.
    pub fn mappable(&self) -> bool {
        self.flags & REGION_FLAG_MMAP != 0
    }

    /// Why this region cannot be a window, or `None` if it can.
    pub fn unmappable_reason(&self) -> Option<String> {
        if self.size == 0 {
            return Some("the region is empty: the device has no BAR at this index".into());
        }
        if !self.mappable() {
            return Some(
                "VFIO does not allow mmap of it (no VFIO_REGION_INFO_FLAG_MMAP): config space, \
                 ROM, I/O-port BARs and BARs smaller than a page are reached with pread/pwrite \
                 (VfioDevice::read_region / write_region) instead"
                    .into(),
            );
        }
        if !self.readable() && !self.writable() {
            return Some("the region is neither readable nor writable".into());
        }
        if let Some(reason) = &self.caps_unreadable {
            return Some(format!(
                "its VFIO capability chain could not be read ({reason}), so which parts of it \
                 may be mmapped is unknown: check the kernel log (dmesg) for vfio-pci errors, \
                 and the kernel and QEMU versions"
            ));
        }
        if let Some(areas) = &self.sparse_areas
            && !(areas.len() == 1 && areas[0] == (0, self.size))
        {
            let list: Vec<String> = areas
                .iter()
                .map(|(o, s)| format!("{o:#x}+{s:#x}"))
                .collect();
            return Some(format!(
                "only parts of it may be mmapped (sparse areas {}): map a BAR without \
                 MSI-X tables in it",
                list.join(", ")
            ));
        }
        None
    }

    fn from_raw(raw: RawRegionInfo) -> RegionInfo {
        RegionInfo {
            index: raw.index,
            size: raw.size,
            offset: raw.offset,
            flags: raw.flags,
            sparse_areas: raw.sparse_areas,
            caps_unreadable: raw.caps_unreadable,
        }
    }
}

/// What `VFIO_DEVICE_GET_INFO` says about a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VfioDeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// Number of regions.
    pub num_regions: u32,
    /// Number of interrupt indices.
    pub num_irqs: u32,
}

impl VfioDeviceInfo {
    /// A PCI device (vfio-pci).
    pub fn is_pci(&self) -> bool {
        self.flags & DEVICE_FLAGS_PCI != 0
    }
    /// Supports `VFIO_DEVICE_RESET`.
    pub fn can_reset(&self) -> bool {
        self.flags & DEVICE_FLAGS_RESET != 0
    }
}

/// A device opened through VFIO. Cheap to clone (a shared handle); the
/// device, its group and container stay open while any clone, window or
/// DMA mapping of it lives.
#[derive(Debug, Clone)]
pub struct VfioDevice {
    inner: Arc<DeviceInner>,
}

impl VfioDevice {
    /// Opens a device by address (`0000:01:00.0`) or by `vendor:device`
    /// (`1af4:1110`, `1af4:1110#1` for the second match) in a container of
    /// its own.
    pub fn open(spec: &str) -> Result<VfioDevice, VfioError> {
        VfioDevice::open_in(VfioEnv::default(), spec)
    }

    /// [`VfioDevice::open`] in another environment.
    pub fn open_in(env: VfioEnv, spec: &str) -> Result<VfioDevice, VfioError> {
        let spec: DeviceSpec = spec.parse()?;
        let bdf = spec.resolve(&env.sysfs_root)?;
        Container::open_in(env)?.open_device(bdf)
    }

    pub(crate) fn open_in_group(group: Arc<GroupInner>, bdf: Bdf) -> Result<VfioDevice, VfioError> {
        let sys = group.container.env.sys.clone();
        let name = CString::new(bdf.to_string()).expect("an address has no NUL");
        let fd = sys.group_get_device_fd(group.fd, &name).map_err(|errno| {
            if errno.is_permission() {
                VfioError::PermissionDenied {
                    path: group.path().to_path_buf(),
                    errno,
                }
            } else {
                VfioError::System {
                    operation: "VFIO_GROUP_GET_DEVICE_FD",
                    target: bdf.to_string(),
                    errno,
                }
            }
        })?;
        let mut inner = DeviceInner {
            bdf,
            fd,
            info: RawDeviceInfo::default(),
            group,
        };
        inner.info = sys.device_get_info(fd).map_err(|errno| VfioError::System {
            operation: "VFIO_DEVICE_GET_INFO",
            target: bdf.to_string(),
            errno,
        })?;
        Ok(VfioDevice {
            inner: Arc::new(inner),
        })
    }

    /// The device's address.
    pub fn bdf(&self) -> Bdf {
        self.inner.bdf
    }

    /// The IOMMU group.
    pub fn group(&self) -> u32 {
        self.inner.group.id
    }

    /// The container the device is in (to map DMA for it, or open more
    /// devices into the same IOMMU domain).
    pub fn container(&self) -> Container {
        Container {
            inner: self.inner.group.container.clone(),
        }
    }

    /// Flags and counts.
    pub fn info(&self) -> VfioDeviceInfo {
        VfioDeviceInfo {
            flags: self.inner.info.flags,
            num_regions: self.inner.info.num_regions,
            num_irqs: self.inner.info.num_irqs,
        }
    }

    fn sys(&self) -> &Arc<dyn crate::sys::VfioSys> {
        &self.inner.group.container.env.sys
    }

    /// Describes region `index`.
    pub fn region_info(&self, index: u32) -> Result<RegionInfo, VfioError> {
        let count = self.inner.info.num_regions;
        if index >= count {
            return Err(VfioError::NoSuchRegion {
                bdf: self.bdf(),
                index,
                count,
            });
        }
        self.sys()
            .device_get_region_info(self.inner.fd, index)
            .map(RegionInfo::from_raw)
            .map_err(|errno| match errno {
                Errno(libc::EINVAL) => VfioError::NoSuchRegion {
                    bdf: self.bdf(),
                    index,
                    count,
                },
                errno => VfioError::System {
                    operation: "VFIO_DEVICE_GET_REGION_INFO",
                    target: self.bdf().to_string(),
                    errno,
                },
            })
    }

    /// Every region of the device (BARs, ROM, config space, and any
    /// device-specific ones), empty ones included — what a report lists.
    ///
    /// Regions the device does not implement are left out: the kernel
    /// answers EINVAL for them (e.g. the VGA region of a device that is not
    /// a VGA controller), which is not an error of the device as a whole.
    pub fn regions(&self) -> Result<Vec<RegionInfo>, VfioError> {
        let mut regions = vec![];
        for index in 0..self.inner.info.num_regions {
            match self.region_info(index) {
                Ok(info) => regions.push(info),
                Err(VfioError::NoSuchRegion { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(regions)
    }

    /// Maps all of region `index` (a memory BAR) as a window, with the
    /// protection its flags allow. Fails with
    /// [`VfioError::RegionNotMappable`] for regions VFIO does not let be
    /// mmapped (config space, ROM, I/O BARs, small BARs, sparse regions) or
    /// that are empty.
    pub fn map_region(&self, index: u32) -> Result<BarWindow, VfioError> {
        let info = self.region_info(index)?;
        if let Some(reason) = info.unmappable_reason() {
            return Err(VfioError::RegionNotMappable {
                bdf: self.bdf(),
                index,
                flags: info.flags,
                size: info.size,
                reason,
            });
        }
        let len = usize::try_from(info.size).map_err(|_| VfioError::RegionNotMappable {
            bdf: self.bdf(),
            index,
            flags: info.flags,
            size: info.size,
            reason: "larger than the address space".into(),
        })?;
        let prot = Prot {
            read: info.readable(),
            write: info.writable(),
        };
        let owner: Owner = self.inner.clone();
        let region = Region::map(
            self.sys().clone(),
            Some(self.inner.fd),
            len,
            info.offset,
            prot,
            Some(owner),
        )
        .map_err(|errno| VfioError::MapFailed {
            what: format!("region {index} of {} through VFIO", self.bdf()),
            len,
            errno,
        })?;
        Ok(BarWindow::new(
            Arc::new(region),
            BarSource::Vfio {
                bdf: self.bdf(),
                index,
            },
        ))
    }

    /// Reads `buf.len()` bytes at `offset` of region `index` with `pread`
    /// (config space, small register BARs, ROM).
    pub fn read_region(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), VfioError> {
        let info = self.region_info(index)?;
        let at = self.region_offset(&info, offset, buf.len())?;
        match self.sys().pread(self.inner.fd, buf, at) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(self.access_error(offset, buf.len(), format!("short read of {n}"))),
            Err(errno) => Err(self.access_error(offset, buf.len(), errno.to_string())),
        }
    }

    /// Writes `buf` at `offset` of region `index` with `pwrite`.
    pub fn write_region(&self, index: u32, offset: u64, buf: &[u8]) -> Result<(), VfioError> {
        let info = self.region_info(index)?;
        let at = self.region_offset(&info, offset, buf.len())?;
        match self.sys().pwrite(self.inner.fd, buf, at) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(self.access_error(offset, buf.len(), format!("short write of {n}"))),
            Err(errno) => Err(self.access_error(offset, buf.len(), errno.to_string())),
        }
    }

    fn region_offset(&self, info: &RegionInfo, offset: u64, len: usize) -> Result<u64, VfioError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= info.size => Ok(info.offset + offset),
            _ => Err(self.access_error(
                offset,
                len,
                format!("outside region {} of {:#x} bytes", info.index, info.size),
            )),
        }
    }

    fn access_error(&self, offset: u64, len: usize, detail: String) -> VfioError {
        VfioError::ConfigAccess {
            bdf: self.bdf(),
            offset,
            len,
            detail,
        }
    }

    /// Reads config space.
    pub fn read_config(&self, offset: u64, buf: &mut [u8]) -> Result<(), VfioError> {
        self.read_region(region_index::CONFIG, offset, buf)
    }

    /// Writes config space (vfio-pci filters what may be written).
    pub fn write_config(&self, offset: u64, buf: &[u8]) -> Result<(), VfioError> {
        self.write_region(region_index::CONFIG, offset, buf)
    }

    /// Turns on memory decoding and bus mastering in the command register,
    /// so the device can DMA; returns the new command value.
    pub fn enable_bus_master(&self) -> Result<u16, VfioError> {
        let mut cmd = [0u8; 2];
        self.read_config(PCI_COMMAND, &mut cmd)?;
        let value = u16::from_le_bytes(cmd) | PCI_COMMAND_MASTER | PCI_COMMAND_MEMORY;
        self.write_config(PCI_COMMAND, &value.to_le_bytes())?;
        self.read_config(PCI_COMMAND, &mut cmd)?;
        Ok(u16::from_le_bytes(cmd))
    }

    /// `VFIO_DEVICE_RESET`.
    pub fn reset(&self) -> Result<(), VfioError> {
        self.sys()
            .device_reset(self.inner.fd)
            .map_err(|errno| VfioError::System {
                operation: "VFIO_DEVICE_RESET",
                target: self.bdf().to_string(),
                errno,
            })
    }
}

// Opening a device is the device's business: the container only lends it
// a group, so this part of `Container` lives here, and `container` needs
// nothing of `device`.
impl Container {
    /// Opens the device `bdf` in this container: checks that it is bound to
    /// vfio-pci, opens its group (or reuses it, if already in this
    /// container), checks the group is viable, joins it to the container,
    /// selects the IOMMU for the first group, and gets the device.
    pub fn open_device(&self, bdf: Bdf) -> Result<VfioDevice, VfioError> {
        let env = &self.inner.env;
        bind::existing_device_dir(&env.sysfs_root, bdf)?;
        let driver = bind::driver_of(&env.sysfs_root, bdf);
        if driver.as_deref() != Some(VFIO_PCI) {
            return Err(VfioError::NotBoundToVfio { bdf, driver });
        }
        let group_id =
            bind::iommu_group_of(&env.sysfs_root, bdf).ok_or(VfioError::NoIommuGroup { bdf })?;
        let group = self.group(group_id)?;
        VfioDevice::open_in_group(group, bdf)
    }
}
