//! `barlink::connect` over BAR windows in the QEMU guest of
//! `tests/vm/run.sh`: two processes, each mapping its own ivshmem BAR and
//! the other's through sysfs `resource2`, no socket between them; the
//! facade picks BAR P2P (the devices are not GPUs the topology classifies,
//! so the windows are used as named) and says so.
//!
//! Every test is `#[ignore]`d; the harness runs `guest_` tests in the guest
//! (as root, `BARLINK_VM_GUEST=1`). Anywhere else each test prints
//! `SKIPPED <name>: ...` and returns.
//!
//! The guest's ivshmem devices (see vfio/tests/guest.rs): 10.0 and 12.0 are
//! BAR 2 over host file A, 11.0 and 13.0 over file B. This test uses the
//! range at 0xC00000 (2 MiB + 256 bytes) of both files: P owns 10.0 and
//! writes through 13.0, Q owns 11.0 and writes through 12.0.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use barlink::{BarEnds, BarRef, ConnectOptions, PathKind, Peer, Role, connect};

#[path = "support/guest.rs"]
mod guest_support;

use guest_support::{enable_for_sysfs as enable, in_guest, ivshmem_addresses as ivshmem};

const REGION: usize = 0xC0_0000;
const REGION_LEN: usize = (2 << 20) + 256;
const MESSAGES: u64 = 2_000;
const TIMEOUT: Duration = Duration::from_secs(60);
const CHILD_SPEC: &str = "BARLINK_CONNECT_GUEST_CHILD";

fn options(own: &str, peer: &str) -> ConnectOptions {
    let bar = |device: &str| BarRef {
        device: device.to_string(),
        bar: 2,
        offset: REGION,
        len: REGION_LEN,
    };
    let mut options = ConnectOptions {
        bars: Some(BarEnds {
            own: bar(own),
            peer: bar(peer),
        }),
        setup_timeout: TIMEOUT,
        ..ConnectOptions::default()
    };
    options.engine.mtu = 16 << 10;
    // TCG is slow: a peer that is quiet for a while is not lost.
    options.engine.peer_timeout = Duration::from_secs(30);
    options
}

fn message(index: u64) -> Vec<u8> {
    let len = (index * 7919 % 40_000) as usize;
    (0..len).map(|i| (i as u64 ^ index) as u8).collect()
}

fn peer() -> Peer {
    Peer::Local {
        name: "guest-bars".to_string(),
    }
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_connect_picks_bar_p2p_and_moves_messages_between_processes() {
    if !in_guest("guest_connect_picks_bar_p2p_and_moves_messages_between_processes") {
        return;
    }
    let [a, b, a_alias, b_alias] = ivshmem();
    for device in [&a, &b, &a_alias, &b_alias] {
        enable(device);
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_connect_bar_side",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SPEC, format!("{b},{a_alias}"))
        // Its libtest lines must not pass for this test's own.
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut connection =
        connect(&peer(), Role::Accept, &options(&a, &b_alias)).unwrap_or_else(|e| {
            let _ = child.kill();
            panic!("{e}")
        });
    let _ = writeln!(std::io::stderr(), "picked {}", connection.decision);
    assert_eq!(connection.decision.path, PathKind::BarP2p);
    assert!(
        connection.decision.reason.contains("not GPUs"),
        "{}",
        connection.decision
    );
    for index in 0..MESSAGES {
        let got = connection
            .recv(TIMEOUT)
            .unwrap_or_else(|e| panic!("message {index}: {e}"));
        assert!(got == message(index), "message {index} differs");
    }
    connection.send(b"done".to_vec(), TIMEOUT).unwrap();
    connection.flush(TIMEOUT).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        let _ = connection.progress();
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the other side ran past {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(status.success(), "the other side failed: {status}");
    let stats = connection.stats();
    assert_eq!(stats.messages_delivered, MESSAGES);
    let _ = writeln!(
        std::io::stderr(),
        "{MESSAGES} messages over BAR windows, {} CRC failures caught, {} retransmits",
        stats.crc_failures,
        stats.retransmits()
    );
}

/// The other process: owns 11.0 (file B), writes through 12.0 (file A).
#[test]
#[ignore = "a child role, started by the guest_ test"]
fn child_connect_bar_side() {
    let Ok(spec) = std::env::var(CHILD_SPEC) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED child_connect_bar_side: a child role, started by the guest_ test"
        );
        return;
    };
    let (own, peer_device) = spec.split_once(',').expect("own,peer");
    let mut connection = connect(&peer(), Role::Connect, &options(own, peer_device)).unwrap();
    assert_eq!(connection.decision.path, PathKind::BarP2p);
    for index in 0..MESSAGES {
        connection
            .send(message(index), TIMEOUT)
            .unwrap_or_else(|e| panic!("message {index}: {e}"));
    }
    assert_eq!(connection.recv(TIMEOUT).unwrap(), b"done");
    connection.flush(TIMEOUT).unwrap();
}
