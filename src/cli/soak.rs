//! `barlink soak`: random-size messages through a ring link whose windows
//! inject faults (bit flips, dropped, torn and stalled writes), every
//! payload checked against a seeded generator, for a set duration.
//!
//! Each message starts with its index; its length and the rest of its
//! bytes follow from (seed, index). So the receiver tells apart a message
//! lost (an index skipped), duplicated (an index again) and corrupted
//! (bytes that differ), and counts each. Any of the three is a failure.
//! A message the sender saw acknowledged that never arrived is lost too.
//! If the link itself fails, the messages it had not delivered were failed
//! with that error, not lost silently: they are counted apart
//! (`failed with error`), and the run fails with the error.
//!
//! The rings live in memfd windows. `--scribble RATE` adds a co-tenant
//! with its own mappings of them that writes random bytes at random
//! offsets, control blocks included (`--scribble-control`): the link must
//! count the index words it cannot use and go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::EngineConfig;
use barlink_transport::link::IndexStats;
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::{
    FaultConfig, FaultWindow, ScribbleConfig, Scribbled, Scribbler, ShmOptions, ShmWindow, Window,
};
use clap::Args;
use serde_json::json;

use super::args::JsonArg;
use super::{CommandError, Status, parse_size};

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long to run: 90s, 10m, 2h. Default 10m; with --quick 15s.
    #[arg(long, env = "BARLINK_DURATION")]
    duration: Option<String>,
    /// Probability that a bulk write into a ring is faulted, split evenly
    /// between bit flips, dropped, torn and stalled writes.
    #[arg(long, default_value_t = 0.001, env = "BARLINK_FAULT_RATE")]
    fault_rate: f64,
    /// Largest message.
    #[arg(long, default_value = "256K", value_parser = parse_size, env = "BARLINK_MAX_SIZE")]
    max_size: usize,
    /// Packet size.
    #[arg(long, default_value = "4K", value_parser = parse_size, env = "BARLINK_MTU")]
    mtu: usize,
    /// Random writes per second by a co-tenant over both rings' memory
    /// (1 to 8 random bytes at a random offset each), on top of the
    /// faults of --fault-rate. 0: none.
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "WRITES_PER_S",
        env = "BARLINK_SCRIBBLE"
    )]
    scribble: f64,
    /// The share of --scribble's writes that land in a ring's 256-byte
    /// control block (its index words and identity) rather than its slots.
    #[arg(long, default_value_t = 0.01, env = "BARLINK_SCRIBBLE_CONTROL")]
    scribble_control: f64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 10)]
    progress_every: u64,
    /// Seed for message contents and faults.
    #[arg(long, default_value_t = 1, env = "BARLINK_SEED")]
    seed: u64,
    /// A short run (15 seconds).
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: JsonArg,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 90s, 10m, 2h)"))?;
    let seconds = match unit {
        "" | "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        other => return Err(format!("unknown duration unit {other:?} (use s, m or h)")),
    };
    Ok(Duration::from_secs(seconds))
}

/// Message `index`: its index, then seeded bytes; length from the seed too.
fn soak_message(seed: u64, index: u64, max_size: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = 8 + match rng.below(8) {
        0..=3 => rng.below(512) as usize,
        4..=6 => rng.below(32 << 10) as usize,
        _ => rng.below(max_size.max(1) as u64) as usize,
    };
    let mut data = vec![0; len];
    data[..8].copy_from_slice(&index.to_le_bytes());
    rng.fill(&mut data[8..]);
    data
}

/// What the receiver found.
#[derive(Debug, Default)]
struct Verdicts {
    messages: AtomicU64,
    bytes: AtomicU64,
    lost: AtomicU64,
    /// Queued messages a failed link never delivered (each was failed with
    /// the link's error).
    failed_with_error: AtomicU64,
    corrupted: AtomicU64,
    duplicated: AtomicU64,
}

/// A link over two faulty windows: the sender's and the receiver's ends.
type SoakLink = RingLink<Arc<dyn Window>>;

pub fn run(args: &SoakArgs) -> Result<Status, CommandError> {
    let duration = match &args.duration {
        Some(text) => {
            parse_duration(text).map_err(|e| CommandError::usage(format!("--duration: {e}")))?
        }
        None if args.quick => Duration::from_secs(15),
        None => Duration::from_secs(600),
    };
    if !(0.0..=0.2).contains(&args.fault_rate) {
        return Err(CommandError::usage(format!(
            "--fault-rate {} is outside 0..=0.2",
            args.fault_rate
        )));
    }
    if !(0.0..=1e6).contains(&args.scribble) || !(0.0..=1.0).contains(&args.scribble_control) {
        return Err(CommandError::usage(format!(
            "--scribble {} must be within 0..=1000000 writes/s and --scribble-control {} within 0..=1",
            args.scribble, args.scribble_control
        )));
    }
    let (mut sender, receiver, tenant_view) = links(args)?;
    let scribbler = (args.scribble > 0.0).then(|| {
        Scribbler::start(
            tenant_view,
            ScribbleConfig {
                writes_per_second: args.scribble,
                control_share: args.scribble_control,
                index_share: 0.0,
                seed: args.seed ^ 0x5C41_BB1E,
            },
        )
    });
    let verdicts = Arc::new(Verdicts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let reader = spawn_reader(receiver, args, verdicts.clone(), stop.clone());

    let started = Instant::now();
    let progress = Progress {
        args,
        started,
        verdicts: &verdicts,
        scribbler: scribbler.as_ref(),
    };
    let (sent, mut failure) = send_for(&mut sender, &progress, duration);
    let scribbled = scribbler
        .as_ref()
        .map(Scribbler::scribbled)
        .unwrap_or_default();
    // Wait for the receiver to see everything that was acknowledged.
    let until = Instant::now() + Duration::from_secs(30);
    while verdicts.messages.load(Ordering::Relaxed) < sent && Instant::now() < until {
        let _ = sender.progress();
        thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    let (receiver, receiver_failure) = reader
        .join()
        .map_err(|_| CommandError::environment("soak: the receiving thread panicked"))?;
    if let Some(e) = receiver_failure {
        failure.get_or_insert(format!("receiver: {e}"));
    }
    // Acknowledged to the sender means delivered to the receiver: any
    // shortfall there is loss. Beyond it, what the sender queued but the
    // failed link never acknowledged was failed with the link's error.
    let received = verdicts.messages.load(Ordering::Relaxed);
    let acknowledged = sender.completed();
    if received < acknowledged {
        verdicts
            .lost
            .fetch_add(acknowledged - received, Ordering::Relaxed);
    }
    verdicts.failed_with_error.store(
        sent.saturating_sub(acknowledged.max(received)),
        Ordering::Relaxed,
    );
    let caught = sender.engine().stats().crc_failures
        + sender.engine().stats().malformed
        + receiver.engine().stats().crc_failures
        + receiver.engine().stats().malformed;
    let index = sender.index_stats().plus(receiver.index_stats());
    let tally = Tally {
        sent,
        caught,
        index,
        scribbled,
    };
    progress.report("final", &sender, &tally);
    drop(scribbler);
    if let Some(e) = failure {
        eprintln!("barlink soak: the link failed: {e}");
        return Ok(Status::CheckFailed);
    }
    let bad = verdicts.lost.load(Ordering::Relaxed)
        + verdicts.corrupted.load(Ordering::Relaxed)
        + verdicts.duplicated.load(Ordering::Relaxed);
    Ok(if bad == 0 {
        Status::Ok
    } else {
        Status::CheckFailed
    })
}

/// The sender's and the receiver's ends, and a co-tenant's own mappings
/// of the two rings.
type SoakSetup = (SoakLink, SoakLink, Vec<Arc<dyn Window>>);

/// The two ends of a link whose windows fault as `--fault-rate` says, and
/// a co-tenant's own mappings of the two rings.
fn links(args: &SoakArgs) -> Result<SoakSetup, CommandError> {
    let config = EngineConfig {
        mtu: args.mtu,
        max_message_len: (args.max_size as u64 + 8).max(1 << 20),
        ..EngineConfig::default()
    };
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let window_len = barlink_transport::ring::Geometry::window_len_for(4 << 20);
    let each = args.fault_rate / 4.0;
    let faults = FaultConfig::none()
        .with_bit_flip(each)
        .with_drop(each)
        .with_tear(each)
        .with_stall(each, 3);
    let setup = |e: &dyn std::fmt::Display| CommandError::environment(format!("soak setup: {e}"));
    let memfd = |name: &str| {
        ShmWindow::create_memfd(name, window_len, &ShmOptions::default()).map_err(|e| setup(&e))
    };
    let (window_a, window_b) = (Arc::new(memfd("soak-a")?), Arc::new(memfd("soak-b")?));
    let second_mapping = |w: &ShmWindow| -> Result<Arc<dyn Window>, CommandError> {
        let fd = w.fd().try_clone_to_owned().map_err(|e| setup(&e))?;
        Ok(Arc::new(ShmWindow::from_fd(fd).map_err(|e| setup(&e))?))
    };
    let tenant_view = vec![second_mapping(&window_a)?, second_mapping(&window_b)?];
    let geometry = Geometry::for_window(window_len, config.mtu).map_err(|e| setup(&e))?;
    init_ring(&*window_a, geometry, 1).map_err(|e| setup(&e))?;
    init_ring(&*window_b, geometry, 1).map_err(|e| setup(&e))?;
    let faulty = |w: Arc<ShmWindow>, seed: u64| -> Arc<dyn Window> {
        Arc::new(FaultWindow::new(w, faults.clone(), seed))
    };
    let a_own: Arc<dyn Window> = window_a.clone();
    let b_own: Arc<dyn Window> = window_b.clone();
    let sender: SoakLink =
        RingLink::new(a_own, faulty(window_b, args.seed ^ 0xA), config.clone(), 1)
            .map_err(|e| setup(&e))?;
    let receiver: SoakLink = RingLink::new(b_own, faulty(window_a, args.seed ^ 0xB), config, 1)
        .map_err(|e| setup(&e))?;
    Ok((sender, receiver, tenant_view))
}

/// The receiving thread: checks every message and counts what is wrong
/// until `stop`. The link comes back whatever happens, so that its
/// statistics are reported even after a failure.
fn spawn_reader(
    mut receiver: SoakLink,
    args: &SoakArgs,
    verdicts: Arc<Verdicts>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<(SoakLink, Option<String>)> {
    let (seed, max_size) = (args.seed, args.max_size);
    thread::spawn(move || {
        let mut expected = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // Short waits, so that the end of the run is seen long
            // before the peer timeout could fire.
            let data = match receiver.recv(Duration::from_millis(100)) {
                Ok(data) => data,
                Err(barlink_transport::link::IoError::Timeout { .. }) => continue,
                Err(e) => return (receiver, Some(e.to_string())),
            };
            let index = u64::from_le_bytes(
                data.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0xFF; 8]),
            );
            if index < expected {
                verdicts.duplicated.fetch_add(1, Ordering::Relaxed);
            } else {
                if index > expected {
                    verdicts.lost.fetch_add(index - expected, Ordering::Relaxed);
                }
                if data != soak_message(seed, index, max_size) {
                    verdicts.corrupted.fetch_add(1, Ordering::Relaxed);
                }
                expected = index + 1;
            }
            verdicts.messages.fetch_add(1, Ordering::Relaxed);
            verdicts
                .bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            receiver.recycle(data);
        }
        (receiver, None)
    })
}

/// What a report line needs besides the link.
struct Progress<'a> {
    args: &'a SoakArgs,
    started: Instant,
    verdicts: &'a Verdicts,
    scribbler: Option<&'a Scribbler>,
}

/// The counts of a report line that the receiver's thread does not keep.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    /// Corrupt packets caught (mid-run: NAKs the sender received).
    caught: u64,
    /// Index words not acted on (mid-run: the sender's side only).
    index: IndexStats,
    scribbled: Scribbled,
}

/// Sends messages for `duration`, with a progress line now and then, then
/// flushes: how many were sent, and the link's error if it failed.
fn send_for(
    sender: &mut SoakLink,
    progress: &Progress,
    duration: Duration,
) -> (u64, Option<String>) {
    let step = Duration::from_secs(5);
    let every = Duration::from_secs(progress.args.progress_every.max(1));
    let mut next_report = progress.started + every;
    let mut sent = 0u64;
    while progress.started.elapsed() < duration {
        let message = soak_message(progress.args.seed, sent, progress.args.max_size);
        if let Err(e) = sender.send_blocking(message, step * 6) {
            return (sent, Some(e.to_string()));
        }
        sent += 1;
        if Instant::now() >= next_report {
            // Mid-run, the receiver's counters live on its thread; the NAKs
            // it sent stand for the corruption it caught.
            let tally = Tally {
                sent,
                caught: sender.engine().stats().naks_received,
                index: sender.index_stats(),
                scribbled: progress
                    .scribbler
                    .map(Scribbler::scribbled)
                    .unwrap_or_default(),
            };
            progress.report("progress", sender, &tally);
            next_report += every;
        }
    }
    match sender.flush(Duration::from_secs(60)) {
        Ok(()) => (sent, None),
        Err(e) => (sent, Some(e.to_string())),
    }
}

impl Progress<'_> {
    fn report(&self, kind: &str, sender: &SoakLink, tally: &Tally) {
        let stats = sender.engine().stats();
        let elapsed = self.started.elapsed().as_secs_f64();
        let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let verdicts = self.verdicts;
        let (messages, bytes) = (count(&verdicts.messages), count(&verdicts.bytes));
        let (lost, corrupted) = (count(&verdicts.lost), count(&verdicts.corrupted));
        let duplicated = count(&verdicts.duplicated);
        let failed = count(&verdicts.failed_with_error);
        let goodput_gbps = bytes as f64 / elapsed.max(1e-9) / 1e9;
        let (index, scribbled) = (tally.index, tally.scribbled);
        if self.args.output.json {
            println!(
                "{}",
                json!({
                    "kind": kind,
                    "elapsed_s": (elapsed * 10.0).round() / 10.0,
                    "messages_sent": tally.sent,
                    "messages": messages,
                    "bytes": bytes,
                    "goodput_gbps": (goodput_gbps * 1000.0).round() / 1000.0,
                    "retransmits": stats.retransmits(),
                    "crc_failures_caught": tally.caught,
                    "index_words_corrupt": index.corrupt,
                    "index_words_implausible": index.implausible,
                    "index_words_republished": index.republished,
                    "scribbled_writes": scribbled.writes,
                    "scribbled_into_control": scribbled.into_control,
                    "lost": lost,
                    "corrupted": corrupted,
                    "duplicated": duplicated,
                    "failed_with_error": failed,
                })
            );
            return;
        }
        let scribble = if scribbled.writes > 0 {
            format!(
                "  scribbled {} ({} into control blocks)",
                scribbled.writes, scribbled.into_control
            )
        } else {
            String::new()
        };
        println!(
            "soak {kind}: {elapsed:.0}s  messages {messages}  bytes {bytes}  goodput {goodput_gbps:.2} GB/s  retransmits {}  crc failures caught {}  missed index updates {}{scribble}  lost {lost}  corrupted {corrupted}  duplicated {duplicated}{}",
            stats.retransmits(),
            tally.caught,
            index.missed(),
            if failed > 0 {
                format!("  failed with error {failed}")
            } else {
                String::new()
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn soak_messages_carry_their_index_and_replay() {
        let a = soak_message(7, 42, 1000);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 42);
        assert_eq!(a, soak_message(7, 42, 1000));
        assert_ne!(a, soak_message(8, 42, 1000));
    }
}
