//! PCI class codes and the roles barlink gives devices (GPU, NIC, bridge).

use std::fmt;

use serde::{Serialize, Serializer};

/// NVIDIA's PCI vendor id.
pub const VENDOR_NVIDIA: u16 = 0x10de;
/// AMD/ATI graphics vendor id.
pub const VENDOR_AMD_GRAPHICS: u16 = 0x1002;
/// Intel's vendor id (integrated and Arc GPUs, chipsets, NICs).
pub const VENDOR_INTEL: u16 = 0x8086;
/// Mellanox (NVIDIA networking): ConnectX and BlueField.
pub const VENDOR_MELLANOX: u16 = 0x15b3;

/// The 24-bit class code from the `class` attribute (`0x030000`): base class,
/// subclass and programming interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClassCode(pub u32);

impl ClassCode {
    pub fn base(self) -> u8 {
        (self.0 >> 16) as u8
    }

    pub fn subclass(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// Base class and subclass together, e.g. `0x0300` for VGA.
    pub fn base_and_subclass(self) -> u16 {
        (self.0 >> 8) as u16
    }

    /// A short English name for the classes that matter in a report.
    pub fn describe(self) -> &'static str {
        match self.base_and_subclass() {
            0x0300 => "VGA controller",
            0x0302 => "3D controller",
            0x0380 => "display controller",
            0x0200 => "Ethernet controller",
            0x0207 => "InfiniBand controller",
            0x0280 => "network controller",
            0x0600 => "host bridge",
            0x0601 => "ISA bridge",
            0x0604 => "PCI bridge",
            0x0108 => "NVMe controller",
            0x0106 => "SATA controller",
            0x0403 => "audio device",
            0x0c03 => "USB controller",
            0x0880 => "system peripheral",
            _ => match self.base() {
                0x01 => "storage controller",
                0x02 => "network controller",
                0x03 => "display controller",
                0x04 => "multimedia device",
                0x06 => "bridge",
                0x08 => "system peripheral",
                0x0c => "serial bus controller",
                0x12 => "processing accelerator",
                _ => "other device",
            },
        }
    }

    pub fn is_display(self) -> bool {
        matches!(self.base_and_subclass(), 0x0300 | 0x0302)
    }

    pub fn is_network(self) -> bool {
        matches!(self.base_and_subclass(), 0x0200 | 0x0207)
    }

    /// A PCI-to-PCI bridge: root ports, switch ports, PCIe-to-PCI bridges.
    pub fn is_pci_bridge(self) -> bool {
        matches!(self.base_and_subclass(), 0x0604 | 0x0609)
    }
}

impl fmt::Display for ClassCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}

impl Serialize for ClassCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What a device is to barlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceRole {
    /// A discrete GPU that can take part in peer-to-peer transfers.
    Gpu,
    /// A display device that is not a P2P candidate: BMC video (ASPEED,
    /// Matrox), emulated VGA in VMs, integrated graphics.
    OtherDisplay,
    /// An Ethernet or InfiniBand controller.
    Nic,
    /// A PCI-to-PCI bridge (root port, switch port).
    Bridge,
    /// Anything else.
    Other,
    /// The class or vendor could not be read.
    Unknown,
}

/// Decides a device's role from its class and vendor, and whether it sits
/// directly on a root bus (`on_root_bus`, no bridge above it).
///
/// Only NVIDIA and AMD display/3D functions count as GPUs, plus Intel ones that
/// sit behind a bridge (Arc cards); Intel functions on the root bus are
/// integrated graphics. Every server has a BMC VGA device (ASPEED 0x1a03,
/// Matrox 0x102b) and every VM an emulated one; treating those as GPUs would
/// fill reports with pairs nobody can use.
pub fn role_of(class: Option<ClassCode>, vendor: Option<u16>, on_root_bus: bool) -> DeviceRole {
    let Some(class) = class else {
        return DeviceRole::Unknown;
    };
    if class.is_pci_bridge() {
        return DeviceRole::Bridge;
    }
    if class.is_network() {
        return DeviceRole::Nic;
    }
    if class.is_display() {
        return match vendor {
            Some(VENDOR_NVIDIA) | Some(VENDOR_AMD_GRAPHICS) => DeviceRole::Gpu,
            Some(VENDOR_INTEL) if !on_root_bus => DeviceRole::Gpu,
            Some(_) => DeviceRole::OtherDisplay,
            None => DeviceRole::Unknown,
        };
    }
    DeviceRole::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_fields_decode() {
        let vga = ClassCode(0x030000);
        assert_eq!(vga.base(), 3);
        assert_eq!(vga.subclass(), 0);
        assert_eq!(vga.base_and_subclass(), 0x0300);
        assert_eq!(vga.to_string(), "0x030000");
        assert!(ClassCode(0x030200).is_display());
        assert!(ClassCode(0x020700).is_network());
        assert!(ClassCode(0x060400).is_pci_bridge());
        assert!(!ClassCode(0x060000).is_pci_bridge());
    }

    #[test]
    fn roles_follow_class_and_vendor() {
        let vga = Some(ClassCode(0x030000));
        assert_eq!(role_of(vga, Some(0x10de), false), DeviceRole::Gpu);
        assert_eq!(
            role_of(Some(ClassCode(0x030200)), Some(0x10de), true),
            DeviceRole::Gpu
        );
        assert_eq!(role_of(vga, Some(0x1a03), false), DeviceRole::OtherDisplay);
        assert_eq!(role_of(vga, Some(0x8086), true), DeviceRole::OtherDisplay);
        assert_eq!(role_of(vga, Some(0x8086), false), DeviceRole::Gpu);
        assert_eq!(role_of(vga, None, false), DeviceRole::Unknown);
        assert_eq!(
            role_of(Some(ClassCode(0x020000)), Some(0x15b3), false),
            DeviceRole::Nic
        );
        assert_eq!(
            role_of(Some(ClassCode(0x060400)), Some(0x10b5), false),
            DeviceRole::Bridge
        );
        assert_eq!(role_of(None, Some(0x10de), false), DeviceRole::Unknown);
        assert_eq!(
            role_of(Some(ClassCode(0x010802)), Some(0x144d), false),
            DeviceRole::Other
        );
    }
}
