//! Partial, malformed and hostile sysfs trees: discovery never panics, and
//! every report says what it could not read and what that means.

mod support;

use std::path::{Path, PathBuf};

use barlink_topology::aperture::ApertureVerdict;
use barlink_topology::diag::{Problem, Subject};
use barlink_topology::topology::PairIssue;
use barlink_topology::{
    DiscoveryError, PathChoice, PathClass, PathPolicy, Topology, Verdict, doctor, render,
};
use support::{BarKind, Dev, GIB, MIB, TempDir, Tree, speed};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs")
        .join(name)
}

fn discover(root: &Path) -> Topology {
    Topology::discover(root, PathPolicy::default()).expect("the PCI directory exists")
}

#[test]
fn the_malformed_fixture_is_read_as_far_as_possible() {
    let topology = discover(&fixture("malformed"));
    let platform = &topology.platform;
    let kinds: Vec<&str> = platform
        .diagnostics
        .iter()
        .map(|d| d.problem.kind())
        .collect();
    for kind in [
        "not-a-pci-address",
        "missing",
        "bad-link",
        "malformed",
        "config-limited",
        "path-outside-device-tree",
        "link-speed-unknown",
    ] {
        assert!(kinds.contains(&kind), "no {kind} diagnostic in {kinds:?}");
    }
    for diagnostic in &platform.diagnostics {
        assert!(!diagnostic.consequence.is_empty(), "{diagnostic}");
        assert!(!diagnostic.to_string().is_empty());
    }
    // Entries that lead nowhere are named, not silently dropped.
    let entries: Vec<String> = platform
        .diagnostics
        .iter()
        .filter_map(|d| match &d.subject {
            Subject::Entry(name) => Some(name.clone()),
            _ => None,
        })
        .collect();
    for name in ["not-a-bdf", "0000:03:00.0", "0000:04:00.0"] {
        assert!(
            entries.iter().any(|e| e == name),
            "{name} not reported: {entries:?}"
        );
    }
    assert!(platform.diagnostics.iter().any(|d| matches!(
        &d.problem,
        Problem::Read(barlink_topology::sysfs::ReadError::BadLink { .. })
    )));

    // What could be read still counts.
    assert_eq!(topology.gpus.len(), 2);
    let gpu0 = platform.device(topology.gpus[0].bdf).unwrap();
    assert_eq!(gpu0.device_id, None);
    assert_eq!(gpu0.numa_node, None);
    assert_eq!(gpu0.bars.len(), 1, "BAR0 survives the bad BAR1 line");
    assert_eq!(gpu0.link.current_width, Some(16), "\"x16\" is tolerated");
    assert_eq!(gpu0.link.current_speed, None);
    assert_eq!(topology.gpus[0].aperture.verdict, ApertureVerdict::Unknown);
    assert_eq!(topology.gpus[1].aperture.verdict, ApertureVerdict::Unknown);

    let nic = &topology.nics[0];
    assert_eq!(nic.bdf.to_string(), "0000:05:00.0");
    let to_nic = topology.pair("GPU0", "NIC0").unwrap();
    assert!(
        to_nic
            .issues
            .iter()
            .any(|i| matches!(i, PairIssue::RouteUnknown { .. }))
    );
}

#[test]
fn the_malformed_fixture_reports_unknowns_without_failing() {
    let topology = discover(&fixture("malformed"));
    let report = doctor::run(&topology);
    let text = report.render_text();
    assert!(!report.has_failures(), "{text}");
    assert_eq!(report.worst("pci-tree"), Some(Verdict::Warn));
    assert_eq!(report.worst("bar1"), Some(Verdict::Warn));
    assert!(text.contains("Could not read"), "{text}");
    assert!(text.contains("banana"), "{text}");
    assert!(!report.unreadable.is_empty());

    let topo_text = render::topo_text(&topology);
    assert!(topo_text.contains("Could not read"));
    let json = render::topo_json(&topology);
    let unreadable = json["unreadable"].as_array().unwrap();
    assert!(!unreadable.is_empty());
    for item in unreadable {
        for key in ["subject", "kind", "problem", "consequence"] {
            assert!(item[key].is_string(), "{key} missing in {item}");
        }
    }
}

#[test]
fn a_root_without_sysfs_is_an_error_that_names_it() {
    let dir = TempDir::new("empty-root");
    let error = Topology::discover(dir.path(), PathPolicy::default()).unwrap_err();
    let DiscoveryError::NoPciDirectory { root, .. } = &error else {
        panic!("unexpected error {error:?}");
    };
    assert_eq!(root, dir.path());
    assert!(error.to_string().contains("--sysfs-root"), "{error}");
}

#[test]
fn an_empty_pci_directory_is_no_gpus_not_an_error() {
    let dir = TempDir::new("no-devices");
    std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
    let topology = discover(dir.path());
    let report = doctor::run(&topology);
    assert_eq!(report.worst("gpus"), Some(Verdict::Warn));
    assert!(render::topo_text(&topology).contains("No GPUs found."));
    assert!(!report.has_failures());
}

/// A one-GPU tree on root port 00:01.0 with the given GPU.
fn single_gpu(dir: &Path, gpu: Dev) -> Tree {
    let mut tree = Tree::new(dir);
    tree.cpuinfo("GenuineIntel", "test");
    tree.cmdline("quiet");
    tree.add(
        &Dev::root_port("pci0000:00/0000:00:01.0", 0x8086, 0x1901).link(
            speed::GEN4,
            16,
            speed::GEN4,
            16,
        ),
    );
    tree.add(&gpu);
    tree
}

#[test]
fn an_idle_narrow_link_warns_and_mentions_idle_power_saving() {
    let dir = TempDir::new("slow-link");
    single_gpu(
        dir.path(),
        Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0").link(speed::GEN1, 8, speed::GEN4, 16),
    );
    let report = doctor::run(&discover(dir.path()));
    let links: Vec<_> = report.checks_named("link").collect();
    assert_eq!(links.len(), 2, "{}", report.render_text());
    assert!(links.iter().all(|c| c.verdict == Verdict::Warn));
    assert!(
        links[0].message.contains("2.5 GT/s"),
        "{}",
        links[0].message
    );
    assert!(links[0].fix.as_deref().unwrap().contains("idle"));
    assert!(links[1].message.contains("x8"), "{}", links[1].message);
}

#[test]
fn a_translating_iommu_with_nothing_to_pair_only_warns() {
    let dir = TempDir::new("one-gpu-iommu");
    let tree = single_gpu(
        dir.path(),
        Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0").group(3),
    );
    tree.iommu_units(&["dmar0"]);
    tree.iommu_group_type(3, "DMA");
    let report = doctor::run(&discover(dir.path()));
    assert_eq!(report.worst("iommu"), Some(Verdict::Warn));
    assert!(!report.has_failures());
}

#[test]
fn groups_without_a_type_file_fall_back_to_the_command_line() {
    let dir = TempDir::new("old-kernel");
    let tree = single_gpu(
        dir.path(),
        Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0").group(3),
    );
    tree.iommu_units(&["dmar0"]);
    let topology = discover(dir.path());
    let translation = &topology.gpus[0].translation;
    assert!(translation.translates());
    assert!(translation.to_string().contains("assumed"), "{translation}");

    tree.cmdline("intel_iommu=on iommu=pt");
    let topology = discover(dir.path());
    assert!(!topology.gpus[0].translation.translates());
}

#[test]
fn unknown_numa_nodes_on_a_two_socket_machine_count_as_apart() {
    let dir = TempDir::new("numa-unknown");
    let mut tree = Tree::new(dir.path());
    tree.cpuinfo("AuthenticAMD", "test");
    tree.cmdline("quiet");
    tree.numa_online("0-1");
    for (host, bus) in [("00", 0x00u8), ("80", 0x80)] {
        let rp = format!("pci0000:{host}/0000:{bus:02x}:01.0");
        tree.add(&Dev::root_port(&rp, 0x1022, 0x1483));
        tree.add(&Dev::rtx_4090(&format!("{rp}/0000:{:02x}:00.0", bus + 1)));
    }
    let topology = discover(dir.path());
    let gpus = topology.pair("GPU0", "GPU1").unwrap();
    assert_eq!(gpus.link, PathClass::Sys);
    assert!(gpus.issues.contains(&PairIssue::NumaUnknown));
    assert_eq!(gpus.path, PathChoice::HostBounce);

    // With one node online the same tree is NODE, and AMD allows P2P there.
    tree.numa_online("0");
    let topology = discover(dir.path());
    let gpus = topology.pair("GPU0", "GPU1").unwrap();
    assert_eq!(gpus.link, PathClass::Node);
    assert_eq!(gpus.path, PathChoice::P2p);
}

#[test]
fn a_data_center_gpus_bar1_is_found_after_its_64bit_bar0() {
    // H100/H200: BAR0 is 64-bit, so NVIDIA's BAR1 is PCI BAR 2.
    let dir = TempDir::new("h200-bar1");
    single_gpu(
        dir.path(),
        Dev::new(
            "pci0000:00/0000:00:01.0/0000:01:00.0",
            0x030200,
            0x10de,
            0x2335,
        )
        .bar(0, 16 * MIB, BarKind::Mem64Prefetch)
        .bar(2, 256 * GIB, BarKind::Mem64Prefetch)
        .bar(4, 32 * MIB, BarKind::Mem64Prefetch)
        .config_len(64),
    );
    let topology = discover(dir.path());
    let aperture = &topology.gpus[0].aperture;
    assert_eq!(aperture.bar_index, Some(2));
    assert_eq!(aperture.bytes, Some(256 * GIB));
    assert_eq!(aperture.verdict, ApertureVerdict::Sufficient);
    assert!(
        aperture.explanation.starts_with("BAR1 (PCI BAR 2"),
        "{}",
        aperture.explanation
    );
}

#[test]
fn unknown_gpus_are_judged_by_stated_assumptions() {
    let dir = TempDir::new("unknown-gpu");
    let unknown_model = |bar1: u64| {
        Dev::new(
            "pci0000:00/0000:00:01.0/0000:01:00.0",
            0x030200,
            0x10de,
            0x1234,
        )
        .bar(0, 16 * MIB, BarKind::Mem32)
        .bar(1, bar1, BarKind::Mem64Prefetch)
        .config_len(64)
    };
    single_gpu(dir.path(), unknown_model(8 * GIB));
    let topology = discover(dir.path());
    let aperture = &topology.gpus[0].aperture;
    assert_eq!(aperture.verdict, ApertureVerdict::Sufficient);
    assert!(
        aperture.explanation.contains("assumed"),
        "{}",
        aperture.explanation
    );

    let dir = TempDir::new("unknown-gpu-small");
    single_gpu(dir.path(), unknown_model(256 * MIB));
    let report = doctor::run(&discover(dir.path()));
    let bar1 = report.checks_named("bar1").next().unwrap();
    assert_eq!(bar1.verdict, Verdict::Fail);
    assert!(bar1.message.contains("assuming"), "{}", bar1.message);
}

#[test]
fn garbage_config_space_is_survived() {
    let dir = TempDir::new("garbage-config");
    let tree = single_gpu(
        dir.path(),
        Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0"),
    );
    // Every byte 0xff except a capability list pointing into itself.
    let mut bytes = vec![0xffu8; 4096];
    bytes[0x0e] = 0x00;
    bytes[0x34] = 0x40;
    bytes[0x40] = 0x10;
    bytes[0x41] = 0x40;
    bytes[0x100..0x104].copy_from_slice(&0x1000_000du32.to_le_bytes());
    tree.write(
        "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/config",
        &bytes,
    );
    let topology = discover(dir.path());
    assert!(
        topology
            .platform
            .diagnostics
            .iter()
            .any(|d| d.problem.kind() == "config-inconsistent"),
        "{:?}",
        topology.platform.diagnostics
    );
    let _ = doctor::run(&topology).render_text();
    let _ = render::topo_json(&topology);
}

#[test]
fn odd_link_strings_are_diagnosed_not_trusted() {
    let dir = TempDir::new("odd-links");
    let tree = single_gpu(
        dir.path(),
        Dev::rtx_4090("pci0000:00/0000:00:01.0/0000:01:00.0"),
    );
    let gpu = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    tree.write(&format!("{gpu}/current_link_speed"), "Unknown speed\n");
    tree.write(&format!("{gpu}/max_link_speed"), "16.0 GT/s PCIe\n");
    tree.write(&format!("{gpu}/current_link_width"), "\u{0}\u{1}\n");
    let topology = discover(dir.path());
    let kinds: Vec<&str> = topology
        .platform
        .diagnostics
        .iter()
        .map(|d| d.problem.kind())
        .collect();
    assert!(kinds.contains(&"link-speed-unknown"), "{kinds:?}");
    assert!(kinds.contains(&"malformed"), "{kinds:?}");
    let report = doctor::run(&topology);
    assert!(!report.has_failures());
    assert_ne!(report.worst("link"), Some(Verdict::Fail));
}
