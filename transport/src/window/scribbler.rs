//! [`Scribbler`]: a co-tenant that writes random bytes at random offsets
//! into live ring windows, the way a stray DMA, a buggy process with the
//! memory mapped, or a flaky PCIe path does — control blocks included.
//!
//! Where [`super::FaultWindow`] corrupts the link's own writes, this
//! corrupts the memory behind its back, at any moment: between a store and
//! the load that should see it, over an index word already read, over the
//! identity line nothing should read again. Give it its own mappings of
//! the windows' memory (a second mapping of a memfd), as a co-tenant
//! process would have.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::Window;
use crate::ring::{CONTROL_LEN, offset};
use crate::rng::SplitMix64;

/// How a [`Scribbler`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ScribbleConfig {
    /// Writes per second, over all windows together.
    pub writes_per_second: f64,
    /// The share of writes that land in a window's control block (its
    /// first [`CONTROL_LEN`] bytes) rather than in its slots.
    pub control_share: f64,
    /// Of those, the share aimed straight at an index word (head or
    /// consumed); the rest land anywhere in the control block.
    pub index_share: f64,
    /// Seeds offsets, lengths and bytes.
    pub seed: u64,
}

/// What a [`Scribbler`] has written so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scribbled {
    /// Writes of 1 to 8 random bytes.
    pub writes: u64,
    /// Of those, writes into a control block.
    pub into_control: u64,
    /// Of those, writes onto an index word.
    pub onto_index: u64,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    into_control: AtomicU64,
    onto_index: AtomicU64,
}

/// A thread that scribbles over windows until stopped (or dropped).
#[derive(Debug)]
pub struct Scribbler {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Scribbler {
    /// Starts scribbling over `windows`, each laid out as a ring (control
    /// block first). Windows shorter than a control block get control
    /// writes only.
    pub fn start(windows: Vec<Arc<dyn Window>>, config: ScribbleConfig) -> Scribbler {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let thread = thread::spawn({
            let (stop, counters) = (stop.clone(), counters.clone());
            move || scribble(&windows, &config, &stop, &counters)
        });
        Scribbler {
            stop,
            counters,
            thread: Some(thread),
        }
    }

    /// What was written so far.
    pub fn scribbled(&self) -> Scribbled {
        Scribbled {
            writes: self.counters.writes.load(Ordering::Relaxed),
            into_control: self.counters.into_control.load(Ordering::Relaxed),
            onto_index: self.counters.onto_index.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread and returns what it wrote.
    pub fn stop(mut self) -> Scribbled {
        self.halt();
        self.scribbled()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic in the thread is a failed window write, which the
            // counts already show as writes that did not happen.
            let _ = thread.join();
        }
    }
}

impl Drop for Scribbler {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The longest the thread sleeps without looking at its stop flag.
const STOP_CHECK: Duration = Duration::from_millis(10);

/// Where one write lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Slots,
    Control,
    Index,
}

fn scribble(
    windows: &[Arc<dyn Window>],
    config: &ScribbleConfig,
    stop: &AtomicBool,
    counters: &Counters,
) {
    if windows.is_empty() || config.writes_per_second <= 0.0 {
        return;
    }
    let every = Duration::from_secs_f64(1.0 / config.writes_per_second);
    let mut rng = SplitMix64::new(config.seed);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let window = &windows[rng.below(windows.len() as u64) as usize];
        let len = window.len();
        let mut bytes = [0u8; 8];
        rng.fill(&mut bytes);
        let (at, target) = if len <= CONTROL_LEN || rng.chance(config.control_share) {
            if rng.chance(config.index_share) {
                let word = [offset::HEAD, offset::CONSUMED][rng.below(2) as usize];
                (word + rng.below(8) as usize, Target::Index)
            } else {
                (rng.below(CONTROL_LEN as u64) as usize, Target::Control)
            }
        } else {
            let slots = (len - CONTROL_LEN) as u64;
            (CONTROL_LEN + rng.below(slots) as usize, Target::Slots)
        };
        let take = (1 + rng.below(8) as usize).min(len.saturating_sub(at));
        if take > 0 && window.write(at, &bytes[..take]).is_ok() {
            counters.writes.fetch_add(1, Ordering::Relaxed);
            if target != Target::Slots {
                counters.into_control.fetch_add(1, Ordering::Relaxed);
            }
            if target == Target::Index {
                counters.onto_index.fetch_add(1, Ordering::Relaxed);
            }
        }
        next += every;
        if next < Instant::now() {
            // Behind (a slow machine): catch up without a burst.
            next = Instant::now();
        }
        // In short naps, so that a stop is seen soon at any rate.
        while let Some(wait) = next.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            thread::sleep(wait.min(STOP_CHECK));
        }
    }
}
