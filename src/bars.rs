//! BAR windows named in text, the same way on every face: the C config's
//! `own_bar`/`peer_bar`, Python's `own_bar=`/`peer_bar=`, and
//! [`BarRef`]'s `FromStr`.
//!
//! `DEVICE/BAR@OFFSET+LEN`: the device as `barlink topo` names it (a PCI
//! address like `0000:01:00.0`, or `vendor:device[#n]`), the BAR's index,
//! and the window's first byte and length within that BAR. Numbers are
//! bytes in decimal or `0x` hex, or with a binary unit (`4K`, `2M`, `1G`);
//! `@OFFSET` may be left out for a window at the start of the BAR.
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// A BAR window: bytes `offset..offset + len` of BAR `bar` of a device
/// (an address like `0000:01:00.0`, or `vendor:device[#n]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarRef {
    pub device: String,
    pub bar: u32,
    pub offset: usize,
    pub len: usize,
}

/// The BAR windows of the two sides on this host: each side reads its own
/// ring in `own` and writes the peer's in `peer` (the peer names the same
/// two, swapped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarEnds {
    pub own: BarRef,
    pub peer: BarRef,
}

/// Why a BAR window's text is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarRefError {
    text: String,
    why: String,
}

impl fmt::Display for BarRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BAR window {:?}: {} (write DEVICE/BAR@OFFSET+LEN, e.g. 0000:01:00.0/1@0+256M)",
            self.text, self.why
        )
    }
}

impl std::error::Error for BarRefError {}

/// The most BARs a PCI function has.
const BAR_COUNT: u32 = 6;

/// Bytes written as decimal, `0x` hex, or a number with K, M or G (binary).
fn bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a number of bytes");
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return usize::from_str_radix(hex, 16).map_err(|_| bad());
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: usize = number.parse().map_err(|_| bad())?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(format!("{text:?} has an unknown unit (use K, M or G)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

impl FromStr for BarRef {
    type Err = BarRefError;

    fn from_str(text: &str) -> Result<BarRef, BarRefError> {
        let fail = |why: String| BarRefError {
            text: text.to_string(),
            why,
        };
        let (device, rest) = text
            .rsplit_once('/')
            .ok_or_else(|| fail("no '/' between the device and the BAR".into()))?;
        if device.is_empty() {
            return Err(fail("the device is empty".into()));
        }
        let (place, len) = rest
            .split_once('+')
            .ok_or_else(|| fail("no '+LEN': the window's length is needed".into()))?;
        let (bar, offset) = match place.split_once('@') {
            Some((bar, offset)) => (bar, bytes(offset).map_err(&fail)?),
            None => (place, 0),
        };
        let bar: u32 = bar
            .parse()
            .ok()
            .filter(|&bar| bar < BAR_COUNT)
            .ok_or_else(|| fail(format!("the BAR {bar:?} is not an index 0 to 5")))?;
        let len = bytes(len).map_err(&fail)?;
        if len == 0 {
            return Err(fail("the window is empty".into()));
        }
        if offset.checked_add(len).is_none() {
            return Err(fail("the window runs past the address space".into()));
        }
        Ok(BarRef {
            device: device.to_string(),
            bar,
            offset,
            len,
        })
    }
}

impl fmt::Display for BarRef {
    /// The text [`BarRef::from_str`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}@{:#x}+{:#x}",
            self.device, self.bar, self.offset, self.len
        )
    }
}

impl BarEnds {
    /// Both windows from their text, or neither: one without the other is
    /// an error that says which is missing.
    pub fn from_texts(own: Option<&str>, peer: Option<&str>) -> Result<Option<BarEnds>, String> {
        match (own, peer) {
            (None, None) => Ok(None),
            (Some(own), Some(peer)) => Ok(Some(BarEnds {
                own: own.parse().map_err(|e: BarRefError| e.to_string())?,
                peer: peer.parse().map_err(|e: BarRefError| e.to_string())?,
            })),
            (Some(_), None) => Err(
                "own_bar is named but peer_bar is not: BAR P2P needs both windows (the peer names the same two, swapped)"
                    .into(),
            ),
            (None, Some(_)) => Err(
                "peer_bar is named but own_bar is not: BAR P2P needs both windows (the peer names the same two, swapped)"
                    .into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BarRef, String> {
        text.parse::<BarRef>().map_err(|e| e.to_string())
    }

    #[test]
    fn windows_parse_with_addresses_ids_units_and_hex() {
        assert_eq!(
            parse("0000:01:00.0/1@0+256M").unwrap(),
            BarRef {
                device: "0000:01:00.0".into(),
                bar: 1,
                offset: 0,
                len: 256 << 20,
            }
        );
        assert_eq!(
            parse("10de:2684#1/1@0xC00000+0x200100").unwrap(),
            BarRef {
                device: "10de:2684#1".into(),
                bar: 1,
                offset: 0xC0_0000,
                len: 0x20_0100,
            }
        );
        let at_start = parse("0000:00:10.0/2+4K").unwrap();
        assert_eq!((at_start.bar, at_start.offset, at_start.len), (2, 0, 4096));
    }

    #[test]
    fn display_reads_back_as_the_same_window() {
        let bar = parse("0000:41:00.0/3@12M+2097408").unwrap();
        assert_eq!(bar.to_string(), "0000:41:00.0/3@0xc00000+0x200100");
        assert_eq!(parse(&bar.to_string()).unwrap(), bar);
    }

    #[test]
    fn malformed_windows_say_what_is_wrong() {
        for (text, says) in [
            ("0000:01:00.0", "no '/'"),
            ("/1+4K", "device is empty"),
            ("0000:01:00.0/1@0", "no '+LEN'"),
            ("0000:01:00.0/6+4K", "not an index 0 to 5"),
            ("0000:01:00.0/x+4K", "not an index"),
            ("0000:01:00.0/1@zz+4K", "not a number of bytes"),
            ("0000:01:00.0/1+4T", "unknown unit"),
            ("0000:01:00.0/1+0", "empty"),
            (
                "0000:01:00.0/1@0xffffffffffffffff+1",
                "past the address space",
            ),
            ("0000:01:00.0/1+99999999999999999999", "not a number"),
            ("0000:01:00.0/1+17179869184G", "too large"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.contains("DEVICE/BAR@OFFSET+LEN"), "{error}");
        }
    }

    #[test]
    fn both_windows_or_neither() {
        assert_eq!(BarEnds::from_texts(None, None), Ok(None));
        let both = BarEnds::from_texts(Some("0000:01:00.0/1+4M"), Some("0000:02:00.0/1+4M"))
            .unwrap()
            .unwrap();
        assert_eq!(both.peer.device, "0000:02:00.0");
        let one = BarEnds::from_texts(Some("0000:01:00.0/1+4M"), None).unwrap_err();
        assert!(one.contains("peer_bar is not"), "{one}");
        let other = BarEnds::from_texts(None, Some("0000:01:00.0/1+4M")).unwrap_err();
        assert!(other.contains("own_bar is not"), "{other}");
        let bad = BarEnds::from_texts(Some("x"), Some("0000:02:00.0/1+4M")).unwrap_err();
        assert!(bad.contains("no '/'"), "{bad}");
    }
}
