//! A PCI function as sysfs shows it — [`PciDevice`]: its identity, BARs,
//! link, NUMA node, IOMMU group, driver, configuration-space capabilities,
//! and the chain of bridges from its root port down — and the value types
//! and parsers for each part (addresses, class codes, config space, links,
//! the `resource` file).
//!
//! Reading a whole tree, with diagnostics for what cannot be read, is
//! [`crate::tree`]'s part.

pub mod address;
pub mod class;
pub mod config;
pub mod link;
pub mod resource;

use serde::Serialize;

use address::{Bdf, HostBridge};
use class::{ClassCode, DeviceRole};
use config::{ConfigInfo, PortType};
use link::LinkState;
use resource::Bar;

/// Where Linux lists every PCI function, relative to the sysfs root.
pub const PCI_DEVICES_DIR: &str = "sys/bus/pci/devices";

/// One PCI function.
#[derive(Debug, Clone, Serialize)]
pub struct PciDevice {
    pub bdf: Bdf,
    /// Canonical directory relative to the sysfs root, e.g.
    /// `sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`.
    pub sysfs_path: String,
    /// The root bus the device hangs from; `None` when its path could not be
    /// understood.
    pub host_bridge: Option<HostBridge>,
    /// Bridges from the root port (first) down to the device's parent (last).
    pub upstream_bridges: Vec<Bdf>,
    pub class: Option<ClassCode>,
    #[serde(serialize_with = "serialize_id")]
    pub vendor: Option<u16>,
    #[serde(serialize_with = "serialize_id")]
    pub device_id: Option<u16>,
    pub role: DeviceRole,
    pub bars: Vec<Bar>,
    /// `None` when the kernel reports -1 (no affinity) or it is unreadable.
    pub numa_node: Option<u32>,
    /// CPUs local to the device (`local_cpulist`), as the kernel prints them.
    pub local_cpulist: Option<String>,
    pub link: LinkState,
    pub iommu_group: Option<u32>,
    pub driver: Option<String>,
    #[serde(skip)]
    pub config: ConfigInfo,
    /// RDMA devices registered on this function (`infiniband/`), e.g. `mlx5_0`.
    pub rdma_devices: Vec<String>,
    /// Network interfaces on this function (`net/`), e.g. `ens1f0np0`.
    pub net_devices: Vec<String>,
}

fn serialize_id<S: serde::Serializer>(id: &Option<u16>, serializer: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => serializer.serialize_str(&format!("0x{id:04x}")),
        None => serializer.serialize_none(),
    }
}

impl PciDevice {
    /// The bridge directly above this device.
    pub fn parent_bridge(&self) -> Option<Bdf> {
        self.upstream_bridges.last().copied()
    }

    /// The BAR with this index, if the device has it.
    pub fn bar(&self, index: u8) -> Option<&Bar> {
        self.bars.iter().find(|b| b.index == index)
    }

    /// `vendor:device` as lspci prints it, `????` for unknown halves.
    pub fn id_string(&self) -> String {
        let half = |id: Option<u16>| id.map_or_else(|| "????".to_string(), |v| format!("{v:04x}"));
        format!("{}:{}", half(self.vendor), half(self.device_id))
    }

    /// The port type from the PCI Express capability, when it was readable.
    pub fn port_type(&self) -> Option<PortType> {
        self.config.port_type
    }
}
