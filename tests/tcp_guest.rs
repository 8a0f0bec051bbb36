//! barlink over TCP between the two QEMU guests of `tests/vm/run.sh`
//! (wired by a QEMU socket netdev): `barlink::connect` with `Peer::Tcp`
//! moving messages both ways, sealed, every byte checked; and `barlink
//! bench --tcp` as server and client, with its ping-pong baseline (and
//! iperf3 where the guest has it).
//!
//! Every test is `#[ignore]`d; `run.sh`'s second phase runs them in both
//! guests with the filter `two_guests_`, `BARLINK_VM_ROLE` (`server` in
//! 10.0.2.15, `client` in 10.0.2.16) and `BARLINK_VM_PEER_IP`. Without
//! those the tests print `SKIPPED <name>: ...` and return. Speed under
//! emulation means nothing: it is printed and saved, never asserted.

use std::process::Command;
use std::time::{Duration, Instant};

use barlink::connect::AnyLink;
use barlink::transport::auth::{PeerAuth, SecretKey};
use barlink::transport::link::IoError;
use barlink::transport::rng::SplitMix64;
use barlink::{ConnectOptions, Peer, Role};

#[path = "support/guest.rs"]
mod guest_support;

use guest_support::{Side, say, skipped, two_guests};

const PORT_LINK: u16 = 18680;
const PORT_BENCH: u16 = 18690;
const MESSAGES: u64 = 1_000;
const LIMIT: Duration = Duration::from_secs(300);

fn psk() -> PeerAuth {
    PeerAuth::PreSharedKey {
        key: SecretKey::from_hex(&"2b".repeat(32)).expect("64 hex digits"),
        source: "the test key".to_string(),
    }
}

fn message(stream: u64, index: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(stream ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = 1 + (rng.next_u64() % [256, 2048, 65_536][(index % 3) as usize]) as usize;
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_tcp_link_moves_messages_each_way_sealed() {
    let test = "two_guests_tcp_link_moves_messages_each_way_sealed";
    let Some((side, peer)) = two_guests(test) else {
        return;
    };
    let (addr, role, send, recv) = match side {
        Side::Server => (format!("0.0.0.0:{PORT_LINK}"), Role::Accept, 1, 2),
        Side::Client => (format!("{peer}:{PORT_LINK}"), Role::Connect, 2, 1),
    };
    let options = ConnectOptions {
        auth: Some(psk()),
        encrypt: true,
        // The other guest may still be booting.
        setup_timeout: Duration::from_secs(120),
        ..ConnectOptions::default()
    };
    let started = Instant::now();
    let mut connection = barlink::connect::<Vec<u8>>(&Peer::Tcp { addr }, role, &options)
        .unwrap_or_else(|e| panic!("{side:?}: connect: {e}"));
    let setup = started.elapsed();
    say(&format!("{side:?}: {}", connection.decision));
    let AnyLink::Tcp(link) = &mut connection.link else {
        panic!("not a TCP link: {}", connection.decision);
    };
    let (mut sent, mut received) = (0, 0);
    let deadline = Instant::now() + LIMIT;
    while received < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "stuck: sent {sent}, received {received}"
        );
        if sent < MESSAGES {
            match link.send_blocking(message(send, sent), Duration::from_millis(1)) {
                Ok(_) => sent += 1,
                Err(IoError::Timeout { .. }) => {}
                Err(error) => panic!("{side:?}: send {sent}: {error}"),
            }
        }
        match link.recv(Duration::from_millis(1)) {
            Ok(data) => {
                assert_eq!(
                    data,
                    message(recv, received),
                    "{side:?}: message {received}"
                );
                received += 1;
            }
            Err(IoError::Timeout { .. }) => {}
            Err(error) => panic!("{side:?}: receive {received}: {error}"),
        }
    }
    link.flush(LIMIT).expect("flush");
    let stats = link.engine().stats().clone();
    say(&format!(
        "{side:?}: TCP, sealed: setup {setup:.1?}, {MESSAGES} messages each way (1 B..64 KiB) in {:.1?}; \
         {} packets sent, {} retransmitted, {} CRC failures; medium {:?}",
        started.elapsed() - setup,
        stats.packets_sent,
        stats.retransmits(),
        stats.crc_failures,
        link.medium().stats()
    ));
    // Both sides received everything: closing now loses nothing.
    let _ = link.close(Duration::from_secs(10));
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_bench_tcp() {
    let test = "two_guests_bench_tcp";
    let Some((side, peer)) = two_guests(test) else {
        return;
    };
    let Some(barlink) = std::env::var("BARLINK_VM_BARLINK")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        skipped(test, "needs the barlink CLI (BARLINK_VM_BARLINK)");
        return;
    };
    let psk = std::env::temp_dir().join("barlink-tcp-guest.psk");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&psk, format!("{}\n", "2b".repeat(32))).expect("writing the key");
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let mut command = Command::new(barlink);
    command.args(["bench", "--tcp"]);
    match side {
        Side::Server => command.args([
            "--server",
            "--listen",
            &format!("0.0.0.0:{PORT_BENCH}"),
            "--accept-timeout",
            "120",
        ]),
        Side::Client => command.args([&format!("{peer}:{PORT_BENCH}"), "--json"]),
    };
    command.args([
        "--psk-file",
        psk.to_str().unwrap(),
        // Small settings: TCP under TCG is slow, and the guests' time is CI's.
        "--sizes",
        "64,4K,64K",
        "--windows",
        "2",
        "--bytes-per-window",
        "256K",
        "--lat-iters",
        "20",
    ]);
    let started = Instant::now();
    let output = command.output().expect("running barlink bench --tcp");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "{side:?} failed ({}):\n{stderr}\n{stdout}",
        output.status
    );
    assert!(stdout.contains("barlink-tcp"), "{stdout}");
    if side == Side::Client {
        assert!(
            stdout.contains("tcp-ping-pong"),
            "the baseline ran:\n{stdout}"
        );
    }
    say(&format!(
        "{side:?}: bench --tcp between two guests in {:.1?} (emulation: the figures say nothing about speed)\n{stdout}{stderr}",
        started.elapsed()
    ));
    if let Some(dir) = std::env::var_os("BARLINK_VM_OUT") {
        let _ = std::fs::write(
            std::path::PathBuf::from(dir).join(format!("bench-tcp-two-guests-{side:?}.jsonl")),
            stdout.as_bytes(),
        );
    }
}
