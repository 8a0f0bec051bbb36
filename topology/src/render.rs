//! Rendering a [`Topology`] for people (a matrix in the manner of
//! `nvidia-smi topo -m`, then paths, NIC affinity, warnings and what could not
//! be read) and for scripts (one JSON document).
//!
//! The CLI prints what these return; nothing here writes to a terminal.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::pci::PciDevice;
use crate::pci::link::LinkState;
use crate::pci::resource::human_bytes;
use crate::topology::{Pair, PathClass, Topology};

/// Column width of the matrix cells.
const CELL: usize = 8;

fn link_text(link: &LinkState) -> String {
    let speed = |s: Option<crate::pci::link::LinkSpeed>| {
        s.map_or_else(|| "?".to_string(), |s| s.to_string())
    };
    let width = |w: Option<u8>| w.map_or_else(|| "?".to_string(), |w| format!("x{w}"));
    if link.is_empty() {
        return "link not reported".to_string();
    }
    format!(
        "{} {} (max {} {})",
        speed(link.current_speed),
        width(link.current_width),
        speed(link.max_speed),
        width(link.max_width)
    )
}

fn cell(pair: Option<&Pair>) -> String {
    match pair {
        Some(pair) if pair.is_impaired() => format!("{}!", pair.link),
        Some(pair) => pair.link.to_string(),
        None => "?".to_string(),
    }
}

/// The human-readable topology report.
pub fn topo_text(topology: &Topology) -> String {
    let mut out = String::new();
    let platform = &topology.platform;
    let _ = writeln!(
        out,
        "PCI topology under {} ({} devices, CPU {}, {} NUMA node(s))",
        platform.sysfs_root.display(),
        platform.devices.len(),
        platform.cpu_vendor,
        platform
            .numa_nodes_online
            .map_or_else(|| "?".to_string(), |n| n.to_string())
    );
    out.push('\n');

    if topology.gpus.is_empty() {
        out.push_str("No GPUs found.\n\n");
        write_devices_seen(&mut out, topology);
    } else {
        write_matrix(&mut out, topology);
        write_gpus(&mut out, topology);
    }
    write_nics(&mut out, topology);
    write_paths(&mut out, topology);
    write_affinity(&mut out, topology);

    let _ = writeln!(out, "IOMMU: {}", platform.iommu.summary());
    let _ = writeln!(
        out,
        "P2P limit: {} ({})",
        topology.p2p_limit, topology.p2p_limit_reason
    );

    if !topology.warnings.is_empty() {
        out.push_str("\nWarnings:\n");
        for warning in &topology.warnings {
            let _ = writeln!(out, "  - {warning}");
        }
    }
    write_unreadable(&mut out, topology);
    out
}

fn write_matrix(out: &mut String, topology: &Topology) {
    let names: Vec<&str> = topology
        .gpus
        .iter()
        .map(|g| g.name.as_str())
        .chain(topology.nics.iter().map(|n| n.name.as_str()))
        .collect();
    let _ = write!(out, "{:CELL$}", "");
    for name in &names {
        let _ = write!(out, "{name:<CELL$}");
    }
    out.push_str("CPU Affinity    NUMA Affinity\n");
    for row in &names {
        let _ = write!(out, "{row:<CELL$}");
        for column in &names {
            let text = if row == column {
                " X".to_string()
            } else if row.starts_with("NIC") && column.starts_with("NIC") {
                // NIC–NIC pairs are not classified (no transfer uses them).
                " -".to_string()
            } else {
                cell(topology.pair(row, column))
            };
            let _ = write!(out, "{text:<CELL$}");
        }
        let device = topology
            .gpu(row)
            .map(|g| g.bdf)
            .or_else(|| topology.nic(row).map(|n| n.bdf))
            .and_then(|bdf| topology.platform.device(bdf));
        let affinity = device
            .and_then(|d| d.local_cpulist.clone())
            .unwrap_or_else(|| "N/A".to_string());
        let numa = device
            .and_then(|d| d.numa_node)
            .map_or_else(|| "N/A".to_string(), |n| n.to_string());
        let _ = writeln!(out, "{affinity:<16}{numa}");
    }
    out.push_str("\nLegend:\n\n  X    = Self\n");
    for connection in PathClass::ALL.iter().rev() {
        let _ = writeln!(
            out,
            "  {:<4} = {}",
            connection.as_str(),
            connection.legend()
        );
    }
    out.push_str(
        "  !    = P2P on this pair is broken or slowed by the platform (ACS, IOMMU or BAR size): see Paths\n\n",
    );
}

fn write_gpus(out: &mut String, topology: &Topology) {
    out.push_str("GPUs:\n");
    for gpu in &topology.gpus {
        let Some(device) = topology.platform.device(gpu.bdf) else {
            continue;
        };
        let aperture = gpu
            .aperture
            .bytes
            .map_or_else(|| "?".to_string(), human_bytes);
        let bar = gpu
            .aperture
            .bar_index
            .map_or_else(|| "BAR".to_string(), |i| format!("BAR{i}"));
        let _ = writeln!(
            out,
            "  {:<5} {}  {} {}  NUMA {}  {bar} {aperture}  {}  driver {}",
            gpu.name,
            gpu.bdf,
            device.id_string(),
            gpu.model.unwrap_or(""),
            device
                .numa_node
                .map_or_else(|| "N/A".to_string(), |n| n.to_string()),
            link_text(&device.link),
            device.driver.as_deref().unwrap_or("none"),
        );
    }
    out.push('\n');
}

fn write_nics(out: &mut String, topology: &Topology) {
    if topology.nics.is_empty() {
        return;
    }
    out.push_str("NIC Legend:\n\n");
    for nic in &topology.nics {
        let rdma = if nic.rdma_capable { "RDMA" } else { "no RDMA" };
        let label = if nic.label == nic.bdf.to_string() {
            String::new()
        } else {
            format!("{} ", nic.label)
        };
        let _ = writeln!(
            out,
            "  {}: {label}({}, {rdma}: {})",
            nic.name, nic.bdf, nic.rdma_evidence
        );
    }
    out.push('\n');
}

fn write_paths(out: &mut String, topology: &Topology) {
    if topology.gpu_pairs.is_empty() && topology.gpu_nic_pairs.is_empty() {
        return;
    }
    out.push_str("Paths:\n");
    for pair in topology.gpu_pairs.iter().chain(&topology.gpu_nic_pairs) {
        let _ = writeln!(
            out,
            "  {:<5} <-> {:<5} {:<5} {:<12} {}",
            pair.a,
            pair.b,
            pair.link.as_str(),
            pair.path.as_str(),
            pair.reason
        );
    }
    out.push('\n');
}

fn write_affinity(out: &mut String, topology: &Topology) {
    if topology.nic_affinity.is_empty() {
        return;
    }
    out.push_str("NIC affinity:\n");
    let _ = writeln!(
        out,
        "  {:<6} {:<14} {:<30} {:<5} Path",
        "GPU", "Address", "Nearest RDMA NIC", "Link"
    );
    for entry in &topology.nic_affinity {
        let nic = match (&entry.nic, &entry.nic_label, entry.nic_bdf) {
            (Some(name), Some(label), Some(bdf)) if *label != bdf.to_string() => {
                format!("{name} {label} ({bdf})")
            }
            (Some(name), _, Some(bdf)) => format!("{name} ({bdf})"),
            _ => "none".to_string(),
        };
        let _ = writeln!(
            out,
            "  {:<6} {:<14} {:<30} {:<5} {}",
            entry.gpu,
            entry.gpu_bdf.to_string(),
            nic,
            entry.link.map_or("-", |l| l.as_str()),
            entry.path.map_or("-", |p| p.as_str()),
        );
    }
    out.push('\n');
}

fn describe_device(device: &PciDevice) -> String {
    device
        .class
        .map_or_else(|| "unknown class".to_string(), |c| c.describe().to_string())
}

fn write_devices_seen(out: &mut String, topology: &Topology) {
    let _ = writeln!(
        out,
        "PCI devices seen ({}):",
        topology.platform.devices.len()
    );
    for device in topology.platform.devices.values() {
        let _ = writeln!(
            out,
            "  {}  {}  {:<24} driver {}",
            device.bdf,
            device.id_string(),
            describe_device(device),
            device.driver.as_deref().unwrap_or("none")
        );
    }
    out.push('\n');
}

fn write_unreadable(out: &mut String, topology: &Topology) {
    let (relevant, others) = topology.diagnostics_by_relevance();
    if !relevant.is_empty() {
        let _ = writeln!(
            out,
            "\nCould not read ({} affecting verdicts):",
            crate::doctor::plural(relevant.len(), "item", "items")
        );
        for diagnostic in relevant {
            let _ = writeln!(out, "  - {diagnostic}");
        }
    }
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "\n({} more could not be read about devices that change no verdict; see --json)",
            crate::doctor::plural(others.len(), "item", "items")
        );
    }
}

fn device_json(device: &PciDevice) -> Value {
    json!({
        "bdf": device.bdf,
        "vendor": device.vendor.map(|v| format!("0x{v:04x}")),
        "device": device.device_id.map(|v| format!("0x{v:04x}")),
        "class": device.class,
        "class_name": device.class.map(|c| c.describe()),
        "role": device.role,
        "driver": device.driver,
        "numa_node": device.numa_node,
        "cpu_affinity": device.local_cpulist,
        "iommu_group": device.iommu_group,
        "host_bridge": device.host_bridge,
        "upstream_bridges": device.upstream_bridges,
        "link": device.link,
        "bars": device.bars,
        "config_access": device.config.access,
        "config_bytes": device.config.bytes_read,
        "port_type": device.config.port_type,
        "sysfs_path": device.sysfs_path,
    })
}

/// The topology as one JSON document.
///
/// Top-level keys: `sysfs_root`, `cpu_vendor`, `numa_nodes_online`,
/// `p2p_limit`, `p2p_limit_reason`, `gpus` (each with `name`, `bdf`,
/// `numa_node`, `bar1_bytes`, …), `nics`, `pairs` (each with `a`, `b`,
/// `link`, `path`, `reason`, `issues`, …), `nic_affinity`, `bridges` (with
/// ACS state), `iommu`, `ignored_display`, `devices` (everything seen),
/// `warnings`, `unreadable` (diagnostics affecting verdicts) and
/// `unreadable_other` (diagnostics about unrelated devices).
pub fn topo_json(topology: &Topology) -> Value {
    let platform = &topology.platform;
    let gpus: Vec<Value> = topology
        .gpus
        .iter()
        .filter_map(|gpu| {
            let device = platform.device(gpu.bdf)?;
            let mut value = device_json(device);
            let object = value.as_object_mut()?;
            object.insert("name".into(), json!(gpu.name));
            object.insert("model".into(), json!(gpu.model));
            object.insert("bar1_bytes".into(), json!(gpu.aperture.bytes));
            object.insert("aperture".into(), json!(gpu.aperture));
            object.insert("iommu".into(), json!(gpu.translation));
            object.insert("rebar".into(), json!(device.config.rebar));
            Some(value)
        })
        .collect();
    let nics: Vec<Value> = topology
        .nics
        .iter()
        .filter_map(|nic| {
            let device = platform.device(nic.bdf)?;
            let mut value = device_json(device);
            let object = value.as_object_mut()?;
            object.insert("name".into(), json!(nic.name));
            object.insert("label".into(), json!(nic.label));
            object.insert("rdma_capable".into(), json!(nic.rdma_capable));
            object.insert("rdma_evidence".into(), json!(nic.rdma_evidence));
            object.insert("rdma_devices".into(), json!(device.rdma_devices));
            object.insert("net_devices".into(), json!(device.net_devices));
            object.insert("iommu".into(), json!(nic.translation));
            Some(value)
        })
        .collect();
    let bridges: Vec<Value> = topology
        .relevant_devices()
        .into_iter()
        .filter_map(|bdf| platform.device(bdf))
        .filter(|d| d.class.is_some_and(|c| c.is_pci_bridge()))
        .map(|d| {
            json!({
                "bdf": d.bdf,
                "id": d.id_string(),
                "port_type": d.config.port_type,
                "config_access": d.config.access,
                "acs": d.config.acs,
                "link": d.link,
            })
        })
        .collect();
    let devices: Vec<Value> = platform
        .devices
        .values()
        .map(|d| {
            json!({
                "bdf": d.bdf,
                "id": d.id_string(),
                "class": d.class,
                "class_name": d.class.map(|c| c.describe()),
                "role": d.role,
                "driver": d.driver,
            })
        })
        .collect();
    let pairs: Vec<&Pair> = topology
        .gpu_pairs
        .iter()
        .chain(&topology.gpu_nic_pairs)
        .collect();
    let (relevant, other) = topology.diagnostics_by_relevance();
    json!({
        "sysfs_root": platform.sysfs_root.display().to_string(),
        "cpu_vendor": platform.cpu_vendor.to_string(),
        "numa_nodes_online": platform.numa_nodes_online,
        "p2p_limit": topology.p2p_limit,
        "p2p_limit_reason": topology.p2p_limit_reason,
        "gpus": gpus,
        "nics": nics,
        "pairs": pairs,
        "nic_affinity": topology.nic_affinity,
        "bridges": bridges,
        "iommu": {
            "mode": platform.iommu.mode(),
            "summary": platform.iommu.summary(),
            "active": platform.iommu.is_active(),
            "units": platform.iommu.units,
            "cmdline": platform.iommu.cmdline,
            "groups": platform.iommu.groups.iter().map(|(g, t)| (g.to_string(), json!(t.as_ref().map(|t| t.to_string())))).collect::<serde_json::Map<String, Value>>(),
        },
        "ignored_display": topology.ignored_display,
        "devices": devices,
        "warnings": topology.warnings,
        "unreadable": relevant,
        "unreadable_other": other,
    })
}
