//! What the RDMA link tests in the guest share (`rdma/tests/guest_link.rs`
//! in one guest, `tests/rdma_guest.rs` across two), included with
//! `#[path]`: the soft-RoCE device the harness set up, and a seeded
//! exchange of messages both ways, every byte checked.
#![allow(dead_code)] // Each test file uses what it needs.

use std::time::{Duration, Instant};

use barlink_rdma::RdmaLink;
use barlink_rdma::oob::OobOptions;
use barlink_rdma::verbs_queue::{RdmaLinkOptions, VerbsQueue};
use barlink_transport::auth::{PeerAuth, SecretKey};
use barlink_transport::rng::SplitMix64;
use barlink_transport::{EngineConfig, SendError};

/// The seeds of the two directions.
pub const SERVER_STREAM: u64 = 0x5E4E_0001;
pub const CLIENT_STREAM: u64 = 0xC11E_0002;

/// A pre-shared key for tests: 32 bytes of `byte`.
pub fn test_psk(byte: u8) -> PeerAuth {
    PeerAuth::PreSharedKey {
        key: SecretKey::from_hex(&format!("{byte:02x}").repeat(32)).expect("64 hex digits"),
        source: format!("the test key {byte}"),
    }
}

/// The RDMA device the harness brought up in this guest.
pub struct Rdma {
    pub dev: String,
    pub ip: String,
    pub gid: Option<u8>,
}

/// Link options for `rdma` as soft-RoCE under emulation needs them: slow
/// acknowledgements (a long QP timeout, every retry), timers of
/// hundreds of milliseconds, and a setup that tries `connect_retries`
/// times, `retry_interval` apart (another guest may still be booting).
pub fn soft_roce_options(
    rdma: &Rdma,
    connect_retries: u32,
    retry_interval: Duration,
) -> RdmaLinkOptions {
    RdmaLinkOptions {
        device: Some(rdma.dev.clone()),
        gid_index: rdma.gid,
        slots: 64,
        send_queue_depth: 128,
        qp_timeout: 18,
        retry_count: 7,
        rnr_retry: 7,
        oob: OobOptions {
            connect_timeout: Duration::from_secs(5),
            connect_retries,
            retry_interval,
            io_timeout: Duration::from_secs(60),
            // X25519 under emulation is slow.
            auth_timeout: Duration::from_secs(60),
            auth: Some(test_psk(1)),
            deadline: None,
        },
        engine: EngineConfig {
            mtu: 16 << 10,
            max_message_len: 1 << 20,
            initial_rto: Duration::from_millis(200),
            min_rto: Duration::from_millis(50),
            max_rto: Duration::from_secs(2),
            heartbeat_interval: Duration::from_millis(200),
            peer_timeout: Duration::from_secs(4),
            ..EngineConfig::default()
        },
        epoch: 1,
        ..RdmaLinkOptions::default()
    }
}

/// The device from `BARLINK_VM_RDMA_*`, or `None` after saying
/// `SKIPPED <test>` (anywhere but the guest).
pub fn rdma_env(test: &str) -> Option<Rdma> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var("BARLINK_VM_RDMA_DEV"), var("BARLINK_VM_RDMA_IP")) {
        (Some(dev), Some(ip)) => Some(Rdma {
            dev,
            ip,
            gid: var("BARLINK_VM_RDMA_GID").and_then(|g| g.trim().parse().ok()),
        }),
        _ => {
            eprintln!(
                "SKIPPED {test}: needs soft-RoCE in the QEMU guest (tests/vm/run.sh sets \
                 BARLINK_VM_RDMA_DEV and BARLINK_VM_RDMA_IP)"
            );
            None
        }
    }
}

/// Message `index` of `stream`: 1 B .. 64 KiB, mostly small (rxe under
/// emulation is slow), the same on both sides.
pub fn message(stream: u64, index: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(stream ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let top = match rng.below(100) {
        0 => 64 << 10,
        1..=9 => 16 << 10,
        10..=39 => 2 << 10,
        _ => 256,
    };
    let len = 1 + rng.below(top) as usize;
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

/// Sends `count` messages of stream `send` and receives `count` of `recv`,
/// checking each byte for byte, then a last empty message each way, so
/// that each side knows the other received everything before it closes.
pub fn exchange(
    link: &mut RdmaLink<VerbsQueue>,
    send: u64,
    recv: u64,
    count: u64,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    let (mut sent, mut received) = (0u64, 0u64);
    let mut next: Option<Vec<u8>> = None;
    // Message `count` is the empty "done" message.
    while received <= count || sent <= count {
        assert!(
            Instant::now() < deadline,
            "stuck after {limit:?}: sent {sent}, received {received}; engine {:?}; medium {:?}",
            link.engine().stats(),
            link.medium().stats()
        );
        if sent < count || (sent == count && received >= count) {
            let data = next.take().unwrap_or_else(|| {
                if sent < count {
                    message(send, sent)
                } else {
                    Vec::new()
                }
            });
            match link.send(data) {
                Ok(_) => sent += 1,
                Err(SendError::QueueFull(back)) => next = Some(back),
                Err(other) => panic!("send {sent}: {other}"),
            }
        }
        match link.try_recv() {
            Ok(Some(data)) => {
                if received < count {
                    let expected = message(recv, received);
                    assert_eq!(data.len(), expected.len(), "message {received}: length");
                    assert!(data == expected, "message {received}: bytes differ");
                } else {
                    assert!(data.is_empty(), "the done message");
                }
                received += 1;
                link.recycle(data);
            }
            Ok(None) => {}
            Err(error) => panic!("receiving message {received}: {error}"),
        }
    }
    link.flush(limit).expect("flush");
}
