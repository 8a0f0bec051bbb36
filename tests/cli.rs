//! The `barlink` command as a user runs it: output shapes, JSON fields and
//! exit statuses (0 ok, 1 check failed, 2 usage, 3 environment).

use std::path::PathBuf;
use std::process::{Command, Output};

fn barlink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(args)
        .env_remove("BARLINK_SIZES")
        .output()
        .expect("the barlink binary runs")
}

fn fixture(name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "sysfs",
        name,
    ]
    .iter()
    .collect();
    path.to_string_lossy().into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `--json` row output: one JSON object per line.
fn json_rows(output: &Output) -> Vec<serde_json::Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect()
}

#[test]
fn bench_json_has_one_object_per_row_with_the_documented_fields() {
    let output = barlink(&[
        "bench",
        "--path",
        "engine-mem",
        "--json",
        "--sizes",
        "64,4K",
        "--windows",
        "1",
        "--bytes-per-window",
        "1M",
        "--lat-iters",
        "20",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<serde_json::Value> = json_rows(&output);
    assert_eq!(rows.len(), 4, "two sizes, engine and baseline each");
    for row in &rows {
        for field in [
            "path",
            "size_bytes",
            "gbps",
            "lat_p50_us",
            "lat_p99_us",
            "retransmits",
            "crc_errors",
        ] {
            assert!(row.get(field).is_some(), "{field} missing from {row}");
        }
        assert!(row["gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["crc_errors"], 0);
    }
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["engine-mem", "memcpy", "engine-mem", "memcpy"]);
}

#[test]
fn bench_with_injected_corruption_catches_and_resends_every_one() {
    let output = barlink(&[
        "bench",
        "--path",
        "engine-mem",
        "--json",
        "--sizes",
        "64K",
        "--mtu",
        "4K",
        "--windows",
        "2",
        "--bytes-per-window",
        "8M",
        "--lat-iters",
        "10",
        "--fault-rate",
        "0.01",
    ]);
    assert!(output.status.success(), "{output:?}");
    let row: serde_json::Value =
        serde_json::from_str(stdout(&output).lines().next().unwrap()).unwrap();
    assert!(row["crc_errors"].as_u64().unwrap() > 0, "{row}");
    assert!(row["retransmits"].as_u64().unwrap() > 0, "{row}");
}

#[test]
fn bench_table_is_for_people() {
    let output = barlink(&[
        "bench",
        "--path",
        "engine-mem",
        "--sizes",
        "4K",
        "--windows",
        "1",
        "--bytes-per-window",
        "1M",
        "--lat-iters",
        "10",
    ]);
    assert!(output.status.success());
    let text = stdout(&output);
    assert!(
        text.contains("GB/s") && text.contains("vs memcpy"),
        "{text}"
    );
    assert!(text.contains("engine-mem") && text.contains("memcpy"));
}

#[test]
fn bench_between_processes_reports_barlink_and_its_baselines() {
    let output = barlink(&[
        "bench",
        "--json",
        "--sizes",
        "64,64K",
        "--windows",
        "1",
        "--bytes-per-window",
        "2M",
        "--lat-iters",
        "50",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<serde_json::Value> = json_rows(&output);
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "barlink",
            "raw-ring",
            "raw-ring-crc",
            "unix-socket",
            "barlink",
            "raw-ring",
            "raw-ring-crc",
            "unix-socket"
        ]
    );
    for row in &rows {
        for field in [
            "size_bytes",
            "gbps",
            "lat_p50_us",
            "lat_p99_us",
            "retransmits",
            "crc_errors",
            "ratio_to_raw_ring",
            "ratio_to_raw_ring_crc",
            "ratio_to_unix_socket",
            "gbps_min",
            "gbps_max",
        ] {
            assert!(row.get(field).is_some(), "{field} missing from {row}");
        }
        assert!(row["gbps"].as_f64().unwrap() > 0.0, "{row}");
        // The median window lies between the slowest and the fastest.
        let (low, high) = (
            row["gbps_min"].as_f64().unwrap(),
            row["gbps_max"].as_f64().unwrap(),
        );
        let median = row["gbps"].as_f64().unwrap();
        assert!(low <= median && median <= high, "{row}");
        assert_eq!(row["crc_errors"], 0, "{row}");
    }
}

/// `--progress thread`: the barlink links between the processes are driven
/// by background progress threads; rows say so, and everything arrives
/// (the child checks sizes and bytes).
#[test]
fn bench_with_progress_threads_moves_every_message() {
    let output = barlink(&[
        "bench",
        "--json",
        "--progress",
        "thread",
        "--paths",
        "barlink,raw-ring",
        "--sizes",
        "64,64K",
        "--windows",
        "1",
        "--bytes-per-window",
        "2M",
        "--lat-iters",
        "50",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<serde_json::Value> = json_rows(&output);
    let barlink_rows: Vec<_> = rows.iter().filter(|r| r["path"] == "barlink").collect();
    assert_eq!(barlink_rows.len(), 2, "{rows:?}");
    for row in barlink_rows {
        assert_eq!(row["progress"], "thread", "{row}");
        assert!(row["gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["lat_p50_us"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert!(
        rows.iter()
            .all(|r| r["path"] != "raw-ring" || r.get("progress").is_none())
    );
}

#[test]
fn a_short_soak_with_faults_loses_nothing_and_says_so() {
    let output = barlink(&["soak", "--duration", "3s", "--fault-rate", "0.01", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "final");
    assert!(last["messages"].as_u64().unwrap() > 100, "{last}");
    assert!(last["crc_failures_caught"].as_u64().unwrap() > 0, "{last}");
    assert!(last["retransmits"].as_u64().unwrap() > 0, "{last}");
    for field in ["lost", "corrupted", "duplicated"] {
        assert_eq!(last[field], 0, "{field}: {last}");
    }
}

#[test]
fn bench_between_processes_recovers_injected_faults_and_reports_goodput() {
    let output = barlink(&[
        "bench",
        "--quick",
        "--sizes",
        "4K",
        "--paths",
        "barlink",
        "--fault-rate",
        "0.01",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<serde_json::Value> = json_rows(&output);
    let faulty = rows
        .iter()
        .find(|row| row["path"] == "barlink-faults")
        .expect("a barlink-faults row");
    assert!(faulty["crc_errors"].as_u64().unwrap() > 0, "{faulty}");
    assert!(faulty["retransmits"].as_u64().unwrap() > 0, "{faulty}");
    assert!(faulty["ratio_to_clean"].as_f64().unwrap() > 0.0, "{faulty}");
    assert!(rows.iter().any(|row| row["path"] == "barlink"));
}

/// Messages larger than the 4 MiB ring cannot all be written in one round:
/// when the bench turns from the barlink link to the next path, what was
/// queued must already be on its way, or both processes wait on each other
/// (found by a 16 MiB run that timed out).
#[test]
fn bench_interleaves_paths_with_messages_larger_than_the_ring() {
    let output = barlink(&[
        "bench",
        "--sizes",
        "5M",
        "--windows",
        "1",
        "--bytes-per-window",
        "5M",
        "--lat-iters",
        "10",
        "--paths",
        "barlink,unix-socket",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("\"path\":\"barlink\""), "{text}");
    assert!(text.contains("\"path\":\"unix-socket\""), "{text}");
}

#[test]
fn bad_usage_exits_2_and_says_what_is_wrong() {
    for args in [
        &["bench", "--sizes", "4Q"][..],
        &["bench", "--fault-rate", "0.9"],
        &["bench", "--mtu", "100"],
        &["soak", "--duration", "5d"],
        &["topo", "--p2p-level", "FAR"],
        &["no-such-command"],
    ] {
        let output = barlink(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(!output.stderr.is_empty(), "{args:?} said nothing");
    }
}

#[test]
fn a_missing_sysfs_root_is_an_environment_problem() {
    let output = barlink(&["topo", "--sysfs-root", "/nonexistent-barlink-root"]);
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--sysfs-root"));
}

#[test]
fn topo_json_names_gpus_nics_and_pairs() {
    let output = barlink(&["topo", "--json", "--sysfs-root", &fixture("desktop-2x4090")]);
    assert!(output.status.success(), "{output:?}");
    let doc: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(doc["gpus"].as_array().unwrap().len(), 2);
    assert!(doc["gpus"][0]["bdf"].is_string());
    assert!(doc["gpus"][0]["bar1_bytes"].as_u64().unwrap() > 0);
    assert!(doc["nics"].is_array());
    let pair = &doc["pairs"][0];
    for field in ["a", "b", "link", "path", "reason"] {
        assert!(pair.get(field).is_some(), "{field} missing from {pair}");
    }
}

#[test]
fn doctor_exits_1_on_a_platform_that_breaks_p2p() {
    for (name, expected) in [
        ("desktop-2x4090", 0),
        ("acs-cascade-4gpu", 1),
        ("iommu-translating", 1),
        ("small-bar1", 1),
    ] {
        let output = barlink(&["doctor", "--sysfs-root", &fixture(name)]);
        assert_eq!(
            output.status.code(),
            Some(expected),
            "{name}: {}",
            stdout(&output)
        );
        let text = stdout(&output);
        if expected == 1 {
            assert!(text.contains("FAIL"), "{name}: {text}");
        }
    }
}

#[test]
fn doctor_on_this_machine_says_what_it_found() {
    let output = barlink(&["doctor", "--json"]);
    assert!(matches!(output.status.code(), Some(0 | 1)), "{output:?}");
    let doc: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert!(doc.is_object());
}

/// `BARLINK_LOG` filters the log on stderr (stdout stays the report); a
/// filter that does not parse is reported and ignored, never fatal.
#[test]
fn barlink_log_filters_the_log_on_stderr() {
    let run = |filter: &str| {
        Command::new(env!("CARGO_BIN_EXE_barlink"))
            .args(["bench", "--json", "--sizes", "4K", "--windows", "1"])
            .args([
                "--bytes-per-window",
                "1M",
                "--lat-iters",
                "10",
                "--paths",
                "barlink",
            ])
            .env("BARLINK_LOG", filter)
            .output()
            .expect("the barlink binary runs")
    };
    let output = run("barlink_transport=info");
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("memfd rings exchanged"), "{stderr}");
    assert!(json_rows(&output).iter().all(|r| r["path"] == "barlink"));
    let quiet = run("warn");
    assert!(quiet.status.success(), "{quiet:?}");
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("INFO"));
    let bad = run("barlink_transport=[");
    assert!(bad.status.success(), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a log filter"));
}
