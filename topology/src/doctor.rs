//! The platform doctor: one PASS/WARN/FAIL/SKIP line per check, each failing
//! or warning line with the fix.
//!
//! Checks, in order (ids as printed): `pci-tree` (what could be read),
//! `gpus` (any found), `config-access` (config space readable enough),
//! `acs` (redirection on switch ports GPU traffic enters), `iommu`
//! (translation), `bar1` (aperture size, one line per GPU), `numa` (GPUs
//! across sockets), `link` (trained below capability), `paths` (pairs that
//! fall back to host memory), `rdma-nic` (nearest RDMA NIC per GPU).
//!
//! FAIL means P2P as configured is broken or unsafe on this machine; the CLI
//! exits 1 when [`DoctorReport::has_failures`] is true. WARN means slower,
//! unverified or worth a look; SKIP means the check had nothing to examine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use crate::aperture::ApertureVerdict;
use crate::diag::Diagnostic;
use crate::iommu::DeviceTranslation;
use crate::pci::PciDevice;
use crate::pci::address::Bdf;
use crate::pci::config::{AcsBits, ConfigAccess};
use crate::pci::link::LinkSpeed;
use crate::pci::resource::human_bytes;
use crate::topology::{self, PairIssue, PathChoice, PathClass, Topology};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable id of the check, e.g. `acs`.
    pub id: &'static str,
    #[serde(rename = "status")]
    pub verdict: Verdict,
    /// The device or group of devices the line is about, when there is one.
    pub subject: Option<String>,
    pub message: String,
    /// What to do about it (for WARN and FAIL).
    pub fix: Option<String>,
}

impl Check {
    /// A finding of a check outside this crate (the command adds the
    /// setup's own, such as remote authentication).
    pub fn new(id: &'static str, verdict: Verdict, message: impl Into<String>) -> Check {
        Check {
            id,
            verdict,
            subject: None,
            message: message.into(),
            fix: None,
        }
    }

    fn subject(mut self, subject: impl Into<String>) -> Check {
        self.subject = Some(subject.into());
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

/// The doctor's findings.
#[derive(Debug, Clone)]
pub struct DoctorReport {
    pub sysfs_root: String,
    pub checks: Vec<Check>,
    /// What could not be read that bears on the verdicts.
    pub unreadable: Vec<Diagnostic>,
    /// How many further diagnostics concern devices that change no verdict.
    pub unreadable_other: usize,
}

impl DoctorReport {
    /// True when any check failed: the CLI exits 1.
    pub fn has_failures(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }

    pub fn has_warnings(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Warn)
    }

    /// The checks with this id.
    pub fn checks_named<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Check> + 'a {
        self.checks.iter().filter(move |c| c.id == id)
    }

    /// The worst verdict among the checks with this id.
    pub fn worst(&self, id: &str) -> Option<Verdict> {
        self.checks_named(id).map(|c| c.verdict).max()
    }

    pub fn count(&self, verdict: Verdict) -> usize {
        self.checks.iter().filter(|c| c.verdict == verdict).count()
    }

    /// The report for people: one line per check, the fix indented below.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "barlink doctor (sysfs root {})\n", self.sysfs_root);
        for check in &self.checks {
            let subject = check
                .subject
                .as_ref()
                .map(|s| format!("{s}: "))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{:<5} {:<14} {subject}{}",
                check.verdict.as_str(),
                check.id,
                check.message
            );
            if let Some(fix) = &check.fix {
                let _ = writeln!(out, "{:<20} fix: {fix}", "");
            }
        }
        if !self.unreadable.is_empty() {
            let _ = writeln!(
                out,
                "\nCould not read ({} affecting verdicts):",
                plural(self.unreadable.len(), "item", "items")
            );
            for diagnostic in &self.unreadable {
                let _ = writeln!(out, "  - {diagnostic}");
            }
        }
        if self.unreadable_other > 0 {
            let _ = writeln!(
                out,
                "\n({} more could not be read about devices that change no verdict; see --json)",
                plural(self.unreadable_other, "item", "items")
            );
        }
        let _ = writeln!(
            out,
            "\nSummary: {} passed, {} warnings, {} failed, {} skipped",
            self.count(Verdict::Pass),
            self.count(Verdict::Warn),
            self.count(Verdict::Fail),
            self.count(Verdict::Skip)
        );
        out
    }

    /// The report as one JSON document: `checks` (each with `id`, `status`,
    /// `subject`, `message`, `fix`), `summary`, `has_failures`, `unreadable`.
    pub fn to_json(&self) -> Value {
        json!({
            "sysfs_root": self.sysfs_root,
            "checks": self.checks,
            "summary": {
                "pass": self.count(Verdict::Pass),
                "warn": self.count(Verdict::Warn),
                "fail": self.count(Verdict::Fail),
                "skip": self.count(Verdict::Skip),
            },
            "has_failures": self.has_failures(),
            "unreadable": self.unreadable,
            "unreadable_other": self.unreadable_other,
        })
    }
}

/// `1 item`, `2 items`.
pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Runs every check on an analysed topology.
pub fn run(topology: &Topology) -> DoctorReport {
    let (relevant, other) = topology.diagnostics_by_relevance();
    let mut checks = Vec::new();
    check_pci_tree(topology, relevant.len(), &mut checks);
    check_gpus(topology, &mut checks);
    check_config_access(topology, &mut checks);
    check_acs(topology, &mut checks);
    check_iommu(topology, &mut checks);
    check_bar1(topology, &mut checks);
    check_numa(topology, &mut checks);
    check_links(topology, &mut checks);
    check_paths(topology, &mut checks);
    check_rdma_nic(topology, &mut checks);
    DoctorReport {
        sysfs_root: topology.platform.sysfs_root.display().to_string(),
        checks,
        unreadable: relevant.into_iter().cloned().collect(),
        unreadable_other: other.len(),
    }
}

fn check_pci_tree(topology: &Topology, unreadable: usize, checks: &mut Vec<Check>) {
    let count = topology.platform.devices.len();
    checks.push(if unreadable == 0 {
        Check::new("pci-tree", Verdict::Pass, format!("read {count} PCI devices"))
    } else {
        Check::new(
            "pci-tree",
            Verdict::Warn,
            format!(
                "read {count} PCI devices; {} that bear on the verdicts could not be read (listed below), so checks that depend on them are unverified",
                plural(unreadable, "item", "items")
            ),
        )
        .fix("see the list below; run as root, and check that --sysfs-root points at a complete tree")
    });
}

fn check_gpus(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpus.is_empty() {
        let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
        for device in topology.platform.devices.values() {
            let name = device.class.map_or("unknown class", |c| c.describe());
            *classes.entry(name).or_default() += 1;
        }
        let seen = classes
            .iter()
            .map(|(name, n)| format!("{n} {name}"))
            .collect::<Vec<_>>()
            .join(", ");
        checks.push(
            Check::new(
                "gpus",
                Verdict::Warn,
                format!(
                    "no GPUs found; saw {} PCI devices ({seen}). Nothing to check for GPU peer-to-peer",
                    topology.platform.devices.len()
                ),
            )
            .fix("if GPUs are installed, check that they enumerate (lspci -d 10de:) and that --sysfs-root points at the right tree"),
        );
        return;
    }
    let list = topology
        .gpus
        .iter()
        .map(|g| {
            let id = topology
                .platform
                .device(g.bdf)
                .map(|d| d.id_string())
                .unwrap_or_default();
            match g.model {
                Some(model) => format!("{} {} {id} {model}", g.name, g.bdf),
                None => format!("{} {} {id}", g.name, g.bdf),
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    checks.push(Check::new(
        "gpus",
        Verdict::Pass,
        format!("{} GPU(s): {list}", topology.gpus.len()),
    ));
}

fn check_config_access(topology: &Topology, checks: &mut Vec<Check>) {
    let relevant = topology.relevant_devices();
    if relevant.is_empty() {
        checks.push(Check::new(
            "config-access",
            Verdict::Skip,
            "no GPUs or NICs whose config space matters",
        ));
        return;
    }
    let mut limited: BTreeMap<ConfigAccess, Vec<Bdf>> = BTreeMap::new();
    for bdf in &relevant {
        let Some(device) = topology.platform.device(*bdf) else {
            continue;
        };
        if device.config.extended_capabilities_known() {
            continue;
        }
        let access = device.config.access;
        // Truncated and unreadable files share a line: both mean "nothing".
        let key = match access {
            ConfigAccess::Full => continue,
            ConfigAccess::Truncated => ConfigAccess::Unreadable,
            other => other,
        };
        limited.entry(key).or_default().push(*bdf);
    }
    if limited.is_empty() {
        checks.push(Check::new(
            "config-access",
            Verdict::Pass,
            format!(
                "config space readable for all {} GPUs, NICs and bridges above them",
                relevant.len()
            ),
        ));
        return;
    }
    for (access, devices) in limited {
        let list = devices
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let check = match access {
            ConfigAccess::HeaderOnly => Check::new(
                "config-access",
                Verdict::Warn,
                format!(
                    "only the first 64 bytes of config space are readable (not root) for {} devices: port types, ACS and Resizable BAR are unverified ({list})",
                    devices.len()
                ),
            )
            .fix("run as root (sudo barlink doctor) to read the capabilities"),
            ConfigAccess::NoExtendedSpace => Check::new(
                "config-access",
                Verdict::Warn,
                format!(
                    "no extended config space (256 bytes only) for {list}: ACS and Resizable BAR are unverified"
                ),
            )
            .fix("on a VM, give the guest a PCIe machine type (q35); otherwise the platform lacks extended config access (ECAM/MMCONFIG)"),
            _ => Check::new(
                "config-access",
                Verdict::Warn,
                format!("config space unreadable or truncated for {list}: port types, ACS and Resizable BAR are unverified"),
            )
            .fix("check permissions and that the device is present (lspci -s BDF -vvv)"),
        };
        checks.push(check);
    }
}

fn role_above(topology: &Topology, port: Bdf) -> String {
    let below: Vec<&str> = topology
        .gpus
        .iter()
        .map(|g| (g.name.as_str(), g.bdf))
        .chain(topology.nics.iter().map(|n| (n.name.as_str(), n.bdf)))
        .filter(|(_, bdf)| {
            topology
                .platform
                .device(*bdf)
                .is_some_and(|d| d.upstream_bridges.contains(&port))
        })
        .map(|(name, _)| name)
        .collect();
    let kind = topology
        .platform
        .device(port)
        .and_then(|d| d.port_type())
        .map_or("port", |t| t.describe());
    if below.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} above {}", below.join(", "))
    }
}

fn check_acs(topology: &Topology, checks: &mut Vec<Check>) {
    let pairs: Vec<_> = topology
        .gpu_pairs
        .iter()
        .chain(&topology.gpu_nic_pairs)
        .collect();
    if pairs.is_empty() {
        checks.push(Check::new(
            "acs",
            Verdict::Skip,
            "no GPU–GPU or GPU–NIC pairs",
        ));
        return;
    }
    let mut redirecting: BTreeMap<Bdf, (u16, AcsBits, Vec<String>)> = BTreeMap::new();
    let mut unverified: BTreeSet<Bdf> = BTreeSet::new();
    let mut examined: BTreeSet<Bdf> = BTreeSet::new();
    for pair in &pairs {
        examined.extend(pair.route.ports_below_meeting.iter().copied());
        for issue in &pair.issues {
            match issue {
                PairIssue::AcsRedirect {
                    port,
                    acs_offset,
                    control,
                } => {
                    redirecting
                        .entry(*port)
                        .or_insert_with(|| (*acs_offset, *control, Vec::new()))
                        .2
                        .push(format!("{}<->{}", pair.a, pair.b));
                }
                PairIssue::AcsUnverified { port, .. } => {
                    unverified.insert(*port);
                }
                _ => {}
            }
        }
    }
    for (port, (offset, control, affected)) in &redirecting {
        let shown: Vec<&String> = affected.iter().take(6).collect();
        let more = if affected.len() > shown.len() {
            format!(" and {} more", affected.len() - shown.len())
        } else {
            String::new()
        };
        checks.push(
            Check::new(
                "acs",
                Verdict::Fail,
                format!(
                    "ACS control {} ({}): peer traffic of {}{more} is redirected up to the root complex instead of across the switch (slow; hangs or corrupts where the root complex does not route peer traffic)",
                    control.describe(),
                    role_above(topology, *port),
                    shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                ),
            )
            .subject(port.to_string())
            .fix(format!(
                "sudo setpci -s {port} ECAP_ACS+0x6.w=0000 (ACS control is at config offset 0x{:x}; lasts until reboot); to persist, boot with pci=disable_acs_redir={port}",
                offset + 6
            )),
        );
    }
    if !unverified.is_empty() {
        let list = unverified
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        checks.push(
            Check::new(
                "acs",
                Verdict::Warn,
                format!("ACS state unknown on {list} (config space not fully readable): switch-local P2P through them is unverified"),
            )
            .fix("run as root to read the ACS capability"),
        );
    }
    if redirecting.is_empty() && unverified.is_empty() {
        let message = if examined.is_empty() {
            "no pair shares a PCIe switch or root port, so ACS redirection does not change any route (their traffic crosses the root complex anyway)".to_string()
        } else {
            format!(
                "no ACS redirection on the {} switch ports that GPU traffic enters",
                examined.len()
            )
        };
        checks.push(Check::new("acs", Verdict::Pass, message));
    }
}

fn iommu_fix(topology: &Topology) -> String {
    let vendor_flag = match topology.platform.cpu_vendor {
        crate::platform::CpuVendor::Intel => "intel_iommu=on iommu=pt",
        crate::platform::CpuVendor::Amd => "iommu=pt",
        _ => "iommu=pt (or iommu.passthrough=1)",
    };
    format!(
        "add {vendor_flag} to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub and reboot): host DMA is passed through while VFIO still works; or turn the IOMMU off in firmware if nothing needs it"
    )
}

fn check_iommu(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpus.is_empty() {
        checks.push(Check::new(
            "iommu",
            Verdict::Skip,
            format!("no GPUs; {}", topology.platform.iommu.summary()),
        ));
        return;
    }
    let ends = topology
        .gpus
        .iter()
        .map(|g| (g.name.as_str(), &g.translation))
        .chain(
            topology
                .nics
                .iter()
                .map(|n| (n.name.as_str(), &n.translation)),
        );
    let mut translating: Vec<String> = Vec::new();
    let mut unknown: Vec<&str> = Vec::new();
    let mut assumed = false;
    for (name, translation) in ends {
        match translation {
            DeviceTranslation::Translating { domain, assumed: a } => {
                assumed |= *a;
                translating.push(format!("{name} ({domain})"));
            }
            DeviceTranslation::Unknown => unknown.push(name),
            DeviceTranslation::Off | DeviceTranslation::Passthrough { .. } => {}
        }
    }
    let any_pairs = !topology.gpu_pairs.is_empty() || !topology.gpu_nic_pairs.is_empty();
    if !translating.is_empty() {
        let verdict = if any_pairs {
            Verdict::Fail
        } else {
            Verdict::Warn
        };
        let assumption = if assumed {
            " (assumed: no group type file was readable and the command line has no iommu=pt)"
        } else {
            ""
        };
        checks.push(
            Check::new(
                "iommu",
                verdict,
                format!(
                    "the IOMMU translates DMA for {}{assumption}: peer writes to a BAR's physical address are looked up as IOVAs and fault or return zeroed data, so these pairs use host-bounce",
                    translating.join(", ")
                ),
            )
            .fix(iommu_fix(topology)),
        );
    }
    if !unknown.is_empty() {
        checks.push(
            Check::new(
                "iommu",
                Verdict::Warn,
                format!(
                    "an IOMMU is active but the domain of {} is unknown: P2P through it is unverified",
                    unknown.join(", ")
                ),
            )
            .fix("check /sys/kernel/iommu_groups/*/type and the kernel command line; iommu=pt makes host DMA untranslated"),
        );
    }
    if translating.is_empty() && unknown.is_empty() {
        let message = if topology.platform.iommu.is_active() {
            format!(
                "the IOMMU passes DMA through (identity) for every GPU and NIC; {}",
                topology.platform.iommu.summary()
            )
        } else {
            format!(
                "{}, so DMA is not translated",
                topology.platform.iommu.summary()
            )
        };
        checks.push(Check::new("iommu", Verdict::Pass, message));
    }
}

fn check_bar1(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpus.is_empty() {
        checks.push(Check::new("bar1", Verdict::Skip, "no GPUs"));
        return;
    }
    for gpu in &topology.gpus {
        let aperture = &gpu.aperture;
        let verdict = match aperture.verdict {
            ApertureVerdict::Sufficient => Verdict::Pass,
            ApertureVerdict::Doubtful | ApertureVerdict::Unknown => Verdict::Warn,
            ApertureVerdict::Insufficient => Verdict::Fail,
        };
        let mut check = Check::new("bar1", verdict, aperture.explanation.clone())
            .subject(format!("{} {}", gpu.name, gpu.bdf));
        if aperture.verdict == ApertureVerdict::Unknown {
            check = check.fix(format!(
                "see why the BARs could not be read (listed below); lspci -s {} -v shows the BAR sizes",
                gpu.bdf
            ));
        } else if verdict != Verdict::Pass {
            let supports = aperture
                .rebar_max_bytes
                .map(|max| {
                    format!(
                        " (this GPU advertises BAR sizes up to {})",
                        human_bytes(max)
                    )
                })
                .unwrap_or_default();
            check = check.fix(format!(
                "enable \"Above 4G Decoding\" and \"Resizable BAR\" (Re-Size BAR Support) in the firmware setup, with CSM off{supports}; NVIDIA cards also need a vBIOS with Resizable BAR support. Check with: lspci -s {} -vv | grep -A3 'Resizable BAR'",
                gpu.bdf
            ));
        }
        checks.push(check);
    }
}

fn check_numa(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpus.len() < 2 {
        checks.push(Check::new("numa", Verdict::Skip, "fewer than two GPUs"));
        return;
    }
    let mut by_node: BTreeMap<Option<u32>, Vec<&str>> = BTreeMap::new();
    for gpu in &topology.gpus {
        let node = topology.platform.device(gpu.bdf).and_then(|d| d.numa_node);
        by_node.entry(node).or_default().push(gpu.name.as_str());
    }
    let cross: Vec<_> = topology
        .gpu_pairs
        .iter()
        .filter(|p| p.link == PathClass::Sys)
        .collect();
    if cross.is_empty() {
        let where_ = match by_node.keys().next() {
            Some(Some(node)) if by_node.len() == 1 => format!("all GPUs on NUMA node {node}"),
            _ => "no GPU pair crosses sockets".to_string(),
        };
        checks.push(Check::new("numa", Verdict::Pass, where_));
        return;
    }
    let layout = by_node
        .iter()
        .map(|(node, names)| {
            let node = node.map_or_else(|| "unknown node".to_string(), |n| format!("node {n}"));
            format!("{node}: {}", names.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let first_group = by_node
        .values()
        .next()
        .map(|names| {
            names
                .iter()
                .map(|n| n.trim_start_matches("GPU"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let first_node = by_node.keys().next().copied().flatten().unwrap_or(0);
    checks.push(
        Check::new(
            "numa",
            Verdict::Warn,
            format!(
                "GPUs span sockets ({layout}); {} pairs cross the inter-socket link and use host-bounce",
                cross.len()
            ),
        )
        .fix(format!(
            "run jobs that exchange data on GPUs of one socket, e.g. CUDA_VISIBLE_DEVICES={first_group} numactl --cpunodebind={first_node} --membind={first_node} <command>"
        )),
    );
}

/// The port above a device (or above a bridge at `index` in a chain).
fn parent_of<'a>(topology: &'a Topology, chain: &[Bdf]) -> Option<&'a PciDevice> {
    chain.last().and_then(|bdf| topology.platform.device(*bdf))
}

fn min_known<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn check_links(topology: &Topology, checks: &mut Vec<Check>) {
    // Endpoints (GPUs, NICs) and the upstream ports of switches above them:
    // each link is then judged once, from its lower end, against what both
    // of its ends can do (a x16 card in a slot bifurcated to x8 is fine).
    let mut subjects: Vec<(String, Bdf, Vec<Bdf>, bool)> = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, bdf, is_gpu) in topology
        .gpus
        .iter()
        .map(|g| (g.name.clone(), g.bdf, true))
        .chain(topology.nics.iter().map(|n| (n.name.clone(), n.bdf, false)))
    {
        let Some(device) = topology.platform.device(bdf) else {
            continue;
        };
        let chain = &device.upstream_bridges;
        for index in 0..chain.len() {
            if topology::switch_of(&topology.platform, chain, index) == Some(chain[index])
                && seen.insert(chain[index])
            {
                subjects.push((
                    format!("switch {}", chain[index]),
                    chain[index],
                    chain[..index].to_vec(),
                    false,
                ));
            }
        }
        subjects.push((name, bdf, chain.clone(), is_gpu));
    }
    let mut checked = 0;
    let mut findings = Vec::new();
    for (name, bdf, above, is_gpu) in subjects {
        let Some(device) = topology.platform.device(bdf) else {
            continue;
        };
        let link = &device.link;
        let parent = parent_of(topology, &above).map(|p| &p.link);
        let max_speed = min_known(
            link.max_speed.filter(|s| *s != LinkSpeed::Unknown),
            parent
                .and_then(|p| p.max_speed)
                .filter(|s| *s != LinkSpeed::Unknown),
        );
        let max_width = min_known(
            link.max_width.filter(|w| *w > 0),
            parent.and_then(|p| p.max_width).filter(|w| *w > 0),
        );
        let mut judged = false;
        if let (Some(current), Some(max)) = (
            link.current_speed.filter(|s| *s != LinkSpeed::Unknown),
            max_speed,
        ) {
            judged = true;
            if current < max {
                let idle = if is_gpu {
                    " GPUs drop their link speed when idle to save power, so this is expected on an idle GPU;"
                } else {
                    ""
                };
                findings.push(
                    Check::new(
                        "link",
                        Verdict::Warn,
                        format!("link trained at {current}, below the {max} both ends support"),
                    )
                    .subject(format!("{name} {bdf}"))
                    .fix(format!(
                        "{idle} check again under load (lspci -s {bdf} -vv | grep LnkSta); if it stays low, reseat the card, check risers and cables, and set the slot's PCIe speed to Auto or the highest generation in firmware"
                    ).trim_start().to_string()),
                );
            }
        }
        if let (Some(current), Some(max)) = (link.current_width.filter(|w| *w > 0), max_width) {
            judged = true;
            if current < max {
                findings.push(
                    Check::new(
                        "link",
                        Verdict::Warn,
                        format!("link trained at x{current}, below the x{max} both ends support"),
                    )
                    .subject(format!("{name} {bdf}"))
                    .fix("reseat the card; check the slot is wired for the full width (not shared with an M.2 slot or a neighbour slot) and that risers or cables carry all lanes"),
                );
            }
        }
        if judged {
            checked += 1;
        }
    }
    if findings.is_empty() {
        checks.push(if checked == 0 {
            Check::new("link", Verdict::Skip, "no link speeds or widths readable")
        } else {
            Check::new(
                "link",
                Verdict::Pass,
                format!(
                    "{checked} link{} trained at the speed and width both ends support",
                    if checked == 1 { "" } else { "s" }
                ),
            )
        });
    } else {
        checks.extend(findings);
    }
}

fn check_paths(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpu_pairs.is_empty() {
        checks.push(Check::new("paths", Verdict::Skip, "fewer than two GPUs"));
        return;
    }
    let bounced: Vec<_> = topology
        .gpu_pairs
        .iter()
        .filter(|p| p.path == PathChoice::HostBounce)
        .collect();
    if bounced.is_empty() {
        let message = match topology.gpu_pairs.len() {
            1 => "the GPU pair uses p2p".to_string(),
            n => format!("all {n} GPU pairs use p2p"),
        };
        checks.push(Check::new("paths", Verdict::Pass, message));
        return;
    }
    let by_link: BTreeMap<PathClass, usize> = bounced.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(p.link).or_default() += 1;
        m
    });
    let breakdown = by_link
        .iter()
        .map(|(link, n)| format!("{n} {link}"))
        .collect::<Vec<_>>()
        .join(", ");
    let example = bounced
        .first()
        .map(|p| format!("e.g. {}<->{}: {}", p.a, p.b, p.reason))
        .unwrap_or_default();
    checks.push(
        Check::new(
            "paths",
            Verdict::Warn,
            format!(
                "{} of {} GPU pairs use host-bounce ({breakdown}); {example}",
                bounced.len(),
                topology.gpu_pairs.len()
            ),
        )
        .fix({
            let beyond_limit = format!(
                "pairs beyond the P2P limit ({} {}) stay on host-bounce unless the limit is raised after measuring P2P bandwidth",
                topology.p2p_limit, topology.p2p_limit_source
            );
            if checks.iter().any(|c| c.verdict == Verdict::Fail) {
                format!("fix the FAIL lines above first; {beyond_limit}")
            } else {
                beyond_limit
            }
        }),
    );
}

fn check_rdma_nic(topology: &Topology, checks: &mut Vec<Check>) {
    if topology.gpus.is_empty() {
        checks.push(Check::new("rdma-nic", Verdict::Skip, "no GPUs"));
        return;
    }
    if !topology.nics.iter().any(|n| n.rdma_capable) {
        checks.push(Check::new(
            "rdma-nic",
            Verdict::Skip,
            "no RDMA-capable NIC: transfers to other nodes cannot use GPUDirect RDMA here",
        ));
        return;
    }
    let mut far = Vec::new();
    let mut near = Vec::new();
    for entry in &topology.nic_affinity {
        let (Some(nic), Some(link), Some(path)) = (&entry.nic, entry.link, entry.path) else {
            continue;
        };
        let text = format!("{}->{nic} ({link}, {path})", entry.gpu);
        if link <= PathClass::Pxb && path == PathChoice::P2p {
            near.push(text);
        } else {
            far.push(text);
        }
    }
    if far.is_empty() {
        checks.push(Check::new(
            "rdma-nic",
            Verdict::Pass,
            format!(
                "every GPU has an RDMA NIC under a shared switch: {}",
                near.join(", ")
            ),
        ));
    } else {
        checks.push(
            Check::new(
                "rdma-nic",
                Verdict::Warn,
                format!(
                    "GPUs whose nearest RDMA NIC is beyond PXB or cannot use GPUDirect: {}",
                    far.join(", ")
                ),
            )
            .fix("place a NIC under the same PCIe switch as these GPUs, or fix the blocking issue above; otherwise inter-node traffic is staged through host memory"),
        );
    }
}
