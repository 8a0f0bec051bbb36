//! The committed sysfs fixtures, as code. Each function builds one tree;
//! `docs/TOPOLOGY.md` says which real layout each is modeled on. Bridge and
//! chipset device ids are illustrative; GPU and NIC ids are the real ones.

use std::path::Path;

use super::{ACS_CAP_SWITCH, ACS_LINUX_DEFAULT, BarKind, Dev, MIB, Tree, port, speed};

/// Writes one fixture tree under the given root.
pub type BuildFixture = fn(&Path);

/// Name and builder of every committed fixture.
pub const ALL: &[(&str, BuildFixture)] = &[
    ("desktop-2x4090", desktop_2x4090),
    ("server-8gpu-2socket", server_8gpu_2socket),
    ("acs-cascade-4gpu", acs_cascade_4gpu),
    ("iommu-translating", iommu_translating),
    ("small-bar1", small_bar1),
    ("malformed", malformed),
];

/// Two RTX 4090s on CPU root ports of an AMD desktop (x16 slot bifurcated
/// x8/x8), NVMe and a chipset 2.5GbE NIC; IOMMU off in firmware.
pub fn desktop_2x4090(root: &Path) {
    desktop_2x4090_with(root, 4096);
}

/// The desktop tree with every `config` cut to `config_len` bytes (64 shows
/// what a non-root reader sees).
pub fn desktop_2x4090_with(root: &Path, config_len: usize) {
    let mut t = Tree::new(root);
    t.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0-51-generic root=UUID=6a1f0c2e-5b4d-4c1e-9a57-2f8e0b7c3d21 ro quiet splash");
    t.cpuinfo("AuthenticAMD", "AMD Ryzen 9 7950X 16-Core Processor");
    t.numa_online("0");
    let cpus = "0-31";
    let devs = vec![
        Dev::host_bridge("pci0000:00/0000:00:00.0", 0x1022, 0x14d8),
        Dev::root_port("pci0000:00/0000:00:01.1", 0x1022, 0x14db).link(
            speed::GEN4,
            8,
            speed::GEN5,
            8,
        ),
        Dev::rtx_4090("pci0000:00/0000:00:01.1/0000:01:00.0").link(speed::GEN4, 8, speed::GEN4, 16),
        Dev::gpu_audio("pci0000:00/0000:00:01.1/0000:01:00.1", 0x22ba).link(
            speed::GEN4,
            8,
            speed::GEN4,
            16,
        ),
        Dev::root_port("pci0000:00/0000:00:01.2", 0x1022, 0x14db).link(
            speed::GEN4,
            8,
            speed::GEN5,
            8,
        ),
        Dev::rtx_4090("pci0000:00/0000:00:01.2/0000:02:00.0").link(speed::GEN4, 8, speed::GEN4, 16),
        Dev::gpu_audio("pci0000:00/0000:00:01.2/0000:02:00.1", 0x22ba).link(
            speed::GEN4,
            8,
            speed::GEN4,
            16,
        ),
        Dev::root_port("pci0000:00/0000:00:02.1", 0x1022, 0x14db).link(
            speed::GEN4,
            4,
            speed::GEN4,
            4,
        ),
        Dev::new(
            "pci0000:00/0000:00:02.1/0000:03:00.0",
            0x010802,
            0x144d,
            0xa80c,
        )
        .bar(0, 16 * 1024, BarKind::Mem64Prefetch)
        .link(speed::GEN4, 4, speed::GEN4, 4)
        .driver("nvme"),
        Dev::root_port("pci0000:00/0000:00:02.2", 0x1022, 0x14db).link(
            speed::GEN4,
            4,
            speed::GEN4,
            4,
        ),
        Dev::upstream_port("pci0000:00/0000:00:02.2/0000:04:00.0", 0x1022, 0x43f4).link(
            speed::GEN4,
            4,
            speed::GEN4,
            4,
        ),
        Dev::downstream_port(
            "pci0000:00/0000:00:02.2/0000:04:00.0/0000:05:08.0",
            0x1022,
            0x43f5,
        )
        .link(speed::GEN2, 1, speed::GEN4, 1),
        Dev::new(
            "pci0000:00/0000:00:02.2/0000:04:00.0/0000:05:08.0/0000:06:00.0",
            0x020000,
            0x8086,
            0x125c,
        )
        .bar(0, MIB, BarKind::Mem32)
        .bar(3, 16 * 1024, BarKind::Mem32)
        .link(speed::GEN2, 1, speed::GEN2, 1)
        .driver("igc")
        .net("enp6s0"),
    ];
    for dev in devs {
        let dev = if dev.class >> 16 == 0x06 {
            dev
        } else {
            dev.numa(-1, cpus)
        };
        t.add(&dev.config_len(config_len));
    }
}

/// One switch of the 8-GPU server: a root port alone on host bridge
/// `pci0000:BUS` (one PCIe stack), a PEX 8796 (Gen3) below it with three
/// downstream ports, two GPUs and a ConnectX-6 on the next three buses.
fn server_switch(t: &mut Tree, bus: u8, node: i32, cpus: &str, rdma: &str, net: &str, group: u32) {
    let hb = format!("{bus:02x}");
    let rp = format!("pci0000:{hb}/0000:{bus:02x}:00.0");
    let usp = format!("{rp}/0000:{:02x}:00.0", bus + 1);
    let dsp = |dev: u8| format!("{usp}/0000:{:02x}:{dev:02x}.0", bus + 2);
    let gen3 = speed::GEN3;
    let devs = vec![
        Dev::root_port(&rp, 0x8086, 0x2030).link(gen3, 16, gen3, 16),
        Dev::upstream_port(&usp, 0x10b5, 0x8796).link(gen3, 16, gen3, 16),
        Dev::downstream_port(&dsp(0x08), 0x10b5, 0x8796)
            .link(gen3, 16, gen3, 16)
            .acs(ACS_CAP_SWITCH, 0),
        Dev::downstream_port(&dsp(0x10), 0x10b5, 0x8796)
            .link(gen3, 16, gen3, 16)
            .acs(ACS_CAP_SWITCH, 0),
        Dev::downstream_port(&dsp(0x14), 0x10b5, 0x8796)
            .link(gen3, 16, gen3, 16)
            .acs(ACS_CAP_SWITCH, 0),
        Dev::rtx_4090(&format!("{}/0000:{:02x}:00.0", dsp(0x08), bus + 3)).link(
            gen3,
            16,
            speed::GEN4,
            16,
        ),
        Dev::gpu_audio(&format!("{}/0000:{:02x}:00.1", dsp(0x08), bus + 3), 0x22ba).link(
            gen3,
            16,
            speed::GEN4,
            16,
        ),
        Dev::rtx_4090(&format!("{}/0000:{:02x}:00.0", dsp(0x10), bus + 4)).link(
            gen3,
            16,
            speed::GEN4,
            16,
        ),
        Dev::gpu_audio(&format!("{}/0000:{:02x}:00.1", dsp(0x10), bus + 4), 0x22ba).link(
            gen3,
            16,
            speed::GEN4,
            16,
        ),
        Dev::connectx(
            &format!("{}/0000:{:02x}:00.0", dsp(0x14), bus + 5),
            0x101b,
            0x020700,
            rdma,
            net,
        )
        .link(gen3, 16, speed::GEN4, 16),
    ];
    for (i, dev) in devs.into_iter().enumerate() {
        t.iommu_group_type(group + i as u32, "identity");
        t.add(&dev.numa(node, cpus).group(group + i as u32));
    }
}

/// A dual-socket Intel server with eight RTX 4090s: four PCIe switches, two
/// per socket, each holding two GPUs and a ConnectX-6 InfiniBand NIC (the
/// DGX-1 PCIe arrangement), enumerated with one root bus per PCIe stack as
/// Intel's server CPUs do, plus the BMC's VGA and an onboard I210 on the
/// chipset.
pub fn server_8gpu_2socket(root: &Path) {
    let mut t = Tree::new(root);
    t.cmdline("BOOT_IMAGE=/boot/vmlinuz-5.15.0-126-generic root=/dev/mapper/vg0-root ro intel_iommu=on iommu=pt");
    t.cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz");
    t.numa_online("0-1");
    t.iommu_units(&["dmar0", "dmar1", "dmar2", "dmar3", "dmar4", "dmar5"]);
    let node0 = "0-19,40-59";
    let node1 = "20-39,60-79";
    let chipset = vec![
        Dev::host_bridge("pci0000:00/0000:00:00.0", 0x8086, 0x2020),
        Dev::root_port("pci0000:00/0000:00:1c.0", 0x8086, 0xa190).link(
            speed::GEN1,
            1,
            speed::GEN3,
            1,
        ),
        Dev::new(
            "pci0000:00/0000:00:1c.0/0000:01:00.0",
            0x060400,
            0x1a03,
            0x1150,
        )
        .port(port::PCIE_TO_PCI)
        .link(speed::GEN1, 1, speed::GEN2, 1),
        Dev::new(
            "pci0000:00/0000:00:1c.0/0000:01:00.0/0000:02:00.0",
            0x030000,
            0x1a03,
            0x2000,
        )
        .bar(0, 64 * MIB, BarKind::Mem32)
        .bar(1, 128 * 1024, BarKind::Mem32)
        .driver("ast")
        .conventional_pci(),
        Dev::root_port("pci0000:00/0000:00:1c.5", 0x8086, 0xa195).link(
            speed::GEN1,
            1,
            speed::GEN3,
            1,
        ),
        Dev::new(
            "pci0000:00/0000:00:1c.5/0000:03:00.0",
            0x020000,
            0x8086,
            0x1533,
        )
        .bar(0, MIB, BarKind::Mem32)
        .bar(3, 16 * 1024, BarKind::Mem32)
        .link(speed::GEN1, 1, speed::GEN1, 1)
        .driver("igb")
        .net("eno1"),
    ];
    for (i, dev) in chipset.into_iter().enumerate() {
        t.iommu_group_type(i as u32, "identity");
        t.add(&dev.numa(0, node0).group(i as u32));
    }
    server_switch(&mut t, 0x17, 0, node0, "mlx5_0", "ibp28s0", 10);
    server_switch(&mut t, 0x3a, 0, node0, "mlx5_1", "ibp63s0", 20);
    server_switch(&mut t, 0x85, 1, node1, "mlx5_2", "ibp138s0", 30);
    server_switch(&mut t, 0xae, 1, node1, "mlx5_3", "ibp179s0", 40);
}

/// A single-socket Intel workstation whose root port feeds a Gen4 switch that
/// fans out to two more switches with two RTX 4090s each, and a ConnectX-6 Dx
/// on the top switch. Linux left ACS (SV RR CR UF) on every downstream port,
/// as it does whenever an IOMMU driver is loaded, even with iommu=pt.
pub fn acs_cascade_4gpu(root: &Path) {
    acs_cascade_4gpu_with(root, 4096);
}

pub fn acs_cascade_4gpu_with(root: &Path, config_len: usize) {
    let mut t = Tree::new(root);
    t.cmdline(
        "BOOT_IMAGE=/boot/vmlinuz-6.8.0-51-generic root=/dev/nvme0n1p2 ro intel_iommu=on iommu=pt",
    );
    t.cpuinfo("GenuineIntel", "Intel(R) Xeon(R) w9-3495X");
    t.numa_online("0");
    t.iommu_units(&["dmar0", "dmar1"]);
    let rp = "pci0000:00/0000:00:01.0";
    let top = format!("{rp}/0000:01:00.0");
    let top_dsp = |dev: u8| format!("{top}/0000:02:{dev:02x}.0");
    let g4 = speed::GEN4;
    let mut devs = vec![
        Dev::host_bridge("pci0000:00/0000:00:00.0", 0x8086, 0x09a2),
        Dev::root_port(rp, 0x8086, 0x352a)
            .link(g4, 16, g4, 16)
            .acs(0x005f, ACS_LINUX_DEFAULT),
        Dev::upstream_port(&top, 0x1000, 0xc010).link(g4, 16, g4, 16),
    ];
    let mut bus = 3u8;
    for (slot, gpus) in [(0x00u8, 2usize), (0x01, 2)] {
        let dsp = top_dsp(slot);
        devs.push(
            Dev::downstream_port(&dsp, 0x1000, 0xc010)
                .link(g4, 16, g4, 16)
                .acs(ACS_CAP_SWITCH, ACS_LINUX_DEFAULT),
        );
        let lower = format!("{dsp}/0000:{bus:02x}:00.0");
        devs.push(Dev::upstream_port(&lower, 0x1000, 0xc010).link(g4, 16, g4, 16));
        let lower_dsp_bus = bus + 1;
        for i in 0..gpus {
            let ldsp = format!("{lower}/0000:{lower_dsp_bus:02x}:{i:02x}.0");
            devs.push(
                Dev::downstream_port(&ldsp, 0x1000, 0xc010)
                    .link(g4, 16, g4, 16)
                    .acs(ACS_CAP_SWITCH, ACS_LINUX_DEFAULT),
            );
            let gpu_bus = lower_dsp_bus + 1 + i as u8;
            devs.push(Dev::rtx_4090(&format!("{ldsp}/0000:{gpu_bus:02x}:00.0")));
            devs.push(Dev::gpu_audio(
                &format!("{ldsp}/0000:{gpu_bus:02x}:00.1"),
                0x22ba,
            ));
        }
        bus = lower_dsp_bus + 1 + gpus as u8;
    }
    let nic_dsp = top_dsp(0x02);
    devs.push(
        Dev::downstream_port(&nic_dsp, 0x1000, 0xc010)
            .link(g4, 16, g4, 16)
            .acs(ACS_CAP_SWITCH, ACS_LINUX_DEFAULT),
    );
    devs.push(Dev::connectx(
        &format!("{nic_dsp}/0000:{bus:02x}:00.0"),
        0x101d,
        0x020000,
        "mlx5_0",
        "enp11s0f0np0",
    ));
    for (i, dev) in devs.into_iter().enumerate() {
        t.iommu_group_type(i as u32, "identity");
        t.add(&dev.numa(0, "0-55").group(i as u32).config_len(config_len));
    }
}

/// An X299 workstation board with a PLX PEX 8747 behind one CPU root port
/// (as on ASUS WS X299 SAGE), two RTX 4090s on it, ACS cleared with setpci,
/// but `intel_iommu=on` without `iommu=pt`: every group is a translated
/// DMA-FQ domain.
pub fn iommu_translating(root: &Path) {
    let mut t = Tree::new(root);
    t.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.5.0-45-generic root=UUID=0c2d9b1e-1f7a-4e39-8d1c-7b3e5a9f2c40 ro quiet splash intel_iommu=on");
    t.cpuinfo("GenuineIntel", "Intel(R) Core(TM) i9-10980XE CPU @ 3.00GHz");
    t.numa_online("0");
    t.iommu_units(&["dmar0", "dmar1", "dmar2", "dmar3"]);
    let gen3 = speed::GEN3;
    let rp = "pci0000:16/0000:16:00.0";
    let usp = format!("{rp}/0000:17:00.0");
    let devs = vec![
        (
            Dev::host_bridge("pci0000:00/0000:00:00.0", 0x8086, 0x2020),
            0,
        ),
        (
            Dev::root_port(rp, 0x8086, 0x2030)
                .link(gen3, 16, gen3, 16)
                .acs(0x005f, 0),
            30,
        ),
        (
            Dev::upstream_port(&usp, 0x10b5, 0x8747).link(gen3, 16, gen3, 16),
            31,
        ),
        (
            Dev::downstream_port(&format!("{usp}/0000:18:08.0"), 0x10b5, 0x8747)
                .link(gen3, 16, gen3, 16)
                .acs(ACS_CAP_SWITCH, 0),
            32,
        ),
        (
            Dev::rtx_4090(&format!("{usp}/0000:18:08.0/0000:19:00.0")).link(
                gen3,
                16,
                speed::GEN4,
                16,
            ),
            33,
        ),
        (
            Dev::gpu_audio(&format!("{usp}/0000:18:08.0/0000:19:00.1"), 0x22ba).link(
                gen3,
                16,
                speed::GEN4,
                16,
            ),
            33,
        ),
        (
            Dev::downstream_port(&format!("{usp}/0000:18:10.0"), 0x10b5, 0x8747)
                .link(gen3, 16, gen3, 16)
                .acs(ACS_CAP_SWITCH, 0),
            34,
        ),
        (
            Dev::rtx_4090(&format!("{usp}/0000:18:10.0/0000:1a:00.0")).link(
                gen3,
                16,
                speed::GEN4,
                16,
            ),
            35,
        ),
        (
            Dev::gpu_audio(&format!("{usp}/0000:18:10.0/0000:1a:00.1"), 0x22ba).link(
                gen3,
                16,
                speed::GEN4,
                16,
            ),
            35,
        ),
    ];
    for (dev, group) in devs {
        t.iommu_group_type(group, "DMA-FQ");
        t.add(&dev.group(group).numa(-1, "0-35"));
    }
}

/// A single-socket AMD workstation with two RTX 3090s on different root
/// complexes and Resizable BAR off in firmware: each BAR1 is the legacy
/// 256 MiB although the cards advertise up to 32 GiB. IOMMU in passthrough.
pub fn small_bar1(root: &Path) {
    let mut t = Tree::new(root);
    t.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0-51-generic root=UUID=9e4b7c1a-3d2f-4a8e-b6c5-1f0e2d3c4b5a ro amd_iommu=on iommu=pt");
    t.cpuinfo(
        "AuthenticAMD",
        "AMD Ryzen Threadripper 3970X 32-Core Processor",
    );
    t.numa_online("0");
    t.iommu_units(&["ivhd0", "ivhd1", "ivhd2", "ivhd3"]);
    let g4 = speed::GEN4;
    let devs = vec![
        (
            Dev::host_bridge("pci0000:00/0000:00:00.0", 0x1022, 0x1480),
            0,
        ),
        (
            Dev::root_port("pci0000:20/0000:20:03.1", 0x1022, 0x1483).link(g4, 16, g4, 16),
            20,
        ),
        (
            Dev::rtx_3090_small_bar("pci0000:20/0000:20:03.1/0000:21:00.0"),
            21,
        ),
        (
            Dev::gpu_audio("pci0000:20/0000:20:03.1/0000:21:00.1", 0x1aef),
            21,
        ),
        (
            Dev::root_port("pci0000:40/0000:40:01.1", 0x1022, 0x1483).link(g4, 16, g4, 16),
            40,
        ),
        (
            Dev::rtx_3090_small_bar("pci0000:40/0000:40:01.1/0000:41:00.0"),
            41,
        ),
        (
            Dev::gpu_audio("pci0000:40/0000:40:01.1/0000:41:00.1", 0x1aef),
            41,
        ),
    ];
    for (dev, group) in devs {
        t.iommu_group_type(group, "identity");
        t.add(&dev.group(group).numa(0, "0-63"));
    }
}

/// A tree with everything that can go wrong: malformed attributes, a
/// truncated and an empty `config`, odd link strings, missing files, a name
/// that is not an address, links that dangle or leave the root, a device
/// directory outside `sys/devices`, and no `proc` at all.
pub fn malformed(root: &Path) {
    let mut t = Tree::new(root);
    t.add(
        &Dev::root_port("pci0000:00/0000:00:01.0", 0x8086, 0x1901)
            .link(speed::GEN3, 16, speed::GEN3, 16)
            .config_len(10),
    );
    let gpu0 = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    t.add(
        &Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0")
            .group(7)
            .config_len(0),
    );
    t.write(&format!("{gpu0}/device"), "zzz\n");
    t.write(
        &format!("{gpu0}/resource"),
        "0x00000000a0000000 0x00000000a0ffffff 0x0000000000040200\n0x0000006000000000 garbage 0x000000000014220c\n",
    );
    t.write(&format!("{gpu0}/numa_node"), "banana\n");
    t.write(&format!("{gpu0}/current_link_speed"), "fast\n");
    t.write(&format!("{gpu0}/max_link_speed"), "Unknown\n");
    t.write(&format!("{gpu0}/current_link_width"), "x16\n");
    t.write(&format!("{gpu0}/max_link_width"), "sixteen\n");
    t.symlink(
        &format!("{gpu0}/iommu_group"),
        "../../../../kernel/iommu_groups/seven",
    );

    t.add(&Dev::root_port("pci0000:00/0000:00:02.0", 0x8086, 0x1905).config_len(64));
    let gpu1 = "sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0";
    let mut second = Dev::rtx_4090("pci0000:00/0000:00:02.0/0000:02:00.0").config_len(64);
    second.link = None;
    t.add(&second);
    t.remove(&format!("{gpu1}/resource"));
    t.remove(&format!("{gpu1}/numa_node"));

    t.symlink(
        "sys/bus/pci/devices/not-a-bdf",
        "../../../devices/pci0000:00/0000:00:01.0",
    );
    t.symlink(
        "sys/bus/pci/devices/0000:03:00.0",
        "../../../devices/pci0000:00/0000:00:03.0/0000:03:00.0",
    );
    t.symlink(
        "sys/bus/pci/devices/0000:04:00.0",
        "../../../../../../../../etc",
    );
    // A plain directory where a link should be: its path says nothing about
    // the bridges above it.
    t.write("sys/bus/pci/devices/0000:05:00.0/class", "0x020000\n");
    t.write("sys/bus/pci/devices/0000:05:00.0/vendor", "0x15b3\n");
    t.write("sys/bus/pci/devices/0000:05:00.0/device", "0x1017\n");
    t.write("sys/bus/pci/devices/0000:05:00.0/numa_node", "-1\n");
}
