//! Real VFIO, real BARs, a real IOMMU: tests that run inside the QEMU guest
//! of `tests/vm/run.sh`, and checks the host makes afterwards on the files
//! behind the BARs.
//!
//! Every test here is `#[ignore]`d. The harness runs, in the guest (as
//! root, with `BARLINK_VM_GUEST=1`),
//! `guest --ignored --test-threads=1 guest_`, and after the guest has
//! powered off, on the host (with `BARLINK_VM_BAR_A`/`BARLINK_VM_BAR_B`
//! naming the backing files), `guest --ignored --test-threads=1 host_after_guest_`.
//! Run anywhere else, each test prints `SKIPPED <name>: ...` and returns.
//! Child roles (`child_*`, started by the tests with `--exact`) do not match
//! either filter; started by hand they say `SKIPPED` too.
//!
//! # The guest (the contract with `tests/vm/run.sh`)
//! q35 with an emulated VT-d (`intel_iommu=on`), vfio-pci and
//! vfio_iommu_type1 loaded, devtmpfs on /dev, every device in its own IOMMU
//! group:
//! - `0000:00:10.0` ivshmem-plain, 16 MiB BAR 2 backed by host file A
//! - `0000:00:11.0` ivshmem-plain, BAR 2 backed by file B
//! - `0000:00:12.0` ivshmem-plain, BAR 2 backed by file A again (aliases 10.0)
//! - `0000:00:13.0` ivshmem-plain, BAR 2 backed by file B again (aliases 11.0)
//! - `0000:00:14.0` QEMU edu (1234:11e8): DMA engine, 28-bit DMA mask
//! - `0000:00:15.0` virtio-net (not touched here)
//!
//! (`BARLINK_VM_IVSHMEM` and `BARLINK_VM_EDU` override the addresses.)
//! Both files are zero when the guest boots. The tests bind what they use
//! to vfio-pci themselves, so each runs alone as well as in the sequence.
//!
//! # Layout of the BARs (the same offsets in files A and B)
//! ```text
//! 0x000000  64 KiB  guest_pattern_for_host: seeded pattern (A via VFIO of
//!                   10.0, B via sysfs resource2 of 11.0); the host checks it
//! 0x010000   4 KiB  guest_map_both_bars: scratch, written and read back
//! 0x020000   2 KiB  guest_edu_dma_into_ivshmem_bar: what the edu device
//!                   DMAs into A; the host checks it
//! 0x030000          (free)
//! 0x100000   3 MiB  guest_bar_link_between_processes: link region
//! 0x400000   3 MiB  guest_bar_link_with_faults: link region
//! 0x700000          (free)
//! 0x800000   4 MiB  guest_validate_cli_over_bars: `barlink validate`'s
//!                   tested range (patterns, then a ring at its start);
//!                   the host checks the rings' magic
//! 0xC00000  2 MiB  tests/connect_guest.rs: the facade's BAR link
//! 0xE10000  1.9 MiB ffi/tests/guest.rs: kv_transfer's BAR link
//!                   (up to 0xFFFFFF)
//! ```
//! A link region: a 64 KiB handshake page (`READY` word at +0, written by
//! the ring's owner once its ring is laid out; `DONE` word at +8, written by
//! the peer when it has everything), then the ring window (2 MiB + 256 bytes
//! at +64 KiB). Process P owns 10.0 (file A) as its receive window and
//! writes Q's ring through 13.0 (file B); process Q owns 11.0 (file B) and
//! writes P's through 12.0 (file A): two processes, four VFIO groups, two
//! shared buffers.
//!
//! # IOVAs (edu can reach 28 bits)
//! host memory at 0x100000, the BAR of 10.0 at 0x1000000.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use barlink_topology::Bdf;
use barlink_transport::EngineConfig;
use barlink_transport::SendError;
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::{FaultConfig, FaultWindow, Window};
use barlink_vfio::bind::{self, driver_of, iommu_group_of};
use barlink_vfio::sys::mock::MockSys;
use barlink_vfio::{
    BarSource, BarWindow, BindOutcome, Container, DmaBuffer, SysfsBar, VfioDevice, VfioEnv,
    VfioError, bind_to_vfio_pci,
};

// ------------------------------------------------------------------ layout

#[path = "../../tests/support/guest.rs"]
mod guest_support;

use guest_support::{in_guest, wait_with_deadline};

const PATTERN_OFFSET: usize = 0;
const PATTERN_LEN: usize = 64 << 10;
const PATTERN_SEED_A: u64 = 0xA11C_E5EE_D000_000A;
const PATTERN_SEED_B: u64 = 0xB0B5_EED0_0000_000B;
const SCRATCH_OFFSET: usize = 0x1_0000;
const EDU_TARGET_OFFSET: usize = 0x2_0000;
const EDU_XFER: usize = 2048;
const EDU_SEED: u64 = 0xED0_D3A;
const LINK_REGION: usize = 0x10_0000;
const FAULT_LINK_REGION: usize = 0x40_0000;
const VALIDATE_REGION: usize = 0x80_0000;
const VALIDATE_LEN: usize = 4 << 20;
const RING_AT: usize = 64 << 10;
const RING_LEN: usize = (2 << 20) + barlink_transport::ring::CONTROL_LEN;
const READY: usize = 0;
const DONE: usize = 8;

const RAM_IOVA: u64 = 0x10_0000;
const BAR_IOVA: u64 = 0x100_0000;

// edu registers (QEMU docs/specs/edu.rst)
const EDU_ID: usize = 0x00;
const EDU_LIVENESS: usize = 0x04;
const EDU_DMA_SRC: usize = 0x80;
const EDU_DMA_DST: usize = 0x88;
const EDU_DMA_COUNT: usize = 0x90;
const EDU_DMA_CMD: usize = 0x98;
const EDU_DMA_RUN: u64 = 1;
const EDU_DMA_TO_RAM: u64 = 2;
const EDU_BUFFER: u64 = 0x4_0000;

// ------------------------------------------------------------------ helpers

fn ivshmem() -> [Bdf; 4] {
    guest_support::ivshmem_addresses().map(|s| s.parse().expect("BARLINK_VM_IVSHMEM: addresses"))
}

fn edu() -> Bdf {
    std::env::var("BARLINK_VM_EDU")
        .unwrap_or_else(|_| "0000:00:14.0".into())
        .parse()
        .expect("BARLINK_VM_EDU: an address")
}

fn bind_all(bdfs: &[Bdf]) {
    for &bdf in bdfs {
        bind_to_vfio_pci(bdf).unwrap_or_else(|e| panic!("binding {bdf}: {e}"));
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0; len];
    SplitMix64::new(seed).fill(&mut data);
    data
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Message `index` of a stream: mixed sizes (0 B to 32 KiB), its index in
/// the first bytes and a pattern after, so a lost, repeated, misplaced or
/// corrupted message shows.
fn message(seed: u64, index: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = match rng.below(20) {
        0 => 0,
        1..=6 => rng.below(64) as usize,
        7..=13 => 64 + rng.below(1024 - 64) as usize,
        14..=18 => 1024 + rng.below(7 << 10) as usize,
        // Larger than the MTU: fragmented and reassembled.
        _ => (16 << 10) + rng.below(16 << 10) as usize,
    };
    let tag = rng.next_u64() as u8;
    let mut data: Vec<u8> = (0..len)
        .map(|j| tag.wrapping_add((j as u8) ^ ((j >> 8) as u8)))
        .collect();
    let id = index.to_le_bytes();
    let n = len.min(8);
    data[..n].copy_from_slice(&id[..n]);
    data
}

fn engine_config() -> EngineConfig {
    // TCG is slow and two processes share two vCPUs: generous timers.
    EngineConfig {
        mtu: 16 << 10,
        max_message_len: 1 << 20,
        initial_rto: Duration::from_millis(300),
        min_rto: Duration::from_millis(100),
        max_rto: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        peer_timeout: Duration::from_secs(60),
        max_transmissions: 64,
        ..EngineConfig::default()
    }
}

fn nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()) << 32) | 1
}

/// Spawns this test binary as a child role, stdout discarded (its libtest
/// lines must not count as tests of the run), stderr collected.
fn spawn_child(role: &str, spec: &str) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            role,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SPEC, spec)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {role}: {e}"));
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    (child, reader)
}

/// Waits for a child, failing with its stderr if it fails.
fn expect_child_success(
    mut child: std::process::Child,
    reader: std::thread::JoinHandle<String>,
    what: &str,
) {
    let status = wait_with_deadline(&mut child, CHILD_LIMIT, what);
    let text = reader.join().unwrap_or_default();
    let text: String = text
        .lines()
        .map(|line| format!("    child> {line}\n"))
        .collect();
    // Captured by the harness unless run with --nocapture.
    eprint!("{text}");
    assert!(status.success(), "{what} failed ({status}):\n{text}");
}

/// Longest a child role may run (the harness's own limit is longer, so a
/// hung child is named here rather than killing the whole binary).
const CHILD_LIMIT: Duration = Duration::from_secs(150);

/// The environment variable that carries a child role's instructions.
const CHILD_SPEC: &str = "BARLINK_VFIO_GUEST_CHILD";

/// The child's instructions, or `None` (after saying SKIPPED) when started
/// by hand.
fn child_spec(role: &str) -> Option<String> {
    match std::env::var(CHILD_SPEC) {
        Ok(spec) => Some(spec),
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {role}: a child role, started by the guest_ tests"
            );
            None
        }
    }
}

// ------------------------------------------------------------------ links

/// One side of a BAR link: which device is the receive window, which the
/// window into the peer's ring.
struct Side {
    own: Bdf,
    peer: Bdf,
}

/// P owns 10.0 (file A) and writes through 13.0 (file B); Q owns 11.0
/// (file B) and writes through 12.0 (file A).
fn sides() -> (Side, Side) {
    let [a, b, a_alias, b_alias] = ivshmem();
    (
        Side {
            own: a,
            peer: b_alias,
        },
        Side {
            own: b,
            peer: a_alias,
        },
    )
}

/// Both BARs of a side, opened in one container, as full windows.
fn open_side(side: &Side) -> (BarWindow, BarWindow) {
    let container = Container::open().unwrap_or_else(|e| panic!("{e}"));
    let own = container
        .open_device(side.own)
        .unwrap_or_else(|e| panic!("{}: {e}", side.own));
    let peer = container
        .open_device(side.peer)
        .unwrap_or_else(|e| panic!("{}: {e}", side.peer));
    let own_bar = own.map_region(2).unwrap_or_else(|e| panic!("{e}"));
    let peer_bar = peer.map_region(2).unwrap_or_else(|e| panic!("{e}"));
    (own_bar, peer_bar)
}

#[derive(Debug, Clone, Copy)]
struct LinkPlan {
    region: usize,
    nonce: u64,
    faults: bool,
    /// Messages P sends to Q, and Q to P.
    p_to_q: u64,
    q_to_p: u64,
    timeout: Duration,
}

impl LinkPlan {
    fn encode(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.region,
            self.nonce,
            u8::from(self.faults),
            self.p_to_q,
            self.q_to_p,
            self.timeout.as_secs()
        )
    }

    fn decode(text: &str) -> LinkPlan {
        let v: Vec<u64> = text.split(',').map(|s| s.parse().unwrap()).collect();
        LinkPlan {
            region: v[0] as usize,
            nonce: v[1],
            faults: v[2] == 1,
            p_to_q: v[3],
            q_to_p: v[4],
            timeout: Duration::from_secs(v[5]),
        }
    }
}

const SEED_P_TO_Q: u64 = 0x5EED_0001;
const SEED_Q_TO_P: u64 = 0x5EED_0002;

fn fault_config() -> FaultConfig {
    FaultConfig::none()
        .with_bit_flip(0.005)
        .with_drop(0.002)
        .with_tear(0.002)
        .with_stall(0.002, 3)
}

/// What one side of a link saw.
#[derive(Debug)]
struct SideReport {
    received: u64,
    stats: barlink_transport::Stats,
    /// Index words (head, consumed) not acted on, and repeated.
    index: barlink_transport::link::IndexStats,
    injected: Option<barlink_transport::window::InjectedFaults>,
}

/// Runs one side of the link: lays out its own ring, publishes READY,
/// waits for the peer's, then sends `send` messages and checks each of the
/// `receive` it gets, until both are done; then the DONE handshake.
fn run_side(is_p: bool, plan: &LinkPlan, own_bar: &BarWindow, peer_bar: &BarWindow) -> SideReport {
    let region_own = own_bar.slice(plan.region, 3 << 20).unwrap();
    let region_peer = peer_bar.slice(plan.region, 3 << 20).unwrap();
    let own_ring = region_own.slice(RING_AT, RING_LEN).unwrap();
    let peer_ring = region_peer.slice(RING_AT, RING_LEN).unwrap();
    let config = engine_config();
    let geometry = Geometry::for_window(RING_LEN, config.mtu).unwrap();
    init_ring(&own_ring, geometry, 1).unwrap();
    region_own.store_fence();
    region_own
        .store_u64(READY, plan.nonce, Ordering::Release)
        .unwrap();
    let deadline = Instant::now() + plan.timeout;
    while region_peer.load_u64(READY, Ordering::Acquire).unwrap() != plan.nonce {
        assert!(
            Instant::now() < deadline,
            "the peer never published its ring"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (send, send_seed, receive, receive_seed) = if is_p {
        (plan.p_to_q, SEED_P_TO_Q, plan.q_to_p, SEED_Q_TO_P)
    } else {
        (plan.q_to_p, SEED_Q_TO_P, plan.p_to_q, SEED_P_TO_Q)
    };
    let traffic = Traffic {
        send,
        send_seed,
        receive,
        receive_seed,
        nonce: plan.nonce,
        deadline,
    };
    if plan.faults {
        // Faults injected into every write to the peer's BAR.
        let faulty = Arc::new(FaultWindow::new(
            peer_ring,
            fault_config(),
            plan.nonce ^ u64::from(is_p),
        ));
        let own: Arc<dyn Window> = Arc::new(own_ring);
        let peer: Arc<dyn Window> = faulty.clone();
        let link: RingLink<Arc<dyn Window>> =
            RingLink::new(own, peer, config, 1).unwrap_or_else(|e| panic!("link setup: {e}"));
        let mut report = exchange(link, &traffic, &region_own, &region_peer);
        report.injected = Some(faulty.injected());
        report
    } else {
        // The BAR windows themselves, as the link's windows: no wrapper.
        let link: RingLink<BarWindow> = RingLink::new(own_ring, peer_ring, config, 1)
            .unwrap_or_else(|e| panic!("link setup: {e}"));
        exchange(link, &traffic, &region_own, &region_peer)
    }
}

/// What one side sends and expects.
struct Traffic {
    send: u64,
    send_seed: u64,
    receive: u64,
    receive_seed: u64,
    nonce: u64,
    deadline: Instant,
}

/// Sends and checks messages until both directions are done, then the
/// DONE handshake in the link region's first page.
fn exchange<W: Window>(
    mut link: RingLink<W>,
    traffic: &Traffic,
    region_own: &BarWindow,
    region_peer: &BarWindow,
) -> SideReport {
    let &Traffic {
        send,
        send_seed,
        receive,
        receive_seed,
        nonce,
        deadline,
    } = traffic;
    let mut sent = 0u64;
    let mut received = 0u64;
    while received < receive || link.completed() < send {
        let mut busy = false;
        while sent < send {
            match link.send(message(send_seed, sent)) {
                Ok(_) => {
                    sent += 1;
                    busy = true;
                }
                Err(SendError::QueueFull(_)) => break,
                Err(_) => panic!("message {sent} refused: the link is closed"),
            }
        }
        busy |= link
            .progress()
            .unwrap_or_else(|e| panic!("after {received} received: {e}"));
        while let Some(got) = link
            .try_recv()
            .unwrap_or_else(|e| panic!("after {received} received: {e}"))
        {
            let want = message(receive_seed, received);
            assert!(
                got == want,
                "message {received}: {} bytes arrived, {} sent; first difference at {:?}",
                got.len(),
                want.len(),
                first_difference(&got, &want)
            );
            link.recycle(got);
            received += 1;
            busy = true;
        }
        assert!(
            Instant::now() < deadline,
            "timed out: {received}/{receive} received, {}/{send} acknowledged; {:?}",
            link.completed(),
            link.engine().stats()
        );
        if !busy {
            std::thread::yield_now();
        }
    }
    // Everything is here and acknowledged; tell the peer, and keep
    // acknowledging until it says the same.
    region_peer
        .store_u64(DONE, nonce, Ordering::Release)
        .unwrap();
    while region_own.load_u64(DONE, Ordering::Acquire).unwrap() != nonce {
        link.progress().unwrap_or_else(|e| panic!("lingering: {e}"));
        assert!(Instant::now() < deadline, "the peer never finished");
        std::thread::yield_now();
    }
    // A little more, so the peer's last acknowledgements are not cut off.
    let linger = Instant::now() + Duration::from_millis(300);
    while Instant::now() < linger {
        let _ = link.progress();
        std::thread::yield_now();
    }
    SideReport {
        received,
        stats: link.engine().stats().clone(),
        index: link.index_stats(),
        injected: None,
    }
}

/// P's part: clears both regions, starts Q, runs its side, waits for Q.
fn run_link_test(name: &str, plan: LinkPlan) -> SideReport {
    let (p, q) = sides();
    bind_all(&[p.own, p.peer, q.own, q.peer]);
    let (own_bar, peer_bar) = open_side(&p);
    // Nothing of an earlier run may look like a live ring or handshake.
    let zeros = vec![0u8; RING_AT + 4096];
    own_bar.write(plan.region, &zeros).unwrap();
    peer_bar.write(plan.region, &zeros).unwrap();
    own_bar.store_fence();
    let (child, reader) = spawn_child("child_bar_link_peer", &plan.encode());
    let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_side(true, &plan, &own_bar, &peer_bar)
    }));
    match report {
        Ok(report) => {
            expect_child_success(child, reader, "the peer process (Q)");
            let _ = writeln!(
                std::io::stderr(),
                "{name}: received {} messages; {:?}; {:?}; faults injected {:?}",
                report.received,
                report.stats,
                report.index,
                report.injected
            );
            report
        }
        Err(panic) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            let text = reader.join().unwrap_or_default();
            let _ = writeln!(std::io::stderr(), "peer process (Q) stderr:\n{text}");
            std::panic::resume_unwind(panic);
        }
    }
}

/// Q: the peer process of the link tests.
#[test]
#[ignore = "child role of guest_bar_link_*; started by them"]
fn child_bar_link_peer() {
    let Some(spec) = child_spec("child_bar_link_peer") else {
        return;
    };
    let plan = LinkPlan::decode(&spec);
    let (_, q) = sides();
    let (own_bar, peer_bar) = open_side(&q);
    let report = run_side(false, &plan, &own_bar, &peer_bar);
    assert_eq!(report.received, plan.p_to_q);
    if let Some(injected) = report.injected {
        eprintln!("Q injected {injected:?}");
    }
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_bar_link_between_processes() {
    if !in_guest("guest_bar_link_between_processes") {
        return;
    }
    let plan = LinkPlan {
        region: LINK_REGION,
        nonce: nonce(),
        faults: false,
        p_to_q: 500,
        q_to_p: 10_000,
        timeout: Duration::from_secs(110),
    };
    let report = run_link_test("guest_bar_link_between_processes", plan);
    assert_eq!(report.received, 10_000);
    assert_eq!(report.stats.messages_delivered, 10_000);
    assert_eq!(
        report.stats.crc_failures, 0,
        "CRC failures on a clean BAR: {:?}",
        report.stats
    );
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_bar_link_with_faults() {
    if !in_guest("guest_bar_link_with_faults") {
        return;
    }
    let plan = LinkPlan {
        region: FAULT_LINK_REGION,
        nonce: nonce(),
        faults: true,
        p_to_q: 300,
        q_to_p: 2_000,
        timeout: Duration::from_secs(60),
    };
    let report = run_link_test("guest_bar_link_with_faults", plan);
    assert_eq!(report.received, 2_000);
    let injected = report.injected.expect("P's peer window is faulted");
    assert!(
        injected.bit_flips + injected.dropped + injected.torn + injected.stalled > 0,
        "no faults were injected: {injected:?}"
    );
    // The index stores into Q's BAR went through the faulting wrapper too.
    assert!(injected.index_stores > 0, "{injected:?}");
    let stats = &report.stats;
    assert!(
        stats.crc_failures + stats.malformed + stats.retransmits() > 0,
        "faults were injected but nothing was caught or resent: {stats:?}"
    );
}

// ------------------------------------------------------------------ the CLI

/// Runs the `barlink` CLI of the harness (`BARLINK_VM_BARLINK`) with
/// `args`, killing it past `limit`; returns its exit code, stdout, stderr.
fn run_cli(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let barlink = std::env::var_os("BARLINK_VM_BARLINK")
        .expect("BARLINK_VM_BARLINK names the barlink CLI (tests/vm/run.sh sets it)");
    let mut child = Command::new(&barlink)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", PathBuf::from(&barlink).display()));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_with_deadline(&mut child, limit, &format!("barlink {args:?}"));
    (
        status.code(),
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    )
}

/// `barlink validate` over two real BARs through VFIO, as a user runs it:
/// each BAR one side's receive window; a clean run is PASS, and with bit
/// flips injected the raw phase finds them (FAIL, exit 1) while the link
/// catches its own and delivers everything intact.
#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_validate_cli_over_bars() {
    if !in_guest("guest_validate_cli_over_bars") {
        return;
    }
    let [a, b, ..] = ivshmem();
    bind_all(&[a, b]);
    let devices = format!("{a},{b}");
    let offset = VALIDATE_REGION.to_string();
    let size = VALIDATE_LEN.to_string();
    // TCG is slow: a smaller link load than --quick's, the same shape.
    let mut args = vec![
        "validate",
        "--quick",
        "--device",
        &devices,
        "--offset",
        &offset,
        "--size",
        &size,
        "--link-bytes",
        "4M",
        "--max-size",
        "256K",
        "--timeout",
        "100",
        "--json",
    ];
    let (code, stdout, stderr) = run_cli(&args, Duration::from_secs(150));
    let doc: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}); exit {code:?}\n{stdout}\nstderr:\n{stderr}"));
    eprintln!(
        "validate: {} — {} (raw {:?}, link {:?})",
        doc["verdict"], doc["reason"], doc["raw"]["bad_words"], doc["link"]["elapsed_s"]
    );
    assert_eq!(code, Some(0), "{doc:#}\nstderr:\n{stderr}");
    assert_eq!(doc["verdict"], "PASS", "{doc:#}");
    for (device, bdf) in doc["devices"].as_array().unwrap().iter().zip([a, b]) {
        assert_eq!(device["bdf"], bdf.to_string(), "{device}");
        assert_eq!(device["via"], "vfio", "bound to vfio-pci: {device}");
        assert_eq!(device["bar"], 2, "the largest BAR: {device}");
    }
    assert_eq!(doc["raw"]["patterns"].as_array().unwrap().len(), 6);
    let link = &doc["link"];
    assert!(link["messages"].as_u64().unwrap() > 0, "{link}");
    for field in ["crc_failures_caught", "lost", "corrupted", "duplicated"] {
        assert_eq!(link[field], 0, "{field}: {link}");
    }

    // Bit flips injected into the writes: found raw, caught by the link.
    args.truncate(6);
    args.extend([
        "--size",
        "1M",
        "--link-bytes",
        "2M",
        "--max-size",
        "64K",
        "--inject-faults",
        "0.05",
        "--timeout",
        "60",
        "--json",
    ]);
    let (code, stdout, stderr) = run_cli(&args, Duration::from_secs(90));
    let doc: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}); exit {code:?}\n{stdout}\nstderr:\n{stderr}"));
    assert_eq!(code, Some(1), "{doc:#}\nstderr:\n{stderr}");
    assert_eq!(doc["verdict"], "FAIL", "{doc:#}");
    assert!(doc["raw"]["bad_words"].as_u64().unwrap() > 0, "{doc:#}");
    let link = &doc["link"];
    assert!(link["crc_failures_caught"].as_u64().unwrap() > 0, "{link}");
    for field in ["lost", "corrupted", "duplicated"] {
        assert_eq!(link[field], 0, "{field}: {link}");
    }
}

// ------------------------------------------------------------------ binding and mapping

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_bind_to_vfio_pci() {
    if !in_guest("guest_bind_to_vfio_pci") {
        return;
    }
    let root = std::path::Path::new("/");
    let mut devices = ivshmem().to_vec();
    devices.push(edu());
    let mut groups = Vec::new();
    for &bdf in &devices {
        let outcome = bind_to_vfio_pci(bdf).unwrap_or_else(|e| panic!("{bdf}: {e}"));
        assert_eq!(driver_of(root, bdf).as_deref(), Some("vfio-pci"), "{bdf}");
        let group = iommu_group_of(root, bdf).expect("an IOMMU group");
        assert!(
            PathBuf::from(format!("/dev/vfio/{group}")).exists(),
            "{bdf}: /dev/vfio/{group} missing"
        );
        eprintln!("{bdf}: {outcome:?}, group {group}");
        groups.push(group);
    }
    let mut distinct = groups.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        groups.len(),
        "one group per device: {groups:?}"
    );
    // Unbound, then bound again by the same call: it probes anew.
    let bdf = ivshmem()[2];
    bind::unbind(root, bdf).unwrap();
    assert_eq!(driver_of(root, bdf), None);
    assert_eq!(
        bind_to_vfio_pci(bdf).unwrap(),
        BindOutcome::Bound { previous: None }
    );
    assert_eq!(bind_to_vfio_pci(bdf).unwrap(), BindOutcome::AlreadyBound);
    // And the device opens, by address and by vendor:device.
    let device = VfioDevice::open(&bdf.to_string()).unwrap();
    assert!(device.info().is_pci());
    drop(device);
    let by_id = VfioDevice::open("1af4:1110").unwrap();
    assert_eq!(by_id.bdf(), ivshmem()[0]);
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_map_both_bars() {
    if !in_guest("guest_map_both_bars") {
        return;
    }
    let [a, b, a_alias, _] = ivshmem();
    bind_all(&[a, a_alias]);
    let device = VfioDevice::open(&a.to_string()).unwrap();
    let info = device.region_info(2).unwrap();
    assert_eq!(info.size, 16 << 20);
    assert!(info.mappable() && info.readable() && info.writable());
    let vfio_bar = device.map_region(2).unwrap();
    assert_eq!(vfio_bar.len(), 16 << 20);
    // 11.0 through sysfs (it may be bound to vfio-pci, but not open).
    let sysfs_bar = SysfsBar::open(&b.to_string(), 2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sysfs_bar.len(), 16 << 20);
    eprintln!("sysfs route: {}", sysfs_bar.source());
    assert!(matches!(sysfs_bar.source(), BarSource::Sysfs { .. }));
    for (bar, seed) in [(&vfio_bar, 1u64), (&sysfs_bar, 2)] {
        let data = pattern(seed, 4096);
        bar.write(SCRATCH_OFFSET, &data).unwrap();
        bar.store_fence();
        let mut back = vec![0u8; 4096];
        bar.read(SCRATCH_OFFSET, &mut back).unwrap();
        assert!(back == data, "{}: read back differs", bar.source());
        bar.store_u64(
            SCRATCH_OFFSET + 4096,
            0x1234_5678_9abc_def0,
            Ordering::Release,
        )
        .unwrap();
        assert_eq!(
            bar.load_u64(SCRATCH_OFFSET + 4096, Ordering::Acquire),
            Ok(0x1234_5678_9abc_def0)
        );
    }
    // 12.0 shares file A with 10.0: what one writes, the other reads.
    let alias = VfioDevice::open(&a_alias.to_string()).unwrap();
    let alias_bar = alias.map_region(2).unwrap();
    let mut back = vec![0u8; 4096];
    alias_bar.read(SCRATCH_OFFSET, &mut back).unwrap();
    assert!(back == pattern(1, 4096), "12.0 does not alias 10.0");
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_pattern_for_host() {
    if !in_guest("guest_pattern_for_host") {
        return;
    }
    let [a, b, _, _] = ivshmem();
    bind_all(&[a]);
    let a_bar = VfioDevice::open(&a.to_string())
        .unwrap()
        .map_region(2)
        .unwrap();
    let b_bar = SysfsBar::open(&b.to_string(), 2).unwrap();
    for (bar, seed) in [(&a_bar, PATTERN_SEED_A), (&b_bar, PATTERN_SEED_B)] {
        let data = pattern(seed, PATTERN_LEN);
        bar.write(PATTERN_OFFSET, &data).unwrap();
        bar.store_fence();
        let mut back = vec![0u8; PATTERN_LEN];
        bar.read(PATTERN_OFFSET, &mut back).unwrap();
        assert!(back == data, "{}: read back differs", bar.source());
    }
}

// ------------------------------------------------------------------ DMA

/// Runs one edu DMA and waits for it (the device finishes after ~100 ms of
/// virtual time).
fn edu_dma(regs: &BarWindow, src: u64, dst: u64, len: usize, to_ram: bool) {
    regs.write_u64(EDU_DMA_SRC, src).unwrap();
    regs.write_u64(EDU_DMA_DST, dst).unwrap();
    regs.write_u64(EDU_DMA_COUNT, len as u64).unwrap();
    let cmd = EDU_DMA_RUN | if to_ram { EDU_DMA_TO_RAM } else { 0 };
    regs.write_u64(EDU_DMA_CMD, cmd).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while regs.read_u64(EDU_DMA_CMD).unwrap() & EDU_DMA_RUN != 0 {
        assert!(Instant::now() < deadline, "edu DMA did not complete");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The edu device opened in `container`, checked alive, bus master on.
fn edu_registers(container: &Container) -> (VfioDevice, BarWindow) {
    let device = container
        .open_device(edu())
        .unwrap_or_else(|e| panic!("{e}"));
    let regs = device.map_region(0).unwrap_or_else(|e| panic!("{e}"));
    let id = regs.read_u32(EDU_ID).unwrap();
    assert_eq!(id & 0xff, 0xed, "edu identification {id:#x}");
    regs.write_u32(EDU_LIVENESS, 0x1234_5678).unwrap();
    assert_eq!(regs.read_u32(EDU_LIVENESS).unwrap(), !0x1234_5678);
    let command = device.enable_bus_master().unwrap();
    assert_ne!(command & 0x4, 0, "bus mastering stayed off: {command:#x}");
    (device, regs)
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_dma_map_host_memory() {
    if !in_guest("guest_dma_map_host_memory") {
        return;
    }
    bind_all(&[edu()]);
    let container = Container::open().unwrap();
    let ram = DmaBuffer::new(2 << 20).unwrap();
    // Before any device, the container has no IOMMU to map into.
    assert!(container.map_dma(RAM_IOVA, &ram).is_err());
    let (_edu, regs) = edu_registers(&container);
    let info = container.iommu_info().unwrap();
    assert_ne!(info.iova_pgsizes & 0x1000, 0, "4 KiB IOMMU pages: {info:?}");
    let mapping = container.map_dma(RAM_IOVA, &ram).unwrap();
    assert_eq!(mapping.iova(), RAM_IOVA);
    // The same IOVA twice is refused with a reason.
    let error = container.map_dma(RAM_IOVA, &ram).unwrap_err();
    assert!(matches!(error, VfioError::DmaMapFailed { .. }), "{error}");
    // RAM -> edu -> RAM at another IOVA, through the IOMMU.
    let data = pattern(7, EDU_XFER);
    ram.write(0, &data).unwrap();
    edu_dma(&regs, RAM_IOVA, EDU_BUFFER, EDU_XFER, false);
    edu_dma(&regs, EDU_BUFFER, RAM_IOVA + 0x1000, EDU_XFER, true);
    let mut back = vec![0u8; EDU_XFER];
    ram.read(0x1000, &mut back).unwrap();
    assert!(
        back == data,
        "DMA round trip differs at {:?}",
        first_difference(&back, &data)
    );
    mapping.unmap().unwrap();
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_edu_dma_into_ivshmem_bar() {
    if !in_guest("guest_edu_dma_into_ivshmem_bar") {
        return;
    }
    let [a, ..] = ivshmem();
    bind_all(&[edu(), a]);
    let container = Container::open().unwrap();
    let (_edu, regs) = edu_registers(&container);
    let ivshmem = container.open_device(a).unwrap();
    let bar = ivshmem.map_region(2).unwrap();
    bar.write(EDU_TARGET_OFFSET, &[0u8; EDU_XFER]).unwrap();
    // The BAR at an IOVA: a peer-to-peer target for the edu device.
    let bar_mapping = container
        .map_dma(BAR_IOVA, &bar)
        .unwrap_or_else(|e| panic!("{e}"));
    let ram = DmaBuffer::new(4096).unwrap();
    let ram_mapping = container.map_dma(RAM_IOVA, &ram).unwrap();
    let data = pattern(EDU_SEED, EDU_XFER);
    ram.write(0, &data).unwrap();
    edu_dma(&regs, RAM_IOVA, EDU_BUFFER, EDU_XFER, false);
    edu_dma(
        &regs,
        EDU_BUFFER,
        BAR_IOVA + EDU_TARGET_OFFSET as u64,
        EDU_XFER,
        true,
    );
    let mut back = vec![0u8; EDU_XFER];
    bar.read(EDU_TARGET_OFFSET, &mut back).unwrap();
    assert!(
        back == data,
        "the device's write into the BAR differs at {:?}",
        first_difference(&back, &data)
    );
    drop(ram_mapping);
    drop(bar_mapping);
}

// ------------------------------------------------------------------ errors

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_errors_device_not_bound_to_vfio_pci() {
    if !in_guest("guest_errors_device_not_bound_to_vfio_pci") {
        return;
    }
    let root = std::path::Path::new("/");
    let bdf = ivshmem()[3];
    bind_all(&[bdf]);
    bind::unbind(root, bdf).unwrap();
    let error = VfioDevice::open(&bdf.to_string()).unwrap_err();
    let text = error.to_string();
    bind_to_vfio_pci(bdf).unwrap(); // put it back before asserting
    assert_eq!(error, VfioError::NotBoundToVfio { bdf, driver: None });
    assert!(text.contains("driver_override"), "{text}");
    eprintln!("unbound: {text}");
    // A device on another driver (virtio-net on virtio-pci), if there is
    // one: refused before anything is opened.
    let net: Bdf = "0000:00:15.0".parse().unwrap();
    if let Some(driver) = driver_of(root, net).filter(|d| d != "vfio-pci") {
        let error = VfioDevice::open(&net.to_string()).unwrap_err();
        assert!(
            error.to_string().contains(&format!("is bound to {driver}")),
            "{error}"
        );
    }
}

/// Every device here has an IOMMU group of its own, so no group can be made
/// non-viable in this guest: the test checks that premise on the real
/// sysfs, then runs the non-viable path with the real sysfs tree and the
/// mock's group status (the unit tests in vfio_mock.rs cover a group with a
/// device on another driver).
#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_errors_group_not_viable() {
    if !in_guest("guest_errors_group_not_viable") {
        return;
    }
    let root = std::path::Path::new("/");
    let bdf = ivshmem()[0];
    bind_all(&[bdf]);
    let group = iommu_group_of(root, bdf).unwrap();
    let members = bind::group_members(root, group);
    assert_eq!(members.len(), 1, "group {group}: {members:?}");
    let sys = Arc::new(MockSys::new());
    sys.state().group_flags = 0;
    let env = VfioEnv::default().with_sys(sys.clone());
    let error = VfioDevice::open_in(env, &bdf.to_string()).unwrap_err();
    assert_eq!(
        error,
        VfioError::GroupNotViable {
            group,
            blockers: vec![]
        }
    );
    assert!(
        error
            .to_string()
            .contains(&format!("/sys/kernel/iommu_groups/{group}/devices")),
        "{error}"
    );
    assert!(sys.open_fds().is_empty());
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_errors_region_not_mappable() {
    if !in_guest("guest_errors_region_not_mappable") {
        return;
    }
    let [a, b, ..] = ivshmem();
    bind_all(&[a]);
    let device = VfioDevice::open(&a.to_string()).unwrap();
    // Config space: never mmappable.
    let error = device.map_region(7).unwrap_err();
    assert!(
        matches!(error, VfioError::RegionNotMappable { index: 7, .. }),
        "{error}"
    );
    eprintln!("config: {error}");
    // ivshmem-plain has no BAR 1.
    let error = device.map_region(1).unwrap_err();
    assert!(
        matches!(
            error,
            VfioError::RegionNotMappable {
                index: 1,
                size: 0,
                ..
            }
        ),
        "{error}"
    );
    // No region 40.
    let error = device.map_region(40).unwrap_err();
    assert!(
        matches!(error, VfioError::NoSuchRegion { index: 40, .. }),
        "{error}"
    );
    // BAR 0 is 256 bytes of registers: mappable or not depends on the
    // kernel (sub-page BARs); either way the answer is clean.
    match device.map_region(0) {
        Ok(bar) => eprintln!("BAR 0 mapped: {} bytes", bar.len()),
        Err(error) => eprintln!("BAR 0: {error}"),
    }
    // Config space is still reachable with pread.
    let mut id = [0u8; 4];
    device.read_config(0, &mut id).unwrap();
    assert_eq!(&id[..2], &0x1af4u16.to_le_bytes());
    // The sysfs route: no BAR 4.
    let error = SysfsBar::open(&b.to_string(), 4).unwrap_err();
    assert!(
        matches!(
            error,
            VfioError::RegionNotMappable { index: 4, .. } | VfioError::ResourceMissing { .. }
        ),
        "{error}"
    );
}

#[test]
#[ignore = "needs the QEMU guest: tests/vm/run.sh"]
fn guest_errors_missing_permission() {
    if !in_guest("guest_errors_missing_permission") {
        return;
    }
    let [a, b, ..] = ivshmem();
    bind_all(&[a]);
    let (child, reader) = spawn_child("child_unprivileged_open", &format!("{a},{b}"));
    expect_child_success(child, reader, "the unprivileged child");
}

/// Drops to nobody (65534) and expects permission errors that name the file.
#[test]
#[ignore = "child role of guest_errors_missing_permission; started by it"]
fn child_unprivileged_open() {
    let Some(spec) = child_spec("child_unprivileged_open") else {
        return;
    };
    let (a, b) = spec.split_once(',').unwrap();
    // SAFETY: plain system calls with integer arguments; setgroups with a
    // null list and length 0 clears the supplementary groups. glibc applies
    // setgid/setuid to every thread of the process.
    let dropped = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(65534) == 0
            && libc::setuid(65534) == 0
    };
    assert!(dropped, "could not drop privileges");
    // SAFETY: getuid has no arguments and cannot fail.
    assert_eq!(unsafe { libc::getuid() }, 65534);
    for path in ["/sys/bus/pci/devices", &format!("/sys/bus/pci/devices/{a}")] {
        eprintln!(
            "as uid 65534: stat {path}: {:?}",
            std::fs::metadata(path).map(|m| m.is_dir())
        );
    }
    let error = VfioDevice::open(a).unwrap_err();
    match &error {
        VfioError::PermissionDenied { path, .. } => {
            assert!(path.starts_with("/dev/vfio/"), "{error}");
        }
        other => panic!("expected PermissionDenied, got: {other}"),
    }
    assert!(error.to_string().contains("chown"), "{error}");
    eprintln!("vfio: {error}");
    let error = SysfsBar::open(b, 2).unwrap_err();
    assert!(
        matches!(error, VfioError::PermissionDenied { .. }),
        "expected PermissionDenied, got: {error}"
    );
    assert!(error.to_string().contains("Run as root"), "{error}");
    eprintln!("sysfs: {error}");
}

// ------------------------------------------------------------------ host side

fn backing_file(var: &str, test: &str) -> Option<Vec<u8>> {
    let Some(path) = std::env::var_os(var) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: runs on the host after the QEMU guest (tests/vm/run.sh sets {var})"
        );
        return None;
    };
    let data = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{var}={}: {e}", PathBuf::from(&path).display()));
    assert_eq!(data.len(), 16 << 20, "{var}: a 16 MiB BAR file");
    Some(data)
}

#[test]
#[ignore = "runs on the host after the QEMU guest: tests/vm/run.sh"]
fn host_after_guest_backing_files() {
    let test = "host_after_guest_backing_files";
    let Some(a) = backing_file("BARLINK_VM_BAR_A", test) else {
        return;
    };
    let Some(b) = backing_file("BARLINK_VM_BAR_B", test) else {
        return;
    };
    for (name, file, seed, route) in [
        ("A", &a, PATTERN_SEED_A, "VFIO mmap of 10.0"),
        ("B", &b, PATTERN_SEED_B, "sysfs resource2 of 11.0"),
    ] {
        let want = pattern(seed, PATTERN_LEN);
        let got = &file[PATTERN_OFFSET..PATTERN_OFFSET + PATTERN_LEN];
        assert!(
            got == want.as_slice(),
            "file {name}: the pattern written through {route} differs at {:?}",
            first_difference(got, &want)
        );
    }
}

#[test]
#[ignore = "runs on the host after the QEMU guest: tests/vm/run.sh"]
fn host_after_guest_validate_rings_in_both_files() {
    let test = "host_after_guest_validate_rings_in_both_files";
    let Some(a) = backing_file("BARLINK_VM_BAR_A", test) else {
        return;
    };
    let Some(b) = backing_file("BARLINK_VM_BAR_B", test) else {
        return;
    };
    // `barlink validate` laid side A's ring at the start of its range in
    // 10.0's BAR (file A), side B's in 11.0's (file B).
    let magic = barlink_transport::ring::RING_MAGIC.to_le_bytes();
    for (name, file) in [("A", &a), ("B", &b)] {
        assert_eq!(
            file[VALIDATE_REGION..VALIDATE_REGION + 8],
            magic,
            "file {name}: no ring at {VALIDATE_REGION:#x}: the CLI's writes through the BAR did not land"
        );
    }
}

#[test]
#[ignore = "runs on the host after the QEMU guest: tests/vm/run.sh"]
fn host_after_guest_edu_dma_landed_in_file_a() {
    let Some(a) = backing_file(
        "BARLINK_VM_BAR_A",
        "host_after_guest_edu_dma_landed_in_file_a",
    ) else {
        return;
    };
    let want = pattern(EDU_SEED, EDU_XFER);
    let got = &a[EDU_TARGET_OFFSET..EDU_TARGET_OFFSET + EDU_XFER];
    assert!(
        got == want.as_slice(),
        "the edu DMA into BAR 2 of 10.0 is not in file A (differs at {:?})",
        first_difference(got, &want)
    );
}
