//! Discovery on the machine running the tests. On the development VM there
//! are no GPUs: the report must say so and still list what it saw. On a GPU
//! machine the same test checks that the matrix is produced.

use std::path::Path;

use barlink_topology::{PathPolicy, Topology, Verdict, doctor, render};

#[test]
fn discovery_on_this_machine_reports_what_it_sees() {
    let topology = match Topology::discover(Path::new("/"), PathPolicy::default()) {
        Ok(topology) => topology,
        Err(error) => {
            // No sysfs at all (a bare container): the error must say where it looked.
            assert!(error.to_string().contains("sysfs root /"), "{error}");
            return;
        }
    };
    let text = render::topo_text(&topology);
    let json = render::topo_json(&topology);
    let report = doctor::run(&topology);
    let report_text = report.render_text();
    assert!(json["devices"].is_array());
    if topology.gpus.is_empty() {
        assert!(text.contains("No GPUs found."), "{text}");
        for bdf in topology.platform.devices.keys() {
            assert!(text.contains(&bdf.to_string()), "{bdf} not listed:\n{text}");
        }
        let gpus = report.checks_named("gpus").next().unwrap();
        assert_eq!(gpus.verdict, Verdict::Warn);
        assert!(gpus.message.contains("no GPUs found"), "{}", gpus.message);
        assert!(report_text.contains("WARN  gpus"));
        assert!(!report.has_failures(), "{report_text}");
    } else {
        assert!(text.contains("GPU0"));
        assert!(json["gpus"].as_array().is_some_and(|g| !g.is_empty()));
    }
}
