//! Classification of GPU–GPU and GPU–NIC pairs, and the choice of a transfer
//! path for each.
//!
//! Pairs are classified as NCCL and `nvidia-smi topo -m` do:
//!
//! | class | meaning |
//! |-------|---------|
//! | PIX   | at most one PCIe switch between them (or the same root port) |
//! | PXB   | several switches, below one root port (no host bridge) |
//! | PHB   | through a host bridge: two root ports of one root complex |
//! | NODE  | across host bridges within one NUMA node |
//! | SYS   | across NUMA nodes (the inter-socket link) |
//!
//! A switch is named by its upstream port; its downstream ports belong to it.
//! Port types come from the PCI Express capability when config space is
//! readable, and otherwise from position (below a root port comes an upstream
//! port, below that downstream ports, and so on), which is how PCIe
//! hierarchies are built.
//!
//! Then each pair gets a path, `p2p` (peer writes into the BAR) or
//! `host-bounce` (staged through host memory), with the reason. P2P is ruled
//! out by: a translating IOMMU on either end; ACS redirection on a switch
//! port the pair's traffic enters; an aperture too small to expose GPU memory;
//! and a class beyond the policy's limit (by default NODE on AMD, whose root
//! complexes forward peer traffic; PXB elsewhere, as NCCL does on Intel).

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::{Serialize, Serializer};

use crate::aperture::{self, Aperture, ApertureVerdict};
use crate::diag::{Diagnostic, Subject};
use crate::iommu::DeviceTranslation;
use crate::pci::PciDevice;
use crate::pci::address::{Bdf, HostBridge};
use crate::pci::class::{DeviceRole, VENDOR_MELLANOX};
use crate::pci::config::{AcsBits, ConfigAccess, PortType};
use crate::platform::{self, CpuVendor, DiscoveryError, Platform};

/// The class of the PCIe path between two devices, nearest first: NCCL's
/// path types and the connection types of `nvidia-smi topo -m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathClass {
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl PathClass {
    pub const ALL: [PathClass; 5] = [
        PathClass::Pix,
        PathClass::Pxb,
        PathClass::Phb,
        PathClass::Node,
        PathClass::Sys,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
        }
    }

    /// The legend line for this class, in the words `nvidia-smi topo -m` uses.
    pub fn legend(self) -> &'static str {
        match self {
            PathClass::Pix => "Connection traversing at most a single PCIe switch",
            PathClass::Pxb => {
                "Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)"
            }
            PathClass::Phb => {
                "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"
            }
            PathClass::Node => {
                "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"
            }
            PathClass::Sys => {
                "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"
            }
        }
    }

    /// Parses `PIX`, `pxb`, … (for a policy given on a command line).
    pub fn parse(text: &str) -> Option<PathClass> {
        PathClass::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(text.trim()))
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for PathClass {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The transfer path chosen for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PathChoice {
    /// Peer-to-peer over the BAR (for a GPU–NIC pair: GPUDirect RDMA).
    #[serde(rename = "p2p")]
    P2p,
    /// Staged through host memory.
    #[serde(rename = "host-bounce")]
    HostBounce,
}

impl PathChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            PathChoice::P2p => "p2p",
            PathChoice::HostBounce => "host-bounce",
        }
    }
}

impl fmt::Display for PathChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far peer-to-peer is trusted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathPolicy {
    /// The farthest connection over which P2P is used; `None` chooses by CPU
    /// vendor (NODE on AMD, PXB otherwise).
    pub max_p2p_connection: Option<PathClass>,
}

impl PathPolicy {
    /// The effective limit, where it comes from (short, for pair reasons),
    /// and why (long, for reports).
    pub fn effective(&self, cpu: &CpuVendor) -> (PathClass, String, String) {
        if let Some(max) = self.max_p2p_connection {
            return (
                max,
                "set by policy".to_string(),
                format!("P2P limit {max} set by policy"),
            );
        }
        match cpu {
            CpuVendor::Amd => (
                PathClass::Node,
                "for AMD CPUs".to_string(),
                "AMD root complexes forward peer-to-peer traffic between root ports and host bridges of one socket, so P2P is used up to NODE".to_string(),
            ),
            other => (
                PathClass::Pxb,
                format!("for {other} CPUs"),
                format!(
                    "on {other} CPUs peer-to-peer through the root complex is slow or unsupported (NCCL also stops at PXB on Intel), so P2P is used up to PXB"
                ),
            ),
        }
    }
}

/// Which kinds of devices a pair joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairKind {
    GpuGpu,
    GpuNic,
}

/// Something about a pair that breaks, slows or leaves unverified its P2P.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "issue", rename_all = "kebab-case")]
pub enum PairIssue {
    /// ACS on this port sends the pair's peer traffic up to the root complex.
    AcsRedirect {
        port: Bdf,
        acs_offset: u16,
        control: AcsBits,
    },
    /// This port's ACS state could not be read.
    AcsUnverified { port: Bdf, access: ConfigAccess },
    /// DMA from this device is translated by the IOMMU.
    IommuTranslates {
        device: Bdf,
        translation: DeviceTranslation,
    },
    /// An IOMMU is active but this device's domain is unknown.
    IommuUnknown { device: Bdf },
    /// The GPU's aperture cannot expose its memory.
    ApertureTooSmall { device: Bdf, bytes: Option<u64> },
    /// NUMA nodes unknown on a multi-node machine: assumed to be different.
    NumaUnknown,
    /// The bridges above a device are unknown.
    RouteUnknown { device: Bdf },
}

/// How a pair's traffic travels through the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    pub connection: PathClass,
    /// The lowest bridge above both devices; `None` when they meet at a host
    /// bridge or beyond.
    pub meeting_bridge: Option<Bdf>,
    /// Switches traversed, each named by its upstream port.
    pub switches: Vec<Bdf>,
    /// Bridges below the meeting point: the ports where the traffic enters
    /// and leaves the shared part of the tree.
    pub ports_below_meeting: Vec<Bdf>,
    pub host_bridges: [Option<HostBridge>; 2],
    pub numa_nodes: [Option<u32>; 2],
}

/// A classified pair with its chosen path.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub kind: PairKind,
    /// Display names, `GPU0`, `NIC1`.
    pub a: String,
    pub b: String,
    pub a_bdf: Bdf,
    pub b_bdf: Bdf,
    pub link: PathClass,
    pub path: PathChoice,
    pub reason: String,
    pub issues: Vec<PairIssue>,
    pub route: Route,
}

impl Pair {
    /// Whether an issue breaks or slows P2P on this pair (as opposed to
    /// leaving it unverified).
    pub fn is_impaired(&self) -> bool {
        self.issues.iter().any(|i| {
            matches!(
                i,
                PairIssue::AcsRedirect { .. }
                    | PairIssue::IommuTranslates { .. }
                    | PairIssue::ApertureTooSmall { .. }
            )
        })
    }
}

/// A GPU as the topology sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    /// `GPU0`, `GPU1`, … in PCI address order (as `nvidia-smi` numbers them).
    pub name: String,
    pub bdf: Bdf,
    /// The model name for well-known device ids.
    pub model: Option<&'static str>,
    pub aperture: Aperture,
    pub translation: DeviceTranslation,
}

/// A NIC as the topology sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Nic {
    /// `NIC0`, `NIC1`, … in PCI address order.
    pub name: String,
    pub bdf: Bdf,
    /// The RDMA device (`mlx5_0`), else the interface name, else the address.
    pub label: String,
    pub rdma_capable: bool,
    /// Why it is (or is not) taken to be RDMA-capable.
    pub rdma_evidence: String,
    pub translation: DeviceTranslation,
}

/// The nearest RDMA NIC of one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct NicAffinity {
    pub gpu: String,
    pub gpu_bdf: Bdf,
    /// `None` when the machine has no RDMA NIC.
    pub nic: Option<String>,
    pub nic_bdf: Option<Bdf>,
    pub nic_label: Option<String>,
    pub link: Option<PathClass>,
    pub path: Option<PathChoice>,
}

/// The analysed platform: GPUs, NICs, every pair, NIC affinity, warnings.
#[derive(Debug, Clone)]
pub struct Topology {
    pub platform: Platform,
    /// The farthest connection P2P is used over, and why.
    pub p2p_limit: PathClass,
    /// Where the limit comes from, e.g. "for Intel CPUs".
    pub p2p_limit_source: String,
    pub p2p_limit_reason: String,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    /// Display devices that are not P2P candidates (BMC video, emulated VGA).
    pub ignored_display: Vec<Bdf>,
    pub gpu_pairs: Vec<Pair>,
    pub gpu_nic_pairs: Vec<Pair>,
    pub nic_affinity: Vec<NicAffinity>,
    /// Platform-wide remarks for people.
    pub warnings: Vec<String>,
}

impl Topology {
    /// Reads the platform under `root` and analyses it.
    pub fn discover(root: &Path, policy: PathPolicy) -> Result<Topology, DiscoveryError> {
        Ok(Topology::analyze(platform::discover(root)?, policy))
    }

    /// Analyses an already-read platform.
    pub fn analyze(platform: Platform, policy: PathPolicy) -> Topology {
        let (p2p_limit, p2p_limit_source, p2p_limit_reason) =
            policy.effective(&platform.cpu_vendor);
        let mut gpus = Vec::new();
        let mut nics = Vec::new();
        let mut ignored_display = Vec::new();
        for device in platform.devices.values() {
            match device.role {
                DeviceRole::Gpu => gpus.push(Gpu {
                    name: format!("GPU{}", gpus.len()),
                    bdf: device.bdf,
                    model: device
                        .device_id
                        .filter(|_| device.vendor == Some(crate::pci::class::VENDOR_NVIDIA))
                        .and_then(aperture::known_nvidia_gpu)
                        .map(|(name, _)| name),
                    aperture: aperture::assess(device),
                    translation: platform.iommu.translation_for(device.iommu_group),
                }),
                DeviceRole::Nic => {
                    let (rdma_capable, rdma_evidence) = rdma_capability(device);
                    nics.push(Nic {
                        name: format!("NIC{}", nics.len()),
                        bdf: device.bdf,
                        label: device
                            .rdma_devices
                            .first()
                            .or(device.net_devices.first())
                            .cloned()
                            .unwrap_or_else(|| device.bdf.to_string()),
                        rdma_capable,
                        rdma_evidence,
                        translation: platform.iommu.translation_for(device.iommu_group),
                    });
                }
                DeviceRole::OtherDisplay => ignored_display.push(device.bdf),
                _ => {}
            }
        }

        let mut topology = Topology {
            platform,
            p2p_limit,
            p2p_limit_source,
            p2p_limit_reason,
            gpus,
            nics,
            ignored_display,
            gpu_pairs: Vec::new(),
            gpu_nic_pairs: Vec::new(),
            nic_affinity: Vec::new(),
            warnings: Vec::new(),
        };
        let gpu_ends: Vec<(String, Bdf)> = topology
            .gpus
            .iter()
            .map(|g| (g.name.clone(), g.bdf))
            .collect();
        let nic_ends: Vec<(String, Bdf)> = topology
            .nics
            .iter()
            .map(|n| (n.name.clone(), n.bdf))
            .collect();
        for (i, a) in gpu_ends.iter().enumerate() {
            for b in &gpu_ends[i + 1..] {
                if let Some(pair) = topology.make_pair(PairKind::GpuGpu, a, b) {
                    topology.gpu_pairs.push(pair);
                }
            }
        }
        for a in &gpu_ends {
            for b in &nic_ends {
                if let Some(pair) = topology.make_pair(PairKind::GpuNic, a, b) {
                    topology.gpu_nic_pairs.push(pair);
                }
            }
        }
        topology.nic_affinity = topology.compute_nic_affinity();
        topology.warnings = topology.compute_warnings();
        topology
    }

    /// The GPU–GPU or GPU–NIC pair joining two named devices, in either order.
    pub fn pair(&self, a: &str, b: &str) -> Option<&Pair> {
        self.gpu_pairs
            .iter()
            .chain(&self.gpu_nic_pairs)
            .find(|p| (p.a == a && p.b == b) || (p.a == b && p.b == a))
    }

    pub fn gpu(&self, name: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.name == name)
    }

    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Every device whose state can change a verdict: GPUs, NICs, and the
    /// bridges above them.
    pub fn relevant_devices(&self) -> BTreeSet<Bdf> {
        let mut relevant = BTreeSet::new();
        let endpoints = self
            .gpus
            .iter()
            .map(|g| g.bdf)
            .chain(self.nics.iter().map(|n| n.bdf));
        for bdf in endpoints {
            relevant.insert(bdf);
            if let Some(device) = self.platform.device(bdf) {
                relevant.extend(device.upstream_bridges.iter().copied());
            }
        }
        relevant
    }

    /// Splits the diagnostics into those that bear on the verdicts (system
    /// ones, and those of relevant devices) and the rest.
    pub fn diagnostics_by_relevance(&self) -> (Vec<&Diagnostic>, Vec<&Diagnostic>) {
        let relevant = self.relevant_devices();
        self.platform
            .diagnostics
            .iter()
            .partition(|diagnostic| match &diagnostic.subject {
                Subject::Device(bdf) => relevant.contains(bdf),
                Subject::System | Subject::Entry(_) => true,
            })
    }

    /// Classifies one pair and chooses its path. `None` only if a device is
    /// missing from the platform, which cannot happen for devices taken from
    /// its own map.
    fn make_pair(&self, kind: PairKind, a: &(String, Bdf), b: &(String, Bdf)) -> Option<Pair> {
        let platform = &self.platform;
        let (dev_a, dev_b) = (platform.device(a.1)?, platform.device(b.1)?);
        let (route, mut issues) = classify(platform, dev_a, dev_b);
        let mut findings = Findings::default();
        self.check_translation([(&a.0, dev_a), (&b.0, dev_b)], &mut issues, &mut findings);
        check_acs(&issues, &mut findings);
        self.check_apertures(a.1, b.1, &mut issues, &mut findings);
        if issues.contains(&PairIssue::NumaUnknown) {
            findings.notes.push(
                "NUMA nodes unknown on a multi-node machine: assumed different sockets".to_string(),
            );
        }
        if route.connection > self.p2p_limit {
            findings.blocking.push(format!(
                "{}; {} is beyond the P2P limit {} {}",
                describe_route(&route),
                route.connection,
                self.p2p_limit,
                self.p2p_limit_source
            ));
        }
        // Without RDMA a NIC cannot read or write GPU memory at all.
        if let Some(nic) = self.nics.iter().find(|n| n.bdf == b.1 && !n.rdma_capable) {
            findings.blocking.insert(
                0,
                format!(
                    "{} ({}) has no RDMA, so GPUDirect is impossible and its traffic is staged in host memory",
                    nic.name, nic.label
                ),
            );
        }
        let (path, reason) = findings.path_and_reason(&route);
        Some(Pair {
            kind,
            a: a.0.clone(),
            b: b.0.clone(),
            a_bdf: a.1,
            b_bdf: b.1,
            link: route.connection,
            path,
            reason,
            issues,
            route,
        })
    }

    /// Translation at either end: a translating IOMMU blocks BAR-address
    /// P2P, an unknown one leaves it unverified.
    fn check_translation(
        &self,
        ends: [(&String, &PciDevice); 2],
        issues: &mut Vec<PairIssue>,
        findings: &mut Findings,
    ) {
        let mut translating: Vec<String> = Vec::new();
        for (name, device) in ends {
            let translation = self.platform.iommu.translation_for(device.iommu_group);
            match translation {
                DeviceTranslation::Translating { .. } => {
                    translating.push(format!("{name}: {translation}"));
                    issues.push(PairIssue::IommuTranslates {
                        device: device.bdf,
                        translation,
                    });
                }
                DeviceTranslation::Unknown => {
                    findings
                        .notes
                        .push(format!("IOMMU state of {name} unverified"));
                    issues.push(PairIssue::IommuUnknown { device: device.bdf });
                }
                DeviceTranslation::Off | DeviceTranslation::Passthrough { .. } => {}
            }
        }
        if !translating.is_empty() {
            findings.blocking.push(format!(
                "the IOMMU translates DMA ({}): peer writes to a raw BAR address are looked up as IOVAs and fault or read zeros",
                translating.join("; ")
            ));
        }
    }

    /// Apertures of the GPU ends. Two cards of one model give the same
    /// explanation; say it once.
    fn check_apertures(
        &self,
        a: Bdf,
        b: Bdf,
        issues: &mut Vec<PairIssue>,
        findings: &mut Findings,
    ) {
        let mut small: Vec<(&str, &str)> = Vec::new();
        for gpu in self.gpus.iter().filter(|g| g.bdf == a || g.bdf == b) {
            match gpu.aperture.verdict {
                ApertureVerdict::Insufficient => {
                    small.push((&gpu.name, &gpu.aperture.explanation));
                    issues.push(PairIssue::ApertureTooSmall {
                        device: gpu.bdf,
                        bytes: gpu.aperture.bytes,
                    });
                }
                ApertureVerdict::Doubtful | ApertureVerdict::Unknown => {
                    findings
                        .notes
                        .push(format!("{}: {}", gpu.name, gpu.aperture.explanation));
                }
                ApertureVerdict::Sufficient => {}
            }
        }
        match small.as_slice() {
            [] => {}
            [(x, why_x), (y, why_y)] if why_x == why_y => {
                findings.blocking.push(format!("{x} and {y}: {why_x}"));
            }
            many => {
                for (name, why) in many {
                    findings.blocking.push(format!("{name}: {why}"));
                }
            }
        }
    }

    fn compute_nic_affinity(&self) -> Vec<NicAffinity> {
        self.gpus
            .iter()
            .map(|gpu| {
                let nearest = self
                    .gpu_nic_pairs
                    .iter()
                    .filter(|p| p.a_bdf == gpu.bdf)
                    .filter(|p| self.nics.iter().any(|n| n.bdf == p.b_bdf && n.rdma_capable))
                    .min_by_key(|p| (p.link, p.route.switches.len(), p.b_bdf));
                let nic = nearest.and_then(|p| self.nics.iter().find(|n| n.bdf == p.b_bdf));
                NicAffinity {
                    gpu: gpu.name.clone(),
                    gpu_bdf: gpu.bdf,
                    nic: nic.map(|n| n.name.clone()),
                    nic_bdf: nic.map(|n| n.bdf),
                    nic_label: nic.map(|n| n.label.clone()),
                    link: nearest.map(|p| p.link),
                    path: nearest.map(|p| p.path),
                }
            })
            .collect()
    }

    fn compute_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.gpus.is_empty() {
            warnings.push(format!(
                "no GPUs found among {} PCI devices",
                self.platform.devices.len()
            ));
        }
        if !self.ignored_display.is_empty() {
            let list: Vec<String> = self
                .ignored_display
                .iter()
                .map(|bdf| {
                    let id = self
                        .platform
                        .device(*bdf)
                        .map(|d| d.id_string())
                        .unwrap_or_default();
                    format!("{bdf} ({id})")
                })
                .collect();
            warnings.push(format!(
                "display devices not treated as GPUs (BMC, emulated or integrated video): {}",
                list.join(", ")
            ));
        }
        let impaired = self.gpu_pairs.iter().filter(|p| p.is_impaired()).count();
        if impaired > 0 {
            warnings.push(format!(
                "{impaired} of {} GPU pairs have P2P broken or slowed by the platform (ACS, IOMMU or BAR size): see the doctor",
                self.gpu_pairs.len()
            ));
        }
        let relevant = self.relevant_devices();
        let header_only = relevant
            .iter()
            .filter_map(|bdf| self.platform.device(*bdf))
            .filter(|d| d.config.access == ConfigAccess::HeaderOnly)
            .count();
        if header_only > 0 {
            warnings.push(format!(
                "config space beyond the first 64 bytes is readable only by root ({header_only} relevant devices): ACS, port types and Resizable BAR are unverified; run as root"
            ));
        }
        warnings
    }
}

/// What stands against P2P on a pair (`blocking`) and what is only left
/// unverified (`notes`), in words for the pair's reason.
#[derive(Default)]
struct Findings {
    blocking: Vec<String>,
    notes: Vec<String>,
}

impl Findings {
    /// P2P when nothing blocks it, with the route and any notes as the
    /// reason; otherwise a host bounce, the first blocker first.
    fn path_and_reason(mut self, route: &Route) -> (PathChoice, String) {
        if self.blocking.is_empty() {
            let mut reason = describe_route(route);
            if !self.notes.is_empty() {
                reason.push_str("; ");
                reason.push_str(&self.notes.join("; "));
            }
            (PathChoice::P2p, reason)
        } else {
            let mut reason = self.blocking.remove(0);
            if !self.blocking.is_empty() {
                reason.push_str("; also: ");
                reason.push_str(&self.blocking.join("; "));
            }
            (PathChoice::HostBounce, reason)
        }
    }
}

/// ACS on the ports the traffic enters, as [`classify`] found it:
/// redirection blocks P2P, an unreadable port leaves it unverified.
fn check_acs(issues: &[PairIssue], findings: &mut Findings) {
    let redirecting: Vec<String> = issues
        .iter()
        .filter_map(|i| match i {
            PairIssue::AcsRedirect { port, control, .. } => {
                Some(format!("{port} ({})", control.names().join("+")))
            }
            _ => None,
        })
        .collect();
    if !redirecting.is_empty() {
        findings.blocking.push(format!(
            "ACS on {} redirects peer requests up to the root complex instead of across the switch (slow, and it hangs or corrupts where the root complex does not route peer traffic)",
            redirecting.join(", ")
        ));
    }
    let unverified: Vec<String> = issues
        .iter()
        .filter_map(|i| match i {
            PairIssue::AcsUnverified { port, .. } => Some(port.to_string()),
            _ => None,
        })
        .collect();
    if !unverified.is_empty() {
        findings.notes.push(format!(
            "ACS on {} unverified (config space not fully readable)",
            unverified.join(", ")
        ));
    }
}

/// Whether a NIC can do RDMA, and the evidence.
fn rdma_capability(device: &PciDevice) -> (bool, String) {
    if let Some(name) = device.rdma_devices.first() {
        return (true, format!("RDMA device {name} registered"));
    }
    if device.vendor == Some(VENDOR_MELLANOX) {
        return (
            true,
            "Mellanox/NVIDIA ConnectX, but no RDMA device registered (is mlx5_ib loaded?)"
                .to_string(),
        );
    }
    if device
        .class
        .is_some_and(|c| c.base_and_subclass() == 0x0207)
    {
        return (
            true,
            "InfiniBand controller, but no RDMA device registered".to_string(),
        );
    }
    (false, "no RDMA device registered".to_string())
}

/// The switch a bridge belongs to, named by the switch's upstream port; `None`
/// for root ports (part of the host bridge).
pub(crate) fn switch_of(platform: &Platform, chain: &[Bdf], index: usize) -> Option<Bdf> {
    let bridge = *chain.get(index)?;
    let parent = index.checked_sub(1).and_then(|i| chain.get(i)).copied();
    match platform.device(bridge).and_then(|d| d.port_type()) {
        Some(PortType::RootPort) => None,
        Some(PortType::UpstreamPort) => Some(bridge),
        Some(PortType::DownstreamPort) => Some(parent.unwrap_or(bridge)),
        Some(PortType::PcieToPciBridge) | Some(PortType::PciToPcieBridge) => Some(bridge),
        // Unknown type: by position. Index 0 hangs off the host bridge (a root
        // port); then upstream and downstream ports alternate.
        _ => match index {
            0 => None,
            i if i % 2 == 1 => Some(bridge),
            _ => Some(parent.unwrap_or(bridge)),
        },
    }
}

/// Classifies the connection between two devices and finds the ACS and
/// NUMA issues on the way.
fn classify(platform: &Platform, a: &PciDevice, b: &PciDevice) -> (Route, Vec<PairIssue>) {
    let mut issues = Vec::new();
    for device in [a, b] {
        if device.host_bridge.is_none() {
            issues.push(PairIssue::RouteUnknown { device: device.bdf });
        }
    }
    let host_bridges = [a.host_bridge, b.host_bridge];
    let numa_nodes = [a.numa_node, b.numa_node];
    let same_host = a.host_bridge.is_some() && a.host_bridge == b.host_bridge;
    if !same_host {
        let connection = match (a.numa_node, b.numa_node) {
            (Some(x), Some(y)) if x == y => PathClass::Node,
            (Some(_), Some(_)) => PathClass::Sys,
            // A single-node machine reports -1 everywhere: same node.
            _ if platform.numa_nodes_online.unwrap_or(1) <= 1 => PathClass::Node,
            _ => {
                issues.push(PairIssue::NumaUnknown);
                PathClass::Sys
            }
        };
        let route = Route {
            connection,
            meeting_bridge: None,
            switches: Vec::new(),
            ports_below_meeting: Vec::new(),
            host_bridges,
            numa_nodes,
        };
        return (route, issues);
    }
    let chain_a = &a.upstream_bridges;
    let chain_b = &b.upstream_bridges;
    let common = chain_a
        .iter()
        .zip(chain_b)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        let route = Route {
            connection: PathClass::Phb,
            meeting_bridge: None,
            switches: Vec::new(),
            ports_below_meeting: Vec::new(),
            host_bridges,
            numa_nodes,
        };
        return (route, issues);
    }
    let mut switches = BTreeSet::new();
    for (chain, first) in [(chain_a, common - 1), (chain_b, common)] {
        for index in first..chain.len() {
            if let Some(switch) = switch_of(platform, chain, index) {
                switches.insert(switch);
            }
        }
    }
    let ports_below_meeting: Vec<Bdf> = chain_a[common..]
        .iter()
        .chain(&chain_b[common..])
        .copied()
        .collect();
    for port in &ports_below_meeting {
        match platform.device(*port) {
            Some(bridge) if bridge.config.extended_capabilities_known() => {
                if let Some(acs) = bridge.config.acs
                    && acs.control.redirects_peer_traffic()
                {
                    issues.push(PairIssue::AcsRedirect {
                        port: *port,
                        acs_offset: acs.offset,
                        control: acs.control,
                    });
                }
            }
            // Upstream ports rarely implement ACS and never redirect peer
            // requests, so an unreadable one is not worth a note.
            Some(bridge) if bridge.port_type() == Some(PortType::UpstreamPort) => {}
            Some(bridge) => issues.push(PairIssue::AcsUnverified {
                port: *port,
                access: bridge.config.access,
            }),
            None => issues.push(PairIssue::AcsUnverified {
                port: *port,
                access: ConfigAccess::Unreadable,
            }),
        }
    }
    let connection = if switches.len() <= 1 {
        PathClass::Pix
    } else {
        PathClass::Pxb
    };
    let route = Route {
        connection,
        meeting_bridge: chain_a.get(common - 1).copied(),
        switches: switches.into_iter().collect(),
        ports_below_meeting,
        host_bridges,
        numa_nodes,
    };
    (route, issues)
}

/// A sentence about where the pair's traffic goes.
pub fn describe_route(route: &Route) -> String {
    let node = |n: Option<u32>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    let host = |h: Option<HostBridge>| {
        h.map_or_else(|| "an unknown host bridge".to_string(), |h| h.to_string())
    };
    match route.connection {
        PathClass::Pix => match (route.switches.first(), route.meeting_bridge) {
            (Some(switch), _) => format!(
                "PIX: one PCIe switch (upstream port {switch}) between them, so peer traffic turns around inside the switch"
            ),
            (None, Some(port)) => format!("PIX: both below port {port}"),
            (None, None) => "PIX".to_string(),
        },
        PathClass::Pxb => format!(
            "PXB: {} PCIe switches ({}) between them, below {}; traffic stays under the root port",
            route.switches.len(),
            route
                .switches
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            route
                .meeting_bridge
                .map_or_else(|| "one root port".to_string(), |b| b.to_string()),
        ),
        PathClass::Phb => format!(
            "PHB: through host bridge {} (different root ports), so peer traffic crosses the CPU's root complex",
            host(route.host_bridges[0])
        ),
        PathClass::Node => format!(
            "NODE: across host bridges {} and {} {}, through the CPU's internal fabric",
            host(route.host_bridges[0]),
            host(route.host_bridges[1]),
            match route.numa_nodes[0].or(route.numa_nodes[1]) {
                Some(n) => format!("within NUMA node {n}"),
                None => "on a machine with one NUMA node".to_string(),
            }
        ),
        PathClass::Sys => format!(
            "SYS: across NUMA nodes {} and {}, over the inter-socket link (UPI / Infinity Fabric)",
            node(route.numa_nodes[0]),
            node(route.numa_nodes[1])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_classes_order_and_parse() {
        assert!(PathClass::Pix < PathClass::Pxb);
        assert!(PathClass::Node < PathClass::Sys);
        assert_eq!(PathClass::parse("phb"), Some(PathClass::Phb));
        assert_eq!(PathClass::parse("nv4"), None);
        assert_eq!(serde_json::to_value(PathClass::Sys).unwrap(), "SYS");
        assert_eq!(
            serde_json::to_value(PathChoice::HostBounce).unwrap(),
            "host-bounce"
        );
    }

    #[test]
    fn policy_defaults_follow_cpu_vendor() {
        let policy = PathPolicy::default();
        assert_eq!(policy.effective(&CpuVendor::Amd).0, PathClass::Node);
        assert_eq!(policy.effective(&CpuVendor::Intel).1, "for Intel CPUs");
        assert_eq!(policy.effective(&CpuVendor::Intel).0, PathClass::Pxb);
        assert_eq!(policy.effective(&CpuVendor::Unknown).0, PathClass::Pxb);
        let forced = PathPolicy {
            max_p2p_connection: Some(PathClass::Sys),
        };
        assert_eq!(forced.effective(&CpuVendor::Intel).0, PathClass::Sys);
    }
}
