//! PCI addresses: a function's domain:bus:device.function (BDF) and the host
//! bridge (`pciDDDD:BB` in sysfs paths) a hierarchy hangs from.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A PCI function address with its domain, e.g. `0000:01:00.0`.
///
/// The domain is 32 bits wide because Intel VMD and Hyper-V create domains
/// above `ffff` (printed with more than four digits, as Linux does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdfParseError {
    pub text: String,
}

impl fmt::Display for BdfParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a PCI address of the form DDDD:BB:DD.F",
            self.text
        )
    }
}

impl std::error::Error for BdfParseError {}

impl FromStr for Bdf {
    type Err = BdfParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || BdfParseError {
            text: text.to_string(),
        };
        let (domain, rest) = text.split_once(':').ok_or_else(error)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(error)?;
        let (device, function) = rest.split_once('.').ok_or_else(error)?;
        let hex = |s: &str, max_len: usize| -> Option<u32> {
            if s.is_empty() || s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(s, 16).ok()
        };
        if domain.len() < 4 || bus.len() != 2 || device.len() != 2 || function.len() != 1 {
            return Err(error());
        }
        let domain = hex(domain, 8).ok_or_else(error)?;
        let bus = hex(bus, 2).ok_or_else(error)?;
        let device = hex(device, 2).ok_or_else(error)?;
        let function = hex(function, 1).ok_or_else(error)?;
        // Device numbers are 5 bits and function numbers 3 bits on the wire.
        if device > 0x1f || function > 7 {
            return Err(error());
        }
        Ok(Bdf {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for Bdf {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A PCI host bridge (root bus) as named in sysfs device paths: `pci0000:00`.
/// Devices under different host bridges meet only in the CPU's fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostBridge {
    pub domain: u32,
    pub bus: u8,
}

impl HostBridge {
    /// Parses the `pciDDDD:BB` directory name.
    pub fn parse(text: &str) -> Option<HostBridge> {
        let rest = text.strip_prefix("pci")?;
        let (domain, bus) = rest.split_once(':')?;
        if domain.len() < 4
            || domain.len() > 8
            || bus.len() != 2
            || !domain.bytes().all(|b| b.is_ascii_hexdigit())
            || !bus.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return None;
        }
        Some(HostBridge {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
        })
    }
}

impl fmt::Display for HostBridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}

impl Serialize for HostBridge {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_round_trips() {
        let bdf: Bdf = "0000:1a:00.1".parse().unwrap();
        assert_eq!(bdf.bus, 0x1a);
        assert_eq!(bdf.function, 1);
        assert_eq!(bdf.to_string(), "0000:1a:00.1");
        let vmd: Bdf = "10000:e0:06.0".parse().unwrap();
        assert_eq!(vmd.to_string(), "10000:e0:06.0");
    }

    #[test]
    fn bdf_rejects_what_is_not_an_address() {
        for text in [
            "",
            "pci0000:00",
            "0000:00:00",
            "0000:00:20.0",
            "0000:00:00.8",
            "00:00:00.0",
            "0000:0g:00.0",
            "0000:000:00.0",
            "not-a-bdf",
        ] {
            assert!(text.parse::<Bdf>().is_err(), "{text}");
        }
    }

    #[test]
    fn host_bridge_names_parse() {
        let hb = HostBridge::parse("pci0000:3a").unwrap();
        assert_eq!(hb.bus, 0x3a);
        assert_eq!(hb.to_string(), "pci0000:3a");
        assert!(HostBridge::parse("pci0000").is_none());
        assert!(HostBridge::parse("0000:00:01.0").is_none());
        assert!(HostBridge::parse("pcixyzw:00").is_none());
    }
}
