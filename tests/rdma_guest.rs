//! barlink over RDMA in the QEMU guests of `tests/vm/run.sh` (soft-RoCE
//! `rxe0` on `eth0`): `barlink bench --rdma` as server and client, with
//! perftest's `ib_write_bw` as the baseline, and, between two guests wired
//! by a QEMU socket netdev, `barlink::connect` moving 10,000 messages of
//! mixed sizes and noticing a killed peer.
//!
//! Every test is `#[ignore]`d.
//! - `guest_*` run in the one guest (`run.sh`'s first phase), needing
//!   `BARLINK_VM_RDMA_DEV`, `BARLINK_VM_RDMA_IP` and the CLI in
//!   `BARLINK_VM_BARLINK`.
//! - `two_guests_*` run in both guests of the second phase (`run.sh`
//!   runs them with the filter `two_guests_`), each with
//!   `BARLINK_VM_ROLE` (`server` in 10.0.2.15, `client` in 10.0.2.16) and
//!   `BARLINK_VM_PEER_IP`. Both guests run the same tests in the same
//!   (name) order; each test's two sides meet on their own TCP port.
//!
//! Without their variables the tests print `SKIPPED <name>: ...` and return.
//! Speed under emulation means nothing (rxe under TCG moves 10-30 MB/s):
//! the ratio to `ib_write_bw` is printed and saved (in `BARLINK_VM_OUT`,
//! the results share), never asserted.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use barlink::connect::AnyLink;
use barlink::rdma::RdmaLink;
use barlink::rdma::verbs_queue::VerbsQueue;
use barlink::transport::auth::PeerAuth;
use barlink::transport::link::IoError;
use barlink::{ConnectOptions, LinkError, PathKind, Peer, Role};
use serde_json::Value;

/// Small settings: rxe under TCG is slow, and the guest's time is CI's.
const BENCH_SETTINGS: &[&str] = &[
    "--sizes",
    "64,4K,64K",
    "--windows",
    "2",
    "--bytes-per-window",
    "256K",
    "--lat-iters",
    "20",
    "--mtu",
    "16K",
    "--qp-timeout",
    "18",
];
#[path = "support/guest.rs"]
mod guest_support;
#[path = "../rdma/tests/support/link_exchange.rs"]
mod link_exchange;

use guest_support::{Side, say, skipped, wait_or_kill};
use link_exchange::{
    CLIENT_STREAM, Rdma, SERVER_STREAM, exchange, message, rdma_env, soft_roce_options, test_psk,
};

const MESSAGES: u64 = 10_000;
const CHILD_SPEC: &str = "BARLINK_RDMA_GUEST_CHILD";
/// The TCP ports of the two-guest tests (perftest takes the bench's + 1).
const PORT_BENCH: u16 = 18640;
const PORT_LINK: u16 = 18650;
const PORT_KILLED: u16 = 18660;
const PORT_WRONG_KEY: u16 = 18670;
/// The one-guest bench.
const PORT_BENCH_ONE: u16 = 18620;

fn cli(test: &str) -> Option<String> {
    let path = std::env::var("BARLINK_VM_BARLINK")
        .ok()
        .filter(|p| !p.is_empty());
    if path.is_none() {
        skipped(test, "needs the barlink CLI (BARLINK_VM_BARLINK)");
    }
    path
}

/// This guest's side in the two-guest phase, the peer's address and the
/// RDMA device.
fn two_guests(test: &str) -> Option<(Side, String, Rdma)> {
    let (side, peer) = guest_support::two_guests(test)?;
    Some((side, peer, rdma_env(test)?))
}

// ------------------------------------------------------------ bench --rdma

/// Runs a command with a deadline (killed past it); its output.
fn run_with_deadline(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let (status, killed) = wait_or_kill(&mut child, limit);
    if killed {
        say(&format!("killed after {limit:?}"));
    }
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn drain(stream: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut stream) = stream {
            let _ = stream.read_to_end(&mut bytes);
        }
        bytes
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks the client's JSON rows; returns a table of the figures.
fn check_rows(stdout: &str, sizes: &[u64], expect_baseline: bool) -> String {
    let rows: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    let mut table = String::new();
    for &size in sizes {
        let of = |path: &str| {
            rows.iter()
                .find(|r| r["path"] == path && r["size_bytes"] == size)
                .cloned()
        };
        let barlink =
            of("barlink-rdma").unwrap_or_else(|| panic!("no barlink-rdma row of {size}: {stdout}"));
        for field in [
            "gbps",
            "lat_p50_us",
            "lat_p99_us",
            "retransmits",
            "crc_errors",
            "path_decision",
            "messages",
            "lost",
        ] {
            assert!(barlink.get(field).is_some(), "{field} missing: {barlink}");
        }
        assert_eq!(barlink["lost"], 0, "messages lost: {barlink}");
        assert!(barlink["messages"].as_u64().unwrap() > 0, "{barlink}");
        assert!(
            barlink["path_decision"]
                .as_str()
                .unwrap()
                .starts_with("rdma: "),
            "{barlink}"
        );
        let perf = of("ib_write_bw");
        if expect_baseline {
            // Present, never judged: a speed under emulation means nothing.
            let perf = perf
                .as_ref()
                .unwrap_or_else(|| panic!("no ib_write_bw row of {size}: {stdout}"));
            assert!(perf["gbps"].as_f64().is_some(), "{perf}");
        }
        let lat = |row: &Value| {
            row["lat_p50_us"]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.0}"))
        };
        table.push_str(&format!(
            "{size:>8} B  barlink-rdma {:>8.3} MB/s  p50 {:>7} us  |  ib_write_bw {:>8} MB/s  ib_write_lat p50 {:>7} us  |  ratio {}  (retrans {}, crc_err {})\n",
            barlink["gbps"].as_f64().unwrap() * 1e3,
            lat(&barlink),
            perf.as_ref()
                .and_then(|p| p["gbps"].as_f64())
                .map_or("-".to_string(), |g| format!("{:.3}", g * 1e3)),
            perf.as_ref().map_or("-".to_string(), lat),
            barlink["ratio_to_ib_write_bw"]
                .as_f64()
                .map_or("-".to_string(), |r| format!("{r:.2}x")),
            barlink["retransmits"],
            barlink["crc_errors"],
        ));
    }
    table
}

/// Saves the figures in the results share (the harness copies them to
/// target/vmtest/artifacts) and prints them.
fn record(name: &str, title: &str, table: &str, jsonl: &str) {
    say(&format!(
        "{title} (emulation: soft-RoCE under TCG; the figures say nothing about speed)\n{table}"
    ));
    if let Some(dir) = std::env::var_os("BARLINK_VM_OUT") {
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::write(
            dir.join(format!("{name}.txt")),
            format!(
                "{title} (emulation: soft-RoCE under TCG; the figures say nothing about speed)\n{table}"
            ),
        );
        let _ = std::fs::write(dir.join(format!("{name}.jsonl")), jsonl);
    }
}

fn has_perftest() -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("ib_write_bw").is_file())
    })
}

/// A file holding the test's pre-shared key (`test_psk(1)`), mode 600,
/// as `barlink keygen --psk` writes one; the same in both guests.
fn psk_file() -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("barlink-test-psk-{}", std::process::id()));
    std::fs::write(&path, format!("{}\n", "01".repeat(32))).expect("writing the key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path.display().to_string()
}

fn bench_command(barlink: &str, rdma: &Rdma, role_args: &[&str]) -> Command {
    let mut command = Command::new(barlink);
    command
        .args(["bench", "--rdma"])
        .args(role_args)
        .args(BENCH_SETTINGS)
        .args(["--rdma-device", &rdma.dev])
        .args(["--psk-file", &psk_file()]);
    if let Some(gid) = rdma.gid {
        command.args(["--gid-index", &gid.to_string()]);
    }
    command
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_bench_rdma_server_and_client() {
    let test = "guest_bench_rdma_server_and_client";
    let (Some(rdma), Some(barlink)) = (rdma_env(test), cli(test)) else {
        return;
    };
    let listen = format!("{}:{PORT_BENCH_ONE}", rdma.ip);
    let mut server = bench_command(
        &barlink,
        &rdma,
        &["--server", "--listen", &listen, "--accept-timeout", "60"],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("starting the server");
    let server_out = drain(server.stdout.take());
    let server_err = drain(server.stderr.take());
    let started = Instant::now();
    let client = run_with_deadline(
        bench_command(&barlink, &rdma, &[&listen, "--json"]),
        Duration::from_secs(150),
    );
    let took = started.elapsed();
    let (server_status, killed) = wait_or_kill(&mut server, Duration::from_secs(30));
    if killed {
        say("the server was killed after 30 s");
    }
    let (server_out, server_err) = (
        text(&server_out.join().unwrap_or_default()),
        text(&server_err.join().unwrap_or_default()),
    );
    let (stdout, stderr) = (text(&client.stdout), text(&client.stderr));
    assert!(
        client.status.success(),
        "the client failed ({}):\n{stderr}\n{stdout}\n--- server ({server_status}):\n{server_err}\n{server_out}",
        client.status
    );
    assert!(
        server_status.success(),
        "the server failed ({server_status}):\n{server_err}\n{server_out}"
    );
    // The server prints the same rows as the client.
    assert!(server_out.contains("barlink-rdma"), "{server_out}");
    assert!(
        stdout.contains("setup authenticated with a pre-shared key"),
        "the decision names the authentication:\n{stdout}"
    );
    let table = check_rows(&stdout, &[64, 4096, 65536], has_perftest());
    if !stderr.is_empty() {
        say(&format!("client notes:\n{stderr}"));
    }
    record(
        "bench-rdma-one-guest",
        &format!(
            "bench --rdma, server and client in one guest over {} in {took:.1?}",
            rdma.dev
        ),
        &table,
        &stdout,
    );
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_bench_rdma() {
    let test = "two_guests_bench_rdma";
    let (Some((side, peer, rdma)), Some(barlink)) = (two_guests(test), cli(test)) else {
        return;
    };
    let started = Instant::now();
    match side {
        Side::Server => {
            let listen = format!("0.0.0.0:{PORT_BENCH}");
            let output = run_with_deadline(
                bench_command(
                    &barlink,
                    &rdma,
                    &["--server", "--listen", &listen, "--accept-timeout", "120"],
                ),
                Duration::from_secs(200),
            );
            let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
            assert!(
                output.status.success(),
                "the server failed ({}):\n{stderr}\n{stdout}",
                output.status
            );
            assert!(stdout.contains("barlink-rdma"), "{stdout}");
            say(&format!(
                "server side, {:.1?}:\n{stdout}",
                started.elapsed()
            ));
        }
        Side::Client => {
            let target = format!("{peer}:{PORT_BENCH}");
            let output = run_with_deadline(
                bench_command(&barlink, &rdma, &[&target, "--json"]),
                Duration::from_secs(200),
            );
            let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
            assert!(
                output.status.success(),
                "the client failed ({}):\n{stderr}\n{stdout}",
                output.status
            );
            let table = check_rows(&stdout, &[64, 4096, 65536], has_perftest());
            if !stderr.is_empty() {
                say(&format!("client notes:\n{stderr}"));
            }
            record(
                "bench-rdma-two-guests",
                &format!(
                    "bench --rdma between two guests ({} -> {peer}) over {} in {:.1?}",
                    rdma.ip,
                    rdma.dev,
                    started.elapsed()
                ),
                &table,
                &stdout,
            );
        }
    }
}

// ------------------------------------------------------------ the link

fn options(rdma: &Rdma) -> ConnectOptions {
    options_with(rdma, test_psk(1))
}

fn options_with(rdma: &Rdma, auth: PeerAuth) -> ConnectOptions {
    let mut rdma = soft_roce_options(rdma, 120, Duration::from_millis(500));
    rdma.oob.auth = Some(auth);
    ConnectOptions {
        engine: rdma.engine.clone(),
        // The other guest may still be booting.
        setup_timeout: Duration::from_secs(120),
        rdma,
        ..ConnectOptions::default()
    }
}

/// The link to the other guest through `barlink::connect`: the server
/// accepts on `port`, the client connects to the peer's.
fn link_to_peer(side: Side, peer: &str, port: u16, rdma: &Rdma) -> RdmaLink<VerbsQueue> {
    let (addr, role) = match side {
        Side::Server => (format!("0.0.0.0:{port}"), Role::Accept),
        Side::Client => (format!("{peer}:{port}"), Role::Connect),
    };
    let connection = barlink::connect(&Peer::Remote { addr }, role, &options(rdma))
        .unwrap_or_else(|e| panic!("{side:?}: connect: {e}"));
    assert_eq!(
        connection.decision.path,
        PathKind::Rdma,
        "{}",
        connection.decision
    );
    say(&format!("{side:?}: {}", connection.decision));
    match connection.link {
        AnyLink::Rdma(link) => *link,
        _ => panic!("not an RDMA link"),
    }
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_link_moves_10000_messages_each_way() {
    let test = "two_guests_link_moves_10000_messages_each_way";
    let Some((side, peer, rdma)) = two_guests(test) else {
        return;
    };
    let started = Instant::now();
    let mut link = link_to_peer(side, &peer, PORT_LINK, &rdma);
    let setup = started.elapsed();
    let (send, recv) = match side {
        Side::Server => (SERVER_STREAM, CLIENT_STREAM),
        Side::Client => (CLIENT_STREAM, SERVER_STREAM),
    };
    exchange(&mut link, send, recv, MESSAGES, Duration::from_secs(150));
    let moved = started.elapsed() - setup;
    let stats = link.engine().stats().clone();
    assert_eq!(
        stats.messages_delivered,
        MESSAGES + 1,
        "nothing lost, nothing extra"
    );
    let medium = link.medium().stats();
    say(&format!(
        "{side:?} ({} <-> {peer}): setup {setup:.1?}, 10,000 messages each way (1 B..64 KiB) in {moved:.1?}; \
         {} packets sent, {} retransmitted, {} CRC failures; {} writes, {} credit writes",
        rdma.ip,
        stats.packets_sent,
        stats.retransmits(),
        stats.crc_failures,
        medium.writes_posted,
        medium.credit_writes,
    ));
    // Both sides saw the other's "done": closing now loses nothing.
    let _ = link.close(Duration::from_secs(10));
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_wrong_key_gets_nothing() {
    let test = "two_guests_wrong_key_gets_nothing";
    let Some((side, peer, rdma)) = two_guests(test) else {
        return;
    };
    match side {
        Side::Server => {
            // The wrong client is refused and logged; the wait goes on and
            // the right one links.
            let mut link = link_to_peer(side, &peer, PORT_WRONG_KEY, &rdma);
            exchange(
                &mut link,
                SERVER_STREAM,
                CLIENT_STREAM,
                100,
                Duration::from_secs(120),
            );
            say("Server: refused the client with the wrong key, then linked with the right one");
            let _ = link.close(Duration::from_secs(10));
        }
        Side::Client => {
            let addr = format!("{peer}:{PORT_WRONG_KEY}");
            let refused = barlink::connect::<Vec<u8>>(
                &Peer::Remote { addr: addr.clone() },
                Role::Connect,
                &options_with(&rdma, test_psk(2)),
            )
            .err()
            .unwrap_or_else(|| panic!("{test}: a link with the wrong key"));
            let text = refused.to_string();
            assert!(text.contains("the pre-shared keys differ"), "{text}");
            say(&format!("Client with the wrong key: {text}"));
            let mut link = link_to_peer(side, &peer, PORT_WRONG_KEY, &rdma);
            exchange(
                &mut link,
                CLIENT_STREAM,
                SERVER_STREAM,
                100,
                Duration::from_secs(120),
            );
            let _ = link.close(Duration::from_secs(10));
        }
    }
}

#[test]
#[ignore = "runs in two QEMU guests (tests/vm/run.sh)"]
fn two_guests_link_detects_a_killed_peer() {
    let test = "two_guests_link_detects_a_killed_peer";
    let Some((side, peer, rdma)) = two_guests(test) else {
        return;
    };
    match side {
        Side::Server => {
            let mut link = link_to_peer(side, &peer, PORT_KILLED, &rdma);
            exchange(
                &mut link,
                SERVER_STREAM,
                CLIENT_STREAM,
                100,
                Duration::from_secs(60),
            );
            // The client guest kills its process now; keep the link going,
            // as a live application would, until it fails.
            let waiting = Instant::now();
            let peer_timeout = options(&rdma).engine.peer_timeout;
            let limit = peer_timeout + Duration::from_secs(30);
            let mut error = None;
            let mut i = 0u64;
            while waiting.elapsed() < limit {
                match link.send_blocking(message(SERVER_STREAM, i), Duration::from_secs(1)) {
                    Ok(_) | Err(IoError::Timeout { .. }) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
                i += 1;
                match link.recv(Duration::from_millis(200)) {
                    Ok(data) => link.recycle(data),
                    Err(IoError::Timeout { .. }) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let took = waiting.elapsed();
            let error = error.unwrap_or_else(|| {
                panic!("no error {took:?} after the exchange: the killed peer went unnoticed")
            });
            say(&format!(
                "server: the peer in the other guest, killed after the exchange, reported {took:.1?} later: {error}"
            ));
            assert!(
                matches!(
                    error,
                    IoError::Closed(LinkError::PeerLost { .. }) | IoError::Medium(_)
                ),
                "{error}"
            );
        }
        Side::Client => {
            // The peer is a child process, SIGKILLed once it has moved its
            // 100 messages: no close, no goodbye.
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "child_peer_to_be_killed",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_SPEC, format!("{peer}:{PORT_KILLED}"))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawning the child");
            let (tx, rx) = mpsc::channel();
            let stderr = child.stderr.take().unwrap();
            let reader = std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("EXCHANGED") {
                        let _ = tx.send(());
                    }
                    lines.push(line);
                }
                lines
            });
            let exchanged = rx.recv_timeout(Duration::from_secs(150)).is_ok();
            child.kill().expect("SIGKILL the child");
            let _ = child.wait();
            let lines = reader.join().unwrap_or_default();
            assert!(
                exchanged,
                "the child never finished its exchange:\n{}",
                lines.join("\n")
            );
            say("client: the peer process was SIGKILLed after its 100 messages");
        }
    }
}

/// The client guest's process that gets killed: connects, moves 100
/// messages each way, says `EXCHANGED`, keeps the link going.
#[test]
#[ignore = "a child role of two_guests_link_detects_a_killed_peer"]
fn child_peer_to_be_killed() {
    let Ok(addr) = std::env::var(CHILD_SPEC) else {
        skipped(
            "child_peer_to_be_killed",
            "a child role, started by two_guests_link_detects_a_killed_peer",
        );
        return;
    };
    let (peer, port) = addr.rsplit_once(':').expect("PEER:PORT");
    let (_, _, rdma) = two_guests("child_peer_to_be_killed").expect("the parent had them");
    let mut link = link_to_peer(Side::Client, peer, port.parse().unwrap(), &rdma);
    exchange(
        &mut link,
        CLIENT_STREAM,
        SERVER_STREAM,
        100,
        Duration::from_secs(60),
    );
    say("EXCHANGED");
    let deadline = Instant::now() + Duration::from_secs(150);
    while Instant::now() < deadline {
        match link.recv(Duration::from_secs(1)) {
            Ok(data) => link.recycle(data),
            Err(IoError::Timeout { .. }) => {}
            Err(error) => panic!("child: {error}"),
        }
    }
}
