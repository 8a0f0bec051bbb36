//! Reading the PCI tree from sysfs: every function under
//! `sys/bus/pci/devices`, with the chain of bridges above it taken from its
//! canonical path under `sys/devices/pciDDDD:BB/…`.
//!
//! [`read_tree`] reads what it can and records what it cannot as
//! [`Diagnostic`]s; only a missing `sys/bus/pci/devices` directory is an
//! error, because then there is nothing to report on.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use crate::diag::{Diagnostic, Problem, Subject};
use crate::pci::address::{Bdf, HostBridge};
use crate::pci::class::{self, ClassCode};
use crate::pci::config::{self, ConfigAccess, ConfigInfo};
use crate::pci::link::{self, LinkSpeed, LinkState};
use crate::pci::resource;
use crate::pci::{PCI_DEVICES_DIR, PciDevice};
use crate::sysfs::{self, ReadError};

/// Every function that could be read, and the diagnostics of the reading.
#[derive(Debug, Clone, Default)]
pub struct PciTree {
    pub devices: BTreeMap<Bdf, PciDevice>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Reads every function listed in `ROOT/sys/bus/pci/devices`.
///
/// Errors only when that directory cannot be listed.
pub fn read_tree(root: &Path) -> Result<PciTree, ReadError> {
    let list_path = root.join(PCI_DEVICES_DIR);
    let names = sysfs::list_dir(&list_path)?;
    let mut tree = PciTree::default();
    for name in names {
        let bdf: Bdf = match name.parse() {
            Ok(bdf) => bdf,
            Err(_) => {
                tree.diagnostics.push(Diagnostic::new(
                    Subject::Entry(name.clone()),
                    Problem::NotAPciAddress { name },
                    "ignored",
                ));
                continue;
            }
        };
        let entry = list_path.join(&name);
        let relative = match sysfs::resolve_within(root, &entry) {
            Ok(relative) => relative,
            Err(error) => {
                tree.diagnostics.push(Diagnostic::new(
                    Subject::Entry(name),
                    Problem::Read(error),
                    "device skipped: its sysfs directory cannot be found, so a GPU or NIC may be missing from the report",
                ));
                continue;
            }
        };
        let dir = root.join(&relative);
        if !dir.is_dir() {
            tree.diagnostics.push(Diagnostic::new(
                Subject::Entry(name),
                Problem::Read(ReadError::Missing { path: dir }),
                "device skipped: its sysfs directory cannot be found, so a GPU or NIC may be missing from the report",
            ));
            continue;
        }
        let device = read_device(bdf, &dir, &relative, &mut tree.diagnostics);
        tree.devices.insert(bdf, device);
    }
    Ok(tree)
}

/// Splits a canonical device path into its host bridge and the bridges above
/// the device. Components before the last `pciDDDD:BB` (ACPI or VMBus nodes,
/// a VMD controller) are not PCI hops on the path we care about.
fn parse_device_path(relative: &Path, bdf: Bdf) -> Option<(HostBridge, Vec<Bdf>)> {
    let parts: Vec<&str> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect();
    if parts.len() < 3 || parts[0] != "sys" || parts[1] != "devices" {
        return None;
    }
    let host_index = parts.iter().rposition(|p| HostBridge::parse(p).is_some())?;
    let host = HostBridge::parse(parts[host_index])?;
    let below: &[&str] = &parts[host_index + 1..];
    let (last, bridges) = below.split_last()?;
    if last.parse::<Bdf>().ok()? != bdf {
        return None;
    }
    let bridges = bridges
        .iter()
        .map(|p| p.parse::<Bdf>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some((host, bridges))
}

fn read_device(
    bdf: Bdf,
    dir: &Path,
    relative: &Path,
    diagnostics: &mut Vec<Diagnostic>,
) -> PciDevice {
    let (host_bridge, upstream_bridges) = match parse_device_path(relative, bdf) {
        Some((host, bridges)) => (Some(host), bridges),
        None => {
            diagnostics.push(Diagnostic::new(
                Subject::Device(bdf),
                Problem::PathOutsideDeviceTree {
                    path: relative.display().to_string(),
                },
                "bridges above it unknown: its pairs are classified as if it sat on a host bridge of its own",
            ));
            (None, Vec::new())
        }
    };
    let (class, vendor, device_id) = read_ids(bdf, dir, diagnostics);
    let on_root_bus = host_bridge.is_some() && upstream_bridges.is_empty();
    let role = class::role_of(class, vendor, on_root_bus);
    let bars = read_bars(bdf, dir, diagnostics);
    let numa_node = read_numa_node(bdf, dir, diagnostics);
    let local_cpulist = sysfs::read_text(&dir.join("local_cpulist")).ok();
    let config = read_config(bdf, dir, diagnostics);
    let link = read_link(bdf, dir, &config, diagnostics);
    let iommu_group = read_iommu_group(bdf, dir, diagnostics);
    let driver = sysfs::read_link_name(&dir.join("driver")).ok();
    let rdma_devices = sysfs::list_dir(&dir.join("infiniband")).unwrap_or_default();
    let net_devices = sysfs::list_dir(&dir.join("net")).unwrap_or_default();

    PciDevice {
        bdf,
        sysfs_path: relative.display().to_string(),
        host_bridge,
        upstream_bridges,
        class,
        vendor,
        device_id,
        role,
        bars,
        numa_node,
        local_cpulist,
        link,
        iommu_group,
        driver,
        config,
        rdma_devices,
        net_devices,
    }
}

/// The class code, vendor id and device id.
fn read_ids(
    bdf: Bdf,
    dir: &Path,
    diagnostics: &mut Vec<Diagnostic>,
) -> (Option<ClassCode>, Option<u16>, Option<u16>) {
    let mut note = |error: ReadError, consequence: &str| {
        diagnostics.push(Diagnostic::device_read(bdf, error, consequence));
    };
    let class = sysfs::read_parsed(&dir.join("class"), "a hex class code like 0x030000", |t| {
        sysfs::parse_hex_u32(t)
            .filter(|v| *v <= 0xff_ffff)
            .map(ClassCode)
    })
    .map_err(|e| note(e, "role unknown: not counted as a GPU or NIC"))
    .ok();
    let vendor = sysfs::read_parsed(
        &dir.join("vendor"),
        "a hex vendor id like 0x10de",
        sysfs::parse_hex_u16,
    )
    .map_err(|e| {
        note(
            e,
            "vendor unknown: a display device is not counted as a GPU",
        )
    })
    .ok();
    let device_id = sysfs::read_parsed(
        &dir.join("device"),
        "a hex device id like 0x2684",
        sysfs::parse_hex_u16,
    )
    .map_err(|e| note(e, "device id unknown: GPU memory size cannot be looked up"))
    .ok();
    (class, vendor, device_id)
}

/// The BARs from the `resource` file; a line that cannot be decoded is
/// left out with a diagnostic of its own.
fn read_bars(bdf: Bdf, dir: &Path, diagnostics: &mut Vec<Diagnostic>) -> Vec<resource::Bar> {
    match sysfs::read_text(&dir.join("resource")) {
        Ok(text) => {
            let (bars, bad_lines) = resource::parse_resource(&text);
            for bad in bad_lines {
                diagnostics.push(Diagnostic::new(
                    Subject::Device(bdf),
                    Problem::ResourceLine {
                        line: bad.line,
                        text: bad.text,
                    },
                    format!("BAR{} ignored: its size is unknown", bad.line),
                ));
            }
            bars
        }
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "BAR sizes unknown: BAR checks for this device cannot be made",
            ));
            Vec::new()
        }
    }
}

/// The NUMA node; `None` for the kernel's -1 (no affinity) too.
fn read_numa_node(bdf: Bdf, dir: &Path, diagnostics: &mut Vec<Diagnostic>) -> Option<u32> {
    match sysfs::read_parsed(&dir.join("numa_node"), "a NUMA node number or -1", |t| {
        t.parse::<i64>().ok()
    }) {
        Ok(n) if n >= 0 => u32::try_from(n).ok(),
        Ok(_) => None,
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "NUMA node unknown: socket placement is judged from host bridges alone",
            ));
            None
        }
    }
}

/// The IOMMU group the `iommu_group` link names.
fn read_iommu_group(bdf: Bdf, dir: &Path, diagnostics: &mut Vec<Diagnostic>) -> Option<u32> {
    match sysfs::read_link_name(&dir.join("iommu_group")) {
        Ok(name) => match name.parse::<u32>() {
            Ok(group) => Some(group),
            Err(_) => {
                diagnostics.push(Diagnostic::device_read(
                    bdf,
                    ReadError::Malformed {
                        path: dir.join("iommu_group"),
                        value: name,
                        expected: "a link to an IOMMU group number",
                    },
                    "IOMMU group unknown: translation for this device is judged from system settings",
                ));
                None
            }
        },
        // No link: the device is not behind an IOMMU (or none is active).
        Err(ReadError::Missing { .. }) => None,
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "IOMMU group unknown: translation for this device is judged from system settings",
            ));
            None
        }
    }
}

fn read_config(bdf: Bdf, dir: &Path, diagnostics: &mut Vec<Diagnostic>) -> ConfigInfo {
    let bytes = match sysfs::read_bytes(&dir.join("config"), config::EXTENDED_LEN as u64) {
        Ok(bytes) => bytes,
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "port type, ACS and Resizable BAR unknown",
            ));
            return ConfigInfo::unreadable();
        }
    };
    let info = config::decode(&bytes);
    let consequence = match info.access {
        ConfigAccess::Full => None,
        ConfigAccess::HeaderOnly => {
            Some("port type, ACS and Resizable BAR unknown: run as root to check them")
        }
        // A conventional PCI device has no extended space to read.
        ConfigAccess::NoExtendedSpace if info.port_type.is_none() => None,
        ConfigAccess::NoExtendedSpace => Some(
            "a PCI Express device without extended config access: ACS and Resizable BAR unknown",
        ),
        ConfigAccess::Truncated | ConfigAccess::Unreadable => {
            Some("port type, ACS and Resizable BAR unknown")
        }
    };
    if let Some(consequence) = consequence {
        diagnostics.push(Diagnostic::new(
            Subject::Device(bdf),
            Problem::ConfigLimited {
                access: info.access,
                bytes: info.bytes_read,
            },
            consequence,
        ));
    }
    for detail in &info.problems {
        diagnostics.push(Diagnostic::new(
            Subject::Device(bdf),
            Problem::ConfigInconsistent {
                detail: detail.clone(),
            },
            "capabilities after this point were not examined",
        ));
    }
    info
}

/// Reads the four link attributes. When all are absent, falls back to the
/// PCI Express capability in config space (quietly: it is the same registers).
fn read_link(
    bdf: Bdf,
    dir: &Path,
    config: &ConfigInfo,
    diagnostics: &mut Vec<Diagnostic>,
) -> LinkState {
    let mut missing = 0;
    let mut speed = |name: &'static str, diagnostics: &mut Vec<Diagnostic>| match sysfs::read_parsed(
        &dir.join(name),
        "a link speed like \"16.0 GT/s PCIe\"",
        LinkSpeed::parse,
    ) {
        Ok(LinkSpeed::Unknown) => {
            diagnostics.push(Diagnostic::new(
                Subject::Device(bdf),
                Problem::LinkSpeedUnknown { attribute: name },
                "link speed not known: the link speed check is skipped for this device",
            ));
            Some(LinkSpeed::Unknown)
        }
        Ok(speed) => Some(speed),
        Err(ReadError::Missing { .. }) => {
            missing += 1;
            None
        }
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "link speed not known: the link speed check is skipped for this device",
            ));
            None
        }
    };
    let current_speed = speed("current_link_speed", diagnostics);
    let max_speed = speed("max_link_speed", diagnostics);
    let mut width = |name: &'static str, diagnostics: &mut Vec<Diagnostic>| match sysfs::read_parsed(
        &dir.join(name),
        "a link width like \"16\"",
        link::parse_link_width,
    ) {
        Ok(width) => Some(width),
        Err(ReadError::Missing { .. }) => {
            missing += 1;
            None
        }
        Err(e) => {
            diagnostics.push(Diagnostic::device_read(
                bdf,
                e,
                "link width not known: the link width check is skipped for this device",
            ));
            None
        }
    };
    let current_width = width("current_link_width", diagnostics);
    let max_width = width("max_link_width", diagnostics);
    let state = LinkState {
        current_speed,
        max_speed,
        current_width,
        max_width,
    };
    if missing == 4 && config.port_type.is_some() {
        return LinkState {
            current_speed: config.link.current_speed,
            max_speed: config.link.max_speed,
            current_width: config.link.current_width,
            max_width: config.link.max_width,
        };
    }
    // Standard capabilities were readable and hold no PCI Express
    // capability: a conventional PCI device (or host bridge), which has no
    // link to report.
    let conventional = config.port_type.is_none()
        && matches!(
            config.access,
            ConfigAccess::Full | ConfigAccess::NoExtendedSpace
        );
    if missing == 4 && !conventional {
        diagnostics.push(Diagnostic::device_read(
            bdf,
            ReadError::Missing {
                path: dir.join("current_link_speed"),
            },
            "link speed and width not reported (not a PCIe device, or an old kernel): link checks skipped",
        ));
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_paths_give_host_bridge_and_bridges() {
        let bdf: Bdf = "0000:1a:00.0".parse().unwrap();
        let (host, bridges) = parse_device_path(
            Path::new("sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:08.0/0000:1a:00.0"),
            bdf,
        )
        .unwrap();
        assert_eq!(host.to_string(), "pci0000:17");
        let names: Vec<String> = bridges.iter().map(|b| b.to_string()).collect();
        assert_eq!(names, ["0000:17:00.0", "0000:18:00.0", "0000:19:08.0"]);
    }

    #[test]
    fn nested_host_bridges_use_the_innermost() {
        let bdf: Bdf = "10000:e1:00.0".parse().unwrap();
        let (host, bridges) = parse_device_path(
            Path::new(
                "sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/10000:e1:00.0",
            ),
            bdf,
        )
        .unwrap();
        assert_eq!(host.to_string(), "pci10000:e0");
        assert_eq!(bridges.len(), 1);
    }

    #[test]
    fn paths_that_do_not_fit_are_rejected() {
        let bdf: Bdf = "0000:01:00.0".parse().unwrap();
        for path in [
            "sys/bus/pci/devices/0000:01:00.0",
            "sys/devices/pci0000:00/0000:02:00.0",
            "sys/devices/pci0000:00/junk/0000:01:00.0",
            "elsewhere/pci0000:00/0000:01:00.0",
        ] {
            assert!(parse_device_path(Path::new(path), bdf).is_none(), "{path}");
        }
    }
}
