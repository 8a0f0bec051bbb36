//! The schedule both processes follow: every size, on every path in turn,
//! a warm-up and the timed windows, then the latency round trips.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pipes::{flush_on, recv_on};
use super::plan::{PeerPlan, plan_args};
use super::setup::{child_pipe, parent_pipe};
use super::watch::{LostPeer, PeerWatch, Phase, watch_parent};

/// What one size measured on one path.
#[derive(Debug, Clone)]
pub struct Measured {
    pub gbps_windows: Vec<f64>,
    pub latencies_us: Vec<f64>,
    pub retransmits: u64,
    pub crc_errors: u64,
}

fn message_of(size: usize, seed: u64) -> Arc<[u8]> {
    let mut data = vec![0u8; size];
    barlink_transport::rng::SplitMix64::new(seed).fill(&mut data);
    data.into()
}

/// Why the parent's side of the run failed.
#[derive(Debug)]
pub enum RunError {
    /// The child ended while the run needed it.
    Lost(LostPeer),
    /// A step failed or timed out.
    Failed(String),
}

/// The parent's side: spawns the child, measures every size on every path,
/// returns one `Measured` per size for each path of `plan.paths`.
pub fn run_parent(plan: &PeerPlan) -> Result<Vec<Vec<Measured>>, RunError> {
    let exe = std::env::current_exe().map_err(|e| RunError::Failed(e.to_string()))?;
    let mut command = Command::new(exe);
    command.arg("bench-peer").args(plan_args(plan));
    let watch = PeerWatch::spawn(command).map_err(RunError::Failed)?;
    let measured = match parent_phases(plan, &watch) {
        Ok(measured) => measured,
        Err(error) => {
            return Err(match watch.abort() {
                Some(lost) => RunError::Lost(lost),
                None => RunError::Failed(error),
            });
        }
    };
    let status = watch.finish().map_err(RunError::Failed)?;
    if !status.success() {
        return Err(RunError::Failed(format!(
            "the peer process failed: {status}"
        )));
    }
    Ok(measured)
}

/// Round trips per turn when the paths take turns at latency.
const LATENCY_TURN: usize = 100;

fn parent_phases(plan: &PeerPlan, watch: &PeerWatch) -> Result<Vec<Vec<Measured>>, String> {
    let mut pipes = vec![];
    for &path in &plan.paths {
        watch.enter(Phase::SettingUp(path));
        let pipe = parent_pipe(plan, path, watch).map_err(|e| format!("{}: {e}", path.name()))?;
        pipes.push(pipe);
    }
    let mut ack = Vec::new();
    let mut reply = Vec::new();
    let mut results: Vec<Vec<Measured>> = vec![vec![]; pipes.len()];
    let mut child_before = vec![(0u64, 0u64); pipes.len()];
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        let message = message_of(size, size as u64);
        let before: Vec<(u64, u64)> = pipes.iter().map(|pipe| pipe.counters()).collect();
        // The child's counters so far, as its last "done" carried them.
        let mut child_now = child_before.clone();
        let mut measured = vec![
            Measured {
                gbps_windows: vec![],
                latencies_us: vec![],
                retransmits: 0,
                crc_errors: 0,
            };
            pipes.len()
        ];
        for window in 0..=plan.windows {
            for (index, measured) in measured.iter_mut().enumerate() {
                watch.enter(Phase::Window {
                    size,
                    window,
                    windows: plan.windows,
                    path: plan.paths[index],
                });
                let start = Instant::now();
                for _ in 0..count {
                    pipes[index].send(&message)?;
                }
                recv_on(&mut pipes, index, &mut ack)?; // the child has them all
                let seconds = start.elapsed().as_secs_f64();
                if let Some(counters) = child_counters(&ack) {
                    child_now[index] = counters;
                }
                flush_on(&mut pipes, index)?;
                if window > 0 {
                    measured
                        .gbps_windows
                        .push((size * count) as f64 / seconds / 1e9);
                }
            }
        }
        for turn in latency_turns(plan.lat_iters) {
            for (index, measured) in measured.iter_mut().enumerate() {
                watch.enter(Phase::Latency {
                    size,
                    path: plan.paths[index],
                });
                for _ in 0..turn {
                    let start = Instant::now();
                    pipes[index].send(&message)?;
                    let len = recv_on(&mut pipes, index, &mut reply)?;
                    measured
                        .latencies_us
                        .push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
                    if len != size {
                        return Err(format!("echo of {size} bytes came back as {len}"));
                    }
                }
                flush_on(&mut pipes, index)?;
            }
        }
        watch.enter(Phase::Flushing { size });
        for index in 0..pipes.len() {
            flush_on(&mut pipes, index)?;
            let pipe = &pipes[index];
            // Both sides: each catches the corruption in what it receives
            // and retransmits what it sent.
            let (retransmits, crc_errors) = pipe.counters();
            let (child_retransmits, child_crc_errors) = child_now[index];
            measured[index].retransmits = retransmits - before[index].0
                + child_retransmits.saturating_sub(child_before[index].0);
            measured[index].crc_errors = crc_errors - before[index].1
                + child_crc_errors.saturating_sub(child_before[index].1);
        }
        for (path_results, measured) in results.iter_mut().zip(measured) {
            path_results.push(measured);
        }
        child_before = child_now;
    }
    Ok(results)
}

/// The child's (retransmits, CRC errors) from a 17-byte "done" message.
fn child_counters(done: &[u8]) -> Option<(u64, u64)> {
    let retransmits = u64::from_le_bytes(done.get(1..9)?.try_into().ok()?);
    let crc_errors = u64::from_le_bytes(done.get(9..17)?.try_into().ok()?);
    Some((retransmits, crc_errors))
}

/// `iters` round trips split into turns of at most [`LATENCY_TURN`].
fn latency_turns(iters: usize) -> impl Iterator<Item = usize> {
    (0..iters.div_ceil(LATENCY_TURN))
        .map(move |turn| (iters - turn * LATENCY_TURN).min(LATENCY_TURN))
}

/// The child's side (`barlink bench-peer`): receives, checks, confirms,
/// echoes, on each path in the parent's order.
pub fn run_child(plan: &PeerPlan) -> Result<(), String> {
    watch_parent();
    let mut pipes = vec![];
    for &path in &plan.paths {
        pipes.push(child_pipe(plan, path).map_err(|e| format!("{}: {e}", path.name()))?);
    }
    let mut done = [1u8; 17];
    let mut buf = Vec::new();
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        let expected = message_of(size, size as u64);
        for _ in 0..=plan.windows {
            for path in 0..pipes.len() {
                for index in 0..count {
                    let len = recv_on(&mut pipes, path, &mut buf)?;
                    if len != size {
                        return Err(format!(
                            "message {index} of size {size} arrived with {len} bytes"
                        ));
                    }
                    if index == 0 && buf[..] != expected[..] {
                        return Err(format!(
                            "message of size {size} arrived with different bytes"
                        ));
                    }
                }
                // "Got them all", with this side's counters so far.
                let (retransmits, crc_errors) = pipes[path].counters();
                done[1..9].copy_from_slice(&retransmits.to_le_bytes());
                done[9..17].copy_from_slice(&crc_errors.to_le_bytes());
                pipes[path].send(&Arc::from(&done[..]))?;
                flush_on(&mut pipes, path)?;
            }
        }
        for turn in latency_turns(plan.lat_iters) {
            for path in 0..pipes.len() {
                for _ in 0..turn {
                    recv_on(&mut pipes, path, &mut buf)?;
                    pipes[path].send(&expected)?;
                }
                flush_on(&mut pipes, path)?;
            }
        }
        for path in 0..pipes.len() {
            flush_on(&mut pipes, path)?;
        }
    }
    // Keep the links up briefly so the parent gets its last acknowledgements.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        for pipe in pipes.iter_mut() {
            let _ = pipe.flush_within(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
