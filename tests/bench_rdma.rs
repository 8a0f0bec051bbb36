//! `barlink bench --rdma` on a host without RDMA (as this project's CI
//! hosts are): a clean exit 3 that names what is missing, before anything
//! listens or connects; and its usage errors (exit 2). The runs between
//! two machines are in the QEMU guest (`tests/rdma_guest.rs`).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn barlink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_barlink"))
        .args(args)
        .env_remove("BARLINK_SIZES")
        .env_remove("BARLINK_RDMA_DEVICE")
        .env_remove("BARLINK_GID_INDEX")
        .output()
        .expect("the barlink binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Whether this host has RDMA devices (then the no-RDMA checks do not
/// apply, and the test says SKIPPED).
fn rdma_here(test: &str) -> bool {
    match barlink::rdma::device::devices() {
        Ok(devices) if !devices.is_empty() => {
            let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            eprintln!("SKIPPED {test}: this host has RDMA devices ({names:?})");
            true
        }
        _ => false,
    }
}

fn assert_clean_no_rdma(output: &Output) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(3), "exit 3 expected: {output:?}");
    assert!(output.stdout.is_empty(), "nothing on stdout: {output:?}");
    assert!(
        text.starts_with("barlink: bench --rdma: no RDMA path from this host: "),
        "{text}"
    );
    // What is missing, by name: the library, or a device.
    assert!(
        text.contains("RDMA not available") && text.contains("libibverbs")
            || text.contains("no RDMA device"),
        "{text}"
    );
    // ... and what to do about it.
    assert!(
        text.contains("install libibverbs1") || text.contains("ibv_devices"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "one line, no backtrace: {text}");
}

#[test]
fn client_without_rdma_exits_3_naming_what_is_missing() {
    if rdma_here("client_without_rdma_exits_3_naming_what_is_missing") {
        return;
    }
    let started = Instant::now();
    // A port where nobody listens: the command must not get that far.
    let output = barlink(&["bench", "--rdma", "127.0.0.1:9", "--quick"]);
    assert_clean_no_rdma(&output);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}: it tried to connect",
        started.elapsed()
    );
    let output = barlink(&["bench", "--rdma", "localhost", "--json"]);
    assert_clean_no_rdma(&output);
}

#[test]
fn server_without_rdma_exits_3_before_listening() {
    if rdma_here("server_without_rdma_exits_3_before_listening") {
        return;
    }
    let started = Instant::now();
    let output = barlink(&[
        "bench",
        "--rdma",
        "--server",
        "--listen",
        "127.0.0.1:0",
        "--accept-timeout",
        "30",
    ]);
    assert_clean_no_rdma(&output);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn rdma_usage_errors_exit_2() {
    for (args, expected) in [
        (&["bench", "--rdma"][..], "needs a role"),
        (
            &["bench", "--rdma", "--server", "host"][..],
            "cannot be used with",
        ),
        (&["bench", "--server"][..], "--rdma"),
        (&["bench", "--rdma", "host:port"][..], "is not a number"),
        (
            &["bench", "--rdma", "h", "--fault-rate", "0.1"][..],
            "--fault-rate",
        ),
        (&["bench", "--rdma", "h", "--sizes", "0"][..], "--sizes"),
        (
            &["bench", "--rdma", "h", "--insecure", "--psk-file", "f"][..],
            "cannot be used with",
        ),
        (
            &["bench", "--rdma", "h", "--key-file", "f"][..],
            "--peer-keys",
        ),
        (
            &["bench", "--rdma", "h:1", "--psk-file", "/nonexistent/psk"][..],
            "key /nonexistent/psk: cannot read it",
        ),
    ] {
        let output = barlink(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(stderr(&output).contains(expected), "{args:?}: {output:?}");
    }
}
