//! The values the verbs take and report: GIDs, MTUs, port states and
//! link layers, access rights, and the device and port attributes.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::Ipv4Addr;

use crate::sys;

/// A 128-bit GID: an InfiniBand port address, or for RoCE an IPv6 address
/// (IPv4 as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether every byte is zero (an unpopulated GID table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), the form
    /// RoCE uses for an interface's IPv4 address.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let (prefix, addr) = self.0.split_at(12);
        (prefix == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
            .then(|| Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
    }
}

/// Formats as sysfs does: eight groups of four hex digits.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// A path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The MTU of a verbs enum value (1 = 256 ... 5 = 4096).
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The verbs enum value.
    pub fn code(self) -> u32 {
        self as u32 + 1
    }

    /// Bytes.
    pub fn bytes(self) -> usize {
        256 << (self as u32)
    }
}

/// A port's logical state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up, not yet configured by a subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Ready for traffic.
    Active,
    /// Active, deferring.
    ActiveDefer,
    /// Another value.
    Other(u32),
}

impl PortState {
    pub(super) fn from_code(code: u32) -> PortState {
        match code {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID; GIDs optional).
    InfiniBand,
    /// Ethernet: RoCE (addressed by GID only).
    Ethernet,
    /// Not reported (older drivers; means InfiniBand).
    Unspecified,
}

/// A device's attributes (`ibv_query_device`), the subset that matters
/// for sizing queues and regions.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID (host byte order).
    pub node_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// PCI vendor id (or IEEE OUI).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: i32,
    /// Most work requests per QP queue.
    pub max_qp_wr: i32,
    /// Most scatter/gather entries per work request.
    pub max_sge: i32,
    /// Most CQs.
    pub max_cq: i32,
    /// Most entries per CQ.
    pub max_cqe: i32,
    /// Most memory regions.
    pub max_mr: i32,
    /// Most protection domains.
    pub max_pd: i32,
    /// Most outstanding RDMA READs/atomics a QP may target.
    pub max_qp_rd_atom: i32,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
}

/// A port's attributes (`ibv_query_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Option<Mtu>,
    /// MTU in use (the largest a QP on this port can use).
    pub active_mtu: Option<Mtu>,
    /// Entries in the GID table.
    pub gid_tbl_len: i32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
}

/// Memory access rights of a region or a QP (`enum ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// The local device may read: what every region allows (no flag), and
    /// all that memory sent from in place needs.
    pub const LOCAL_READ: Access = Access(0);
    /// The local device may write (needed for receives and RDMA READ targets).
    pub const LOCAL_WRITE: Access = Access(sys::IBV_ACCESS_LOCAL_WRITE as u32);
    /// Peers may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(sys::IBV_ACCESS_REMOTE_WRITE as u32);
    /// Peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(sys::IBV_ACCESS_REMOTE_READ as u32);
    /// Peers may do atomics.
    pub const REMOTE_ATOMIC: Access = Access(sys::IBV_ACCESS_REMOTE_ATOMIC as u32);
    /// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ: what ring memory needs.
    pub const RDMA: Access = Access(
        (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ)
            as u32,
    );

    /// The raw flag bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_formats_like_sysfs_and_finds_ipv4() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 2, 15]);
        let gid = Gid(g);
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:020f");
        assert_eq!(gid.ipv4(), Some(Ipv4Addr::new(10, 0, 2, 15)));
        assert!(!gid.is_zero());
        assert!(Gid::default().is_zero());
        assert_eq!(Gid::default().ipv4(), None);
    }

    #[test]
    fn mtu_codes_round_trip() {
        for code in 1..=5 {
            let m = Mtu::from_code(code).unwrap();
            assert_eq!(m.code(), code);
            assert_eq!(m.bytes(), 128 << code);
        }
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
    }
}
