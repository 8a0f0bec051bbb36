//! Whether a GPU's peer aperture — the BAR through which peers and NICs
//! reach its memory (BAR1 on NVIDIA) — is large enough to expose that memory.
//!
//! NVIDIA's memory size is not in sysfs, so the judgement uses, in order:
//! a small table of well-known device ids and their memory sizes; the
//! Resizable BAR capability (a BAR smaller than the largest size the GPU
//! advertises means Resizable BAR is off or limited by firmware); and lastly
//! the rule that no current discrete GPU has less than 1 GiB of memory, so a
//! BAR1 below 1 GiB (the legacy 256 MiB window) cannot expose it. Every
//! verdict carries the assumption it rests on.

use serde::Serialize;

use crate::pci::PciDevice;
use crate::pci::class::VENDOR_NVIDIA;
use crate::pci::resource::{Bar, BarSpace, human_bytes};

const GIB: u64 = 1 << 30;

/// GPUs whose memory size is known from the device id (the common P2P
/// targets). Ids from the PCI ID database; sizes from the vendor's specs.
const KNOWN_NVIDIA_MEMORY: &[(u16, &str, u64)] = &[
    (0x2204, "GeForce RTX 3090", 24 * GIB),
    (0x2203, "GeForce RTX 3090 Ti", 24 * GIB),
    (0x2684, "GeForce RTX 4090", 24 * GIB),
    (0x2685, "GeForce RTX 4090 D", 24 * GIB),
    (0x2b85, "GeForce RTX 5090", 32 * GIB),
];

/// The model name and memory size for a known NVIDIA device id.
pub fn known_nvidia_gpu(device_id: u16) -> Option<(&'static str, u64)> {
    KNOWN_NVIDIA_MEMORY
        .iter()
        .find(|(id, _, _)| *id == device_id)
        .map(|(_, name, bytes)| (*name, *bytes))
}

/// The verdict on a GPU's aperture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApertureVerdict {
    /// Large enough (known, or by the stated assumption).
    Sufficient,
    /// Probably too small, but not certainly.
    Doubtful,
    /// Too small, or not assigned: peers cannot reach all of the memory.
    Insufficient,
    /// The BAR could not be read.
    Unknown,
}

/// What is known about one GPU's aperture, and the reasoning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Aperture {
    /// Which PCI BAR peers use: NVIDIA's BAR1 ([`nvidia_bar1`]: PCI BAR
    /// 1 or 2), the largest prefetchable memory BAR elsewhere.
    pub bar_index: Option<u8>,
    pub bytes: Option<u64>,
    /// GPU memory size when known from the device id.
    pub memory_bytes: Option<u64>,
    /// Largest size the Resizable BAR capability advertises for that BAR.
    pub rebar_max_bytes: Option<u64>,
    pub verdict: ApertureVerdict,
    /// The reasoning, including what was assumed.
    pub explanation: String,
}

/// NVIDIA's BAR1, the aperture onto the GPU's memory: the memory BAR
/// after the register BAR0. That is PCI BAR 1 where BAR0 is 32-bit
/// (GeForce cards) and PCI BAR 2 where a 64-bit BAR0 takes two
/// registers (data-center GPUs such as the H100 and H200).
pub fn nvidia_bar1(bars: &[Bar]) -> Option<&Bar> {
    let bar0_is_64bit = bars.iter().any(|b| b.index == 0 && b.is_64bit);
    let index = if bar0_is_64bit { 2 } else { 1 };
    bars.iter()
        .find(|b| b.index == index && b.space == BarSpace::Memory)
}

/// The BAR peers use on this GPU.
fn aperture_bar(gpu: &PciDevice) -> Option<&Bar> {
    if gpu.vendor == Some(VENDOR_NVIDIA) {
        return nvidia_bar1(&gpu.bars);
    }
    gpu.bars
        .iter()
        .filter(|b| b.space == BarSpace::Memory && b.prefetchable)
        .max_by_key(|b| b.size)
}

/// Judges a GPU's aperture.
pub fn assess(gpu: &PciDevice) -> Aperture {
    let bar_name = if gpu.vendor == Some(VENDOR_NVIDIA) {
        "BAR1".to_string()
    } else {
        "the largest prefetchable BAR".to_string()
    };
    let known = gpu
        .device_id
        .filter(|_| gpu.vendor == Some(VENDOR_NVIDIA))
        .and_then(known_nvidia_gpu);
    let memory_bytes = known.map(|(_, bytes)| bytes);
    let Some(bar) = aperture_bar(gpu) else {
        let verdict = ApertureVerdict::Unknown;
        let explanation = if gpu.bars.is_empty() {
            format!("{bar_name} size unknown: the resource file gave no BARs")
        } else {
            format!("{bar_name} not found among the device's BARs")
        };
        return Aperture {
            bar_index: None,
            bytes: None,
            memory_bytes,
            rebar_max_bytes: None,
            verdict,
            explanation,
        };
    };
    let bar_name = match bar.index {
        index if gpu.vendor == Some(VENDOR_NVIDIA) && index != 1 => {
            format!("BAR1 (PCI BAR {index}, after a 64-bit BAR0)")
        }
        index => format!("BAR{index}"),
    };
    let bytes = bar.size;
    let rebar_max_bytes = if gpu.config.access.has_extended() {
        gpu.config
            .rebar_for(bar.index)
            .and_then(|e| e.max_supported())
    } else {
        None
    };
    let rebar_hint = match rebar_max_bytes {
        Some(max) if max > bytes => format!(
            " (its Resizable BAR capability allows up to {})",
            human_bytes(max)
        ),
        _ => String::new(),
    };
    let (verdict, explanation) = if bar.unassigned {
        (
            ApertureVerdict::Insufficient,
            format!(
                "{bar_name} has no address assigned (firmware ran out of MMIO space){rebar_hint}"
            ),
        )
    } else if let Some((model, memory)) = known {
        judge_by_memory(&bar_name, bytes, model, memory, &rebar_hint)
    } else if let Some(max) = rebar_max_bytes {
        judge_by_rebar(&bar_name, bytes, max)
    } else {
        judge_by_minimum(&bar_name, bytes)
    };
    Aperture {
        bar_index: Some(bar.index),
        bytes: Some(bytes),
        memory_bytes,
        rebar_max_bytes,
        verdict,
        explanation,
    }
}

/// A GPU whose memory size is known: the BAR covers it or it does not.
fn judge_by_memory(
    bar_name: &str,
    bytes: u64,
    model: &str,
    memory: u64,
    rebar_hint: &str,
) -> (ApertureVerdict, String) {
    if bytes >= memory {
        (
            ApertureVerdict::Sufficient,
            format!(
                "{bar_name} is {}, covering the {} of a {model}",
                human_bytes(bytes),
                human_bytes(memory)
            ),
        )
    } else {
        (
            ApertureVerdict::Insufficient,
            format!(
                "{bar_name} is {} but a {model} has {}: peers can reach only part of its memory{rebar_hint}",
                human_bytes(bytes),
                human_bytes(memory)
            ),
        )
    }
}

/// Memory size unknown, but the Resizable BAR capability says how large
/// the BAR may be: a BAR at that size is taken to cover the memory.
fn judge_by_rebar(bar_name: &str, bytes: u64, max: u64) -> (ApertureVerdict, String) {
    if bytes >= max {
        (
            ApertureVerdict::Sufficient,
            format!(
                "{bar_name} is {}, the largest size the GPU advertises (assumed to cover its memory, whose size is not in sysfs)",
                human_bytes(bytes)
            ),
        )
    } else if bytes < GIB {
        (
            ApertureVerdict::Insufficient,
            format!(
                "{bar_name} is {}, below 1 GiB and below the {} the GPU advertises: Resizable BAR is off",
                human_bytes(bytes),
                human_bytes(max)
            ),
        )
    } else {
        (
            ApertureVerdict::Doubtful,
            format!(
                "{bar_name} is {}, below the {} the GPU advertises: it may not cover the GPU's memory (size not in sysfs)",
                human_bytes(bytes),
                human_bytes(max)
            ),
        )
    }
}

/// Nothing known but the BAR's size: no current discrete GPU has less than
/// 1 GiB of memory, so a smaller BAR cannot expose it.
fn judge_by_minimum(bar_name: &str, bytes: u64) -> (ApertureVerdict, String) {
    if bytes < GIB {
        (
            ApertureVerdict::Insufficient,
            format!(
                "{bar_name} is {}; assuming the GPU has at least 1 GiB of memory (its size is not in sysfs), peers cannot reach all of it",
                human_bytes(bytes)
            ),
        )
    } else {
        (
            ApertureVerdict::Sufficient,
            format!(
                "{bar_name} is {}; assumed to cover the GPU's memory (its size is not in sysfs and the Resizable BAR capability was not readable)",
                human_bytes(bytes)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::resource::parse_resource;

    #[test]
    fn nvidia_bar1_follows_a_64bit_bar0_to_pci_bar_2() {
        // An H200's resource file (10de:2335, in a KVM guest): BAR0 is
        // 64-bit, so the 256 GiB aperture is PCI BAR 2 and BAR 1 is empty.
        let h200 = "\
0x0000104002000000 0x0000104002ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000100000000000 0x0000103fffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000104000000000 0x0000104001ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
";
        let (bars, bad) = parse_resource(h200);
        assert!(bad.is_empty());
        let bar1 = nvidia_bar1(&bars).expect("the aperture is found");
        assert_eq!((bar1.index, bar1.size), (2, 256 * GIB));

        // A GeForce card's BAR0 is 32-bit: the aperture is PCI BAR 1.
        let rtx = "\
0x00000000f2000000 0x00000000f2ffffff 0x0000000000040200
0x0000006000000000 0x00000067ffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000006800000000 0x0000006801ffffff 0x000000000014220c
";
        let (bars, _) = parse_resource(rtx);
        let bar1 = nvidia_bar1(&bars).expect("the aperture is found");
        assert_eq!((bar1.index, bar1.size), (1, 32 * GIB));
    }
}
