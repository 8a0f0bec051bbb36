//! Device discovery: which RDMA devices this host has, their ports (state,
//! link layer, MTU), the first GID table entries with their types, and the
//! limits that size queues and regions.
//!
//! GIDs come from the library (`ibv_query_gid`); their types (RoCE v1 or
//! v2) and network devices from sysfs
//! (`/sys/class/infiniband/DEV/ports/N/gid_attrs/{types,ndevs}/I`), which
//! the library reads too. Only the first [`DiscoveryOptions::max_gids`]
//! entries are read: a table has up to 1024 and reading them all is slow.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use crate::error::RdmaError;
use crate::verbs::{Context, Gid, LinkLayer, Mtu, PortState, device_names};

/// A GID's type (from sysfs `gid_attrs/types`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 (Ethernet frames, not routable).
    IbRoceV1,
    /// RoCE v2 (UDP/IP, routable): what RoCE connections should use.
    RoceV2,
    /// Another string.
    Other(String),
}

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (what [`QpConnectOptions::sgid_index`](crate::verbs::QpConnectOptions::sgid_index) takes).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its type, when sysfs says.
    pub gid_type: Option<GidType>,
    /// The network interface it belongs to (RoCE), when sysfs says.
    pub netdev: Option<String>,
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// Logical state.
    pub state: PortState,
    /// Link layer (Ethernet = RoCE).
    pub link_layer: LinkLayer,
    /// MTU in use.
    pub active_mtu: Option<Mtu>,
    /// Largest MTU supported.
    pub max_mtu: Option<Mtu>,
    /// LID (InfiniBand).
    pub lid: u16,
    /// Size of the GID table.
    pub gid_table_len: i32,
    /// The populated entries among the first [`DiscoveryOptions::max_gids`].
    pub gids: Vec<GidEntry>,
}

impl PortInfo {
    /// Whether the port can carry traffic.
    pub fn is_active(&self) -> bool {
        self.state == PortState::Active
    }

    /// The GID a RoCE v2 connection should use: the first RoCE v2 entry of
    /// an IPv4 address, else the first RoCE v2 entry.
    pub fn roce_v2_gid(&self) -> Option<&GidEntry> {
        let v2 = || {
            self.gids
                .iter()
                .filter(|g| g.gid_type == Some(GidType::RoceV2))
        };
        v2().find(|g| g.gid.ipv4().is_some())
            .or_else(|| v2().next())
    }
}

/// One RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaDeviceInfo {
    /// Kernel name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Node GUID (host byte order).
    pub node_guid: u64,
    /// Firmware version.
    pub fw_ver: String,
    /// Vendor id and part id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Most QPs.
    pub max_qp: i32,
    /// Most work requests per queue.
    pub max_qp_wr: i32,
    /// Most CQs.
    pub max_cq: i32,
    /// Most entries per CQ.
    pub max_cqe: i32,
    /// Most memory regions.
    pub max_mr: i32,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Most SGEs per work request.
    pub max_sge: i32,
    /// Ports, in order.
    pub ports: Vec<PortInfo>,
}

impl RdmaDeviceInfo {
    /// The node GUID as `ibv_devices` prints it (`xxxx:xxxx:xxxx:xxxx`).
    pub fn node_guid_string(&self) -> String {
        let g = self.node_guid;
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    }

    /// The first active port, if any.
    pub fn active_port(&self) -> Option<&PortInfo> {
        self.ports.iter().find(|p| p.is_active())
    }
}

/// How discovery reads the platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryOptions {
    /// Root of the sysfs tree for GID types (default `/`).
    pub sysfs_root: PathBuf,
    /// GID table entries read per port (default 8).
    pub max_gids: u32,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        DiscoveryOptions {
            sysfs_root: PathBuf::from("/"),
            max_gids: 8,
        }
    }
}

/// Every RDMA device of this host, with ports and GIDs.
///
/// [`RdmaError::NotAvailable`] without libibverbs, [`RdmaError::NoDevice`]
/// when it finds none (the message says what to check).
pub fn devices() -> Result<Vec<RdmaDeviceInfo>, RdmaError> {
    devices_with(&DiscoveryOptions::default())
}

/// [`devices`] with options.
pub fn devices_with(options: &DiscoveryOptions) -> Result<Vec<RdmaDeviceInfo>, RdmaError> {
    let names = device_names()?;
    if names.is_empty() {
        return Err(RdmaError::NoDevice {
            reason: "libibverbs found no device".into(),
        });
    }
    names.iter().map(|n| device_with(n, options)).collect()
}

/// The device called `name`; [`RdmaError::DeviceNotFound`] lists the
/// others when it is not there.
pub fn device(name: &str) -> Result<RdmaDeviceInfo, RdmaError> {
    device_with(name, &DiscoveryOptions::default())
}

/// [`device`] with options.
pub fn device_with(name: &str, options: &DiscoveryOptions) -> Result<RdmaDeviceInfo, RdmaError> {
    let ctx = Context::open(name)?;
    let attr = ctx.query_device()?;
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let pa = ctx.query_port(port)?;
        let dir = options
            .sysfs_root
            .join("sys/class/infiniband")
            .join(name)
            .join("ports")
            .join(port.to_string());
        let count = u32::try_from(pa.gid_tbl_len.max(0))
            .unwrap_or(0)
            .min(options.max_gids);
        let mut gids = Vec::new();
        for index in 0..count {
            // An unpopulated entry reads as zeros, or fails on newer kernels.
            let Ok(gid) = ctx.query_gid(port, index) else {
                continue;
            };
            if gid.is_zero() {
                continue;
            }
            gids.push(GidEntry {
                index,
                gid,
                gid_type: gid_type(&dir, index),
                netdev: read_trimmed(&dir.join("gid_attrs/ndevs").join(index.to_string())),
            });
        }
        ports.push(PortInfo {
            port,
            state: pa.state,
            link_layer: pa.link_layer,
            active_mtu: pa.active_mtu,
            max_mtu: pa.max_mtu,
            lid: pa.lid,
            gid_table_len: pa.gid_tbl_len,
            gids,
        });
    }
    Ok(RdmaDeviceInfo {
        name: ctx.name().to_string(),
        node_guid: ctx.node_guid(),
        fw_ver: attr.fw_ver,
        vendor_id: attr.vendor_id,
        vendor_part_id: attr.vendor_part_id,
        max_qp: attr.max_qp,
        max_qp_wr: attr.max_qp_wr,
        max_cq: attr.max_cq,
        max_cqe: attr.max_cqe,
        max_mr: attr.max_mr,
        max_mr_size: attr.max_mr_size,
        max_sge: attr.max_sge,
        ports,
    })
}

fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn gid_type(port_dir: &Path, index: u32) -> Option<GidType> {
    let t = read_trimmed(&port_dir.join("gid_attrs/types").join(index.to_string()))?;
    Some(parse_gid_type(&t))
}

/// Parses sysfs's GID type strings (`RoCE v2`, `IB/RoCE v1`).
pub fn parse_gid_type(text: &str) -> GidType {
    match text.trim() {
        "RoCE v2" => GidType::RoceV2,
        "IB/RoCE v1" | "RoCE v1" | "IB" => GidType::IbRoceV1,
        other => GidType::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, ipv4: bool, t: GidType) -> GidEntry {
        let mut g = [0u8; 16];
        if ipv4 {
            g[10] = 0xff;
            g[11] = 0xff;
            g[12] = 10;
        } else {
            g[0] = 0xfe;
            g[1] = 0x80;
        }
        GidEntry {
            index,
            gid: Gid(g),
            gid_type: Some(t),
            netdev: None,
        }
    }

    #[test]
    fn roce_v2_prefers_ipv4() {
        let port = PortInfo {
            port: 1,
            state: PortState::Active,
            link_layer: LinkLayer::Ethernet,
            active_mtu: Some(Mtu::Mtu1024),
            max_mtu: Some(Mtu::Mtu4096),
            lid: 0,
            gid_table_len: 1024,
            gids: vec![
                entry(0, false, GidType::IbRoceV1),
                entry(1, false, GidType::RoceV2),
                entry(2, true, GidType::IbRoceV1),
                entry(3, true, GidType::RoceV2),
            ],
        };
        assert_eq!(port.roce_v2_gid().unwrap().index, 3);
        assert!(port.is_active());
        assert_eq!(parse_gid_type("RoCE v2\n"), GidType::RoceV2);
        assert_eq!(parse_gid_type("IB/RoCE v1"), GidType::IbRoceV1);
    }
}
