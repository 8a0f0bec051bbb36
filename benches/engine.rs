//! Criterion benchmark: two engines over the in-memory medium at 4 KiB and
//! 64 KiB MTU, CRC on and off (the difference is the CRC's share), plus the
//! CRC alone at each packet size, a packet's payload copied into and out of
//! a window with its CRC against the plain copy, memcpy against the
//! window's copy at the placement where memcpy falls off a cliff, and the
//! CPU cost of a small message's round trip over two ring links in one
//! thread (no cross-core traffic: the protocol's own cost, which the
//! one-way latency of `barlink bench` adds to the raw ring's), and the same
//! round trip between two threads (a ping-pong across cores, as `bench`
//! measures between processes: half of it is the one-way latency).
//!
//! `cargo bench --bench engine`; throughput is in bytes (GB/s); packets/s is
//! bytes/s divided by the payload per packet, which the group name gives,
//! and the CRC's share is 1 - time(crc=off) / time(crc=on).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use barlink::EngineConfig;
use barlink::transport::crc::crc32c;
use barlink::transport::link::{RingLink, init_ring};
use barlink::transport::ring::Geometry;
use barlink::transport::sim::{Faults, SimPair};
use barlink::transport::window::{HeapWindow, Window};
use barlink::transport::wire::HEADER_LEN;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const MESSAGE: usize = 1 << 20;
const MESSAGES_PER_ITER: usize = 16;

fn engine_pair(c: &mut Criterion) {
    for mtu in [4096usize, 65536] {
        let mut group = c.benchmark_group(format!(
            "engine_pair/mtu={mtu}/payload_per_packet={}",
            mtu - HEADER_LEN
        ));
        group.throughput(Throughput::Bytes((MESSAGE * MESSAGES_PER_ITER) as u64));
        for crc in [true, false] {
            // A window of 4 MiB in flight, as `barlink bench` uses: larger
            // ones spill the medium's buffers out of cache and measure DRAM.
            let window = ((4 << 20) / mtu).clamp(4, 256) as u32;
            let config = EngineConfig {
                mtu,
                crc,
                send_window: window,
                recv_window: window,
                ..EngineConfig::default()
            };
            let mut pair: SimPair<Arc<[u8]>> =
                SimPair::new(config.clone(), config, Faults::none(), Faults::none(), 1).unwrap();
            let message: Arc<[u8]> = vec![0xA5u8; MESSAGE].into();
            group.bench_function(if crc { "crc=on" } else { "crc=off" }, |b| {
                b.iter(|| {
                    pair.transfer(&message, MESSAGES_PER_ITER, |data| {
                        black_box(data);
                    })
                    .unwrap()
                })
            });
        }
        group.finish();
    }
}

fn crc_alone(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for size in [4096usize - HEADER_LEN, 65536 - HEADER_LEN] {
        let data = vec![0x3Cu8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("{size}B"), |b| b.iter(|| crc32c(black_box(&data))));
    }
    group.finish();
    // What the ring links do with a packet's payload, on cache-hot memory:
    // the sender copies it into the peer's slot and takes its CRC in the
    // same pass (write_crc), the receiver copies it out of its slot and
    // checks it in the same pass (read_crc); the plain copy (write) is
    // the raw ring's whole work, and so the yardstick.
    let mut group = c.benchmark_group("window 64KiB payload");
    let payload = 65536 - HEADER_LEN;
    let window = HeapWindow::new(1 << 20).unwrap();
    let message = vec![0x3Cu8; payload];
    let mut landed = vec![0u8; payload];
    // 64 bytes past a 4 KiB boundary, as a slot's payload sits (behind the
    // header): no placement cliff either way.
    let slot = 4096 + HEADER_LEN;
    group.throughput(Throughput::Bytes(payload as u64));
    group.bench_function("write (copy only)", |b| {
        b.iter(|| window.write(slot, black_box(&message)).unwrap());
    });
    group.bench_function("write_crc (send)", |b| {
        b.iter(|| {
            let mut crc = barlink::transport::crc::Crc32c::new();
            window
                .write_crc(slot, black_box(&message), &mut crc)
                .unwrap();
            crc.finish()
        });
    });
    group.bench_function("read_crc (receive)", |b| {
        b.iter(|| {
            let mut crc = barlink::transport::crc::Crc32c::new();
            window
                .read_crc(slot, black_box(&mut landed), &mut crc)
                .unwrap();
            crc.finish()
        });
    });
    group.finish();
    // Where a copy's destination sits relative to its source, modulo
    // 4 KiB, decides glibc's memcpy speed on AMD (`rep movsb`: 16 bytes
    // above falls off a cliff, 32 and 64 do not); the windows' own copy has
    // no such cliff (docs/ARCHITECTURE.md, design change 18). Heap windows
    // are page-aligned, so the offset below puts the window's copy at the
    // same placement as the memcpy's.
    let mut group = c.benchmark_group("64KiB copy, destination 16 B above the source mod 4 KiB");
    let source = vec![0x5Au8; 65536];
    let mut target = vec![0u8; 65536 + 8192];
    let ahead = |to: usize| (to.wrapping_sub(source.as_ptr() as usize) + 4096 - 16) % 4096;
    let start = 4096 - ahead(target.as_ptr() as usize);
    let offset = 4096 + (source.as_ptr() as usize + 16) % 4096;
    group.throughput(Throughput::Bytes(source.len() as u64));
    group.bench_function("memcpy", |b| {
        b.iter(|| target[start..start + 65536].copy_from_slice(black_box(&source)));
    });
    group.bench_function("window write", |b| {
        b.iter(|| window.write(offset, black_box(&source)).unwrap());
    });
    group.finish();
}

type HeapLink = RingLink<Arc<HeapWindow>, Arc<[u8]>>;

/// Two ring links over a pair of 4 MiB heap windows, 64 KiB MTU.
fn ring_link_pair() -> (HeapLink, HeapLink) {
    let config = EngineConfig {
        mtu: 65536,
        ..EngineConfig::default()
    };
    let window_a = Arc::new(HeapWindow::new(4 << 20).unwrap());
    let window_b = Arc::new(HeapWindow::new(4 << 20).unwrap());
    let geometry = Geometry::for_window(window_a.len(), config.mtu).unwrap();
    init_ring(&*window_a, geometry, 1).unwrap();
    init_ring(&*window_b, geometry, 1).unwrap();
    let a = RingLink::new(window_a.clone(), window_b.clone(), config.clone(), 1).unwrap();
    let b = RingLink::new(window_b, window_a, config, 1).unwrap();
    (a, b)
}

/// A 64-byte message there and back over two ring links driven by one
/// thread: everything both sides do per message, without the wait.
fn ring_round_trip(c: &mut Criterion) {
    let (mut a, mut b) = ring_link_pair();
    let message: Arc<[u8]> = vec![0x5Au8; 64].into();
    let mut round_trip = move || {
        a.send(message.clone()).unwrap();
        a.progress().unwrap();
        let got = loop {
            if let Some(got) = b.try_recv().unwrap() {
                break got;
            }
            // Only while the two set up their session does A need a turn.
            a.progress().unwrap();
        };
        b.recycle(got);
        b.send(message.clone()).unwrap();
        b.progress().unwrap();
        let got = loop {
            if let Some(got) = a.try_recv().unwrap() {
                break got;
            }
            b.progress().unwrap();
        };
        a.recycle(got);
    };
    let mut group = c.benchmark_group("ring_link_round_trip");
    group.bench_function("64B, one thread", |bencher| bencher.iter(&mut round_trip));
    group.finish();
}

/// A 64-byte message there and back between two threads over two ring
/// links, with the blocking calls `barlink bench` uses: the round trip
/// across cores, every cache line the answer needs moved each way.
fn ring_ping_pong(c: &mut Criterion) {
    let (mut a, mut b) = ring_link_pair();
    let timeout = Duration::from_secs(10);
    let message: Arc<[u8]> = vec![0x5Au8; 64].into();
    let stop: Arc<[u8]> = Vec::new().into();
    // Echoes until an empty message comes.
    let echo = std::thread::spawn(move || {
        let answer: Arc<[u8]> = vec![0xA5u8; 64].into();
        loop {
            let got = b.recv(timeout).unwrap();
            let done = got.is_empty();
            b.recycle(got);
            if done {
                b.flush(timeout).unwrap();
                return;
            }
            b.send_blocking(answer.clone(), timeout).unwrap();
        }
    });
    let mut group = c.benchmark_group("ring_link_round_trip");
    group.bench_function("64B, two threads", |bencher| {
        bencher.iter(|| {
            a.send_blocking(message.clone(), timeout).unwrap();
            let got = a.recv(timeout).unwrap();
            a.recycle(got);
        })
    });
    group.finish();
    a.send_blocking(stop, timeout).unwrap();
    a.flush(timeout).unwrap();
    echo.join().unwrap();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = engine_pair, crc_alone, ring_round_trip, ring_ping_pong
}
criterion_main!(benches);
