//! Discovery: everything barlink reads about the machine, in one snapshot.
//!
//! [`discover`] reads the PCI tree, the IOMMU state, the CPU vendor (which
//! decides how far peer-to-peer through the root complex is trusted) and the
//! number of NUMA nodes, all under a configurable root (`/` for the running
//! machine, a fixture directory in tests), and collects every diagnostic.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::diag::Diagnostic;
use crate::iommu::IommuState;
use crate::pci::PciDevice;
use crate::pci::address::Bdf;
use crate::sysfs::{self, ReadError};
use crate::tree;

/// The CPU vendor, from `proc/cpuinfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuVendor {
    Intel,
    /// AMD (and Hygon, which shares its root complex design).
    Amd,
    Arm,
    Other(String),
    Unknown,
}

impl CpuVendor {
    /// Picks the vendor out of `cpuinfo` text.
    pub fn from_cpuinfo(text: &str) -> CpuVendor {
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            match key.trim() {
                "vendor_id" => {
                    return match value.trim() {
                        "GenuineIntel" => CpuVendor::Intel,
                        "AuthenticAMD" | "HygonGenuine" => CpuVendor::Amd,
                        other => CpuVendor::Other(other.to_string()),
                    };
                }
                "CPU implementer" => return CpuVendor::Arm,
                _ => {}
            }
        }
        CpuVendor::Unknown
    }
}

impl fmt::Display for CpuVendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuVendor::Intel => write!(f, "Intel"),
            CpuVendor::Amd => write!(f, "AMD"),
            CpuVendor::Arm => write!(f, "Arm"),
            CpuVendor::Other(name) => write!(f, "{name}"),
            CpuVendor::Unknown => write!(f, "unknown"),
        }
    }
}

/// Discovery could not even start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// `ROOT/sys/bus/pci/devices` cannot be listed: wrong root, no sysfs
    /// mounted, or no PCI bus.
    NoPciDirectory { root: PathBuf, error: ReadError },
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryError::NoPciDirectory { root, error } => write!(
                f,
                "cannot list PCI devices under sysfs root {}: {error} (is this the right --sysfs-root?)",
                root.display()
            ),
        }
    }
}

impl std::error::Error for DiscoveryError {}

/// Everything read about the machine.
#[derive(Debug, Clone)]
pub struct Platform {
    pub sysfs_root: PathBuf,
    pub devices: BTreeMap<Bdf, PciDevice>,
    pub iommu: IommuState,
    pub cpu_vendor: CpuVendor,
    /// How many NUMA nodes are online; `None` when unreadable.
    pub numa_nodes_online: Option<u32>,
    /// Everything that could not be read, device and system.
    pub diagnostics: Vec<Diagnostic>,
}

impl Platform {
    pub fn device(&self, bdf: Bdf) -> Option<&PciDevice> {
        self.devices.get(&bdf)
    }
}

/// Reads the platform under `root` (`/` for this machine: then
/// `/sys/bus/pci/devices`, `/proc/cmdline`, …).
pub fn discover(root: &Path) -> Result<Platform, DiscoveryError> {
    let tree = tree::read_tree(root).map_err(|error| DiscoveryError::NoPciDirectory {
        root: root.to_path_buf(),
        error,
    })?;
    let mut diagnostics = tree.diagnostics;
    let iommu = IommuState::read(root, &mut diagnostics);
    let cpu_vendor = match sysfs::read_bytes(&root.join("proc/cpuinfo"), sysfs::TEXT_LIMIT) {
        Ok(bytes) => CpuVendor::from_cpuinfo(&String::from_utf8_lossy(&bytes)),
        Err(e) => {
            diagnostics.push(Diagnostic::system_read(
                e,
                "CPU vendor unknown: peer-to-peer through the root complex is treated as on Intel (not trusted)",
            ));
            CpuVendor::Unknown
        }
    };
    let numa_nodes_online = read_numa_nodes(root);
    Ok(Platform {
        sysfs_root: root.to_path_buf(),
        devices: tree.devices,
        iommu,
        cpu_vendor,
        numa_nodes_online,
        diagnostics,
    })
}

/// Counts online NUMA nodes from `sys/devices/system/node/online` ("0-1"),
/// falling back to counting `nodeN` directories.
fn read_numa_nodes(root: &Path) -> Option<u32> {
    let node_dir = root.join("sys/devices/system/node");
    if let Ok(text) = sysfs::read_text(&node_dir.join("online"))
        && let Some(count) = count_cpulist(&text)
    {
        return Some(count);
    }
    let names = sysfs::list_dir(&node_dir).ok()?;
    let count = names
        .iter()
        .filter(|n| {
            n.strip_prefix("node")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    u32::try_from(count).ok().filter(|c| *c > 0)
}

/// Counts the members of a kernel list such as `0-1` or `0,2-3`.
pub fn count_cpulist(text: &str) -> Option<u32> {
    let mut count: u32 = 0;
    for part in text.trim().split(',') {
        let (low, high) = match part.split_once('-') {
            Some((low, high)) => (low.parse::<u32>().ok()?, high.parse::<u32>().ok()?),
            None => {
                let value = part.parse::<u32>().ok()?;
                (value, value)
            }
        };
        if high < low {
            return None;
        }
        count = count.checked_add(high - low + 1)?;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_vendor_from_cpuinfo() {
        assert_eq!(
            CpuVendor::from_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n"),
            CpuVendor::Amd
        );
        assert_eq!(
            CpuVendor::from_cpuinfo("vendor_id : GenuineIntel"),
            CpuVendor::Intel
        );
        assert_eq!(
            CpuVendor::from_cpuinfo("CPU implementer\t: 0x41"),
            CpuVendor::Arm
        );
        assert_eq!(CpuVendor::from_cpuinfo(""), CpuVendor::Unknown);
    }

    #[test]
    fn lists_count() {
        assert_eq!(count_cpulist("0-1"), Some(2));
        assert_eq!(count_cpulist("0,2-3\n"), Some(3));
        assert_eq!(count_cpulist("0"), Some(1));
        assert_eq!(count_cpulist("3-1"), None);
        assert_eq!(count_cpulist("x"), None);
    }
}
