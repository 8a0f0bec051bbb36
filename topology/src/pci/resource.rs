//! Decoding the `resource` attribute: one line per resource, `start end
//! flags` in hex, where lines 0–5 are the BARs and line 6 the expansion ROM
//! (further lines are SR-IOV and bridge windows, which we do not need).
//!
//! The flags column is the kernel's `struct resource` flags, so it is decoded
//! with the `IORESOURCE_*` bit values from `include/linux/ioport.h`.

use std::fmt;

use serde::Serialize;

/// `IORESOURCE_IO`: an I/O-port BAR.
pub const IORESOURCE_IO: u64 = 0x0000_0100;
/// `IORESOURCE_MEM`: a memory BAR.
pub const IORESOURCE_MEM: u64 = 0x0000_0200;
/// `IORESOURCE_PREFETCH`: prefetchable memory (what P2P apertures are).
pub const IORESOURCE_PREFETCH: u64 = 0x0000_2000;
/// `IORESOURCE_MEM_64`: a 64-bit memory BAR.
pub const IORESOURCE_MEM_64: u64 = 0x0010_0000;
/// `IORESOURCE_DISABLED`.
pub const IORESOURCE_DISABLED: u64 = 0x1000_0000;
/// `IORESOURCE_UNSET`: the kernel could not give the BAR an address.
pub const IORESOURCE_UNSET: u64 = 0x2000_0000;

/// Number of standard BARs in a type 0 header.
pub const STANDARD_BARS: usize = 6;

/// Whether a BAR decodes memory or I/O ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BarSpace {
    Memory,
    Io,
}

/// One base address register as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bar {
    /// BAR number, 0–5.
    pub index: u8,
    /// Start address as shown to user space (0 when unassigned).
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    pub space: BarSpace,
    pub is_64bit: bool,
    pub prefetchable: bool,
    /// The BAR exists but firmware/kernel gave it no address (too little
    /// MMIO space below 4 GiB is the usual reason: "Above 4G decoding" off).
    pub unassigned: bool,
    /// The raw flags column.
    pub flags: u64,
}

/// A line of the `resource` file that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadResourceLine {
    /// 0-based line number.
    pub line: usize,
    pub text: String,
}

impl fmt::Display for BadResourceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {} {:?} is not three hex numbers",
            self.line, self.text
        )
    }
}

/// Decodes the BAR lines of a `resource` file. Lines that are not three hex
/// numbers are returned as errors and skipped; the rest are still decoded.
pub fn parse_resource(text: &str) -> (Vec<Bar>, Vec<BadResourceLine>) {
    let mut bars = Vec::new();
    let mut bad = Vec::new();
    for (line_no, line) in text.lines().enumerate().take(STANDARD_BARS) {
        let fields: Vec<Option<u64>> = line.split_whitespace().map(parse_hex_u64).collect();
        let (start, end, flags) = match fields.as_slice() {
            [Some(start), Some(end), Some(flags)] => (*start, *end, *flags),
            _ => {
                bad.push(BadResourceLine {
                    line: line_no,
                    text: line.chars().take(80).collect(),
                });
                continue;
            }
        };
        if flags & (IORESOURCE_IO | IORESOURCE_MEM) == 0 && start == 0 && end == 0 {
            continue; // no BAR here
        }
        // An empty or inverted range with type flags is a BAR the kernel
        // knows about but could not size; report it with size 0.
        let size = if end >= start && (end != 0 || flags != 0) {
            end - start + 1
        } else {
            0
        };
        let space = if flags & IORESOURCE_IO != 0 {
            BarSpace::Io
        } else {
            BarSpace::Memory
        };
        bars.push(Bar {
            index: line_no as u8,
            start,
            size,
            space,
            is_64bit: flags & IORESOURCE_MEM_64 != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
            unassigned: flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED) != 0
                || (start == 0 && size > 0),
            flags,
        });
    }
    (bars, bad)
}

fn parse_hex_u64(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x")?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Formats a byte count the way people read BAR sizes: `256 MiB`, `32 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if (value - value.round()).abs() < 0.005 {
        format!("{} {}", value.round() as u64, UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The resource file of an RTX 4090 with Resizable BAR on.
    const RTX_4090: &str = "\
0x00000000fb000000 0x00000000fbffffff 0x0000000000040200
0x0000006000000000 0x00000067ffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000006800000000 0x0000006801ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000000000f000 0x000000000000f07f 0x0000000000040101
0x00000000fc000000 0x00000000fc07ffff 0x0000000000046200
0x0000000000000000 0x0000000000000000 0x0000000000000000
";

    #[test]
    fn decodes_gpu_bars() {
        let (bars, bad) = parse_resource(RTX_4090);
        assert!(bad.is_empty());
        assert_eq!(bars.len(), 4);
        let bar1 = &bars[1];
        assert_eq!(bar1.index, 1);
        assert_eq!(bar1.size, 32 << 30);
        assert!(bar1.is_64bit && bar1.prefetchable && !bar1.unassigned);
        assert_eq!(bars[0].size, 16 << 20);
        assert!(!bars[0].prefetchable && !bars[0].is_64bit);
        assert_eq!(bars[3].space, BarSpace::Io);
        assert_eq!(bars[3].size, 128);
    }

    #[test]
    fn malformed_lines_are_reported_and_skipped() {
        let text =
            "0x1000 garbage 0x200\n0x0000000010000000 0x000000001fffffff 0x0000000000042208\n";
        let (bars, bad) = parse_resource(text);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].line, 0);
        assert_eq!(bars.len(), 1);
        assert_eq!(bars[0].index, 1);
        assert_eq!(bars[0].size, 256 << 20);
    }

    #[test]
    fn unassigned_bars_are_flagged() {
        let text = "0x0000000000000000 0x000000000fffffff 0x000000002014220c\n";
        let (bars, _) = parse_resource(text);
        assert!(bars[0].unassigned);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(32 << 30), "32 GiB");
        assert_eq!(human_bytes(128), "128 B");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
    }
}
