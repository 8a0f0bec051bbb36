//! The C ABI in the QEMU guests of `tests/vm/run.sh`, through the C++
//! example a server would start from (`examples/cpp/kv_transfer.cpp`,
//! built by `run.sh` against `libbarlink_c.a`): a prefill process hands a
//! KV cache to a decode process, which verifies every block.
//!
//! - `guest_*` run in the one guest: over soft-RoCE (`rdma://` to the
//!   guest's own address), and over two ivshmem BARs named in the config.
//! - `two_guests_*` run in both guests of the second phase: decode in the
//!   server guest, prefill in the client, over soft-RoCE between them.
//!
//! Every test is `#[ignore]`d; anywhere but the guest each prints
//! `SKIPPED <name>: ...` and returns. Speed under emulation means nothing:
//! the figures are printed, never asserted.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/support/guest.rs"]
mod guest_support;

use guest_support::{
    Side, enable_for_sysfs, in_guest, ivshmem_addresses, say, skipped, two_guests,
    wait_with_deadline,
};

/// A small KV cache: rxe under TCG moves tens of MB/s.
const PLAN: &[&str] = &["--layers", "2", "--blocks", "16"];
const BLOCKS: usize = 32;
/// Generous under emulation: setup may wait for the other guest to boot.
const TIMEOUTS: &[&str] = &["--setup-timeout-ms", "120000", "--peer-timeout-ms", "30000"];
const LIMIT: Duration = Duration::from_secs(200);
const PORT_ONE: u16 = 18680;
const PORT_TWO: u16 = 18690;

/// The example's path in the guest, or why not: `run.sh` builds it and
/// names it in `BARLINK_VM_KV_TRANSFER`, so in the guest its absence is a
/// failure, not a skip.
fn kv_transfer(test: &str) -> Option<String> {
    if !in_guest(test) {
        return None;
    }
    match std::env::var("BARLINK_VM_KV_TRANSFER") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => panic!(
            "BARLINK_VM_KV_TRANSFER is not set: run.sh did not build examples/cpp/kv_transfer.cpp (see its log)"
        ),
    }
}

/// The guest's soft-RoCE device and address, or `None` after saying
/// `SKIPPED` (a guest run with --no-rdma).
fn rdma(test: &str) -> Option<(String, String, Option<String>)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var("BARLINK_VM_RDMA_DEV"), var("BARLINK_VM_RDMA_IP")) {
        (Some(dev), Some(ip)) => Some((dev, ip, var("BARLINK_VM_RDMA_GID"))),
        _ => {
            skipped(
                test,
                "needs soft-RoCE in the guest (run.sh sets BARLINK_VM_RDMA_DEV and BARLINK_VM_RDMA_IP)",
            );
            None
        }
    }
}

/// A file holding a pre-shared key, mode 600, the same in both guests.
fn psk_file() -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("barlink-ffi-psk-{}", std::process::id()));
    std::fs::write(&path, format!("{}\n", "3c".repeat(32))).expect("writing the key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path.display().to_string()
}

/// The example with the RDMA settings soft-RoCE under emulation needs,
/// given as a C program's user gives them: in the environment.
fn over_rdma(exe: &str, dev: &str, gid: Option<&str>, args: &[&str]) -> Command {
    let mut command = Command::new(exe);
    command
        .args(PLAN)
        .args(TIMEOUTS)
        .args(args)
        .env("BARLINK_PSK_FILE", psk_file())
        .env("BARLINK_RDMA_DEVICE", dev)
        .env("BARLINK_QP_TIMEOUT", "18");
    if let Some(gid) = gid {
        command.env("BARLINK_GID_INDEX", gid);
    }
    command
}

/// Runs the command to its end within [`LIMIT`]; its stdout and stderr.
fn run(mut command: Command, what: &str) -> (bool, String) {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = wait_with_deadline(&mut child, LIMIT, what);
    let text = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    say(&format!(
        "{what} ({status}, {:.1?}):\n{text}",
        started.elapsed()
    ));
    (status.success(), text)
}

/// Prefill's count of packets the NIC read in place from the registered
/// KV pool.
fn packets_in_place(text: &str) -> u64 {
    let marker = "read in place by the NIC: ";
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("prefill printed no in-place count:\n{text}"));
    let rest = &text[at + marker.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("unreadable in-place count:\n{text}"))
}

/// Decode's report: the path it took, and every block verified intact.
fn check_decode(text: &str, path: &str) {
    assert!(
        text.contains(&format!("decode: path {path}")),
        "decode should take {path}:\n{text}"
    );
    assert!(
        text.contains(&format!("verified {BLOCKS} intact, 0 corrupted")),
        "decode should verify all {BLOCKS} blocks:\n{text}"
    );
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_kv_transfer_over_rdma_through_the_c_abi() {
    let test = "guest_kv_transfer_over_rdma_through_the_c_abi";
    let Some(exe) = kv_transfer(test) else {
        return;
    };
    let Some((dev, ip, gid)) = rdma(test) else {
        return;
    };
    let name = format!("rdma://{ip}:{PORT_ONE}");
    let (ok, text) = run(
        over_rdma(&exe, &dev, gid.as_deref(), &["--name", &name]),
        "kv_transfer over rdma:// in one guest",
    );
    assert!(ok, "kv_transfer failed:\n{text}");
    check_decode(&text, "rdma: ");
    assert!(text.contains("pre-shared key"), "{text}");
    // Each 64 KiB block is one packet, its payload read by the NIC from
    // the registered pool (resends count again).
    assert!(packets_in_place(&text) >= BLOCKS as u64, "{text}");
}

/// Decode owns ivshmem 10.0's BAR 2, prefill 11.0's (the guest's devices
/// over two host files); both map both through sysfs `resource2`.
#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_kv_transfer_over_bar_windows_through_the_c_abi() {
    let test = "guest_kv_transfer_over_bar_windows_through_the_c_abi";
    let Some(exe) = kv_transfer(test) else {
        return;
    };
    let [decode_device, prefill_device, _, _] = ivshmem_addresses();
    for device in [&decode_device, &prefill_device] {
        enable_for_sysfs(device);
    }
    // A range of its own, past the facade's guest test's (see the map in
    // vfio/tests/guest.rs): 31 packets of 64 KiB fit.
    let window = |device: &str| format!("{device}/2@0xE10000+0x1F0000");
    let mut command = Command::new(&exe);
    command.args(PLAN).args(TIMEOUTS).args([
        "--own-bar",
        &window(&decode_device),
        "--peer-bar",
        &window(&prefill_device),
    ]);
    let (ok, text) = run(command, "kv_transfer over two ivshmem BARs");
    assert!(ok, "kv_transfer failed:\n{text}");
    check_decode(&text, "bar-p2p: ");
    assert_eq!(
        packets_in_place(&text),
        0,
        "only RDMA reads in place:\n{text}"
    );
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_kv_transfer_over_rdma_through_the_c_abi() {
    let test = "two_guests_kv_transfer_over_rdma_through_the_c_abi";
    let Some((side, peer)) = two_guests(test) else {
        return;
    };
    let Some(exe) = kv_transfer(test) else {
        return;
    };
    let Some((dev, _, gid)) = rdma(test) else {
        return;
    };
    match side {
        Side::Server => {
            let name = format!("rdma://0.0.0.0:{PORT_TWO}");
            let (ok, text) = run(
                over_rdma(
                    &exe,
                    &dev,
                    gid.as_deref(),
                    &["--role", "decode", "--name", &name],
                ),
                "kv_transfer decode (server guest)",
            );
            assert!(ok, "decode failed:\n{text}");
            check_decode(&text, "rdma: ");
        }
        Side::Client => {
            let name = format!("rdma://{peer}:{PORT_TWO}");
            let (ok, text) = run(
                over_rdma(
                    &exe,
                    &dev,
                    gid.as_deref(),
                    &["--role", "prefill", "--name", &name],
                ),
                "kv_transfer prefill (client guest)",
            );
            assert!(ok, "prefill failed:\n{text}");
            assert!(
                text.contains(&format!("prefill: sent {BLOCKS} KV blocks")),
                "{text}"
            );
            assert!(packets_in_place(&text) >= BLOCKS as u64, "{text}");
        }
    }
}
