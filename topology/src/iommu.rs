//! The IOMMU as it affects peer-to-peer: whether DMA from a device is
//! translated (so a peer's raw BAR address is not what the device must use)
//! or passed through.
//!
//! Three sources, strongest first:
//! 1. `sys/kernel/iommu_groups/N/type` (Linux 5.11+): the default domain of
//!    each group, `DMA`, `DMA-FQ` (translated, lazy flush), `identity`
//!    (passthrough), `blocked` or `unmanaged` (owned by VFIO or another user).
//! 2. `proc/cmdline`: `iommu=pt`, `iommu.passthrough=`, `intel_iommu=`,
//!    `amd_iommu=`, `iommu=off`.
//! 3. `sys/class/iommu/*`: which IOMMU units the kernel registered (none
//!    means no IOMMU is active, so nothing is translated).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::diag::Diagnostic;
use crate::sysfs::{self, ReadError};

/// The default domain type of an IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupDomain {
    /// `DMA`: translated, strict invalidation.
    Dma,
    /// `DMA-FQ`: translated, lazy (flush-queue) invalidation.
    DmaFlushQueue,
    /// `identity`: passthrough; bus addresses are physical addresses.
    Identity,
    /// `blocked`: all DMA blocked.
    Blocked,
    /// `unmanaged`: owned by a user such as VFIO, which sets up its own
    /// mappings.
    Unmanaged,
    /// Anything else the kernel may print.
    Other(String),
}

impl GroupDomain {
    pub fn parse(text: &str) -> GroupDomain {
        match text.trim() {
            "DMA" => GroupDomain::Dma,
            "DMA-FQ" => GroupDomain::DmaFlushQueue,
            "identity" => GroupDomain::Identity,
            "blocked" => GroupDomain::Blocked,
            "unmanaged" => GroupDomain::Unmanaged,
            other => GroupDomain::Other(other.to_string()),
        }
    }

    /// Whether DMA through this domain is translated (or blocked), i.e. a
    /// peer's physical BAR address cannot simply be used. `None` if unknown.
    pub fn translates(&self) -> Option<bool> {
        match self {
            GroupDomain::Dma
            | GroupDomain::DmaFlushQueue
            | GroupDomain::Blocked
            | GroupDomain::Unmanaged => Some(true),
            GroupDomain::Identity => Some(false),
            GroupDomain::Other(_) => None,
        }
    }
}

impl fmt::Display for GroupDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupDomain::Dma => write!(f, "DMA"),
            GroupDomain::DmaFlushQueue => write!(f, "DMA-FQ"),
            GroupDomain::Identity => write!(f, "identity"),
            GroupDomain::Blocked => write!(f, "blocked"),
            GroupDomain::Unmanaged => write!(f, "unmanaged"),
            GroupDomain::Other(text) => write!(f, "{text}"),
        }
    }
}

/// The IOMMU-related parameters of the kernel command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelIommuArgs {
    /// The tokens that mention the IOMMU, as written.
    pub tokens: Vec<String>,
    /// `Some(true)` for `iommu=pt`/`iommu.passthrough=1`, `Some(false)` for
    /// `iommu=nopt`/`iommu.passthrough=0`.
    pub passthrough: Option<bool>,
    /// `iommu=off`, `intel_iommu=off` or `amd_iommu=off`.
    pub disabled: bool,
}

/// Picks the IOMMU parameters out of a kernel command line.
pub fn parse_cmdline(cmdline: &str) -> KernelIommuArgs {
    let mut args = KernelIommuArgs::default();
    for token in cmdline.split_whitespace() {
        // Everything after a bare `--` goes to init, not the kernel.
        if token == "--" {
            break;
        }
        let Some((key, value)) = token.split_once('=') else {
            continue;
        };
        let truthy = |v: &str| matches!(v, "1" | "y" | "Y" | "on" | "yes");
        let falsy = |v: &str| matches!(v, "0" | "n" | "N" | "off" | "no");
        match key {
            "iommu" => {
                args.tokens.push(token.to_string());
                for option in value.split(',') {
                    match option {
                        "pt" => args.passthrough = Some(true),
                        "nopt" => args.passthrough = Some(false),
                        "off" => args.disabled = true,
                        _ => {}
                    }
                }
            }
            "iommu.passthrough" => {
                args.tokens.push(token.to_string());
                if truthy(value) {
                    args.passthrough = Some(true);
                } else if falsy(value) {
                    args.passthrough = Some(false);
                }
            }
            "intel_iommu" | "amd_iommu" => {
                args.tokens.push(token.to_string());
                for option in value.split(',') {
                    match option {
                        "off" => args.disabled = true,
                        "pt" => args.passthrough = Some(true),
                        _ => {}
                    }
                }
            }
            "iommu.strict" => args.tokens.push(token.to_string()),
            _ => {}
        }
    }
    args
}

/// How DMA from one device is treated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum DeviceTranslation {
    /// No IOMMU is active.
    Off,
    /// Passthrough (identity). `assumed` when no group type was readable and
    /// the kernel command line was taken at its word.
    Passthrough { assumed: bool },
    /// Translated (or blocked, or user-managed). `assumed` when inferred.
    Translating { domain: String, assumed: bool },
    /// An IOMMU is active but this device's situation could not be read.
    Unknown,
}

impl DeviceTranslation {
    pub fn translates(&self) -> bool {
        matches!(self, DeviceTranslation::Translating { .. })
    }
}

impl fmt::Display for DeviceTranslation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceTranslation::Off => write!(f, "no IOMMU"),
            DeviceTranslation::Passthrough { assumed: false } => {
                write!(f, "IOMMU passthrough (group type identity)")
            }
            DeviceTranslation::Passthrough { assumed: true } => {
                write!(f, "IOMMU passthrough (from the kernel command line)")
            }
            DeviceTranslation::Translating {
                domain,
                assumed: false,
            } => write!(f, "IOMMU translating (group type {domain})"),
            DeviceTranslation::Translating {
                domain,
                assumed: true,
            } => write!(
                f,
                "IOMMU translating (assumed: {domain}, the kernel default, since no group type was readable and the command line has no iommu=pt)"
            ),
            DeviceTranslation::Unknown => write!(f, "IOMMU state unknown"),
        }
    }
}

/// The system-wide IOMMU mode, summarised over all groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IommuMode {
    /// No IOMMU active.
    Off,
    /// Every group passes DMA through.
    Passthrough,
    /// Every group translates.
    Translating,
    /// Some groups translate, others pass through.
    Mixed,
    /// Groups exist but no type could be read and the command line does not
    /// say: translation is assumed (the kernel's usual default).
    AssumedTranslating,
    /// No type could be read but the command line asks for passthrough.
    AssumedPassthrough,
}

/// The system's IOMMU state as read from sysfs and the command line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IommuState {
    /// Registered IOMMU units (`sys/class/iommu`), e.g. `dmar0`, `ivhd0`.
    pub units: Vec<String>,
    /// `None` when `proc/cmdline` could not be read.
    pub cmdline: Option<KernelIommuArgs>,
    /// Each group and its default domain type (`None`: no `type` file).
    pub groups: BTreeMap<u32, Option<GroupDomain>>,
}

impl IommuState {
    /// Reads the three sources under `root`, recording what fails.
    pub fn read(root: &Path, diagnostics: &mut Vec<Diagnostic>) -> IommuState {
        let mut state = IommuState::default();
        match sysfs::list_dir(&root.join("sys/class/iommu")) {
            Ok(units) => state.units = units,
            Err(ReadError::Missing { .. }) => {}
            Err(e) => diagnostics.push(Diagnostic::system_read(
                e,
                "IOMMU units unknown: whether an IOMMU is active is judged from groups alone",
            )),
        }
        match sysfs::read_text(&root.join("proc/cmdline")) {
            Ok(text) => state.cmdline = Some(parse_cmdline(&text)),
            Err(e) => diagnostics.push(Diagnostic::system_read(
                e,
                "kernel command line unknown: IOMMU passthrough is judged from group types alone",
            )),
        }
        let groups_dir = root.join("sys/kernel/iommu_groups");
        match sysfs::list_dir(&groups_dir) {
            Ok(names) => {
                for name in names {
                    let Ok(group) = name.parse::<u32>() else {
                        continue;
                    };
                    let domain = match sysfs::read_text(&groups_dir.join(&name).join("type")) {
                        Ok(text) => Some(GroupDomain::parse(&text)),
                        Err(ReadError::Missing { .. }) => None,
                        Err(e) => {
                            diagnostics.push(Diagnostic::system_read(
                                e,
                                format!("domain type of IOMMU group {group} unknown: assumed from the kernel command line"),
                            ));
                            None
                        }
                    };
                    state.groups.insert(group, domain);
                }
            }
            Err(ReadError::Missing { .. }) => {}
            Err(e) => diagnostics.push(Diagnostic::system_read(
                e,
                "IOMMU groups unknown: translation is judged from the kernel command line",
            )),
        }
        state
    }

    /// Whether the kernel runs an IOMMU at all.
    pub fn is_active(&self) -> bool {
        if self.units.is_empty() && self.groups.is_empty() {
            return false;
        }
        // `iommu=off` leaves no groups even where units are listed.
        let disabled = self.cmdline.as_ref().is_some_and(|c| c.disabled);
        !(disabled && self.groups.is_empty())
    }

    /// How DMA from a device in `group` is treated.
    pub fn translation_for(&self, group: Option<u32>) -> DeviceTranslation {
        if !self.is_active() {
            return DeviceTranslation::Off;
        }
        let Some(group) = group else {
            return DeviceTranslation::Unknown;
        };
        match self.groups.get(&group) {
            Some(Some(domain)) => match domain.translates() {
                Some(true) => DeviceTranslation::Translating {
                    domain: domain.to_string(),
                    assumed: false,
                },
                Some(false) => DeviceTranslation::Passthrough { assumed: false },
                None => DeviceTranslation::Unknown,
            },
            // A group without a readable type: older kernels. The command
            // line is the next best witness; without `iommu=pt` the kernel's
            // usual default is a translated DMA domain.
            _ => match self.cmdline.as_ref().and_then(|c| c.passthrough) {
                Some(true) => DeviceTranslation::Passthrough { assumed: true },
                _ => DeviceTranslation::Translating {
                    domain: "DMA".to_string(),
                    assumed: true,
                },
            },
        }
    }

    /// The system-wide mode.
    pub fn mode(&self) -> IommuMode {
        if !self.is_active() {
            return IommuMode::Off;
        }
        let known: Vec<bool> = self
            .groups
            .values()
            .filter_map(|d| d.as_ref().and_then(|d| d.translates()))
            .collect();
        match (known.iter().any(|t| *t), known.iter().any(|t| !*t)) {
            (true, true) => IommuMode::Mixed,
            (true, false) => IommuMode::Translating,
            (false, true) => IommuMode::Passthrough,
            (false, false) => match self.cmdline.as_ref().and_then(|c| c.passthrough) {
                Some(true) => IommuMode::AssumedPassthrough,
                _ => IommuMode::AssumedTranslating,
            },
        }
    }

    /// One line for reports: which IOMMU, which mode, from what evidence.
    pub fn summary(&self) -> String {
        if !self.is_active() {
            return "no IOMMU active (none registered in sys/class/iommu)".to_string();
        }
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for domain in self.groups.values() {
            let key = domain
                .as_ref()
                .map_or_else(|| "no type file".to_string(), |d| d.to_string());
            *counts.entry(key).or_default() += 1;
        }
        let units = if self.units.is_empty() {
            "IOMMU groups present".to_string()
        } else {
            format!("IOMMU units {}", self.units.join(", "))
        };
        let groups = counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        let tokens = self
            .cmdline
            .as_ref()
            .map(|c| c.tokens.join(" "))
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "no IOMMU options".to_string());
        let mode = match self.mode() {
            IommuMode::Off => "off",
            IommuMode::Passthrough => "passthrough",
            IommuMode::Translating => "translating",
            IommuMode::Mixed => "mixed (some groups translate)",
            IommuMode::AssumedTranslating => "translating (assumed)",
            IommuMode::AssumedPassthrough => "passthrough (assumed from the command line)",
        };
        format!("{mode}; {units}; groups: {groups}; command line: {tokens}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_options_are_understood() {
        let args =
            parse_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet");
        assert_eq!(args.passthrough, Some(true));
        assert!(!args.disabled);
        assert_eq!(args.tokens, vec!["intel_iommu=on", "iommu=pt"]);
        assert_eq!(
            parse_cmdline("iommu.passthrough=0").passthrough,
            Some(false)
        );
        assert_eq!(parse_cmdline("iommu.passthrough=1").passthrough, Some(true));
        assert!(parse_cmdline("amd_iommu=off").disabled);
        assert!(parse_cmdline("intel_iommu=on,sm_on").passthrough.is_none());
        assert_eq!(parse_cmdline("quiet -- iommu=pt").passthrough, None);
    }

    #[test]
    fn group_types_decide_translation() {
        let mut state = IommuState {
            units: vec!["dmar0".into()],
            cmdline: Some(parse_cmdline("intel_iommu=on")),
            groups: BTreeMap::new(),
        };
        state.groups.insert(1, Some(GroupDomain::parse("DMA-FQ")));
        state.groups.insert(2, Some(GroupDomain::parse("identity")));
        state.groups.insert(3, None);
        assert!(state.translation_for(Some(1)).translates());
        assert_eq!(
            state.translation_for(Some(2)),
            DeviceTranslation::Passthrough { assumed: false }
        );
        assert_eq!(
            state.translation_for(Some(3)),
            DeviceTranslation::Translating {
                domain: "DMA".into(),
                assumed: true
            }
        );
        assert_eq!(state.translation_for(None), DeviceTranslation::Unknown);
    }

    #[test]
    fn mode_summarises_groups() {
        let mut state = IommuState {
            units: vec!["ivhd0".into()],
            cmdline: Some(parse_cmdline("iommu=pt")),
            groups: BTreeMap::new(),
        };
        state.groups.insert(1, None);
        assert_eq!(state.mode(), IommuMode::AssumedPassthrough);
        state.groups.insert(2, Some(GroupDomain::Identity));
        assert_eq!(state.mode(), IommuMode::Passthrough);
        state.groups.insert(3, Some(GroupDomain::Dma));
        assert_eq!(state.mode(), IommuMode::Mixed);
        assert!(state.summary().starts_with("mixed"));
    }

    #[test]
    fn no_units_no_groups_means_off() {
        let state = IommuState::default();
        assert!(!state.is_active());
        assert_eq!(state.mode(), IommuMode::Off);
        assert_eq!(state.translation_for(Some(4)), DeviceTranslation::Off);
    }
}
