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

/// How this test binary, and so the `barlink` under test, was built.
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
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
    // A debug build says its figures are not barlink's speed.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.contains("not barlink's speed"),
        build_profile() == "debug",
        "{stderr}"
    );
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
        // Every figure says where it came from: the CPU and the kernels.
        for field in ["cpu", "copy_crc_kernel", "crc_kernel", "copy_kernel"] {
            let value = row[field].as_str().unwrap_or_default();
            assert!(!value.is_empty(), "{field} missing from {row}");
        }
        assert!(row["cpu_features"].is_array(), "{row}");
        // And the build: the binary under test has the tests' profile.
        assert_eq!(row["build"], build_profile(), "{row}");
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

/// `--lat-iters` is how many round trips each path's latency comes from,
/// however many are asked for (it was held at 2000 once, silently).
#[test]
fn bench_between_processes_times_as_many_round_trips_as_asked() {
    let output = barlink(&[
        "bench",
        "--json",
        "--sizes",
        "64",
        "--paths",
        "barlink,raw-ring",
        "--windows",
        "1",
        "--bytes-per-window",
        "1M",
        "--lat-iters",
        "2345",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<serde_json::Value> = json_rows(&output);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert_eq!(row["lat_samples"], 2345, "{row}");
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

/// A co-tenant scribbling over both rings, control blocks included: the
/// link skips the index words it cannot use and loses nothing.
#[test]
fn a_soak_under_a_scribbling_co_tenant_loses_nothing_and_counts_missed_indices() {
    let output = barlink(&[
        "soak",
        "--duration",
        "3s",
        "--fault-rate",
        "0",
        "--scribble",
        "2000",
        "--scribble-control",
        "0.3",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "final");
    assert!(last["messages"].as_u64().unwrap() > 100, "{last}");
    assert!(
        last["scribbled_into_control"].as_u64().unwrap() > 0,
        "{last}"
    );
    assert!(last["index_words_corrupt"].as_u64().unwrap() > 0, "{last}");
    assert!(last["goodput_gbps"].as_f64().unwrap() > 0.0, "{last}");
    for field in ["lost", "corrupted", "duplicated", "failed_with_error"] {
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

/// A `barlink bench` between two processes that runs long enough to be
/// killed in the middle (the child is the second process).
fn start_long_bench(stderr: std::process::Stdio) -> (std::process::Child, u32) {
    use std::process::Stdio;
    let parent = Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(["bench", "--sizes", "1M,16M", "--windows", "40"])
        .args(["--paths", "barlink"])
        .env_remove("BARLINK_SIZES")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("the barlink binary runs");
    let started = std::time::Instant::now();
    let child = loop {
        if let Some(child) = child_of(parent.id()) {
            break child;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "bench started no peer process"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Let both get into their timed windows.
    std::thread::sleep(std::time::Duration::from_secs(2));
    (parent, child)
}

/// A process whose parent is `parent`, from /proc.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        (process_state(pid)?.1 == parent).then_some(pid)
    })
}

/// A process's state letter and parent, from /proc/PID/stat; `None` once
/// it is gone.
fn process_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE PPID ...": the name may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

fn kill_9(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -9 {pid}");
}

/// Waits for `child` to exit, at most `limit`.
fn exit_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// `bench`'s two processes watch each other. A peer killed with SIGKILL is
/// reported by the parent as lost (which process, in which phase) within
/// the link's default peer timeout (2 s), exit status 1; a parent killed
/// so takes its peer down within as long. (Both used to wait out their
/// 60-second step timeouts.)
#[test]
fn bench_processes_watch_each_other_through_kill_9() {
    use std::io::Read;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    const PEER_TIMEOUT: Duration = Duration::from_secs(2);

    let (mut parent, child) = start_long_bench(Stdio::piped());
    kill_9(child);
    let killed = Instant::now();
    let status = exit_within(&mut parent, Duration::from_secs(10));
    let noticed = killed.elapsed();
    if status.is_none() {
        let _ = parent.kill();
    }
    let mut stderr = String::new();
    parent
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = status
        .unwrap_or_else(|| panic!("the parent did not notice its peer's death in 10 s: {stderr}"));
    assert!(
        noticed <= PEER_TIMEOUT,
        "noticed after {noticed:?}: {stderr}"
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("lost the peer process")
            && stderr.contains(&format!("pid {child}"))
            && stderr.contains(" during size "),
        "which process, in which phase: {stderr}"
    );

    let (mut parent, child) = start_long_bench(Stdio::null());
    kill_9(parent.id());
    let killed = Instant::now();
    parent.wait().unwrap();
    let gone = loop {
        // Gone, or a zombie waiting for whoever adopted it.
        if process_state(child).is_none_or(|(state, _)| state == 'Z') {
            break true;
        }
        if killed.elapsed() > Duration::from_secs(10) {
            kill_9(child);
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = killed.elapsed();
    assert!(gone, "the peer outlived its parent by 10 s");
    assert!(
        took <= PEER_TIMEOUT,
        "the peer outlived its parent by {took:?}"
    );
}

#[test]
fn keygen_writes_secrets_only_the_owner_reads_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("barlink-keygen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("node.key");
    let output = barlink(&["keygen", "--out", key.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let public = report["public_key"].as_str().unwrap().to_string();
    assert_eq!(public.len(), 64);
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key), 0o600);
    let pub_file = dir.join("node.key.pub");
    assert_eq!(std::fs::read_to_string(&pub_file).unwrap().trim(), public);
    // The public key is the private key's: the library derives the same.
    let auth = barlink::transport::auth::PeerAuth::pinned_key_files(&key, &pub_file).unwrap();
    assert!(auth.describe().contains(&public), "{}", auth.describe());
    let again = barlink(&["keygen", "--out", key.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));
    let psk = dir.join("psk");
    let output = barlink(&["keygen", "--psk", "--out", psk.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(mode(&psk), 0o600);
    barlink::transport::auth::PeerAuth::psk_file(&psk).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn doctor_says_whether_remote_setup_is_authenticated() {
    let dir = std::env::temp_dir().join(format!("barlink-doctor-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let psk = dir.join("psk");
    assert!(
        barlink(&["keygen", "--psk", "--out", psk.to_str().unwrap()])
            .status
            .success()
    );
    let check = |envs: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_barlink"));
        command.args([
            "doctor",
            "--json",
            "--sysfs-root",
            &fixture("desktop-2x4090"),
        ]);
        for var in [
            "BARLINK_PSK_FILE",
            "BARLINK_PSK",
            "BARLINK_KEY_FILE",
            "BARLINK_PEER_KEYS",
        ] {
            command.env_remove(var);
        }
        command.envs(envs.iter().copied());
        let report: serde_json::Value =
            serde_json::from_slice(&command.output().unwrap().stdout).unwrap();
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "remote-auth")
            .cloned()
            .expect("a remote-auth check")
    };
    let configured = check(&[("BARLINK_PSK_FILE", psk.to_str().unwrap())]);
    assert_eq!(configured["status"], "PASS", "{configured}");
    assert!(
        configured["message"]
            .as_str()
            .unwrap()
            .contains("pre-shared key")
    );
    let broken = check(&[("BARLINK_PSK_FILE", "/nonexistent/psk")]);
    assert_eq!(broken["status"], "FAIL", "{broken}");
    let none = check(&[]);
    assert!(
        none["message"].as_str().unwrap().contains("--insecure"),
        "{none}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--paths barlink,barlink-copied,barlink-acked` measures the link three
/// times in one run: sending one shared buffer, sending a copy made for
/// each message (the baseline of the C face's copying calls), and sending
/// the one buffer again only once each message was acknowledged (that of
/// a blocking C send that lends its bytes). The rows come, in that order,
/// with every message delivered, the last two with their ratio to the
/// first.
#[test]
fn bench_measures_the_link_sending_copies_and_awaiting_each_message_beside_the_shared_buffer() {
    let output = Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args([
            "bench",
            "--quick",
            "--json",
            "--sizes",
            "64K",
            "--windows",
            "1",
        ])
        .args(["--paths", "barlink,barlink-copied,barlink-acked"])
        .env_remove("BARLINK_SIZES")
        .output()
        .expect("the barlink binary runs");
    assert!(output.status.success(), "{output:?}");
    let rows = json_rows(&output);
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["barlink", "barlink-copied", "barlink-acked"],
        "{rows:?}"
    );
    for row in &rows {
        assert!(row["gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["crc_errors"], 0, "{row}");
        assert!(row.get("ratio_to_raw_ring").is_none(), "{row}");
    }
    // The copies' and the awaited messages' rows say how they compare with
    // the shared buffer's.
    assert!(rows[0].get("ratio_to_barlink").is_none(), "{}", rows[0]);
    for row in &rows[1..] {
        let ratio = row["ratio_to_barlink"].as_f64().unwrap();
        let expected = row["gbps"].as_f64().unwrap() / rows[0]["gbps"].as_f64().unwrap();
        assert!(
            (ratio - expected).abs() < 0.01,
            "{ratio} against {expected}: {row}"
        );
    }
    // The table says it in a line of its own; alone, the copies have
    // nothing to be compared with.
    let table = |paths: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_barlink"))
            .args(["bench", "--quick", "--sizes", "64K", "--windows", "1"])
            .args(["--paths", paths])
            .env_remove("BARLINK_SIZES")
            .output()
            .expect("the barlink binary runs");
        assert!(output.status.success(), "{output:?}");
        stdout(&output)
    };
    let all_three = table("barlink,barlink-copied,barlink-acked");
    assert!(
        all_three.contains("a copy made for each message"),
        "{all_three}"
    );
    assert!(
        all_three.contains("each message acknowledged before the next"),
        "{all_three}"
    );
    assert!(!table("barlink-copied").contains("a copy made for each message"));
    assert!(!table("barlink-acked").contains("each message acknowledged before the next"));
}

/// `BARLINK_CPU_ISA` that names no limit is refused before anything runs
/// (exit 2, naming the variable and its values), not ignored.
#[test]
fn a_cpu_isa_limit_that_names_none_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(["bench", "--quick", "--sizes", "64", "--paths", "barlink"])
        .env("BARLINK_CPU_ISA", "avx-512")
        .output()
        .expect("the barlink binary runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("BARLINK_CPU_ISA") && stderr.contains("avx2"),
        "{stderr}"
    );
    assert!(stdout(&output).is_empty(), "nothing measured: {output:?}");
}

/// `BARLINK_CPU_ISA=portable` takes barlink's own kernels out on any CPU:
/// the rows (the parent's report; the child inherits the variable) say
/// the kernels were limited and name the portable ones, and every message
/// still arrives checked.
#[test]
fn a_cpu_isa_limit_reaches_the_kernels_and_every_row() {
    let run = |limit: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_barlink"));
        command.args([
            "bench",
            "--json",
            "--sizes",
            "4K",
            "--paths",
            "barlink",
            "--windows",
            "1",
            "--bytes-per-window",
            "1M",
            "--lat-iters",
            "10",
        ]);
        command.env_remove("BARLINK_CPU_ISA");
        if let Some(limit) = limit {
            command.env("BARLINK_CPU_ISA", limit);
        }
        let output = command.output().expect("the barlink binary runs");
        assert!(output.status.success(), "{output:?}");
        json_rows(&output)
    };
    for row in run(Some("PORTABLE")) {
        assert_eq!(row["cpu_isa_limit"], "portable", "{row}");
        assert_eq!(row["copy_crc_kernel"], "copy, then crc-fast", "{row}");
        assert_eq!(row["crc_kernel"], "crc-fast", "{row}");
        assert_eq!(row["crc_errors"], 0, "{row}");
    }
    for row in run(None) {
        assert!(row["cpu_isa_limit"].is_null(), "{row}");
    }
}
