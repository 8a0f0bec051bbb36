//! `barlink bench --path engine-mem`: two engines in one thread over the
//! in-memory medium, so the figures are the protocol's own cost (packet
//! building, CRC on both sides, acknowledgements, reassembly) with no
//! medium in the way. The baseline `memcpy` moves the same bytes the same
//! way — message to packet buffer to destination — with no protocol.
//!
//! The first window of each size is a warm-up that also verifies every
//! delivered byte.

use std::hint::black_box;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use barlink_transport::EngineConfig;
use barlink_transport::rng::SplitMix64;
use barlink_transport::sim::{Faults, SimPair};

use super::args::{BenchArgs, Plan};
use super::report::{Row, median, micros, percentile, print_header, print_row};
use crate::cli::{CommandError, Status, human_size};

/// One size's setting: the message, the pair of engines, and the
/// baseline's buffers (a window's worth of packet slots, as the medium
/// holds, and the destination).
struct Bench<'a> {
    plan: &'a Plan,
    config: &'a EngineConfig,
    size: usize,
    message: Arc<[u8]>,
    pair: SimPair<Arc<[u8]>>,
    staging: Vec<u8>,
    destination: Vec<u8>,
    /// Whether a progress line goes to stderr.
    progress: bool,
}

pub fn run(args: &BenchArgs, plan: &Plan, config: &EngineConfig) -> Result<Status, CommandError> {
    let faults = Faults {
        corrupt: args.fault_rate,
        ..Faults::none()
    };
    let progress = !args.output.json && std::io::stderr().is_terminal();
    if !args.output.json {
        print_header(args, config, plan.windows);
    }
    let mut rng = SplitMix64::new(args.seed);
    let mut failed_verification = false;
    for &size in &plan.sizes {
        let mut payload = vec![0u8; size];
        rng.fill(&mut payload);
        if progress {
            eprint!("\rbench: {:>6} ...", human_size(size));
        }
        let pair: SimPair<Arc<[u8]>> = SimPair::new(
            config.clone(),
            config.clone(),
            faults.clone(),
            faults.clone(),
            rng.next_u64(),
        )
        .map_err(|e| CommandError::usage(e.to_string()))?;
        let mut bench = Bench {
            plan,
            config,
            size,
            message: payload.into(),
            pair,
            staging: vec![0u8; config.mtu * config.send_window as usize],
            destination: vec![0u8; size],
            progress,
        };
        let environment = |e: String| CommandError::environment(format!("size {size}: {e}"));
        failed_verification |= !bench.warm_up().map_err(environment)?;
        let rows = bench.measure().map_err(environment)?;
        if progress {
            eprint!("\r{:40}\r", "");
        }
        for row in rows {
            print_row(&row, args, config);
        }
    }
    Ok(if failed_verification {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

impl Bench<'_> {
    fn count(&self) -> usize {
        self.plan.messages_per_window(self.size)
    }

    /// The warm-up window, every delivered byte checked: whether all
    /// arrived intact.
    fn warm_up(&mut self) -> Result<bool, String> {
        let count = self.count().min(2000);
        let mut bad = 0usize;
        let mut delivered = 0usize;
        let message = &self.message;
        self.pair
            .transfer(message, count, |data| {
                delivered += 1;
                if data != &message[..] {
                    bad += 1;
                }
            })
            .map_err(|e| e.to_string())?;
        if bad > 0 || delivered != count {
            eprintln!(
                "barlink bench: size {}: {bad} of {delivered} delivered messages differ from what was sent",
                self.size
            );
            return Ok(false);
        }
        Ok(true)
    }

    /// The timed windows and the latencies: the engine's row and the
    /// baseline's.
    fn measure(&mut self) -> Result<[Row; 2], String> {
        let stats_before = self.pair.a.stats().clone();
        let crc_before = self.pair.b.stats().crc_failures + self.pair.b.stats().malformed;
        let mut engine_gbps = Vec::with_capacity(self.plan.windows);
        let mut engine_pps = Vec::with_capacity(self.plan.windows);
        let mut memcpy_gbps = Vec::with_capacity(self.plan.windows);
        for window in 0..self.plan.windows {
            if self.progress {
                eprint!(
                    "\rbench: {:>6} window {}/{} ",
                    human_size(self.size),
                    window + 1,
                    self.plan.windows
                );
            }
            let (gbps, pps) = self.engine_window()?;
            engine_gbps.push(gbps);
            engine_pps.push(pps);
            memcpy_gbps.push(self.memcpy_window());
        }
        let (mut engine_lat, mut memcpy_lat) = self.latencies()?;

        let stats = self.pair.a.stats();
        let retransmits = stats.retransmits() - stats_before.retransmits();
        let crc_errors =
            self.pair.b.stats().crc_failures + self.pair.b.stats().malformed - crc_before;
        let memcpy = median(&mut memcpy_gbps);
        let engine = median(&mut engine_gbps);
        Ok([
            Row {
                path: "engine-mem",
                size: self.size,
                gbps: engine,
                lat_p50_us: percentile(&mut engine_lat, 0.5),
                lat_p99_us: percentile(&mut engine_lat, 0.99),
                packets_per_s: median(&mut engine_pps),
                retransmits,
                crc_errors,
                ratio_to_memcpy: engine / memcpy,
            },
            Row {
                path: "memcpy",
                size: self.size,
                gbps: memcpy,
                lat_p50_us: percentile(&mut memcpy_lat, 0.5),
                lat_p99_us: percentile(&mut memcpy_lat, 0.99),
                packets_per_s: 0.0,
                retransmits: 0,
                crc_errors: 0,
                ratio_to_memcpy: 1.0,
            },
        ])
    }

    /// One timed window through the engines: GB/s and packets per second.
    fn engine_window(&mut self) -> Result<(f64, f64), String> {
        let count = self.count();
        let packets_before = self.pair.a.stats().data_packets_sent;
        let start = Instant::now();
        let mut delivered_bytes = 0usize;
        self.pair
            .transfer(&self.message, count, |data| delivered_bytes += data.len())
            .map_err(|e| e.to_string())?;
        let seconds = start.elapsed().as_secs_f64();
        let packets = self.pair.a.stats().data_packets_sent - packets_before;
        Ok((
            delivered_bytes as f64 / seconds / 1e9,
            packets as f64 / seconds,
        ))
    }

    /// The same window's bytes through the baseline: GB/s.
    fn memcpy_window(&mut self) -> f64 {
        let count = self.count();
        let start = Instant::now();
        let mut cursor = 0;
        for _ in 0..count {
            self.copy_once(&mut cursor);
        }
        let seconds = start.elapsed().as_secs_f64();
        (count * self.size) as f64 / seconds / 1e9
    }

    fn copy_once(&mut self, cursor: &mut usize) {
        copy_like_the_medium(
            &self.message,
            &mut self.staging,
            &mut self.destination,
            self.config.max_payload_len() as usize,
            cursor,
        );
    }

    /// Single-message latency: from `send` to the receiver's delivery, one
    /// message at a time, in microseconds; and the memcpy baseline's.
    fn latencies(&mut self) -> Result<(Vec<f64>, Vec<f64>), String> {
        // Large messages take long; fewer samples still give stable medians.
        let iters = if self.message.len() >= 1 << 20 {
            self.plan.lat_iters.min(50)
        } else {
            self.plan.lat_iters
        };
        let mut engine = Vec::with_capacity(iters);
        let mut memcpy = Vec::with_capacity(iters);
        for _ in 0..iters {
            let start = Instant::now();
            let mut arrived = None;
            self.pair
                .transfer(&self.message, 1, |_| arrived = Some(start.elapsed()))
                .map_err(|e| e.to_string())?;
            let arrived = arrived.ok_or("a message completed without being delivered")?;
            engine.push(micros(arrived));
            let start = Instant::now();
            self.copy_once(&mut 0);
            memcpy.push(micros(start.elapsed()));
        }
        Ok((engine, memcpy))
    }
}

/// What the medium does to a message's bytes, without a protocol: each
/// packet-sized piece copied into the next of a ring of slots (`staging`,
/// a whole number of `slot`-byte slots), then to its place.
fn copy_like_the_medium(
    message: &[u8],
    staging: &mut [u8],
    destination: &mut [u8],
    piece: usize,
    cursor: &mut usize,
) {
    let slot = staging.len() / (staging.len() / piece.max(1)).max(1);
    for (index, chunk) in message.chunks(piece).enumerate() {
        if *cursor + slot > staging.len() {
            *cursor = 0;
        }
        let slot_bytes = &mut staging[*cursor..*cursor + chunk.len()];
        slot_bytes.copy_from_slice(chunk);
        let offset = index * piece;
        destination[offset..offset + chunk.len()].copy_from_slice(slot_bytes);
        *cursor += slot;
    }
    black_box(&destination);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_medium_copy_reassembles_the_message() {
        let message: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut staging = vec![0; 3 * 1000];
        let mut destination = vec![0; 10_000];
        let mut cursor = 0;
        copy_like_the_medium(&message, &mut staging, &mut destination, 944, &mut cursor);
        assert_eq!(message, destination);
        assert!(cursor > 0 && cursor <= staging.len());
    }
}
