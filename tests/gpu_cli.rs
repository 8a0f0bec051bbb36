//! `barlink bench --gpu` and `barlink validate --gpu` as a user runs them:
//! exit 3 saying what is missing without a driver or a GPU, and against the
//! stand-in driver (`cuda/tests/mock/libcuda.c`) the whole of each command:
//! rows with the GPU named, a PASS, and a FAIL where device reads flip bits.

use std::path::PathBuf;
use std::process::{Command, Output};

use barlink::cuda::mock::{self, MockKind};

fn barlink(library: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(args)
        .env("BARLINK_CUDA_LIBRARY", library)
        .output()
        .expect("barlink runs")
}

fn mock_library(test: &str, kind: MockKind) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-mock");
    mock::build_or_skip(&dir, kind, test)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `bench --gpu --json` against `library` with a small schedule: its exit
/// status and rows.
fn bench_gpu(
    library: &std::path::Path,
    sizes: &str,
    windows: &str,
    lat_iters: &str,
) -> (Option<i32>, Vec<serde_json::Value>, String) {
    let output = barlink(
        library,
        &[
            "bench",
            "--gpu",
            "--json",
            "--sizes",
            sizes,
            "--windows",
            windows,
            "--lat-iters",
            lat_iters,
            "--bytes-per-window",
            "4M",
        ],
    );
    let rows = text(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    (output.status.code(), rows, text(&output.stderr))
}

#[test]
fn without_a_driver_or_a_gpu_both_commands_exit_3_saying_what_is_missing() {
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-libcuda.so.1");
    for command in [
        &["bench", "--gpu", "--quick"][..],
        &["validate", "--gpu", "--quick"],
    ] {
        let output = barlink(&missing, command);
        assert_eq!(output.status.code(), Some(3), "{command:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains("no CUDA driver"), "{stderr}");
        assert!(stderr.contains("BARLINK_CUDA_LIBRARY"), "{stderr}");
        assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    }
    let Some(no_device) = mock_library(
        "without_a_driver_or_a_gpu_both_commands_exit_3_saying_what_is_missing",
        MockKind::NoDevice,
    ) else {
        return;
    };
    let output = barlink(&no_device, &["validate", "--gpu"]);
    assert_eq!(output.status.code(), Some(3));
    assert!(
        text(&output.stderr).contains("no usable GPU"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn bench_gpu_rows_name_the_gpu_and_the_cpu_and_check_what_landed() {
    let Some(library) = mock_library(
        "bench_gpu_rows_name_the_gpu_and_the_cpu_and_check_what_landed",
        MockKind::OneDevice,
    ) else {
        return;
    };
    let (status, rows, stderr) = bench_gpu(&library, "4K,1M", "2", "5");
    assert_eq!(status, Some(0), "{stderr}");
    let paths: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap(),
                r["size_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        [
            ("barlink-gpu", 4096),
            ("cumemcpy-staged", 4096),
            ("barlink-gpu", 1 << 20),
            ("cumemcpy-staged", 1 << 20)
        ]
    );
    for row in &rows {
        assert_eq!(row["gpu"], "barlink mock GPU");
        assert_eq!(row["wrong"], 0);
        assert!(row["gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            row["cpu"].is_string() && row["copy_crc_kernel"].is_string(),
            "{row}"
        );
    }
    // The stand-in refuses CUDA IPC: the rows say so rather than leave the
    // baseline out silently.
    assert!(
        rows[0]["cuda_ipc_refused"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR_NOT_SUPPORTED")
    );
    assert!(rows[0]["ratio_to_cumemcpy_staged"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_gpu_counts_what_landed_wrong_and_exits_1() {
    let Some(library) = mock_library(
        "bench_gpu_counts_what_landed_wrong_and_exits_1",
        MockKind::FlipReads,
    ) else {
        return;
    };
    let (status, rows, stderr) = bench_gpu(&library, "1M", "4", "25");
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        rows.iter()
            .any(|r| r["path"] == "barlink-gpu" && r["wrong"].as_u64().unwrap() > 0),
        "{rows:?}"
    );
}

#[test]
fn validate_gpu_passes_a_sound_device_and_fails_one_whose_reads_flip_bits() {
    let test = "validate_gpu_passes_a_sound_device_and_fails_one_whose_reads_flip_bits";
    let (Some(sound), Some(flipping)) = (
        mock_library(test, MockKind::OneDevice),
        mock_library(test, MockKind::FlipReads),
    ) else {
        return;
    };
    let output = barlink(
        &sound,
        &["validate", "--gpu", "--quick", "--size", "8M", "--json"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["verdict"], "PASS", "{document}");
    assert!(document["link"]["messages"].as_u64().unwrap() > 10);

    let output = barlink(
        &flipping,
        &["validate", "--gpu", "--quick", "--size", "8M", "--json"],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["verdict"], "FAIL", "{document}");
    let bad: u64 = document["raw"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bad_words"].as_u64().unwrap())
        .sum();
    assert!(bad > 0, "{document}");
    assert!(
        document["link"]["wrong"].as_u64().unwrap() > 0,
        "{document}"
    );
}

/// The peer process's pid, found by the link name its parent gave it.
fn bench_peer_of(parent: u32) -> Option<i32> {
    let name = format!("--name=barlink-bench-gpu-{parent}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let is_peer = args.contains(&&b"bench-gpu-peer"[..]) && args.contains(&name.as_bytes());
            is_peer.then_some(pid)
        })
}

#[test]
fn bench_gpu_reports_a_peer_that_dies_within_the_peer_timeout() {
    let Some(library) = mock_library(
        "bench_gpu_reports_a_peer_that_dies_within_the_peer_timeout",
        MockKind::OneDevice,
    ) else {
        return;
    };
    let parent = Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(["bench", "--gpu", "--sizes", "1M", "--windows", "1000"])
        .env("BARLINK_CUDA_LIBRARY", &library)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let peer = loop {
        if let Some(pid) = bench_peer_of(parent.id()) {
            break pid;
        }
        assert!(
            started.elapsed().as_secs() < 20,
            "the bench's peer never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Let it get into its windows, then kill it outright.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let killed = Command::new("kill")
        .args(["-9", &peer.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let killed_at = std::time::Instant::now();
    let output = parent.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("peer lost"), "{stderr}");
    // The link's peer timeout is 2 s; allow for a loaded machine.
    assert!(
        killed_at.elapsed().as_secs() < 10,
        "{:?}",
        killed_at.elapsed()
    );
}
