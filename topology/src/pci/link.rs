//! PCIe link state from the `current_link_speed`, `max_link_speed`,
//! `current_link_width` and `max_link_width` attributes.
//!
//! The kernel prints speeds as `"16.0 GT/s PCIe"` (older kernels: `"16 GT/s"`,
//! `"2.5 GT/s"`) and `"Unknown"` (older: `"Unknown speed"`) when the link
//! reports a reserved value; widths are a bare number.

use std::fmt;

use serde::{Serialize, Serializer};

/// A link's signalling rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkSpeed {
    /// The kernel said "Unknown": the register held a value it does not know.
    Unknown,
    /// A rate in megatransfers per second (2500 for 2.5 GT/s).
    Rate { mega_transfers: u32 },
}

impl LinkSpeed {
    /// Parses the kernel's speed string; `None` if it is not one.
    pub fn parse(text: &str) -> Option<LinkSpeed> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("unknown") || text.eq_ignore_ascii_case("unknown speed") {
            return Some(LinkSpeed::Unknown);
        }
        let mut words = text.split_whitespace();
        let number = words.next()?;
        if !words.next()?.eq_ignore_ascii_case("GT/s") {
            return None;
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
        if whole.is_empty()
            || whole.len() > 4
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || fraction.is_empty()
            || fraction.len() > 3
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let whole: u32 = whole.parse().ok()?;
        let fraction: u32 = format!("{fraction:0<3}").parse().ok()?;
        let mega_transfers = whole * 1000 + fraction;
        if mega_transfers == 0 {
            return None;
        }
        Some(LinkSpeed::Rate { mega_transfers })
    }

    /// The PCIe generation for the standard rates.
    pub fn generation(self) -> Option<u8> {
        match self {
            LinkSpeed::Rate { mega_transfers } => match mega_transfers {
                2500 => Some(1),
                5000 => Some(2),
                8000 => Some(3),
                16000 => Some(4),
                32000 => Some(5),
                64000 => Some(6),
                128000 => Some(7),
                _ => None,
            },
            LinkSpeed::Unknown => None,
        }
    }

    /// Decodes the 4-bit speed field of the Link Capabilities / Link Status
    /// registers (1 = 2.5 GT/s … 6 = 64 GT/s).
    pub fn from_register(code: u8) -> Option<LinkSpeed> {
        let mega_transfers = match code {
            1 => 2500,
            2 => 5000,
            3 => 8000,
            4 => 16000,
            5 => 32000,
            6 => 64000,
            7 => 128000,
            _ => return None,
        };
        Some(LinkSpeed::Rate { mega_transfers })
    }
}

impl fmt::Display for LinkSpeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkSpeed::Unknown => write!(f, "unknown speed"),
            LinkSpeed::Rate { mega_transfers } => {
                write!(
                    f,
                    "{}.{} GT/s",
                    mega_transfers / 1000,
                    (mega_transfers % 1000) / 100
                )?;
                if let Some(generation) = self.generation() {
                    write!(f, " (Gen{generation})")?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for LinkSpeed {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LinkSpeed::Unknown => serializer.serialize_str("unknown"),
            LinkSpeed::Rate { mega_transfers } => serializer.serialize_str(&format!(
                "{}.{} GT/s",
                mega_transfers / 1000,
                (mega_transfers % 1000) / 100
            )),
        }
    }
}

/// Parses a link width attribute: `"16"`, also tolerating `"x16"`.
pub fn parse_link_width(text: &str) -> Option<u8> {
    let digits = text.trim().trim_start_matches(['x', 'X']);
    if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What is known about a device's PCIe link. Each field is `None` when the
/// attribute was absent or unreadable (the reason is in the diagnostics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkState {
    pub current_speed: Option<LinkSpeed>,
    pub max_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub max_width: Option<u8>,
}

impl LinkState {
    /// True when nothing at all is known (a conventional PCI device, or a
    /// kernel that does not export link attributes).
    pub fn is_empty(&self) -> bool {
        self.current_speed.is_none()
            && self.max_speed.is_none()
            && self.current_width.is_none()
            && self.max_width.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(mega_transfers: u32) -> LinkSpeed {
        LinkSpeed::Rate { mega_transfers }
    }

    #[test]
    fn kernel_speed_strings_parse() {
        assert_eq!(LinkSpeed::parse("16.0 GT/s PCIe"), Some(rate(16000)));
        assert_eq!(LinkSpeed::parse("2.5 GT/s PCIe"), Some(rate(2500)));
        assert_eq!(LinkSpeed::parse("2.5 GT/s"), Some(rate(2500)));
        assert_eq!(LinkSpeed::parse("8 GT/s"), Some(rate(8000)));
        assert_eq!(LinkSpeed::parse("32.0 GT/s PCIe\n"), Some(rate(32000)));
        assert_eq!(LinkSpeed::parse("Unknown"), Some(LinkSpeed::Unknown));
        assert_eq!(LinkSpeed::parse("Unknown speed"), Some(LinkSpeed::Unknown));
    }

    #[test]
    fn odd_speed_strings_are_rejected() {
        for text in [
            "",
            "fast",
            "16.0",
            "16.0 Gb/s",
            "GT/s",
            "-1 GT/s",
            "0 GT/s",
            "1.2.3 GT/s",
            "99999 GT/s",
        ] {
            assert_eq!(LinkSpeed::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn speeds_order_and_print() {
        assert!(rate(2500) < rate(16000));
        assert_eq!(rate(16000).generation(), Some(4));
        assert_eq!(rate(2500).to_string(), "2.5 GT/s (Gen1)");
        assert_eq!(LinkSpeed::from_register(5), Some(rate(32000)));
        assert_eq!(LinkSpeed::from_register(0), None);
    }

    #[test]
    fn widths_parse() {
        assert_eq!(parse_link_width("16"), Some(16));
        assert_eq!(parse_link_width("x8"), Some(8));
        assert_eq!(parse_link_width("sixteen"), None);
        assert_eq!(parse_link_width(""), None);
        assert_eq!(parse_link_width("255"), None);
    }
}
