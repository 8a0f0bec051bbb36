//! Classification, path choice and doctor verdicts on each committed
//! fixture under `tests/fixtures/sysfs/`.

mod support;

use std::path::{Path, PathBuf};

use barlink_topology::aperture::ApertureVerdict;
use barlink_topology::topology::{PairIssue, PairKind};
use barlink_topology::{
    DoctorReport, Pair, PathChoice, PathClass, PathPolicy, Topology, Verdict, doctor, render,
};
use support::{GIB, MIB, TempDir, fixtures};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs")
        .join(name)
}

fn analyze(root: &Path) -> (Topology, DoctorReport) {
    let topology = Topology::discover(root, PathPolicy::default()).expect("fixture is readable");
    let report = doctor::run(&topology);
    (topology, report)
}

fn pair<'a>(topology: &'a Topology, a: &str, b: &str) -> &'a Pair {
    topology
        .pair(a, b)
        .unwrap_or_else(|| panic!("no pair {a}-{b}"))
}

fn verdicts(report: &DoctorReport, id: &str) -> Vec<Verdict> {
    report.checks_named(id).map(|c| c.verdict).collect()
}

#[test]
fn desktop_two_gpus_on_cpu_root_ports_are_phb_and_use_p2p_on_amd() {
    let (topology, report) = analyze(&fixture("desktop-2x4090"));
    let bdfs: Vec<String> = topology.gpus.iter().map(|g| g.bdf.to_string()).collect();
    assert_eq!(bdfs, ["0000:01:00.0", "0000:02:00.0"]);
    assert_eq!(topology.gpus[0].model, Some("GeForce RTX 4090"));
    assert_eq!(topology.gpus[0].aperture.bytes, Some(32 * GIB));
    assert_eq!(
        topology.gpus[0].aperture.verdict,
        ApertureVerdict::Sufficient
    );

    let gpus = pair(&topology, "GPU0", "GPU1");
    assert_eq!(gpus.link, PathClass::Phb);
    assert_eq!(gpus.path, PathChoice::P2p);
    assert!(gpus.reason.contains("pci0000:00"), "{}", gpus.reason);
    assert!(gpus.issues.is_empty());

    // The chipset NIC is not RDMA-capable: no GPUDirect, no nearest RDMA NIC.
    assert_eq!(topology.nics.len(), 1);
    assert!(!topology.nics[0].rdma_capable);
    assert_eq!(pair(&topology, "GPU0", "NIC0").path, PathChoice::HostBounce);
    assert!(topology.nic_affinity.iter().all(|a| a.nic.is_none()));

    assert!(!report.has_failures());
    assert!(!report.has_warnings(), "{}", report.render_text());
    assert_eq!(verdicts(&report, "bar1"), [Verdict::Pass, Verdict::Pass]);
    // x16 cards in a slot bifurcated to x8: the root port's x8 is the limit.
    assert_eq!(report.worst("link"), Some(Verdict::Pass));
    assert_eq!(report.worst("paths"), Some(Verdict::Pass));
    assert_eq!(report.worst("rdma-nic"), Some(Verdict::Skip));
}

#[test]
fn desktop_renders_a_matrix_and_json() {
    let (topology, report) = analyze(&fixture("desktop-2x4090"));
    let text = render::topo_text(&topology);
    assert!(
        text.contains("        GPU0    GPU1    NIC0    CPU Affinity"),
        "{text}"
    );
    assert!(text.contains("GPU0     X      PHB     PHB"), "{text}");
    assert!(text.contains("  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge"));
    assert!(text.contains("NIC0: enp6s0"));

    let json = render::topo_json(&topology);
    let gpu0 = &json["gpus"][0];
    assert_eq!(gpu0["bdf"], "0000:01:00.0");
    assert_eq!(gpu0["numa_node"], serde_json::Value::Null);
    assert_eq!(gpu0["bar1_bytes"], 32 * GIB);
    assert_eq!(gpu0["name"], "GPU0");
    let first = &json["pairs"][0];
    assert_eq!(first["a"], "GPU0");
    assert_eq!(first["b"], "GPU1");
    assert_eq!(first["link"], "PHB");
    assert_eq!(first["path"], "p2p");
    assert!(first["reason"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(json["nics"].is_array());
    assert!(json["warnings"].is_array());
    assert!(json["unreadable"].is_array());

    let doctor_json = report.to_json();
    assert_eq!(doctor_json["has_failures"], false);
    assert_eq!(doctor_json["checks"][0]["status"], "PASS");
    assert!(report.render_text().contains("PASS  bar1"));
}

#[test]
fn server_classifies_pix_node_sys_and_pairs_each_gpu_with_its_switch_nic() {
    let (topology, report) = analyze(&fixture("server-8gpu-2socket"));
    assert_eq!(topology.gpus.len(), 8);
    assert_eq!(topology.nics.len(), 5);
    assert_eq!(
        topology.ignored_display.len(),
        1,
        "the BMC VGA is not a GPU"
    );

    let same_switch = pair(&topology, "GPU0", "GPU1");
    assert_eq!(same_switch.link, PathClass::Pix);
    assert_eq!(same_switch.path, PathChoice::P2p);
    assert_eq!(same_switch.route.switches.len(), 1);
    assert_eq!(same_switch.route.switches[0].to_string(), "0000:18:00.0");

    let other_stack = pair(&topology, "GPU0", "GPU2");
    assert_eq!(other_stack.link, PathClass::Node);
    assert_eq!(other_stack.path, PathChoice::HostBounce);
    assert!(
        other_stack
            .reason
            .contains("beyond the P2P limit PXB for Intel CPUs"),
        "{}",
        other_stack.reason
    );

    let other_socket = pair(&topology, "GPU3", "GPU4");
    assert_eq!(other_socket.link, PathClass::Sys);
    assert_eq!(other_socket.path, PathChoice::HostBounce);
    assert_eq!(pair(&topology, "GPU6", "GPU7").link, PathClass::Pix);
    assert_eq!(pair(&topology, "GPU4", "GPU6").link, PathClass::Node);

    // NIC0 is the onboard I210, NIC1..4 the ConnectX-6s beside the GPUs.
    assert!(!topology.nics[0].rdma_capable);
    assert_eq!(pair(&topology, "GPU0", "NIC1").link, PathClass::Pix);
    assert_eq!(pair(&topology, "GPU0", "NIC1").path, PathChoice::P2p);
    assert_eq!(pair(&topology, "GPU0", "NIC3").link, PathClass::Sys);
    let nearest: Vec<(String, String)> = topology
        .nic_affinity
        .iter()
        .map(|a| (a.gpu.clone(), a.nic_label.clone().unwrap_or_default()))
        .collect();
    assert_eq!(nearest[0], ("GPU0".to_string(), "mlx5_0".to_string()));
    assert_eq!(nearest[3], ("GPU3".to_string(), "mlx5_1".to_string()));
    assert_eq!(nearest[7], ("GPU7".to_string(), "mlx5_3".to_string()));
    assert!(
        topology
            .nic_affinity
            .iter()
            .all(|a| a.link == Some(PathClass::Pix))
    );

    assert!(!report.has_failures(), "{}", report.render_text());
    assert_eq!(report.worst("numa"), Some(Verdict::Warn));
    assert_eq!(report.worst("paths"), Some(Verdict::Warn));
    assert_eq!(report.worst("acs"), Some(Verdict::Pass));
    assert_eq!(report.worst("iommu"), Some(Verdict::Pass));
    assert_eq!(report.worst("rdma-nic"), Some(Verdict::Pass));
    // GPUs capable of Gen4 behind Gen3 switches train at Gen3: not a fault.
    assert_eq!(report.worst("link"), Some(Verdict::Pass));
    let numa = report.checks_named("numa").next().unwrap();
    assert!(
        numa.fix
            .as_deref()
            .unwrap_or("")
            .contains("CUDA_VISIBLE_DEVICES=0,1,2,3")
    );

    let text = render::topo_text(&topology);
    assert!(
        text.contains("GPU0     X      PIX     NODE    NODE    SYS"),
        "{text}"
    );
    assert!(text.contains("NIC1: mlx5_0"));
}

#[test]
fn a_raised_policy_limit_turns_far_pairs_to_p2p() {
    let policy = PathPolicy {
        max_p2p_connection: Some(PathClass::Sys),
    };
    let topology = Topology::discover(&fixture("server-8gpu-2socket"), policy).unwrap();
    assert!(topology.gpu_pairs.iter().all(|p| p.path == PathChoice::P2p));
    assert!(topology.p2p_limit_reason.contains("set by policy"));
}

#[test]
fn acs_on_switch_ports_fails_and_sends_every_pair_through_host_memory() {
    let (topology, report) = analyze(&fixture("acs-cascade-4gpu"));
    let near = pair(&topology, "GPU0", "GPU1");
    assert_eq!(near.link, PathClass::Pix);
    assert_eq!(near.path, PathChoice::HostBounce);
    let redirecting: Vec<String> = near
        .issues
        .iter()
        .filter_map(|i| match i {
            PairIssue::AcsRedirect { port, .. } => Some(port.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(redirecting, ["0000:04:00.0", "0000:04:01.0"]);
    assert!(near.reason.contains("ACS"), "{}", near.reason);

    let far = pair(&topology, "GPU0", "GPU2");
    assert_eq!(far.link, PathClass::Pxb);
    assert_eq!(far.route.switches.len(), 3);
    assert_eq!(far.path, PathChoice::HostBounce);
    let to_nic = pair(&topology, "GPU3", "NIC0");
    assert_eq!(to_nic.kind, PairKind::GpuNic);
    assert_eq!(to_nic.link, PathClass::Pxb);
    assert_eq!(to_nic.path, PathChoice::HostBounce);

    assert!(report.has_failures());
    let acs: Vec<_> = report.checks_named("acs").collect();
    assert_eq!(acs.len(), 7, "{}", report.render_text());
    for check in &acs {
        assert_eq!(check.verdict, Verdict::Fail);
        let port = check.subject.as_deref().unwrap();
        let fix = check.fix.as_deref().unwrap();
        assert!(
            fix.contains(&format!("setpci -s {port} ECAP_ACS+0x6.w=0000")),
            "{fix}"
        );
        assert!(
            fix.contains(&format!("pci=disable_acs_redir={port}")),
            "{fix}"
        );
    }
    assert_eq!(report.worst("iommu"), Some(Verdict::Pass));
    assert!(render::topo_text(&topology).contains("PIX!"));
    assert!(report.render_text().contains("FAIL  acs"));
    assert_eq!(report.to_json()["has_failures"], true);
}

#[test]
fn without_root_acs_is_unverified_but_the_tree_is_still_classified() {
    let dir = TempDir::new("acs-header-only");
    fixtures::acs_cascade_4gpu_with(dir.path(), 64);
    let (topology, report) = analyze(dir.path());
    // Port types come from position when config space is unreadable.
    assert_eq!(pair(&topology, "GPU0", "GPU1").link, PathClass::Pix);
    assert_eq!(pair(&topology, "GPU0", "GPU2").link, PathClass::Pxb);
    assert_eq!(pair(&topology, "GPU0", "GPU2").route.switches.len(), 3);
    let near = pair(&topology, "GPU0", "GPU1");
    assert_eq!(near.path, PathChoice::P2p);
    assert!(near.reason.contains("unverified"), "{}", near.reason);
    assert!(
        near.issues
            .iter()
            .any(|i| matches!(i, PairIssue::AcsUnverified { .. }))
    );

    assert!(!report.has_failures(), "{}", report.render_text());
    assert_eq!(report.worst("acs"), Some(Verdict::Warn));
    let access = report.checks_named("config-access").next().unwrap();
    assert_eq!(access.verdict, Verdict::Warn);
    assert!(access.message.contains("64 bytes"), "{}", access.message);
    assert!(topology.warnings.iter().any(|w| w.contains("root")));
    // The 4090's memory size is known from its id, so BAR1 is still judged.
    assert_eq!(report.worst("bar1"), Some(Verdict::Pass));
}

#[test]
fn a_translating_iommu_fails_and_forces_host_bounce() {
    let (topology, report) = analyze(&fixture("iommu-translating"));
    let gpus = pair(&topology, "GPU0", "GPU1");
    assert_eq!(gpus.link, PathClass::Pix);
    assert_eq!(gpus.path, PathChoice::HostBounce);
    assert!(gpus.reason.contains("DMA-FQ"), "{}", gpus.reason);
    assert_eq!(
        gpus.issues
            .iter()
            .filter(|i| matches!(i, PairIssue::IommuTranslates { .. }))
            .count(),
        2
    );
    assert!(report.has_failures());
    let iommu = report.checks_named("iommu").next().unwrap();
    assert_eq!(iommu.verdict, Verdict::Fail);
    assert!(iommu.fix.as_deref().unwrap().contains("iommu=pt"));
    assert_eq!(report.worst("acs"), Some(Verdict::Pass));
    assert_eq!(report.worst("bar1"), Some(Verdict::Pass));
    let json = render::topo_json(&topology);
    assert_eq!(json["iommu"]["mode"], "translating");
    assert_eq!(json["pairs"][0]["issues"][0]["issue"], "iommu-translates");
}

#[test]
fn a_256_mib_bar1_fails_with_the_resizable_bar_fix() {
    let (topology, report) = analyze(&fixture("small-bar1"));
    for gpu in &topology.gpus {
        assert_eq!(gpu.aperture.bytes, Some(256 * MIB));
        assert_eq!(gpu.aperture.rebar_max_bytes, Some(32 * GIB));
        assert_eq!(gpu.aperture.verdict, ApertureVerdict::Insufficient);
    }
    let gpus = pair(&topology, "GPU0", "GPU1");
    // Different root complexes of one AMD socket: NODE, within the AMD limit,
    // so only the BAR size sends it through host memory.
    assert_eq!(gpus.link, PathClass::Node);
    assert_eq!(gpus.path, PathChoice::HostBounce);
    assert!(gpus.reason.contains("256 MiB"), "{}", gpus.reason);

    assert!(report.has_failures());
    let bar1: Vec<_> = report.checks_named("bar1").collect();
    assert_eq!(bar1.len(), 2);
    for check in bar1 {
        assert_eq!(check.verdict, Verdict::Fail);
        let fix = check.fix.as_deref().unwrap();
        assert!(
            fix.contains("Resizable BAR") && fix.contains("Above 4G"),
            "{fix}"
        );
        assert!(fix.contains("32 GiB"), "{fix}");
    }
    assert_eq!(report.worst("iommu"), Some(Verdict::Pass));
    assert_eq!(
        render::topo_json(&topology)["gpus"][1]["bar1_bytes"],
        256 * MIB
    );
}
