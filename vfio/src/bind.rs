//! Finding and binding devices through sysfs: which driver a device has,
//! its IOMMU group and the group's other members, devices by
//! `vendor:device`, and binding to vfio-pci (`driver_override`, unbind,
//! `drivers_probe`) — what a user would otherwise do by hand with `echo`.
//!
//! Every path is taken under a sysfs root (normally `/`), so tests can use
//! fixture trees. No unsafe code: this is file reads, writes and links.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use barlink_topology::pci::PCI_DEVICES_DIR;
use barlink_topology::pci::address::Bdf;

use crate::error::{GroupMember, VfioError};
use crate::sys::Errno;

/// The driver name vfio-pci registers.
pub const VFIO_PCI: &str = "vfio-pci";

/// A device named by address or by `vendor:device` (with which match).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// `0000:01:00.0`.
    Address(Bdf),
    /// `10de:2684` (first match in address order), or `10de:2684#1` (the
    /// second).
    Id {
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
        /// Which match, 0-based.
        index: usize,
    },
}

impl FromStr for DeviceSpec {
    type Err = VfioError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || VfioError::BadDeviceSpec {
            text: text.to_string(),
        };
        if let Ok(bdf) = text.parse::<Bdf>() {
            return Ok(DeviceSpec::Address(bdf));
        }
        let (id, index) = match text.split_once('#') {
            Some((id, index)) => (id, index.parse::<usize>().map_err(|_| bad())?),
            None => (text, 0),
        };
        let (vendor, device) = id.split_once(':').ok_or_else(bad)?;
        let hex4 = |s: &str| {
            if s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                u16::from_str_radix(s, 16).ok()
            } else {
                None
            }
        };
        Ok(DeviceSpec::Id {
            vendor: hex4(vendor).ok_or_else(bad)?,
            device: hex4(device).ok_or_else(bad)?,
            index,
        })
    }
}

impl From<Bdf> for DeviceSpec {
    fn from(bdf: Bdf) -> Self {
        DeviceSpec::Address(bdf)
    }
}

impl DeviceSpec {
    /// The address this names: itself, or the `index`-th device (in
    /// address order) with this vendor and device ID under `root`.
    pub fn resolve(&self, root: &Path) -> Result<Bdf, VfioError> {
        match *self {
            DeviceSpec::Address(bdf) => existing_device_dir(root, bdf).map(|_| bdf),
            DeviceSpec::Id {
                vendor,
                device,
                index,
            } => {
                let found = find_by_id(root, vendor, device)?;
                found
                    .get(index)
                    .copied()
                    .ok_or(VfioError::NoMatchingDevice {
                        vendor,
                        device,
                        index,
                        found,
                    })
            }
        }
    }
}

/// `ROOT/sys/bus/pci/devices/BDF`.
pub fn device_dir(root: &Path, bdf: Bdf) -> PathBuf {
    root.join(PCI_DEVICES_DIR).join(bdf.to_string())
}

/// `ROOT/sys/bus/pci/devices/BDF`, checked to exist: a missing directory is
/// [`VfioError::DeviceNotFound`], one that cannot be looked at says why.
pub fn existing_device_dir(root: &Path, bdf: Bdf) -> Result<PathBuf, VfioError> {
    let dir = device_dir(root, bdf);
    match fs::metadata(&dir) {
        Ok(_) => Ok(dir),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Err(VfioError::DeviceNotFound { bdf, path: dir })
        }
        Err(error) => Err(sysfs_error(&dir, &error)),
    }
}

/// Every device under `root` with this vendor and device ID, in address
/// order.
pub fn find_by_id(root: &Path, vendor: u16, device: u16) -> Result<Vec<Bdf>, VfioError> {
    let dir = root.join(PCI_DEVICES_DIR);
    let entries = fs::read_dir(&dir).map_err(|e| sysfs_error(&dir, &e))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(bdf) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<Bdf>().ok())
        else {
            continue;
        };
        let id = |name: &str| -> Option<u16> {
            let text = fs::read_to_string(entry.path().join(name)).ok()?;
            u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
        };
        if id("vendor") == Some(vendor) && id("device") == Some(device) {
            found.push(bdf);
        }
    }
    found.sort();
    Ok(found)
}

/// The name of the driver `bdf` is bound to, `None` when unbound.
pub fn driver_of(root: &Path, bdf: Bdf) -> Option<String> {
    link_name(&device_dir(root, bdf).join("driver"))
}

/// The IOMMU group of `bdf`, `None` when it has none (IOMMU off).
pub fn iommu_group_of(root: &Path, bdf: Bdf) -> Option<u32> {
    link_name(&device_dir(root, bdf).join("iommu_group"))?
        .parse()
        .ok()
}

/// The devices of IOMMU group `group` and their drivers.
pub fn group_members(root: &Path, group: u32) -> Vec<GroupMember> {
    let dir = root.join(format!("sys/kernel/iommu_groups/{group}/devices"));
    let mut members: Vec<GroupMember> = fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| GroupMember {
                    device: entry.file_name().to_string_lossy().into_owned(),
                    driver: link_name(&entry.path().join("driver")),
                })
                .collect()
        })
        .unwrap_or_default();
    members.sort_by(|a, b| a.device.cmp(&b.device));
    members
}

/// The members that keep a group from being viable: bound to a driver that
/// is not a VFIO driver. (The kernel also tolerates `pci-stub` and bridges
/// bound to `pcieport`, so those are not listed.)
pub fn group_blockers(root: &Path, group: u32) -> Vec<GroupMember> {
    group_members(root, group)
        .into_iter()
        .filter(|m| {
            m.driver
                .as_deref()
                .is_some_and(|d| d != VFIO_PCI && d != "pci-stub" && d != "pcieport")
        })
        .collect()
}

/// The last component of a symlink's target.
fn link_name(path: &Path) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

fn sysfs_error(path: &Path, error: &io::Error) -> VfioError {
    match error.raw_os_error() {
        Some(errno) if Errno(errno).is_permission() => VfioError::PermissionDenied {
            path: path.to_path_buf(),
            errno: Errno(errno),
        },
        _ => VfioError::Sysfs {
            path: path.to_path_buf(),
            detail: error.to_string(),
        },
    }
}

fn write_attr(path: &Path, value: &str) -> Result<(), VfioError> {
    fs::write(path, value).map_err(|e| sysfs_error(path, &e))
}

/// What [`bind_to_vfio_pci`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// The device was bound to vfio-pci already; nothing was done.
    AlreadyBound,
    /// The device was unbound from this driver (or had none) and is now
    /// bound to vfio-pci.
    Bound {
        /// The driver it had before, if any.
        previous: Option<String>,
    },
}

/// Binds `bdf` to vfio-pci under `/` (see [`bind_to_vfio_pci_in`]).
pub fn bind_to_vfio_pci(bdf: Bdf) -> Result<BindOutcome, VfioError> {
    bind_to_vfio_pci_in(Path::new("/"), bdf)
}

/// Binds `bdf` to vfio-pci: sets `driver_override` to `vfio-pci`, unbinds
/// its current driver, asks the bus to probe it again, and waits (up to two
/// seconds) for the binding and for its group node under `/dev/vfio` (when
/// `root` is `/`). Needs root. Idempotent: a bound device is left alone.
///
/// The override stays set, so the device returns to vfio-pci after a
/// rebind; [`unbind`] leaves it set too.
pub fn bind_to_vfio_pci_in(root: &Path, bdf: Bdf) -> Result<BindOutcome, VfioError> {
    let dir = existing_device_dir(root, bdf)?;
    let previous = driver_of(root, bdf);
    if previous.as_deref() == Some(VFIO_PCI) {
        return Ok(BindOutcome::AlreadyBound);
    }
    let drivers = root.join("sys/bus/pci/drivers").join(VFIO_PCI);
    if !drivers.exists() {
        return Err(VfioError::BindFailed {
            bdf,
            detail: format!(
                "{} does not exist: load the driver with `modprobe vfio-pci`",
                drivers.display()
            ),
        });
    }
    write_attr(&dir.join("driver_override"), VFIO_PCI)?;
    if previous.is_some() {
        write_attr(&dir.join("driver/unbind"), &bdf.to_string())?;
    }
    write_attr(&root.join("sys/bus/pci/drivers_probe"), &bdf.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now = driver_of(root, bdf);
        if now.as_deref() == Some(VFIO_PCI) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(VfioError::BindFailed {
                bdf,
                detail: format!(
                    "after driver_override and drivers_probe it is bound to {} (check dmesg: \
                     vfio-pci refuses devices without an IOMMU group)",
                    now.as_deref().unwrap_or("no driver")
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // devtmpfs creates the group node asynchronously; wait for it where it
    // would be.
    if root == Path::new("/")
        && let Some(group) = iommu_group_of(root, bdf)
    {
        let node = PathBuf::from(format!("/dev/vfio/{group}"));
        while !node.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(BindOutcome::Bound { previous })
}

/// Unbinds `bdf` from its driver (if any). `driver_override` is left as it
/// is, so a device overridden to vfio-pci stays unbound until
/// [`bind_to_vfio_pci_in`] probes it again.
pub fn unbind(root: &Path, bdf: Bdf) -> Result<(), VfioError> {
    let dir = existing_device_dir(root, bdf)?;
    if driver_of(root, bdf).is_some() {
        write_attr(&dir.join("driver/unbind"), &bdf.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            "0000:00:10.0".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Address("0000:00:10.0".parse().unwrap())
        );
        assert_eq!(
            "1af4:1110".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Id {
                vendor: 0x1af4,
                device: 0x1110,
                index: 0
            }
        );
        assert_eq!(
            "1234:11E8#2".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Id {
                vendor: 0x1234,
                device: 0x11e8,
                index: 2
            }
        );
        for bad in [
            "",
            "1af4",
            "1af4:",
            "1af4:11100",
            "xyzw:1110",
            "1af4:1110#x",
            "0000:00:10",
        ] {
            let error = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(error, VfioError::BadDeviceSpec { .. }), "{bad}");
        }
    }
}
