//! Phase 2: a barlink link over the two rings, one thread per side, a
//! stream of mixed-size messages each way, every delivery checked.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::link::{IndexStats, RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::Window;
use barlink_transport::{EngineConfig, SendError, Stats};

use super::args::ValidateArgs;
use super::patterns::{GAMMA, Pattern, word_of};
use super::progress::{Progress, mib};
use super::target::Target;
use crate::cli::{CommandError, human_size};

/// The messages one side sends: their count and contents follow from the
/// seed, so the receiver regenerates each one to check it.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub seed: u64,
    pub count: u64,
    pub max_size: usize,
}

impl Stream {
    fn rng(&self, index: u64) -> SplitMix64 {
        SplitMix64::new(self.seed ^ index.wrapping_mul(GAMMA))
    }

    /// Message `index`'s length: mostly small and medium, some large (mixed
    /// sizes cross packet boundaries at every alignment).
    pub(super) fn len(&self, index: u64) -> usize {
        let mut rng = self.rng(index);
        let max = self.max_size.max(8) as u64;
        let len = 8 + match rng.below(10) {
            0..=3 => rng.below(256),
            4..=6 => rng.below(16 << 10),
            7..=8 => rng.below(256 << 10),
            _ => rng.below(max),
        };
        len.min(max) as usize
    }

    /// Message `index`: its index (8 bytes, little-endian), then the
    /// pattern `index % 3` keyed by the index.
    pub(super) fn message(&self, index: u64, buf: &mut Vec<u8>) {
        let len = self.len(index);
        buf.clear();
        buf.resize(len, 0);
        buf[..8].copy_from_slice(&index.to_le_bytes());
        let pattern = Pattern::ALL[(index % 3) as usize];
        let key = match pattern {
            Pattern::WalkingOnes => index,
            Pattern::AddressInAddress => index << 40,
            Pattern::Random => self.seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03),
        };
        pattern.fill(key, 8, &mut buf[8..]);
    }

    /// The messages whose lengths add up to at least `bytes`.
    pub fn count_for(seed: u64, max_size: usize, bytes: usize) -> u64 {
        let mut stream = Stream {
            seed,
            count: 0,
            max_size,
        };
        let mut total = 0usize;
        while total < bytes && stream.count < 100_000_000 {
            total += stream.len(stream.count);
            stream.count += 1;
        }
        stream.count
    }

    fn bytes(&self) -> u64 {
        (0..self.count).map(|i| self.len(i) as u64).sum()
    }
}

/// Messages a side queues beyond those acknowledged.
const MAX_QUEUED: u64 = 64;

/// What one side of the link saw.
#[derive(Debug, Default)]
struct SideOutcome {
    sent: u64,
    completed: u64,
    received: u64,
    received_bytes: u64,
    lost: u64,
    corrupted: u64,
    duplicated: u64,
    /// Messages never delivered because the link failed (each failed with
    /// the link's error, not lost silently).
    undelivered: u64,
    /// The first wrong delivery, for the report.
    first_wrong: Option<String>,
    stats: Stats,
    /// Index words from the peer this side could not act on.
    index: IndexStats,
    error: Option<String>,
}

struct SideShared<'a> {
    done: &'a AtomicBool,
    peer_done: &'a AtomicBool,
    abort: &'a AtomicBool,
    received_bytes: &'a AtomicU64,
    deadline: Instant,
    timeout: Duration,
}

/// Runs one side: sends its stream, checks every message of the peer's,
/// until both sides have everything (or an error, or the deadline).
fn run_side(
    mut link: RingLink<Arc<dyn Window>>,
    send: Stream,
    receive: Stream,
    shared: &SideShared<'_>,
) -> SideOutcome {
    let mut out = SideOutcome::default();
    let mut expected = 0u64;
    let mut want = Vec::new();
    let mut pending: Option<Vec<u8>> = None;
    'run: loop {
        let mut busy = false;
        // A bounded number ahead of the acknowledgements: messages are
        // generated as they are queued, and the engine's own queue holds
        // thousands.
        while out.sent < send.count && out.sent - link.completed() < MAX_QUEUED {
            let data = pending.take().unwrap_or_else(|| {
                let mut buf = Vec::new();
                send.message(out.sent, &mut buf);
                buf
            });
            match link.send(data) {
                Ok(_) => {
                    out.sent += 1;
                    busy = true;
                }
                Err(SendError::QueueFull(back)) => {
                    pending = Some(back);
                    break;
                }
                Err(error) => {
                    out.error = Some(format!("message {} refused: {error}", out.sent));
                    break 'run;
                }
            }
        }
        match link.progress() {
            Ok(moved) => busy |= moved,
            Err(error) => {
                out.error = Some(error.to_string());
                break;
            }
        }
        loop {
            let got = match link.try_recv() {
                Ok(Some(got)) => got,
                Ok(None) => break,
                Err(error) => {
                    out.error = Some(error.to_string());
                    break 'run;
                }
            };
            busy = true;
            check_delivery(&mut out, &mut expected, &receive, &got, &mut want);
            shared
                .received_bytes
                .fetch_add(got.len() as u64, Ordering::Relaxed);
            link.recycle(got);
        }
        let done = expected >= receive.count && link.completed() >= send.count;
        if done {
            shared.done.store(true, Ordering::Release);
            if shared.peer_done.load(Ordering::Acquire) {
                break;
            }
        }
        if shared.abort.load(Ordering::Relaxed) {
            out.error = Some("stopped: the other side failed".into());
            break;
        }
        if Instant::now() >= shared.deadline {
            out.error = Some(format!(
                "timed out after {:?} (--timeout): {expected}/{} received, {}/{} acknowledged",
                shared.timeout,
                receive.count,
                link.completed(),
                send.count
            ));
            break;
        }
        if !busy {
            thread::yield_now();
        }
    }
    if out.error.is_some() {
        shared.abort.store(true, Ordering::Relaxed);
    }
    // What never arrived: failed with the error when the link failed (on
    // either side), lost when the link claims success (it cannot, as the
    // loop ends only with everything here; counted to be sure).
    let missing = receive.count.saturating_sub(expected);
    if out.error.is_some() {
        out.undelivered += missing;
    } else {
        out.lost += missing;
    }
    out.completed = link.completed();
    out.stats = link.engine().stats().clone();
    out.index = link.index_stats();
    out
}

/// Checks one delivered message against the peer's stream.
fn check_delivery(
    out: &mut SideOutcome,
    expected: &mut u64,
    receive: &Stream,
    got: &[u8],
    want: &mut Vec<u8>,
) {
    out.received += 1;
    out.received_bytes += got.len() as u64;
    let index = got.get(..8).map_or(u64::MAX, word_of);
    if index >= receive.count {
        out.corrupted += 1;
        out.first_wrong.get_or_insert_with(|| {
            format!(
                "a {}-byte message with index {index:#x}, beyond the {} sent",
                got.len(),
                receive.count
            )
        });
        return;
    }
    if index < *expected {
        out.duplicated += 1;
        out.first_wrong
            .get_or_insert_with(|| format!("message {index} delivered again"));
        return;
    }
    if index > *expected {
        out.lost += index - *expected;
        out.first_wrong
            .get_or_insert_with(|| format!("messages {}..{index} skipped", *expected));
    }
    receive.message(index, want);
    if got != want.as_slice() {
        out.corrupted += 1;
        let at = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        out.first_wrong.get_or_insert_with(|| {
            format!(
                "message {index}: {} bytes arrived, {} sent, first difference at {at:?}",
                got.len(),
                want.len()
            )
        });
    }
    *expected = index + 1;
}

#[derive(Debug)]
pub struct Direction {
    pub name: &'static str,
    pub messages_sent: u64,
    pub messages: u64,
    pub bytes: u64,
    pub crc_failures: u64,
    pub retransmits: u64,
    /// Retransmissions by cause: NAK (corruption reported), timeout, SACK.
    pub retransmits_by: [u64; 3],
    pub naks: u64,
    /// Index words (head, consumed) the receiving side skipped as corrupt
    /// or implausible: missed updates, repaired by the sender's next store.
    pub index_missed: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub duplicated: u64,
    pub undelivered: u64,
    pub first_wrong: Option<String>,
}

impl Direction {
    fn between(name: &'static str, sender: &SideOutcome, receiver: &SideOutcome) -> Direction {
        Direction {
            name,
            messages_sent: sender.sent,
            messages: receiver.received,
            bytes: receiver.received_bytes,
            crc_failures: receiver.stats.crc_failures + receiver.stats.malformed,
            retransmits: sender.stats.retransmits(),
            retransmits_by: [
                sender.stats.retransmits_nak,
                sender.stats.retransmits_timeout,
                sender.stats.retransmits_sack,
            ],
            naks: receiver.stats.naks_sent,
            index_missed: receiver.index.missed(),
            lost: receiver.lost,
            undelivered: receiver.undelivered,
            corrupted: receiver.corrupted,
            duplicated: receiver.duplicated,
            first_wrong: receiver.first_wrong.clone(),
        }
    }
}

pub struct LinkResult {
    pub directions: Vec<Direction>,
    pub error: Option<String>,
    pub elapsed_s: f64,
    pub mtu: usize,
}

impl LinkResult {
    pub fn sum(&self, field: impl Fn(&Direction) -> u64) -> u64 {
        self.directions.iter().map(field).sum()
    }

    pub fn wrong(&self) -> u64 {
        self.sum(|d| d.lost + d.corrupted + d.duplicated)
    }
}

pub fn engine_config(args: &ValidateArgs) -> EngineConfig {
    EngineConfig {
        mtu: args.mtu,
        max_message_len: args.max_size.max(8) as u64,
        // Reads of a ring in a BAR are slow (uncached, across PCIe; under
        // emulation slower still): timers for a slow medium. Corruption is
        // resent on NAK at once, whatever the timers.
        initial_rto: Duration::from_millis(100),
        min_rto: Duration::from_millis(20),
        max_rto: Duration::from_secs(2),
        max_transmissions: 64,
        peer_timeout: Duration::from_secs(30),
        ..EngineConfig::default()
    }
}

/// Phase 2: a link over the two rings, a stream each way.
pub fn link_phase(
    target: &Target,
    peers: [Arc<dyn Window>; 2],
    args: &ValidateArgs,
    config: &EngineConfig,
    streams: [Stream; 2],
    progress: &Progress,
) -> Result<LinkResult, CommandError> {
    let setup = |e: &dyn std::fmt::Display| CommandError::environment(format!("link setup: {e}"));
    for ring in &target.rings {
        let geometry = Geometry::for_window(ring.len(), config.mtu).map_err(|e| {
            CommandError::usage(format!(
                "the rings ({} each) cannot hold packets of --mtu {}: {e}; use a larger --size or a smaller --mtu",
                human_size(ring.len()),
                config.mtu
            ))
        })?;
        init_ring(&**ring, geometry, 1).map_err(|e| setup(&e))?;
    }
    // Side A reads its own ring and writes B's (through `peers[1]`, which
    // may inject faults); side B the other way round.
    let [peer_of_b, peer_of_a] = peers;
    let link_a: RingLink<Arc<dyn Window>> =
        RingLink::new(target.rings[0].clone(), peer_of_a, config.clone(), 1)
            .map_err(|e| setup(&e))?;
    let link_b: RingLink<Arc<dyn Window>> =
        RingLink::new(target.rings[1].clone(), peer_of_b, config.clone(), 1)
            .map_err(|e| setup(&e))?;
    let timeout = Duration::from_secs(
        args.timeout
            .unwrap_or(if args.quick { 60 } else { 600 })
            .max(1),
    );
    let started = Instant::now();
    let deadline = started + timeout;
    let (done_a, done_b, abort) = (
        AtomicBool::new(false),
        AtomicBool::new(false),
        AtomicBool::new(false),
    );
    let received = AtomicU64::new(0);
    let total: u64 = streams.iter().map(Stream::bytes).sum();
    let [a_to_b, b_to_a] = streams;
    let (side_a, side_b) = thread::scope(|scope| {
        let shared_a = SideShared {
            done: &done_a,
            peer_done: &done_b,
            abort: &abort,
            received_bytes: &received,
            deadline,
            timeout,
        };
        let shared_b = SideShared {
            done: &done_b,
            peer_done: &done_a,
            abort: &abort,
            received_bytes: &received,
            deadline,
            timeout,
        };
        let a = scope.spawn(move || run_side(link_a, a_to_b, b_to_a, &shared_a));
        let b = scope.spawn(move || run_side(link_b, b_to_a, a_to_b, &shared_b));
        while !(a.is_finished() && b.is_finished()) {
            thread::sleep(Duration::from_millis(100));
            progress.show(&format!(
                "validate: link {} of {} ({:.0} s)",
                mib(received.load(Ordering::Relaxed)),
                mib(total),
                started.elapsed().as_secs_f64()
            ));
        }
        let panicked = |_| SideOutcome {
            error: Some("the side's thread panicked".into()),
            ..SideOutcome::default()
        };
        (
            a.join().unwrap_or_else(panicked),
            b.join().unwrap_or_else(panicked),
        )
    });
    progress.clear();
    let error = match (&side_a.error, &side_b.error) {
        (Some(a), Some(b)) if b.starts_with("stopped") => Some(format!("side A: {a}")),
        (Some(a), Some(b)) if a.starts_with("stopped") => Some(format!("side B: {b}")),
        (Some(a), Some(b)) => Some(format!("side A: {a}; side B: {b}")),
        (Some(a), None) => Some(format!("side A: {a}")),
        (None, Some(b)) => Some(format!("side B: {b}")),
        (None, None) => None,
    };
    Ok(LinkResult {
        directions: vec![
            Direction::between("A->B", &side_a, &side_b),
            Direction::between("B->A", &side_b, &side_a),
        ],
        error,
        elapsed_s: started.elapsed().as_secs_f64(),
        mtu: config.mtu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_replay_and_carry_their_index() {
        let stream = Stream {
            seed: 3,
            count: 100,
            max_size: 1 << 20,
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for index in [0, 1, 2, 57] {
            stream.message(index, &mut a);
            stream.message(index, &mut b);
            assert_eq!(a, b);
            assert_eq!(word_of(&a[..8]), index);
            assert!(a.len() >= 8 && a.len() <= 1 << 20);
        }
        let count = Stream::count_for(3, 1 << 20, 16 << 20);
        assert!(count > 10, "{count}");
    }

    #[test]
    fn a_delivery_that_differs_is_counted_by_kind() {
        let stream = Stream {
            seed: 9,
            count: 10,
            max_size: 4096,
        };
        let mut out = SideOutcome::default();
        let (mut expected, mut want, mut msg) = (0u64, Vec::new(), Vec::new());
        stream.message(0, &mut msg);
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        stream.message(3, &mut msg);
        let last = msg.len() - 1;
        msg[last] ^= 0x10;
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        assert_eq!((out.duplicated, out.lost, out.corrupted), (1, 2, 1));
        assert_eq!(expected, 4);
    }
}
