//! Decoding PCI configuration space: the binary `config` attribute.
//!
//! How much of it a process can read decides what can be known:
//!
//! * 4096 bytes (root, PCIe device, ECAM available): everything, including
//!   the extended capabilities at 0x100+ where ACS and Resizable BAR live.
//! * 256 bytes: a conventional PCI device, or a platform (often a VM) without
//!   extended config access: standard capabilities only.
//! * 64 bytes: the kernel gives non-root readers only the standard header, so
//!   not even the PCIe capability (port type) is visible.
//!
//! All offsets and pointers read from the bytes are untrusted: every access is
//! bounds-checked and every capability walk is bounded, so a corrupt file
//! yields "unknown", never a panic or a loop.

use serde::{Serialize, Serializer};

use crate::pci::link::LinkSpeed;

/// Bytes a non-root reader gets from `config`.
pub const HEADER_ONLY_LEN: usize = 64;
/// Size of conventional (non-extended) configuration space.
pub const CONVENTIONAL_LEN: usize = 256;
/// Size of PCIe extended configuration space.
pub const EXTENDED_LEN: usize = 4096;

/// Standard capability id of the PCI Express capability.
pub const CAP_ID_PCIE: u8 = 0x10;
/// Extended capability id of Access Control Services.
pub const EXT_CAP_ID_ACS: u16 = 0x000d;
/// Extended capability id of Resizable BAR.
pub const EXT_CAP_ID_REBAR: u16 = 0x0015;

/// How much configuration space could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigAccess {
    /// All 4096 bytes: extended capabilities were examined.
    Full,
    /// 256 bytes: standard capabilities only; ACS and Resizable BAR unknown.
    NoExtendedSpace,
    /// The 64-byte header only (reading as non-root): port type, ACS and
    /// Resizable BAR unknown.
    HeaderOnly,
    /// Fewer bytes than a header, or a length no kernel produces.
    Truncated,
    /// The file could not be read at all.
    Unreadable,
}

impl ConfigAccess {
    /// Whether extended capabilities (ACS, Resizable BAR) could be examined.
    pub fn has_extended(self) -> bool {
        self == ConfigAccess::Full
    }

    /// Classifies a read of `len` bytes.
    pub fn from_len(len: usize) -> ConfigAccess {
        if len >= EXTENDED_LEN {
            ConfigAccess::Full
        } else if len >= CONVENTIONAL_LEN {
            ConfigAccess::NoExtendedSpace
        } else if len == HEADER_ONLY_LEN {
            ConfigAccess::HeaderOnly
        } else {
            ConfigAccess::Truncated
        }
    }
}

/// The Device/Port Type field of the PCI Express capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortType {
    Endpoint,
    LegacyEndpoint,
    RootPort,
    /// Upstream port of a switch: one per switch, so it names the switch.
    UpstreamPort,
    /// Downstream port of a switch: where peer traffic enters the switch.
    DownstreamPort,
    PcieToPciBridge,
    PciToPcieBridge,
    RootComplexIntegratedEndpoint,
    RootComplexEventCollector,
    Reserved(u8),
}

impl PortType {
    pub fn from_field(value: u8) -> PortType {
        match value {
            0x0 => PortType::Endpoint,
            0x1 => PortType::LegacyEndpoint,
            0x4 => PortType::RootPort,
            0x5 => PortType::UpstreamPort,
            0x6 => PortType::DownstreamPort,
            0x7 => PortType::PcieToPciBridge,
            0x8 => PortType::PciToPcieBridge,
            0x9 => PortType::RootComplexIntegratedEndpoint,
            0xa => PortType::RootComplexEventCollector,
            other => PortType::Reserved(other),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            PortType::Endpoint => "endpoint",
            PortType::LegacyEndpoint => "legacy endpoint",
            PortType::RootPort => "root port",
            PortType::UpstreamPort => "switch upstream port",
            PortType::DownstreamPort => "switch downstream port",
            PortType::PcieToPciBridge => "PCIe-to-PCI bridge",
            PortType::PciToPcieBridge => "PCI-to-PCIe bridge",
            PortType::RootComplexIntegratedEndpoint => "root-complex integrated endpoint",
            PortType::RootComplexEventCollector => "root-complex event collector",
            PortType::Reserved(_) => "reserved port type",
        }
    }
}

/// ACS capability or control bits (the two registers share a layout for the
/// bits we use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcsBits(pub u16);

impl AcsBits {
    /// Source Validation.
    pub const SV: u16 = 1 << 0;
    /// Translation Blocking.
    pub const TB: u16 = 1 << 1;
    /// P2P Request Redirect: peer requests go up to the root complex.
    pub const RR: u16 = 1 << 2;
    /// P2P Completion Redirect.
    pub const CR: u16 = 1 << 3;
    /// Upstream Forwarding.
    pub const UF: u16 = 1 << 4;
    /// P2P Egress Control: peer traffic blocked or redirected per port.
    pub const EC: u16 = 1 << 5;
    /// Direct Translated P2P.
    pub const DT: u16 = 1 << 6;

    const NAMES: [(u16, &'static str); 7] = [
        (Self::SV, "SV"),
        (Self::TB, "TB"),
        (Self::RR, "RR"),
        (Self::CR, "CR"),
        (Self::UF, "UF"),
        (Self::EC, "EC"),
        (Self::DT, "DT"),
    ];

    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    /// Whether peer-to-peer requests or completions arriving at this port are
    /// sent up to the root complex instead of across the switch: RR, CR or EC.
    pub fn redirects_peer_traffic(self) -> bool {
        self.0 & (Self::RR | Self::CR | Self::EC) != 0
    }

    /// The set bits by name, e.g. `["SV", "RR", "CR", "UF"]`.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(bit, _)| self.has(*bit))
            .map(|(_, name)| *name)
            .collect()
    }

    /// `SV+ TB- RR+ …`, as lspci prints them.
    pub fn describe(self) -> String {
        Self::NAMES
            .iter()
            .map(|(bit, name)| format!("{name}{}", if self.has(*bit) { '+' } else { '-' }))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Serialize for AcsBits {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut state = serializer.serialize_struct("AcsBits", 2)?;
        state.serialize_field("raw", &format!("0x{:04x}", self.0))?;
        state.serialize_field("set", &self.names())?;
        state.end()
    }
}

/// The ACS extended capability of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AcsCapability {
    /// Offset of the capability header in config space (for setpci).
    pub offset: u16,
    /// What the port supports.
    pub capability: AcsBits,
    /// What is enabled now.
    pub control: AcsBits,
}

/// One BAR's entry in the Resizable BAR capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebarEntry {
    pub bar_index: u8,
    /// Sizes the device supports, smallest first.
    pub supported_bytes: Vec<u64>,
    /// The size programmed now.
    pub current_bytes: u64,
}

impl RebarEntry {
    pub fn max_supported(&self) -> Option<u64> {
        self.supported_bytes.last().copied()
    }
}

/// Link capability and status as read from the PCI Express capability; used
/// when the sysfs link attributes are missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfigLink {
    pub max_speed: Option<LinkSpeed>,
    pub max_width: Option<u8>,
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
}

/// What was learned from a device's configuration space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigInfo {
    pub access: ConfigAccess,
    pub bytes_read: usize,
    /// Header type (0 = endpoint, 1 = PCI-to-PCI bridge), multifunction bit
    /// masked off.
    pub header_type: Option<u8>,
    pub port_type: Option<PortType>,
    pub link: ConfigLink,
    pub acs: Option<AcsCapability>,
    pub rebar: Vec<RebarEntry>,
    /// Inconsistencies found while walking capability lists.
    pub problems: Vec<String>,
}

impl ConfigInfo {
    /// The result when the file could not be read at all.
    pub fn unreadable() -> ConfigInfo {
        ConfigInfo {
            access: ConfigAccess::Unreadable,
            bytes_read: 0,
            header_type: None,
            port_type: None,
            link: ConfigLink::default(),
            acs: None,
            rebar: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// Whether the set of extended capabilities is known: all of config space
    /// was read, or the device is conventional PCI (no PCI Express
    /// capability), which has no extended capabilities at all.
    pub fn extended_capabilities_known(&self) -> bool {
        match self.access {
            ConfigAccess::Full => true,
            ConfigAccess::NoExtendedSpace => self.port_type.is_none(),
            _ => false,
        }
    }

    /// The Resizable BAR entry for `bar_index`, if the capability lists it.
    pub fn rebar_for(&self, bar_index: u8) -> Option<&RebarEntry> {
        self.rebar.iter().find(|e| e.bar_index == bar_index)
    }
}

fn read_u8(bytes: &[u8], offset: usize) -> Option<u8> {
    bytes.get(offset).copied()
}

fn read_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    let raw = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_le_bytes([raw[0], raw[1]]))
}

fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let raw = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

/// Decodes what it can from `bytes`, the contents of a `config` file.
pub fn decode(bytes: &[u8]) -> ConfigInfo {
    let mut info = ConfigInfo {
        access: ConfigAccess::from_len(bytes.len()),
        bytes_read: bytes.len(),
        ..ConfigInfo::unreadable()
    };
    if bytes.len() < HEADER_ONLY_LEN {
        return info;
    }
    info.header_type = read_u8(bytes, 0x0e).map(|t| t & 0x7f);
    if bytes.len() > HEADER_ONLY_LEN {
        walk_standard_capabilities(bytes, &mut info);
    }
    if bytes.len() > CONVENTIONAL_LEN {
        walk_extended_capabilities(bytes, &mut info);
    }
    info
}

fn walk_standard_capabilities(bytes: &[u8], info: &mut ConfigInfo) {
    const STATUS_CAP_LIST: u16 = 1 << 4;
    let status = read_u16(bytes, 0x06).unwrap_or(0);
    if status & STATUS_CAP_LIST == 0 {
        return;
    }
    // Type 2 (CardBus) headers keep the pointer elsewhere; nothing we care
    // about is a CardBus bridge.
    let pointer_offset = match info.header_type {
        Some(0) | Some(1) => 0x34,
        _ => return,
    };
    let mut pointer = usize::from(read_u8(bytes, pointer_offset).unwrap_or(0) & 0xfc);
    // At most 48 capabilities fit between 0x40 and 0x100; more means a loop.
    for _ in 0..48 {
        if pointer == 0 {
            return;
        }
        if pointer < HEADER_ONLY_LEN || pointer + 2 > bytes.len() {
            info.problems.push(format!(
                "capability pointer 0x{pointer:02x} is out of range"
            ));
            return;
        }
        let id = bytes[pointer];
        let next = usize::from(bytes[pointer + 1] & 0xfc);
        if id == CAP_ID_PCIE {
            decode_pcie_capability(bytes, pointer, info);
        }
        pointer = next;
    }
    info.problems
        .push("standard capability list does not end (loop?)".to_string());
}

fn decode_pcie_capability(bytes: &[u8], at: usize, info: &mut ConfigInfo) {
    if let Some(flags) = read_u16(bytes, at + 0x02) {
        info.port_type = Some(PortType::from_field(((flags >> 4) & 0xf) as u8));
    }
    if let Some(link_capabilities) = read_u32(bytes, at + 0x0c) {
        info.link.max_speed = LinkSpeed::from_register((link_capabilities & 0xf) as u8);
        info.link.max_width = Some(((link_capabilities >> 4) & 0x3f) as u8);
    }
    if let Some(link_status) = read_u16(bytes, at + 0x12) {
        info.link.current_speed = LinkSpeed::from_register((link_status & 0xf) as u8);
        info.link.current_width = Some(((link_status >> 4) & 0x3f) as u8);
    }
}

fn walk_extended_capabilities(bytes: &[u8], info: &mut ConfigInfo) {
    let mut offset = CONVENTIONAL_LEN;
    // (4096 - 256) / 4 headers at most; more means a loop.
    for _ in 0..(EXTENDED_LEN - CONVENTIONAL_LEN) / 4 {
        let Some(header) = read_u32(bytes, offset) else {
            info.problems.push(format!(
                "extended capability at 0x{offset:03x} lies past the end of config space"
            ));
            return;
        };
        if header == 0 || header == 0xffff_ffff {
            return;
        }
        let id = (header & 0xffff) as u16;
        let next = ((header >> 20) & 0xffc) as usize;
        match id {
            EXT_CAP_ID_ACS => {
                if let (Some(capability), Some(control)) =
                    (read_u16(bytes, offset + 4), read_u16(bytes, offset + 6))
                {
                    info.acs = Some(AcsCapability {
                        offset: offset as u16,
                        capability: AcsBits(capability),
                        control: AcsBits(control),
                    });
                }
            }
            EXT_CAP_ID_REBAR => decode_rebar(bytes, offset, info),
            _ => {}
        }
        if next == 0 {
            return;
        }
        if next < CONVENTIONAL_LEN {
            info.problems.push(format!(
                "extended capability at 0x{offset:03x} points back into standard space (0x{next:03x})"
            ));
            return;
        }
        offset = next;
    }
    info.problems
        .push("extended capability list does not end (loop?)".to_string());
}

fn decode_rebar(bytes: &[u8], at: usize, info: &mut ConfigInfo) {
    let Some(first_control) = read_u32(bytes, at + 8) else {
        return;
    };
    // Bits 7:5 of the first control register: how many BARs are resizable.
    let count = ((first_control >> 5) & 0x7) as usize;
    for entry in 0..count.min(6) {
        let (Some(capability), Some(control)) = (
            read_u32(bytes, at + 4 + entry * 8),
            read_u32(bytes, at + 8 + entry * 8),
        ) else {
            info.problems
                .push("Resizable BAR capability is cut short".to_string());
            return;
        };
        let mut supported_bytes = Vec::new();
        // Capability bits 31:4 advertise 1 MiB (bit 4) to 128 TiB (bit 31).
        for bit in 4..32 {
            if capability & (1 << bit) != 0 {
                supported_bytes.push((1u64 << 20) << (bit - 4));
            }
        }
        // Control bits 31:16 advertise 256 TiB (bit 16) and up, capped so the
        // shift stays inside u64.
        for bit in 16..28 {
            if control & (1 << bit) != 0 {
                supported_bytes.push(1u64 << (48 + bit - 16));
            }
        }
        let size_code = (control >> 8) & 0x3f;
        let current_bytes = if size_code <= 43 {
            (1u64 << 20) << size_code
        } else {
            0
        };
        info.rebar.push(RebarEntry {
            bar_index: (control & 0x7) as u8,
            supported_bytes,
            current_bytes,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put16(bytes: &mut [u8], at: usize, value: u16) {
        bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
    }

    fn put32(bytes: &mut [u8], at: usize, value: u32) {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// A downstream switch port with PCIe capability at 0x40, AER at 0x100
    /// and ACS at 0x148.
    fn downstream_port(acs_control: u16) -> Vec<u8> {
        let mut bytes = vec![0u8; EXTENDED_LEN];
        put16(&mut bytes, 0x00, 0x10b5);
        put16(&mut bytes, 0x06, 0x0010);
        bytes[0x0e] = 0x01;
        bytes[0x34] = 0x40;
        bytes[0x40] = CAP_ID_PCIE;
        put16(&mut bytes, 0x42, 0x0062);
        put32(&mut bytes, 0x4c, 0x0000_0104); // 16 GT/s x16
        put16(&mut bytes, 0x52, 0x0104);
        put32(&mut bytes, 0x100, 0x1481_0001); // AER, next 0x148
        put32(&mut bytes, 0x148, 0x0001_000d); // ACS, last
        put16(&mut bytes, 0x14c, 0x005f);
        put16(&mut bytes, 0x14e, acs_control);
        bytes
    }

    #[test]
    fn finds_port_type_link_and_acs() {
        let info = decode(&downstream_port(0x001d));
        assert_eq!(info.access, ConfigAccess::Full);
        assert_eq!(info.header_type, Some(1));
        assert_eq!(info.port_type, Some(PortType::DownstreamPort));
        assert_eq!(info.link.max_width, Some(16));
        assert_eq!(info.link.current_speed, LinkSpeed::from_register(4));
        let acs = info.acs.expect("ACS");
        assert_eq!(acs.offset, 0x148);
        assert!(acs.control.redirects_peer_traffic());
        assert_eq!(acs.control.names(), vec!["SV", "RR", "CR", "UF"]);
        assert!(info.problems.is_empty());
    }

    #[test]
    fn cleared_acs_does_not_redirect() {
        let info = decode(&downstream_port(0x0000));
        assert!(!info.acs.unwrap().control.redirects_peer_traffic());
    }

    #[test]
    fn header_only_reads_know_nothing_beyond_the_header() {
        let bytes = downstream_port(0x001d);
        let info = decode(&bytes[..HEADER_ONLY_LEN]);
        assert_eq!(info.access, ConfigAccess::HeaderOnly);
        assert_eq!(info.header_type, Some(1));
        assert_eq!(info.port_type, None);
        assert_eq!(info.acs, None);
        let info = decode(&bytes[..CONVENTIONAL_LEN]);
        assert_eq!(info.access, ConfigAccess::NoExtendedSpace);
        assert_eq!(info.port_type, Some(PortType::DownstreamPort));
        assert_eq!(info.acs, None);
        assert_eq!(decode(&bytes[..10]).access, ConfigAccess::Truncated);
    }

    #[test]
    fn capability_loops_end() {
        let mut bytes = downstream_port(0);
        bytes[0x41] = 0x40; // standard capability points at itself
        put32(&mut bytes, 0x148, 0x1480_000d); // ACS points at itself
        let info = decode(&bytes);
        assert_eq!(info.problems.len(), 2, "{:?}", info.problems);
        assert!(info.acs.is_some());
    }

    #[test]
    fn wild_pointers_are_problems_not_panics() {
        let mut bytes = downstream_port(0);
        bytes[0x34] = 0xfc;
        bytes[0xfd] = 0x00;
        put32(&mut bytes, 0x100, 0xffc0_0001); // next = 0xffc: a header that does not fit
        let info = decode(&bytes[..4094]);
        assert!(!info.problems.is_empty());
    }

    #[test]
    fn decodes_resizable_bar() {
        let mut bytes = vec![0u8; EXTENDED_LEN];
        bytes[0x0e] = 0;
        // ReBAR at 0x100 with two entries: BAR1 64 MiB..32 GiB at 256 MiB, BAR3 32 MiB.
        put32(&mut bytes, 0x100, 0x0001_0015);
        put32(&mut bytes, 0x104, 0x000f_fc00);
        put32(&mut bytes, 0x108, (2 << 5) | (8 << 8) | 1);
        put32(&mut bytes, 0x10c, 1 << 9);
        put32(&mut bytes, 0x110, (5 << 8) | 3);
        let info = decode(&bytes);
        let bar1 = info.rebar_for(1).unwrap();
        assert_eq!(bar1.current_bytes, 256 << 20);
        assert_eq!(bar1.supported_bytes.first(), Some(&(64 << 20)));
        assert_eq!(bar1.max_supported(), Some(32 << 30));
        assert_eq!(info.rebar_for(3).unwrap().current_bytes, 32 << 20);
    }

    #[test]
    fn acs_bits_describe_like_lspci() {
        assert_eq!(AcsBits(0x001d).describe(), "SV+ TB- RR+ CR+ UF+ EC- DT-");
    }
}
