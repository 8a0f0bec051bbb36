//! [`VfioError`]: every way opening a device, mapping a BAR or mapping DMA
//! can fail, each with what is needed to act on it and a message that says
//! what to check or run.

use std::fmt;
use std::path::{Path, PathBuf};

use barlink_topology::pci::address::Bdf;

use crate::sys::Errno;

/// A device in an IOMMU group and the driver it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The device's address (as named in `/sys/kernel/iommu_groups/N/devices`).
    pub device: String,
    /// Its driver, `None` when unbound.
    pub driver: Option<String>,
}

/// Why a VFIO or BAR-window operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VfioError {
    /// `/dev/vfio/vfio` does not exist: VFIO is not in this kernel or not
    /// loaded.
    NoVfio {
        /// The container node looked for.
        path: PathBuf,
    },
    /// The kernel's VFIO API version is not the one this code speaks.
    ApiVersion {
        /// What the kernel reported.
        found: i32,
        /// What barlink needs.
        expected: i32,
    },
    /// No type1 IOMMU backend: the IOMMU is off, or `vfio_iommu_type1` is
    /// not loaded.
    NoIommu {
        /// What was seen.
        detail: String,
    },
    /// The system refused access to a file or node.
    PermissionDenied {
        /// The file.
        path: PathBuf,
        /// The errno of the refusal.
        errno: Errno,
    },
    /// No PCI device at this address.
    DeviceNotFound {
        /// The address.
        bdf: Bdf,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// No device matches a `vendor:device` search.
    NoMatchingDevice {
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
        /// Which match was asked for (0 = first).
        index: usize,
        /// The addresses that do match.
        found: Vec<Bdf>,
    },
    /// A device specification that is neither an address nor `vendor:device`.
    BadDeviceSpec {
        /// The text given.
        text: String,
    },
    /// The device is not bound to vfio-pci.
    NotBoundToVfio {
        /// The device.
        bdf: Bdf,
        /// The driver it is bound to, `None` when unbound.
        driver: Option<String>,
    },
    /// The device has no IOMMU group: the IOMMU is off.
    NoIommuGroup {
        /// The device.
        bdf: Bdf,
    },
    /// The group's node `/dev/vfio/N` does not exist.
    GroupNodeMissing {
        /// The group.
        group: u32,
        /// The node.
        path: PathBuf,
    },
    /// Another process (or container) has the group open.
    GroupBusy {
        /// The group.
        group: u32,
        /// The node.
        path: PathBuf,
    },
    /// Not every device in the group is bound to vfio-pci (or unbound).
    GroupNotViable {
        /// The group.
        group: u32,
        /// The devices that keep it from being viable (bound to another
        /// driver), as far as sysfs tells.
        blockers: Vec<GroupMember>,
    },
    /// No region with this index.
    NoSuchRegion {
        /// The device (or `None` for a sysfs BAR given by path).
        bdf: Bdf,
        /// The index asked for.
        index: u32,
        /// How many regions the device has.
        count: u32,
    },
    /// The region exists but cannot be mapped as a window.
    RegionNotMappable {
        /// The device.
        bdf: Bdf,
        /// The region index.
        index: u32,
        /// Its `VFIO_REGION_INFO_FLAG_*` (0 for sysfs BARs).
        flags: u32,
        /// Its size.
        size: u64,
        /// Why not, and what to use instead.
        reason: String,
    },
    /// A sysfs BAR that decodes I/O ports, which cannot be mapped.
    IoSpaceBar {
        /// The device.
        bdf: Bdf,
        /// The BAR.
        index: u32,
    },
    /// A `resourceN` file that is missing.
    ResourceMissing {
        /// The file.
        path: PathBuf,
    },
    /// A mapping larger than the BAR (or its `resourceN` file).
    BarTooSmall {
        /// The file or region.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// What was asked for.
        requested: u64,
    },
    /// Another open of the BAR's `resourceN` file holds some of these
    /// bytes as a link's receive ring (a second link over the same window
    /// would lay its ring out over the live one).
    WindowInUse {
        /// The file.
        path: PathBuf,
        /// The window's first byte in the BAR.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// `mmap` failed.
    MapFailed {
        /// What was being mapped.
        what: String,
        /// Bytes.
        len: usize,
        /// The errno.
        errno: Errno,
    },
    /// A DMA mapping was refused, or its arguments are unusable.
    DmaMapFailed {
        /// The I/O virtual address.
        iova: u64,
        /// Bytes.
        size: u64,
        /// The errno, when the kernel refused.
        errno: Option<Errno>,
        /// What to check.
        hint: String,
    },
    /// An access to a device's config space outside it, or short.
    ConfigAccess {
        /// The device.
        bdf: Bdf,
        /// Offset in config space.
        offset: u64,
        /// Bytes.
        len: usize,
        /// What went wrong.
        detail: String,
    },
    /// Binding a device to vfio-pci failed.
    BindFailed {
        /// The device.
        bdf: Bdf,
        /// What was seen.
        detail: String,
    },
    /// A sysfs file could not be read or written.
    Sysfs {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// Another system call failed.
    System {
        /// The call, in words.
        operation: &'static str,
        /// What it was applied to.
        target: String,
        /// The errno.
        errno: Errno,
    },
}

impl fmt::Display for VfioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VfioError::NoVfio { path } => write!(
                f,
                "{} does not exist: VFIO is not available. Load it with `modprobe vfio-pci` \
                 (and `modprobe vfio_iommu_type1`); a kernel without CONFIG_VFIO cannot do this",
                path.display()
            ),
            VfioError::ApiVersion { found, expected } => write!(
                f,
                "the kernel's VFIO API version is {found}, barlink speaks {expected}"
            ),
            VfioError::NoIommu { detail } => write!(
                f,
                "no usable IOMMU for VFIO ({detail}): load the type1 backend with \
                 `modprobe vfio_iommu_type1`, and enable the IOMMU on the kernel command line \
                 (intel_iommu=on or amd_iommu=on; check /sys/kernel/iommu_groups is not empty)"
            ),
            VfioError::PermissionDenied { path, errno } => permission_denied(f, path, *errno),
            VfioError::DeviceNotFound { bdf, path } => write!(
                f,
                "no PCI device {bdf} ({} does not exist): check the address with `lspci -D`",
                path.display()
            ),
            VfioError::NoMatchingDevice {
                vendor,
                device,
                index,
                found,
            } => no_matching_device(f, *vendor, *device, *index, found),
            VfioError::BadDeviceSpec { text } => write!(
                f,
                "{text:?} names no device: give an address (0000:01:00.0) or vendor:device \
                 (10de:2684, or 10de:2684#1 for the second match)"
            ),
            VfioError::NotBoundToVfio { bdf, driver } => {
                not_bound_to_vfio(f, *bdf, driver.as_deref())
            }
            VfioError::NoIommuGroup { bdf } => write!(
                f,
                "{bdf} has no IOMMU group: the IOMMU is off or absent. Enable it in firmware \
                 (VT-d / AMD-Vi) and on the kernel command line (intel_iommu=on or amd_iommu=on)"
            ),
            VfioError::GroupNodeMissing { group, path } => write!(
                f,
                "VFIO group {group} has no node {}: is the device bound to vfio-pci, and is \
                 devtmpfs mounted on /dev?",
                path.display()
            ),
            VfioError::GroupBusy { group, path } => write!(
                f,
                "VFIO group {group} ({}) is in use by another process or container: a group \
                 can be open in one place at a time (check `fuser {}`)",
                path.display(),
                path.display()
            ),
            VfioError::GroupNotViable { group, blockers } => group_not_viable(f, *group, blockers),
            VfioError::NoSuchRegion { bdf, index, count } => write!(
                f,
                "{bdf} has no region {index}: it has {count} (0-5 are BARs, 6 the ROM, 7 config \
                 space, 8 VGA)"
            ),
            VfioError::RegionNotMappable {
                bdf,
                index,
                flags,
                size,
                reason,
            } => region_not_mappable(f, *bdf, *index, *flags, *size, reason),
            VfioError::IoSpaceBar { bdf, index } => write!(
                f,
                "BAR {index} of {bdf} decodes I/O ports, not memory: it cannot be mapped; use a \
                 memory BAR (see `lspci -v -s {bdf}`)"
            ),
            VfioError::ResourceMissing { path } => write!(
                f,
                "{} does not exist: the device has no such BAR, or this kernel does not \
                 expose BARs in sysfs",
                path.display()
            ),
            VfioError::BarTooSmall {
                path,
                size,
                requested,
            } => bar_too_small(f, path, *size, *requested),
            VfioError::WindowInUse { path, offset, len } => write!(
                f,
                "bytes {offset:#x}..{:#x} of {} are in use as another link's receive ring (a \
                 process, or another link of this one, claimed them and still has them mapped): \
                 a second ring there would overwrite the live one; give this link a window \
                 elsewhere in the BAR, or end the other link first",
                offset.saturating_add(*len),
                path.display()
            ),
            VfioError::MapFailed { what, len, errno } => map_failed(f, what, *len, *errno),
            VfioError::DmaMapFailed {
                iova,
                size,
                errno,
                hint,
            } => dma_map_failed(f, *iova, *size, *errno, hint),
            VfioError::ConfigAccess {
                bdf,
                offset,
                len,
                detail,
            } => write!(
                f,
                "config space access of {len} bytes at {offset:#x} on {bdf}: {detail}"
            ),
            VfioError::BindFailed { bdf, detail } => {
                write!(f, "binding {bdf} to vfio-pci failed: {detail}")
            }
            VfioError::Sysfs { path, detail } => write!(f, "{}: {detail}", path.display()),
            VfioError::System {
                operation,
                target,
                errno,
            } => write!(f, "{operation} on {target} failed: {errno}"),
        }
    }
}

impl std::error::Error for VfioError {}

/// Root for sysfs files; for VFIO nodes, root or the node's owner, and
/// the locked-memory limit DMA needs.
fn permission_denied(f: &mut fmt::Formatter<'_>, path: &Path, errno: Errno) -> fmt::Result {
    if path.starts_with("/sys") || path.to_string_lossy().contains("/sys/") {
        write!(
            f,
            "{}: {errno}. Run as root: sysfs PCI resource and driver files are \
             root-only (mode 0600 / 0200)",
            path.display()
        )
    } else {
        write!(
            f,
            "{}: {errno}. Run as root, or give this user the node: \
             `chown $USER {}` (VFIO group nodes are root-only by default), and \
             for DMA raise the locked-memory limit (`ulimit -l`)",
            path.display(),
            path.display()
        )
    }
}

/// No such device at all, or fewer matches than the index asked for.
fn no_matching_device(
    f: &mut fmt::Formatter<'_>,
    vendor: u16,
    device: u16,
    index: usize,
    found: &[Bdf],
) -> fmt::Result {
    if found.is_empty() {
        write!(
            f,
            "no PCI device {vendor:04x}:{device:04x}: check with `lspci -nn -d {vendor:04x}:{device:04x}`"
        )
    } else {
        let list: Vec<String> = found.iter().map(Bdf::to_string).collect();
        write!(
            f,
            "match #{index} of {vendor:04x}:{device:04x} asked for, but only {} exist ({})",
            found.len(),
            list.join(", ")
        )
    }
}

/// The commands that bind the device to vfio-pci, unbinding it from its
/// driver first if it has one.
fn not_bound_to_vfio(f: &mut fmt::Formatter<'_>, bdf: Bdf, driver: Option<&str>) -> fmt::Result {
    let (now, unbind) = match driver {
        Some(driver) => (
            format!("is bound to {driver}"),
            format!("echo {bdf} > /sys/bus/pci/devices/{bdf}/driver/unbind; "),
        ),
        None => ("is bound to no driver".to_string(), String::new()),
    };
    write!(
        f,
        "{bdf} {now}, not vfio-pci. Bind it (as root, with vfio-pci loaded): \
         `echo vfio-pci > /sys/bus/pci/devices/{bdf}/driver_override; \
         {unbind}echo {bdf} > /sys/bus/pci/drivers_probe` \
         (barlink_vfio::bind_to_vfio_pci does this), or use the sysfs resource \
         route to keep the vendor driver"
    )
}

/// Names the devices that keep the group from being viable, when sysfs
/// tells which.
fn group_not_viable(
    f: &mut fmt::Formatter<'_>,
    group: u32,
    blockers: &[GroupMember],
) -> fmt::Result {
    write!(
        f,
        "VFIO group {group} is not viable: every device in it must be bound to \
         vfio-pci (or to no driver)"
    )?;
    if blockers.is_empty() {
        write!(f, "; check /sys/kernel/iommu_groups/{group}/devices")
    } else {
        let list: Vec<String> = blockers
            .iter()
            .map(|m| match &m.driver {
                Some(d) => format!("{} (bound to {d})", m.device),
                None => m.device.clone(),
            })
            .collect();
        write!(
            f,
            "; bind or unbind these too: {} (or move the device to a slot with its \
             own group / an ACS-capable switch)",
            list.join(", ")
        )
    }
}

/// The region and why it cannot be a window (with what to use instead).
fn region_not_mappable(
    f: &mut fmt::Formatter<'_>,
    bdf: Bdf,
    index: u32,
    flags: u32,
    size: u64,
    reason: &str,
) -> fmt::Result {
    write!(
        f,
        "region {index} of {bdf} (size {size:#x}, flags {flags:#x}) cannot be mapped \
         as a window: {reason}"
    )
}

/// A mapping longer than the BAR: map less, or make the BAR larger.
fn bar_too_small(
    f: &mut fmt::Formatter<'_>,
    path: &Path,
    size: u64,
    requested: u64,
) -> fmt::Result {
    write!(
        f,
        "{} is {size:#x} bytes, but {requested:#x} were asked for: map less, or \
         resize the BAR (Resizable BAR)",
        path.display()
    )
}

/// EINVAL from mmap of a sysfs BAR usually means the kernel keeps a
/// claimed BAR from being mapped twice.
fn map_failed(f: &mut fmt::Formatter<'_>, what: &str, len: usize, errno: Errno) -> fmt::Result {
    write!(f, "mmap of {len:#x} bytes of {what} failed: {errno}")?;
    if errno.0 == libc::EINVAL {
        write!(
            f,
            " (a sysfs BAR claimed by a driver cannot be mapped when the kernel \
             has CONFIG_IO_STRICT_DEVMEM: close the VFIO user or boot with \
             iomem=relaxed; also check the length and offset are page-aligned)"
        )?;
    }
    Ok(())
}

/// The kernel's errno, when it refused, and what to check.
fn dma_map_failed(
    f: &mut fmt::Formatter<'_>,
    iova: u64,
    size: u64,
    errno: Option<Errno>,
    hint: &str,
) -> fmt::Result {
    write!(f, "DMA mapping of {size:#x} bytes at IOVA {iova:#x} failed")?;
    if let Some(errno) = errno {
        write!(f, ": {errno}")?;
    }
    write!(f, " ({hint})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_to_do() {
        let bdf: Bdf = "0000:00:10.0".parse().unwrap();
        let text = VfioError::NotBoundToVfio {
            bdf,
            driver: Some("nvidia".into()),
        }
        .to_string();
        assert!(text.contains("bound to nvidia"), "{text}");
        assert!(text.contains("/sys/bus/pci/devices/0000:00:10.0/driver_override"));
        assert!(text.contains("0000:00:10.0/driver/unbind"));
        let unbound = VfioError::NotBoundToVfio { bdf, driver: None }.to_string();
        assert!(!unbound.contains("driver/unbind"), "{unbound}");
        let text = VfioError::PermissionDenied {
            path: "/dev/vfio/7".into(),
            errno: Errno(libc::EACCES),
        }
        .to_string();
        assert!(
            text.contains("run as root") || text.contains("Run as root"),
            "{text}"
        );
        assert!(text.contains("chown $USER /dev/vfio/7"), "{text}");
        let text = VfioError::GroupNotViable {
            group: 3,
            blockers: vec![GroupMember {
                device: "0000:01:00.1".into(),
                driver: Some("snd_hda_intel".into()),
            }],
        }
        .to_string();
        assert!(
            text.contains("0000:01:00.1 (bound to snd_hda_intel)"),
            "{text}"
        );
        let text = VfioError::NoIommu { detail: "x".into() }.to_string();
        assert!(text.contains("modprobe vfio_iommu_type1"), "{text}");
    }
}
