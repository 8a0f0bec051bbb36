//! Helpers shared by the QEMU guest tests of every crate
//! (`vfio/tests/guest.rs`, `rdma/tests/guest_link.rs`,
//! `tests/connect_guest.rs`, `tests/rdma_guest.rs`, `tests/tcp_guest.rs`,
//! `ffi/tests/guest.rs`),
//! included with `#[path]`: how a test says it was skipped, which side of
//! the two-guest phase it runs on, and how a child process is waited for
//! without waiting forever.
#![allow(dead_code)] // Each test file uses what it needs.

use std::io::Write;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// A line on stderr, past libtest's capture, so the harness's log shows it.
pub fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Says `SKIPPED <test>: <why>`: the harness counts the line as a skip.
pub fn skipped(test: &str, why: &str) {
    say(&format!("SKIPPED {test}: {why}"));
}

/// A guest's side in the two-guest phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

/// This guest's side in the two-guest phase and the other guest's
/// address, or `None` after saying `SKIPPED`.
pub fn two_guests(test: &str) -> Option<(Side, String)> {
    let role = std::env::var("BARLINK_VM_ROLE").unwrap_or_default();
    let peer = std::env::var("BARLINK_VM_PEER_IP").unwrap_or_default();
    let side = match role.as_str() {
        "server" => Side::Server,
        "client" => Side::Client,
        _ => {
            skipped(
                test,
                "needs two QEMU guests (tests/vm/run.sh's two-guest phase sets BARLINK_VM_ROLE and BARLINK_VM_PEER_IP)",
            );
            return None;
        }
    };
    if peer.is_empty() {
        skipped(test, "BARLINK_VM_PEER_IP is not set");
        return None;
    }
    Some((side, peer))
}

/// Whether this runs in the guest (`BARLINK_VM_GUEST`); if not, says so.
pub fn in_guest(test: &str) -> bool {
    if std::env::var_os("BARLINK_VM_GUEST").is_some() {
        return true;
    }
    skipped(test, "needs the QEMU guest (tests/vm/run.sh)");
    false
}

/// The four ivshmem devices of the guest (10.0 and 12.0 over host file A,
/// 11.0 and 13.0 over file B), or what `BARLINK_VM_IVSHMEM` says.
pub fn ivshmem_addresses() -> [String; 4] {
    let list = std::env::var("BARLINK_VM_IVSHMEM")
        .unwrap_or_else(|_| "0000:00:10.0,0000:00:11.0,0000:00:12.0,0000:00:13.0".into());
    let devices: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    devices
        .try_into()
        .expect("BARLINK_VM_IVSHMEM: four addresses")
}

/// Memory decoding on, for a mapping through sysfs: a device that vfio-pci
/// held (the VFIO tests run first) is left bound and disabled, and its BAR
/// would read all-ones. The kernel enables only a device with no driver.
pub fn enable_for_sysfs(device: &str) {
    let dir = format!("/sys/bus/pci/devices/{device}");
    if std::path::Path::new(&format!("{dir}/driver")).exists() {
        std::fs::write(format!("{dir}/driver/unbind"), device)
            .unwrap_or_else(|e| panic!("unbinding {device}: {e}"));
    }
    let on = std::fs::read_to_string(format!("{dir}/enable")).is_ok_and(|v| v.trim() != "0");
    if !on {
        std::fs::write(format!("{dir}/enable"), "1")
            .unwrap_or_else(|e| panic!("enabling {device}: {e}"));
    }
}

/// Waits for `child` at most `limit`; past it, kills it. The status, and
/// whether it had to be killed.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> (ExitStatus, bool) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return (status, false);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return (child.wait().expect("waiting after the kill"), true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_or_kill`], and a child that ran past `limit` fails the test.
pub fn wait_with_deadline(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    match wait_or_kill(child, limit) {
        (status, false) => status,
        (_, true) => panic!("{what} ran past {limit:?}"),
    }
}
