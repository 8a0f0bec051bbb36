//! The RDMA link over real verbs, between two processes, in the QEMU guest
//! of `tests/vm/run.sh` (soft-RoCE `rxe0` on `eth0`): set up over TCP on
//! the guest's address, 10,000 messages each way checked byte for byte,
//! then a SIGKILLed peer reported as an error within the deadline.
//!
//! Every test is `#[ignore]`d; the harness runs
//! `guest_link --ignored --test-threads=1 guest_` in the guest with
//! `BARLINK_VM_RDMA_DEV` (and `BARLINK_VM_RDMA_IP`, `BARLINK_VM_RDMA_GID`)
//! set when soft-RoCE came up. Without them each test prints
//! `SKIPPED <name>: ...` and returns. The child role (`child_rdma_peer`,
//! started by the tests with `--exact`) does not match the filter.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use barlink_rdma::oob::OobListener;
use barlink_rdma::verbs_queue::{self, RdmaLinkOptions, VerbsQueue};
use barlink_rdma::{PacketQueue, RdmaLink};
use barlink_transport::LinkError;
use barlink_transport::link::IoError;
use barlink_transport::window::Window;

#[path = "../../tests/support/guest.rs"]
mod guest_support;
#[path = "support/link_exchange.rs"]
mod link_exchange;

use guest_support::wait_with_deadline;
use link_exchange::{
    CLIENT_STREAM, Rdma, SERVER_STREAM, exchange, message, rdma_env, soft_roce_options, test_psk,
};

const CHILD_SPEC: &str = "BARLINK_RDMA_GUEST_CHILD";
const MESSAGES: u64 = 10_000;
/// Longest a child may run before the test kills it and fails.
const CHILD_LIMIT: Duration = Duration::from_secs(150);
fn options(rdma: &Rdma) -> RdmaLinkOptions {
    soft_roce_options(rdma, 20, Duration::from_millis(250))
}

fn spawn_child(spec: &str) -> (Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_rdma_peer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SPEC, spec)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    (child, reader)
}

fn child_output(reader: std::thread::JoinHandle<String>) -> String {
    reader
        .join()
        .unwrap_or_default()
        .lines()
        .map(|line| format!("    child> {line}\n"))
        .collect()
}

/// Listens on the guest's address, starts the child with `mode`, accepts.
fn start(
    rdma: &Rdma,
    mode: &str,
) -> (RdmaLink<VerbsQueue>, Child, std::thread::JoinHandle<String>) {
    let listener = OobListener::bind((rdma.ip.as_str(), 0)).expect("listening");
    let port = listener.local_addr().unwrap().port();
    let (mut child, reader) = spawn_child(&format!("{mode} {}:{port}", rdma.ip));
    match verbs_queue::accept(&listener, Duration::from_secs(60), &options(rdma)) {
        Ok(link) => (link, child, reader),
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "setting up the RDMA link: {error}\n{}",
                child_output(reader)
            );
        }
    }
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_rdma_link_moves_10000_messages_each_way() {
    let Some(rdma) = rdma_env("guest_rdma_link_moves_10000_messages_each_way") else {
        return;
    };
    let started = Instant::now();
    let (mut link, mut child, reader) = start(&rdma, "transfer");
    let setup = started.elapsed();
    exchange(
        &mut link,
        SERVER_STREAM,
        CLIENT_STREAM,
        MESSAGES,
        Duration::from_secs(120),
    );
    let moved = started.elapsed();
    let _ = link.close(Duration::from_secs(10));
    let status = wait_with_deadline(&mut child, CHILD_LIMIT, "the child");
    let text = child_output(reader);
    eprint!("{text}");
    assert!(status.success(), "the child failed ({status}):\n{text}");
    let stats = link.engine().stats();
    let medium = link.medium().stats();
    assert_eq!(stats.messages_delivered, MESSAGES + 1);
    let _ = writeln!(
        std::io::stderr(),
        "rdma link over {}: setup {setup:?}, 10,000 messages each way in {:?}; {} packets sent, {} retransmitted, {} CRC failures; {} writes, {} credit writes; QP {:?}",
        rdma.dev,
        moved - setup,
        stats.packets_sent,
        stats.retransmits(),
        stats.crc_failures,
        medium.writes_posted,
        medium.credit_writes,
        link.medium().queue().qp().state()
    );
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_rdma_wrong_key_gets_nothing() {
    let Some(rdma) = rdma_env("guest_rdma_wrong_key_gets_nothing") else {
        return;
    };
    let listener = OobListener::bind((rdma.ip.as_str(), 0)).expect("listening");
    let addr = format!("{}:{}", rdma.ip, listener.local_addr().unwrap().port());
    // The wrong client first; the right one only after it has given up,
    // so the server must have refused one and kept listening.
    let clients = std::thread::spawn(move || {
        let (mut wrong, wrong_log) = spawn_child(&format!("wrong-key {addr}"));
        let wrong_status = wait_with_deadline(&mut wrong, CHILD_LIMIT, "the wrong-key child");
        let wrong_text = child_output(wrong_log);
        let (mut right, right_log) = spawn_child(&format!("brief {addr}"));
        let right_status = wait_with_deadline(&mut right, CHILD_LIMIT, "the right-key child");
        (
            wrong_status,
            wrong_text,
            right_status,
            child_output(right_log),
        )
    });
    let mut link = verbs_queue::accept(&listener, Duration::from_secs(120), &options(&rdma))
        .unwrap_or_else(|error| panic!("setting up the RDMA link: {error}"));
    exchange(
        &mut link,
        SERVER_STREAM,
        CLIENT_STREAM,
        100,
        Duration::from_secs(60),
    );
    let _ = link.close(Duration::from_secs(10));
    let (wrong_status, wrong_text, right_status, right_text) = clients.join().unwrap();
    eprint!("{wrong_text}{right_text}");
    assert!(wrong_status.success(), "the wrong-key child:\n{wrong_text}");
    assert!(
        wrong_text.contains("refused as it must be"),
        "the wrong-key child:\n{wrong_text}"
    );
    assert!(right_status.success(), "the right-key child:\n{right_text}");
    assert_eq!(link.engine().stats().messages_delivered, 100 + 1);
}

#[test]
#[ignore = "runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_rdma_link_detects_a_killed_peer() {
    let Some(rdma) = rdma_env("guest_rdma_link_detects_a_killed_peer") else {
        return;
    };
    let (mut link, mut child, reader) = start(&rdma, "hold");
    // Traffic first: the link works.
    exchange(
        &mut link,
        SERVER_STREAM,
        CLIENT_STREAM,
        100,
        Duration::from_secs(60),
    );
    child.kill().expect("SIGKILL the child");
    let _ = child.wait();
    let killed = Instant::now();
    let peer_timeout = options(&rdma).engine.peer_timeout;
    // Keep sending, as a live application would, until the link fails.
    let mut error = None;
    for i in 0..1000u64 {
        match link.send_blocking(message(SERVER_STREAM, i), Duration::from_secs(1)) {
            Ok(_) => {}
            Err(IoError::Timeout { .. }) => {}
            Err(e) => {
                error = Some(e);
                break;
            }
        }
        match link.recv(Duration::from_millis(200)) {
            Ok(data) => link.recycle(data),
            Err(IoError::Timeout { .. }) => {}
            Err(e) => {
                error = Some(e);
                break;
            }
        }
        if killed.elapsed() > peer_timeout + Duration::from_secs(20) {
            break;
        }
    }
    let took = killed.elapsed();
    let text = child_output(reader);
    let error =
        error.unwrap_or_else(|| panic!("no error {took:?} after the peer was killed\n{text}"));
    // Past libtest's capture, so the harness log shows it.
    let _ = writeln!(
        std::io::stderr(),
        "killed peer reported after {took:?}: {error}"
    );
    assert!(
        matches!(
            error,
            IoError::Closed(LinkError::PeerLost { .. }) | IoError::Medium(_)
        ),
        "{error}"
    );
    assert!(
        took < peer_timeout + Duration::from_secs(5),
        "took {took:?} (peer timeout {peer_timeout:?})"
    );
}

/// The client: connects to the parent, then `transfer` (the 10,000
/// messages, then close) or `hold` (100 messages, then keeps the link
/// going until it is killed).
#[test]
#[ignore = "a child role of the guest_ tests"]
fn child_rdma_peer() {
    let Ok(spec) = std::env::var(CHILD_SPEC) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED child_rdma_peer: a child role, started by the guest_ tests"
        );
        return;
    };
    let (mode, addr) = spec.split_once(' ').expect("spec: MODE ADDR");
    let rdma = rdma_env("child_rdma_peer").expect("the parent had RDMA");
    if mode == "wrong-key" {
        let mut wrong = options(&rdma);
        wrong.oob.auth = Some(test_psk(2));
        match verbs_queue::connect::<Vec<u8>>(addr, &wrong) {
            Ok(_) => panic!("child: linked with the wrong key"),
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains("the pre-shared keys differ"), "child: {text}");
                eprintln!("child: refused as it must be: {text}");
                return;
            }
        }
    }
    let mut link = verbs_queue::connect(addr, &options(&rdma))
        .unwrap_or_else(|error| panic!("child: setting up the RDMA link: {error}"));
    eprintln!(
        "connected: QP {} in {:?}",
        link.medium().queue().qp().qp_num(),
        link.medium().queue().qp().state()
    );
    match mode {
        "transfer" => {
            exchange(
                &mut link,
                CLIENT_STREAM,
                SERVER_STREAM,
                MESSAGES,
                Duration::from_secs(120),
            );
            let stats = link.engine().stats();
            eprintln!(
                "child: done; {} packets sent, {} retransmitted, {} CRC failures, receive region {} bytes",
                stats.packets_sent,
                stats.retransmits(),
                stats.crc_failures,
                link.medium().queue().receive_region().len()
            );
            let _ = link.close(Duration::from_secs(10));
        }
        "brief" => {
            exchange(
                &mut link,
                CLIENT_STREAM,
                SERVER_STREAM,
                100,
                Duration::from_secs(60),
            );
            let _ = link.close(Duration::from_secs(10));
        }
        "hold" => {
            exchange(
                &mut link,
                CLIENT_STREAM,
                SERVER_STREAM,
                100,
                Duration::from_secs(60),
            );
            let deadline = Instant::now() + CHILD_LIMIT;
            while Instant::now() < deadline {
                match link.recv(Duration::from_secs(1)) {
                    Ok(data) => link.recycle(data),
                    Err(IoError::Timeout { .. }) => {}
                    Err(error) => panic!("child: {error}"),
                }
            }
        }
        other => panic!("unknown mode {other}"),
    }
}
