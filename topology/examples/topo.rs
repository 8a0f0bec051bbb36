//! Prints the topology report and the doctor report for a sysfs root, the
//! way `barlink topo` and `barlink doctor` do, without building the CLI:
//!
//! `cargo run -p barlink-topology --example topo -- [ROOT] [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use barlink_topology::{PathPolicy, Topology, doctor, render};

fn main() -> ExitCode {
    let mut root = PathBuf::from("/");
    let mut json = false;
    for arg in std::env::args().skip(1) {
        if arg == "--json" {
            json = true;
        } else {
            root = PathBuf::from(arg);
        }
    }
    let topology = match Topology::discover(&root, PathPolicy::default()) {
        Ok(topology) => topology,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(3);
        }
    };
    let report = doctor::run(&topology);
    if json {
        let document = serde_json::json!({
            "topo": render::topo_json(&topology),
            "doctor": report.to_json(),
        });
        println!("{document:#}");
    } else {
        print!("{}", render::topo_text(&topology));
        println!();
        print!("{}", report.render_text());
    }
    if report.has_failures() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
