//! Builds sysfs trees shaped like Linux's: device directories under
//! `sys/devices/pciDDDD:BB/…`, relative symlinks in `sys/bus/pci/devices`,
//! `driver` and `iommu_group` links, attribute files in the kernel's formats,
//! and binary `config` files with real capability lists (PCI Express, AER,
//! ACS, Resizable BAR).
//!
//! The committed fixtures under `tests/fixtures/sysfs/` are generated from
//! `fixtures.rs` with this builder (see `fixtures_in_sync.rs`); tests that need
//! a variation build their own tree in a temporary directory.
#![allow(dead_code)] // each test crate uses a different part of the builder

pub mod fixtures;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// `IORESOURCE_MEM | IORESOURCE_SIZEALIGN`.
const FLAGS_MEM32: u64 = 0x0004_0200;
/// `IORESOURCE_MEM_64 | IORESOURCE_SIZEALIGN | IORESOURCE_PREFETCH |
/// IORESOURCE_MEM` plus the BAR's own type bits (64-bit, prefetchable).
const FLAGS_MEM64_PREF: u64 = 0x0014_220c;
/// `IORESOURCE_IO | IORESOURCE_SIZEALIGN` plus the I/O space bit.
const FLAGS_IO: u64 = 0x0004_0101;

/// A temporary directory removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("barlink-topology-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Mem32,
    Mem64Prefetch,
    Io,
}

#[derive(Clone, Debug)]
pub struct BarSpec {
    pub index: u8,
    pub size: u64,
    pub kind: BarKind,
}

/// PCIe link attributes: current and maximum speed (kernel strings) and width.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    pub current_speed: String,
    pub current_width: String,
    pub max_speed: String,
    pub max_width: String,
}

/// Device/port type values of the PCI Express capability.
pub mod port {
    pub const ENDPOINT: u8 = 0x0;
    pub const ROOT_PORT: u8 = 0x4;
    pub const UPSTREAM: u8 = 0x5;
    pub const DOWNSTREAM: u8 = 0x6;
    pub const PCIE_TO_PCI: u8 = 0x7;
}

/// One PCI function to add to a tree.
#[derive(Clone, Debug)]
pub struct Dev {
    /// Path below `sys/devices`, e.g. `pci0000:00/0000:00:01.0/0000:01:00.0`.
    pub path: String,
    pub class: u32,
    pub vendor: u16,
    pub device: u16,
    pub revision: u8,
    pub bars: Vec<BarSpec>,
    pub numa_node: i32,
    pub cpulist: Option<String>,
    pub link: Option<LinkSpec>,
    /// `None`: no PCI Express capability (conventional PCI).
    pub port_type: Option<u8>,
    pub iommu_group: Option<u32>,
    pub driver: Option<String>,
    /// ACS capability and control registers.
    pub acs: Option<(u16, u16)>,
    /// Resizable BAR entries: (BAR, capability bits 31:4, current size code).
    pub rebar: Vec<(u8, u32, u8)>,
    /// Bytes of `config` to write (4096 as root sees a PCIe device; 256 for
    /// conventional PCI; 64 as a non-root reader sees any device).
    pub config_len: usize,
    pub rdma: Vec<String>,
    pub net: Vec<String>,
}

/// Speed strings as Linux prints them.
pub mod speed {
    pub const GEN1: &str = "2.5 GT/s PCIe";
    pub const GEN3: &str = "8.0 GT/s PCIe";
    pub const GEN4: &str = "16.0 GT/s PCIe";
    pub const GEN5: &str = "32.0 GT/s PCIe";
    pub const GEN2: &str = "5.0 GT/s PCIe";
}

impl Dev {
    pub fn new(path: &str, class: u32, vendor: u16, device: u16) -> Dev {
        let is_bridge = class >> 8 == 0x0604;
        Dev {
            path: path.to_string(),
            class,
            vendor,
            device,
            revision: 0x01,
            bars: Vec::new(),
            numa_node: -1,
            cpulist: None,
            link: None,
            port_type: Some(if is_bridge {
                port::DOWNSTREAM
            } else {
                port::ENDPOINT
            }),
            iommu_group: None,
            driver: if is_bridge {
                Some("pcieport".into())
            } else {
                None
            },
            acs: None,
            rebar: Vec::new(),
            config_len: 4096,
            rdma: Vec::new(),
            net: Vec::new(),
        }
    }

    pub fn bdf(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }

    pub fn host_bridge(path: &str, vendor: u16, device: u16) -> Dev {
        let mut dev = Dev::new(path, 0x060000, vendor, device);
        dev.port_type = None;
        dev.config_len = 4096;
        dev
    }

    pub fn root_port(path: &str, vendor: u16, device: u16) -> Dev {
        Dev::new(path, 0x060400, vendor, device).port(port::ROOT_PORT)
    }

    pub fn upstream_port(path: &str, vendor: u16, device: u16) -> Dev {
        Dev::new(path, 0x060400, vendor, device).port(port::UPSTREAM)
    }

    pub fn downstream_port(path: &str, vendor: u16, device: u16) -> Dev {
        Dev::new(path, 0x060400, vendor, device).port(port::DOWNSTREAM)
    }

    /// An RTX 4090 as Linux shows it with Resizable BAR on: BAR0 16 MiB,
    /// BAR1 32 GiB, BAR3 32 MiB, BAR5 128 bytes of I/O; its Resizable BAR
    /// capability offers 64 MiB–32 GiB for BAR1.
    pub fn rtx_4090(path: &str) -> Dev {
        Dev::new(path, 0x030000, 0x10de, 0x2684)
            .revision(0xa1)
            .bar(0, 16 * MIB, BarKind::Mem32)
            .bar(1, 32 * GIB, BarKind::Mem64Prefetch)
            .bar(3, 32 * MIB, BarKind::Mem64Prefetch)
            .bar(5, 128, BarKind::Io)
            .rebar(1, rebar_bits(64 * MIB, 32 * GIB), size_code(32 * GIB))
            .rebar(3, rebar_bits(32 * MIB, 32 * MIB), size_code(32 * MIB))
            .link(speed::GEN4, 16, speed::GEN4, 16)
            .driver("nvidia")
    }

    /// An RTX 3090 with Resizable BAR off: BAR1 is the legacy 256 MiB.
    pub fn rtx_3090_small_bar(path: &str) -> Dev {
        Dev::new(path, 0x030000, 0x10de, 0x2204)
            .revision(0xa1)
            .bar(0, 16 * MIB, BarKind::Mem32)
            .bar(1, 256 * MIB, BarKind::Mem64Prefetch)
            .bar(3, 32 * MIB, BarKind::Mem64Prefetch)
            .bar(5, 128, BarKind::Io)
            .rebar(1, rebar_bits(64 * MIB, 32 * GIB), size_code(256 * MIB))
            .rebar(3, rebar_bits(32 * MIB, 32 * MIB), size_code(32 * MIB))
            .link(speed::GEN4, 16, speed::GEN4, 16)
            .driver("nvidia")
    }

    /// The HD Audio function that sits beside every GeForce GPU.
    pub fn gpu_audio(path: &str, device: u16) -> Dev {
        Dev::new(path, 0x040300, 0x10de, device)
            .revision(0xa1)
            .bar(0, 16 * 1024, BarKind::Mem32)
            .link(speed::GEN4, 16, speed::GEN4, 16)
            .driver("snd_hda_intel")
    }

    /// A ConnectX NIC (mlx5): one 64-bit prefetchable BAR.
    pub fn connectx(path: &str, device: u16, class: u32, rdma: &str, net: &str) -> Dev {
        Dev::new(path, class, 0x15b3, device)
            .bar(0, 32 * MIB, BarKind::Mem64Prefetch)
            .link(speed::GEN4, 16, speed::GEN4, 16)
            .driver("mlx5_core")
            .rdma(rdma)
            .net(net)
    }

    pub fn port(mut self, port_type: u8) -> Dev {
        self.port_type = Some(port_type);
        self
    }

    pub fn conventional_pci(mut self) -> Dev {
        self.port_type = None;
        self.link = None;
        self.config_len = 256;
        self
    }

    pub fn revision(mut self, revision: u8) -> Dev {
        self.revision = revision;
        self
    }

    pub fn bar(mut self, index: u8, size: u64, kind: BarKind) -> Dev {
        self.bars.push(BarSpec { index, size, kind });
        self
    }

    pub fn numa(mut self, node: i32, cpulist: &str) -> Dev {
        self.numa_node = node;
        self.cpulist = Some(cpulist.to_string());
        self
    }

    pub fn link(
        mut self,
        current_speed: &str,
        current_width: u8,
        max_speed: &str,
        max_width: u8,
    ) -> Dev {
        self.link = Some(LinkSpec {
            current_speed: current_speed.to_string(),
            current_width: current_width.to_string(),
            max_speed: max_speed.to_string(),
            max_width: max_width.to_string(),
        });
        self
    }

    pub fn group(mut self, group: u32) -> Dev {
        self.iommu_group = Some(group);
        self
    }

    pub fn driver(mut self, driver: &str) -> Dev {
        self.driver = Some(driver.to_string());
        self
    }

    pub fn acs(mut self, capability: u16, control: u16) -> Dev {
        self.acs = Some((capability, control));
        self
    }

    pub fn rebar(mut self, bar: u8, capability_bits: u32, current_code: u8) -> Dev {
        self.rebar.push((bar, capability_bits, current_code));
        self
    }

    pub fn config_len(mut self, len: usize) -> Dev {
        self.config_len = len;
        self
    }

    pub fn rdma(mut self, name: &str) -> Dev {
        self.rdma.push(name.to_string());
        self
    }

    pub fn net(mut self, name: &str) -> Dev {
        self.net.push(name.to_string());
        self
    }
}

/// Resizable BAR capability bits for every size from `min` to `max`.
pub fn rebar_bits(min: u64, max: u64) -> u32 {
    let mut bits = 0u32;
    for bit in 4..32u32 {
        let size = MIB << (bit - 4);
        if size >= min && size <= max {
            bits |= 1 << bit;
        }
    }
    bits
}

/// The Resizable BAR size code of a size (0 = 1 MiB).
pub fn size_code(size: u64) -> u8 {
    (size / MIB).trailing_zeros() as u8
}

/// ACS capability bits a typical switch downstream port offers
/// (SV TB RR CR UF DT).
pub const ACS_CAP_SWITCH: u16 = 0x005f;
/// What Linux turns on when an IOMMU is present: SV RR CR UF.
pub const ACS_LINUX_DEFAULT: u16 = 0x001d;

/// A sysfs tree under construction.
pub struct Tree {
    root: PathBuf,
    next_mem32: u64,
    next_mem64: u64,
    next_io: u64,
}

impl Tree {
    pub fn new(root: &Path) -> Tree {
        fs::create_dir_all(root).expect("create tree root");
        Tree {
            root: root.to_path_buf(),
            next_mem32: 0xa000_0000,
            next_mem64: 0x60_0000_0000,
            next_io: 0x1000,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn write(&self, relative: &str, contents: impl AsRef<[u8]>) {
        let path = self.root.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent");
        }
        fs::write(&path, contents).expect("write fixture file");
    }

    pub fn symlink(&self, relative: &str, target: &str) {
        let path = self.root.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent");
        }
        let _ = fs::remove_file(&path);
        std::os::unix::fs::symlink(target, &path).expect("create symlink");
    }

    pub fn remove(&self, relative: &str) {
        let path = self.root.join(relative);
        let _ = fs::remove_file(&path);
    }

    pub fn cmdline(&self, text: &str) {
        self.write("proc/cmdline", format!("{text}\n"));
    }

    pub fn cpuinfo(&self, vendor: &str, model: &str) {
        self.write(
            "proc/cpuinfo",
            format!(
                "processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel name\t: {model}\n\n"
            ),
        );
    }

    pub fn numa_online(&self, list: &str) {
        self.write("sys/devices/system/node/online", format!("{list}\n"));
    }

    /// Registers IOMMU units in `sys/class/iommu` as links into the device tree.
    pub fn iommu_units(&self, names: &[&str]) {
        for name in names {
            self.symlink(
                &format!("sys/class/iommu/{name}"),
                &format!("../../devices/virtual/iommu/{name}"),
            );
            self.write(&format!("sys/devices/virtual/iommu/{name}/uevent"), "");
        }
    }

    /// Writes `sys/kernel/iommu_groups/N/type`.
    pub fn iommu_group_type(&self, group: u32, domain: &str) {
        self.write(
            &format!("sys/kernel/iommu_groups/{group}/type"),
            format!("{domain}\n"),
        );
    }

    fn allocate(&mut self, bar: &BarSpec) -> u64 {
        let (next, align) = match bar.kind {
            BarKind::Mem32 => (&mut self.next_mem32, bar.size.max(4096)),
            BarKind::Mem64Prefetch => (&mut self.next_mem64, bar.size.max(4096)),
            BarKind::Io => (&mut self.next_io, bar.size.max(16)),
        };
        let start = next.div_ceil(align) * align;
        *next = start + bar.size;
        start
    }

    /// Adds a device: its directory and attributes, its `config`, and the
    /// links that point at it.
    pub fn add(&mut self, dev: &Dev) {
        let dir = format!("sys/devices/{}", dev.path);
        let bdf = dev.bdf().to_string();
        let is_bridge = dev.class >> 8 == 0x0604;
        // Links inside the device directory climb back to `sys/`: one `..`
        // for `devices` and one for each path component.
        let depth = dev.path.split('/').count() + 1;
        let up = "../".repeat(depth);

        self.write(&format!("{dir}/class"), format!("0x{:06x}\n", dev.class));
        self.write(&format!("{dir}/vendor"), format!("0x{:04x}\n", dev.vendor));
        self.write(&format!("{dir}/device"), format!("0x{:04x}\n", dev.device));
        self.write(
            &format!("{dir}/revision"),
            format!("0x{:02x}\n", dev.revision),
        );
        self.write(&format!("{dir}/numa_node"), format!("{}\n", dev.numa_node));
        if let Some(cpulist) = &dev.cpulist {
            self.write(&format!("{dir}/local_cpulist"), format!("{cpulist}\n"));
        }

        let mut starts = Vec::new();
        let mut lines = vec![[0u64; 3]; if is_bridge { 17 } else { 13 }];
        for bar in &dev.bars {
            let start = self.allocate(bar);
            starts.push((bar.index, start, bar.kind));
            let flags = match bar.kind {
                BarKind::Mem32 => FLAGS_MEM32,
                BarKind::Mem64Prefetch => FLAGS_MEM64_PREF,
                BarKind::Io => FLAGS_IO,
            };
            lines[usize::from(bar.index)] = [start, start + bar.size - 1, flags];
        }
        let resource: String = lines
            .iter()
            .map(|[s, e, f]| format!("0x{s:016x} 0x{e:016x} 0x{f:016x}\n"))
            .collect();
        self.write(&format!("{dir}/resource"), resource);

        if let Some(link) = &dev.link {
            self.write(
                &format!("{dir}/current_link_speed"),
                format!("{}\n", link.current_speed),
            );
            self.write(
                &format!("{dir}/current_link_width"),
                format!("{}\n", link.current_width),
            );
            self.write(
                &format!("{dir}/max_link_speed"),
                format!("{}\n", link.max_speed),
            );
            self.write(
                &format!("{dir}/max_link_width"),
                format!("{}\n", link.max_width),
            );
        }
        if let Some(driver) = &dev.driver {
            self.symlink(
                &format!("{dir}/driver"),
                &format!("{up}bus/pci/drivers/{driver}"),
            );
        }
        if let Some(group) = dev.iommu_group {
            self.symlink(
                &format!("{dir}/iommu_group"),
                &format!("{up}kernel/iommu_groups/{group}"),
            );
            self.symlink(
                &format!("sys/kernel/iommu_groups/{group}/devices/{bdf}"),
                &format!("../../../../devices/{}", dev.path),
            );
        }
        for name in &dev.rdma {
            self.write(&format!("{dir}/infiniband/{name}/node_type"), "1: CA\n");
        }
        for name in &dev.net {
            self.write(&format!("{dir}/net/{name}/operstate"), "up\n");
        }
        let config = config_space(dev, &starts);
        self.write(
            &format!("{dir}/config"),
            &config[..dev.config_len.min(config.len())],
        );
        self.symlink(
            &format!("sys/bus/pci/devices/{bdf}"),
            &format!("../../../devices/{}", dev.path),
        );
    }
}

fn put16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

fn put32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn speed_code(text: &str) -> u32 {
    match text.split_whitespace().next().unwrap_or("") {
        "2.5" => 1,
        "5.0" | "5" => 2,
        "8.0" | "8" => 3,
        "16.0" | "16" => 4,
        "32.0" | "32" => 5,
        "64.0" | "64" => 6,
        _ => 0,
    }
}

/// Builds 4096 bytes of configuration space for a device: header with BARs,
/// a standard capability list (power management at 0x60, MSI at 0x68, PCI
/// Express at 0x78) and an extended list (AER at 0x100, then ACS and
/// Resizable BAR where the device has them).
pub fn config_space(dev: &Dev, bar_starts: &[(u8, u64, BarKind)]) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let is_bridge = dev.class >> 8 == 0x0604;
    put16(&mut c, 0x00, dev.vendor);
    put16(&mut c, 0x02, dev.device);
    put16(&mut c, 0x04, 0x0407); // I/O, memory, bus master
    put16(&mut c, 0x06, 0x0010); // capability list present
    c[0x08] = dev.revision;
    c[0x09] = dev.class as u8;
    c[0x0a] = (dev.class >> 8) as u8;
    c[0x0b] = (dev.class >> 16) as u8;
    c[0x0e] = u8::from(is_bridge);
    for (index, start, kind) in bar_starts {
        let at = 0x10 + 4 * usize::from(*index);
        if at + 4 > 0x28 {
            continue;
        }
        match kind {
            BarKind::Mem32 => put32(&mut c, at, *start as u32),
            BarKind::Io => put32(&mut c, at, (*start as u32) | 0x1),
            BarKind::Mem64Prefetch => {
                put32(&mut c, at, (*start as u32) | 0xc);
                if at + 8 <= 0x28 {
                    put32(&mut c, at + 4, (*start >> 32) as u32);
                }
            }
        }
    }
    c[0x34] = 0x60;
    // Power management.
    c[0x60] = 0x01;
    c[0x61] = 0x68;
    put16(&mut c, 0x62, 0x0003);
    // MSI, then PCI Express if the device has it.
    c[0x68] = 0x05;
    if let Some(port_type) = dev.port_type {
        c[0x69] = 0x78;
        c[0x78] = 0x10;
        c[0x79] = 0x00;
        put16(&mut c, 0x7a, 0x0002 | (u16::from(port_type) << 4));
        if let Some(link) = &dev.link {
            let max_width: u32 = link.max_width.parse().unwrap_or(0);
            let current_width: u32 = link.current_width.parse().unwrap_or(0);
            put32(
                &mut c,
                0x78 + 0x0c,
                speed_code(&link.max_speed) | (max_width << 4),
            );
            put16(
                &mut c,
                0x78 + 0x12,
                (speed_code(&link.current_speed) | (current_width << 4)) as u16,
            );
        }
    }
    if dev.port_type.is_none() {
        return c;
    }
    // Extended capabilities, laid out one after another from 0x100.
    let mut extended: Vec<(u16, Vec<u8>)> = vec![(0x0001, vec![0u8; 0x44])]; // AER
    if let Some((capability, control)) = dev.acs {
        let mut body = vec![0u8; 4];
        body[0..2].copy_from_slice(&capability.to_le_bytes());
        body[2..4].copy_from_slice(&control.to_le_bytes());
        extended.push((0x000d, body));
    }
    if !dev.rebar.is_empty() {
        let mut body = Vec::new();
        for (bar, bits, code) in &dev.rebar {
            body.extend_from_slice(&bits.to_le_bytes());
            let count = if body.len() == 4 {
                dev.rebar.len() as u32
            } else {
                0
            };
            let control = u32::from(*bar) | (count << 5) | (u32::from(*code) << 8);
            body.extend_from_slice(&control.to_le_bytes());
        }
        extended.push((0x0015, body));
    }
    let mut at = 0x100usize;
    for (i, (id, body)) in extended.iter().enumerate() {
        let size = (4 + body.len()).div_ceil(8) * 8;
        let next = if i + 1 < extended.len() { at + size } else { 0 };
        put32(
            &mut c,
            at,
            u32::from(*id) | (1 << 16) | ((next as u32) << 20),
        );
        c[at + 4..at + 4 + body.len()].copy_from_slice(body);
        at += size;
    }
    c
}
