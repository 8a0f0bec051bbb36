//! `barlink validate` as a user runs it: the verdicts and their exit
//! statuses (0 PASS/WARN, 1 FAIL, 2 usage, 3 environment), the JSON
//! document, fault injection caught by both phases, and BARs mapped from a
//! sysfs fixture tree (ordinary files standing in for `resourceN`).

use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Runs `barlink validate ARGS` with none of the environment's BARLINK_*
/// options, killed if it runs past two minutes.
fn validate(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_barlink"));
    command.arg("validate").args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BARLINK_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the barlink binary runs");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for barlink") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let status = child.wait().expect("waiting for barlink");
            panic!("barlink validate {args:?} ran past 120 s and was killed ({status})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn json_of(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn patterns(doc: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = doc["raw"]["patterns"]
        .as_array()
        .expect("raw.patterns")
        .iter()
        .map(|p| p["pattern"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn shared_memory_passes_with_every_pattern_and_message_checked() {
    let output = validate(&["--quick", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "PASS", "{doc}");
    assert_eq!(doc["target"], "shm");
    assert_eq!(
        patterns(&doc),
        ["address-in-address", "random", "walking-ones"]
    );
    // Two windows, three patterns each, every range clean.
    let raw = doc["raw"]["patterns"].as_array().unwrap();
    assert_eq!(raw.len(), 6);
    for entry in raw {
        assert_eq!(entry["bad_words"], 0, "{entry}");
        assert!(entry["bytes"].as_u64().unwrap() >= 64 << 10);
        assert!(!entry["ranges"].as_array().unwrap().is_empty());
    }
    let link = &doc["link"];
    assert!(link["messages"].as_u64().unwrap() > 0, "{link}");
    assert!(link["bytes"].as_u64().unwrap() > 0, "{link}");
    for field in ["crc_failures_caught", "lost", "corrupted", "duplicated"] {
        assert_eq!(link[field], 0, "{field}: {link}");
    }
    assert!(link["error"].is_null(), "{link}");
    assert_eq!(link["directions"].as_array().unwrap().len(), 2);
}

#[test]
fn the_text_report_ends_with_the_verdict_line() {
    let output = validate(&["--size", "256K", "--link-bytes", "2M"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "phase 1: raw window writes",
        "walking-ones",
        "address-in-address",
        "random",
        "phase 2: through the link",
        "A->B",
        "B->A",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("validate: PASS — "), "{last}");
}

#[test]
fn injected_faults_are_found_raw_and_caught_by_the_link_with_nothing_corrupted() {
    let output = validate(&["--quick", "--json", "--inject-faults", "0.01"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "FAIL", "{doc}");
    let raw = &doc["raw"];
    assert!(raw["bad_words"].as_u64().unwrap() > 0, "{raw}");
    assert!(raw["injected_bit_flips"].as_u64().unwrap() > 0, "{raw}");
    // Every flipped bit was found: each injected flip spoils one word (two
    // in one word are possible but rare at this rate and size).
    let flipped: u64 = raw["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["flipped_bits"].as_u64().unwrap())
        .sum();
    assert_eq!(
        flipped,
        raw["injected_bit_flips"].as_u64().unwrap(),
        "{raw}"
    );
    // Errors are placed in ranges, with the first ones named.
    let bad = raw["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["bad_words"].as_u64().unwrap() > 0)
        .unwrap();
    let in_ranges: u64 = bad["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bad_words"].as_u64().unwrap())
        .sum();
    assert_eq!(in_ranges, bad["bad_words"].as_u64().unwrap(), "{bad}");
    let first = &bad["first_errors"][0];
    assert_ne!(first["expected"], first["found"], "{bad}");
    let link = &doc["link"];
    assert!(link["crc_failures_caught"].as_u64().unwrap() > 0, "{link}");
    assert!(link["retransmits"].as_u64().unwrap() > 0, "{link}");
    for field in ["lost", "corrupted", "duplicated"] {
        assert_eq!(link[field], 0, "{field}: {link}");
    }
    assert!(link["error"].is_null(), "{link}");
}

#[test]
fn corruption_only_under_the_link_is_a_warning_and_strict_fails_it() {
    let args = [
        "--size",
        "256K",
        "--link-bytes",
        "4M",
        "--inject-faults",
        "0.02",
        "--inject-into",
        "link",
    ];
    let output = validate(&[&args[..], &["--json"]].concat());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "WARN", "{doc}");
    assert_eq!(doc["raw"]["bad_words"], 0);
    assert!(doc["link"]["crc_failures_caught"].as_u64().unwrap() > 0);
    assert_eq!(doc["link"]["corrupted"], 0);
    let strict = validate(&[&args[..], &["--strict"]].concat());
    assert_eq!(strict.status.code(), Some(1), "{}", stderr(&strict));
    let text = String::from_utf8_lossy(&strict.stdout);
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("validate: WARN — "),
        "{text}"
    );
}

#[test]
fn a_link_that_runs_out_of_time_fails_with_its_error_not_with_silent_loss() {
    let output = validate(&[
        "--json",
        "--size",
        "256K",
        "--link-bytes",
        "64G",
        "--timeout",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "FAIL", "{doc}");
    let link = &doc["link"];
    assert!(
        link["error"].as_str().unwrap().contains("timed out"),
        "{link}"
    );
    assert!(link["undelivered"].as_u64().unwrap() > 0, "{link}");
    for field in ["lost", "corrupted", "duplicated"] {
        assert_eq!(link[field], 0, "{field}: {link}");
    }
    assert!(
        doc["reason"].as_str().unwrap().contains("the link failed"),
        "{doc}"
    );
}

#[test]
fn a_missing_device_is_an_environment_problem_that_says_what_to_check() {
    let output = validate(&["--quick", "--device", "0000:ff:1f.7"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let text = stderr(&output);
    assert!(
        text.contains("0000:ff:1f.7") && text.contains("lspci"),
        "{text}"
    );
    // By vendor:device, under a root with no such device.
    let fixture = Fixture::new();
    fixture.device("0000:00:11.0", 1 << 20);
    let output = validate(&[
        "--quick",
        "--device",
        "1234:5678",
        "--sysfs-root",
        fixture.root(),
    ]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(
        stderr(&output).contains("lspci -nn -d 1234:5678"),
        "{output:?}"
    );
}

#[test]
fn bad_usage_exits_2_and_says_what_is_wrong() {
    for args in [
        &["--size", "4Q"][..],
        &["--size", "1000"],
        &["--inject-faults", "2"],
        &["--inject-into", "everything"],
        &["--via", "magic"],
        &["--device", "not-a-device"],
        &["--device", "0000:00:10.0,0000:00:11.0,0000:00:12.0"],
        &["--offset", "4K"],
        &["--bar", "2"],
        &["--messages", "0"],
        &["--max-size", "4"],
        &["--mtu", "100"],
        &["--messages", "10", "--link-bytes", "1M"],
    ] {
        let output = validate(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(!output.stderr.is_empty(), "{args:?} said nothing");
    }
}

// ------------------------------------------------------------------ sysfs fixtures

/// A sysfs tree whose `resourceN` files are ordinary files: mmap of a
/// regular file behaves like mmap of a BAR file for everything but caching.
struct Fixture {
    root: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Fixture {
    fn new() -> Fixture {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!(
            "barlink-validate-fixture-{}-{n}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        Fixture { root }
    }

    fn root(&self) -> &str {
        self.root.to_str().unwrap()
    }

    fn dir(&self, bdf: &str) -> PathBuf {
        self.root.join("sys/bus/pci/devices").join(bdf)
    }

    /// An ivshmem-like device: BAR 0 256 bytes of registers, BAR 2 of
    /// `bar2` bytes, prefetchable (so `resource2_wc` exists too).
    fn device(&self, bdf: &str, bar2: u64) {
        let dir = self.dir(bdf);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), "0x1af4\n").unwrap();
        fs::write(dir.join("device"), "0x1110\n").unwrap();
        let mut lines =
            vec![String::from("0x0000000000000000 0x0000000000000000 0x0000000000000000"); 13];
        lines[0] = "0x00000000fe000000 0x00000000fe0000ff 0x0000000000040200".into();
        lines[2] = format!(
            "0x0000000400000000 0x{:016x} 0x000000000014220c",
            0x4_0000_0000u64 + bar2 - 1
        );
        fs::write(dir.join("resource"), lines.join("\n") + "\n").unwrap();
        fs::File::create(dir.join("resource0"))
            .unwrap()
            .set_len(256)
            .unwrap();
        for name in ["resource2", "resource2_wc"] {
            fs::File::create(dir.join(name))
                .unwrap()
                .set_len(bar2)
                .unwrap();
        }
    }

    fn bar_file(&self, bdf: &str) -> Vec<u8> {
        fs::read(self.dir(bdf).join("resource2_wc")).unwrap()
    }
}

#[test]
fn one_sysfs_bar_holds_both_rings_and_passes() {
    let fixture = Fixture::new();
    fixture.device("0000:00:11.0", 8 << 20);
    let output = validate(&[
        "--quick",
        "--json",
        "--device",
        "0000:00:11.0",
        "--sysfs-root",
        fixture.root(),
        "--offset",
        "1M",
        "--size",
        "2M",
        "--link-bytes",
        "4M",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "PASS", "{doc}");
    assert_eq!(doc["target"], "device");
    let device = &doc["devices"][0];
    assert_eq!(device["bdf"], "0000:00:11.0");
    assert_eq!(device["bar"], 2, "the largest memory BAR: {device}");
    assert_eq!(device["via"], "sysfs");
    assert!(
        device["source"].as_str().unwrap().contains("resource2_wc"),
        "{device}"
    );
    assert_eq!(patterns(&doc).len(), 3);
    assert!(doc["link"]["messages"].as_u64().unwrap() > 0);
    // The address-in-address pattern reports offsets in the BAR.
    assert_eq!(doc["raw"]["patterns"][0]["offset"], 1 << 20);
    // Only the tested range was written: outside it the file is still zero.
    let file = fixture.bar_file("0000:00:11.0");
    assert!(file[..1 << 20].iter().all(|&b| b == 0));
    assert!(file[3 << 20..].iter().all(|&b| b == 0));
    assert!(file[1 << 20..3 << 20].iter().any(|&b| b != 0));
}

#[test]
fn two_sysfs_bars_are_one_receive_window_each() {
    let fixture = Fixture::new();
    fixture.device("0000:00:10.0", 4 << 20);
    fixture.device("0000:00:11.0", 4 << 20);
    let output = validate(&[
        "--json",
        "--device",
        "0000:00:10.0,0000:00:11.0",
        "--via",
        "sysfs",
        "--sysfs-root",
        fixture.root(),
        "--link-bytes",
        "4M",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let doc = json_of(&output);
    assert_eq!(doc["verdict"], "PASS", "{doc}");
    assert_eq!(doc["devices"].as_array().unwrap().len(), 2);
    // The default size: the whole BAR.
    assert_eq!(doc["size_bytes"], 4 << 20);
    let windows: Vec<&str> = doc["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(windows, ["0000:00:10.0", "0000:00:11.0"]);
    // Each BAR carried a ring: both files hold a ring's magic at 0.
    for bdf in ["0000:00:10.0", "0000:00:11.0"] {
        let file = fixture.bar_file(bdf);
        assert_eq!(
            file[..8],
            barlink_transport::ring::RING_MAGIC.to_le_bytes(),
            "{bdf}: no ring control block"
        );
    }
}

#[test]
fn a_sysfs_bar_that_is_too_small_or_missing_is_refused_clearly() {
    let fixture = Fixture::new();
    fixture.device("0000:00:11.0", 1 << 20);
    // An offset past the BAR: usage.
    let output = validate(&[
        "--device",
        "0000:00:11.0",
        "--sysfs-root",
        fixture.root(),
        "--offset",
        "2M",
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(stderr(&output).contains("beyond the BAR"), "{output:?}");
    // A BAR the device does not have: environment, naming the file.
    let output = validate(&[
        "--device",
        "0000:00:11.0",
        "--sysfs-root",
        fixture.root(),
        "--bar",
        "4",
        "--size",
        "64K",
    ]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(stderr(&output).contains("BAR"), "{output:?}");
    // VFIO asked for, but the device is not bound to vfio-pci.
    let output = validate(&[
        "--device",
        "0000:00:11.0",
        "--sysfs-root",
        fixture.root(),
        "--via",
        "vfio",
    ]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
}
