//! Sending in place from [`SendMemory`] over the in-process queue pair:
//! packets whose payload lies in send memory go out as a header from the
//! staging area gathered with the payload where it lies, and arrive
//! intact, in order, resent in place when they were damaged; everything
//! else is copied as before. The same over real verbs runs in the QEMU
//! guest (`guest_link.rs`).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink_rdma::SendMemory;
use barlink_rdma::link::{IN_PLACE_FROM, RdmaLink, RingShape, rdma_link};
use barlink_rdma::loopback::{self, LoopbackControl, LoopbackFaults, LoopbackQueue};
use barlink_transport::EngineConfig;
use barlink_transport::rng::SplitMix64;
use barlink_transport::wire::HEADER_LEN;

const MTU: usize = 8192;

/// A message that is a range of a larger buffer.
#[derive(Debug, Clone)]
struct Slice {
    memory: Arc<[u8]>,
    range: Range<usize>,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        &self.memory[self.range.clone()]
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        mtu: MTU,
        max_message_len: 1 << 20,
        peer_timeout: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(50),
        ..EngineConfig::default()
    }
}

fn pair() -> (
    RdmaLink<LoopbackQueue, Slice>,
    RdmaLink<LoopbackQueue, Slice>,
    LoopbackControl,
) {
    let config = config();
    let ring = RingShape::for_mtu(32, MTU).unwrap();
    let (a, b) = loopback::pair(ring, ring, 64).unwrap();
    let control = a.control();
    let a = rdma_link(a, ring, ring, config.clone(), 1).unwrap();
    let b = rdma_link(b, ring, ring, config, 1).unwrap();
    (a, b, control)
}

/// 256 KiB of random bytes.
fn memory(seed: u64) -> Arc<[u8]> {
    let mut bytes = vec![0u8; 256 << 10];
    SplitMix64::new(seed).fill(&mut bytes);
    bytes.into()
}

/// Ranges of every kind: shorter than `IN_PLACE_FROM`, one packet, many
/// packets with a short last one, at odd offsets.
fn ranges(len: usize) -> Vec<Range<usize>> {
    let mut rng = SplitMix64::new(42);
    let mut ranges = vec![0..1, 3..(3 + IN_PLACE_FROM), 1..(1 + 100_000), 0..len];
    for _ in 0..60 {
        let size = 1 + rng.below(70_000) as usize;
        let start = rng.below((len - size) as u64) as usize;
        ranges.push(start..start + size);
    }
    ranges
}

/// Payload bytes that go in place when `len` bytes are sent once:
/// whole packets' payloads of at least `IN_PLACE_FROM`.
fn in_place_bytes(len: usize) -> u64 {
    let per_packet = MTU - HEADER_LEN;
    let mut bytes = 0;
    let mut left = len;
    while left > 0 {
        let fragment = left.min(per_packet);
        if fragment >= IN_PLACE_FROM {
            bytes += fragment as u64;
        }
        left -= fragment;
    }
    bytes
}

/// Sends every range from A to B, checking each message B receives
/// against the memory it came from.
fn send_all(
    a: &mut RdmaLink<LoopbackQueue, Slice>,
    b: &mut RdmaLink<LoopbackQueue, Slice>,
    memory: &Arc<[u8]>,
    ranges: &[Range<usize>],
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 0;
    let mut received = 0;
    while received < ranges.len() {
        assert!(
            Instant::now() < deadline,
            "stuck: sent {sent}, received {received}"
        );
        if sent < ranges.len() {
            let slice = Slice {
                memory: memory.clone(),
                range: ranges[sent].clone(),
            };
            if a.send(slice).is_ok() {
                sent += 1;
            }
        }
        a.progress().unwrap();
        while let Some(got) = b.try_recv().unwrap() {
            let want = &memory[ranges[received].clone()];
            assert_eq!(got.len(), want.len(), "message {received}: length");
            assert!(got == want, "message {received}: bytes differ");
            received += 1;
            b.recycle(got);
        }
    }
    a.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn payloads_in_send_memory_go_in_place_and_arrive_intact() {
    let (mut a, mut b, _) = pair();
    let memory = memory(1);
    let registered = SendMemory::new(memory.clone()).unwrap();
    let ranges = ranges(memory.len());
    send_all(&mut a, &mut b, &memory, &ranges);
    let medium = a.medium().stats();
    let expected: u64 = ranges.iter().map(|r| in_place_bytes(r.len())).sum();
    assert_eq!(a.engine().stats().retransmits(), 0);
    assert_eq!(medium.bytes_in_place, expected, "{medium:?}");
    assert!(medium.writes_in_place > 0 && medium.writes_in_place < medium.writes_posted);
    // The loopback has no device: nothing was registered with one.
    assert_eq!(registered.registrations(), 0);
    drop(registered);
    // Without the registration the same messages are copied.
    let before = a.medium().stats().writes_in_place;
    send_all(&mut a, &mut b, &memory, &ranges);
    assert_eq!(a.medium().stats().writes_in_place, before);
}

#[test]
fn damaged_writes_in_place_are_resent_in_place() {
    let (mut a, mut b, control) = pair();
    control.set_faults(LoopbackFaults {
        seed: 3,
        corrupt: 0.05,
        lose: 0.02,
    });
    let memory = memory(2);
    let _registered = SendMemory::new(memory.clone()).unwrap();
    let ranges = ranges(memory.len());
    send_all(&mut a, &mut b, &memory, &ranges);
    let injected = control.injected();
    assert!(injected.corrupted > 0 && injected.lost > 0, "{injected:?}");
    assert!(b.engine().stats().crc_failures > 0);
    assert!(a.engine().stats().retransmits() > 0);
    let once: u64 = ranges.iter().map(|r| in_place_bytes(r.len())).sum();
    let medium = a.medium().stats();
    assert!(medium.bytes_in_place > once, "{medium:?}");
}

#[test]
fn memory_outside_send_memory_is_copied() {
    let (mut a, mut b, _) = pair();
    let memory = memory(3);
    // Registered: another buffer, and a range of this one shorter than
    // any packet's payload of IN_PLACE_FROM or more that lies in it.
    let _other = SendMemory::new(vec![1u8; 1 << 20].into()).unwrap();
    let ranges = vec![0..70_000, 20_000..60_000];
    // SAFETY: `memory` outlives the registration (dropped at the end of
    // the test, after it) and is never modified.
    let _part = unsafe { SendMemory::register_raw(memory.as_ptr().add(5), 8_000) }.unwrap();
    send_all(&mut a, &mut b, &memory, &ranges);
    assert_eq!(a.medium().stats().writes_in_place, 0);
}

#[test]
fn empty_send_memory_is_refused() {
    let error = SendMemory::new(Vec::new().into()).unwrap_err();
    assert!(error.to_string().contains("non-empty"), "{error}");
}
