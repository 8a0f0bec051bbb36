//! `barlink validate`: a data-integrity test of a P2P path.
//!
//! Two windows — two shared-memory windows in this process by default, or
//! the BARs of one or two PCI devices — are tested twice:
//!
//! 1. **Raw window writes.** Each pattern (walking ones, address in
//!    address, seeded random) is written over the tested range of every
//!    window with [`Window::write`] in page-sized pieces, fenced, read back
//!    with [`Window::read`] and compared word by word. Mismatches are
//!    counted per offset range and the first ones are shown with what was
//!    expected and what was found. All windows are written before any is
//!    read, so that windows that alias each other show too.
//! 2. **Through the link.** A [`RingLink`] on each side (one thread each),
//!    rings in the windows, sends messages of mixed sizes carrying the same
//!    patterns both ways; every delivered message is checked byte for byte
//!    against its generator. The link's CRC failures (corruption it caught
//!    and had resent) are reported with its retransmissions, and anything
//!    lost, corrupted or duplicated — which the protocol must make
//!    impossible — is counted.
//!
//! The verdict: PASS (nothing wrong anywhere), WARN (raw writes clean, but
//! the link caught corrupt packets: the path corrupts data under load and
//! barlink repaired it), FAIL (raw errors, a failed link, or — should be
//! impossible — a wrong delivery).
//!
//! `--gpu` tests a GPU's memory instead ([`gpu`]).
//!
//! `--inject-faults RATE` wraps the windows in a bit-flipping
//! [`FaultWindow`] to show that the validator catches corruption: the raw
//! phase must then find errors and the link must catch CRC failures and
//! still deliver everything intact.

mod args;
mod gpu;
mod link;
mod patterns;
mod progress;
mod raw;
mod report;
mod target;

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use barlink_transport::window::{FaultConfig, FaultWindow, Window};

use args::InjectInto;
pub use args::ValidateArgs;
use link::{Stream, engine_config, link_phase};
use patterns::GAMMA;
use progress::Progress;
use raw::raw_phase;
use report::{
    ValidationOutcome, ValidationVerdict, document, judge, print_header, print_link, print_raw,
};
use target::{device_target, shm_target};

use super::{CommandError, Status, print_document};

pub fn run(args: &ValidateArgs) -> Result<Status, CommandError> {
    check(args)?;
    if args.gpu {
        let [device_to_device, _] = streams(args);
        return gpu::run(args, device_to_device);
    }
    let config = engine_config(args);
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let target = if args.device.is_empty() {
        shm_target(args)?
    } else {
        device_target(args)?
    };
    let started = Instant::now();
    let progress = Progress {
        on: std::io::stderr().is_terminal(),
    };
    let rate = |phase: InjectInto| {
        if args.inject_into == InjectInto::Both || args.inject_into == phase {
            args.inject_faults
        } else {
            0.0
        }
    };
    let streams = streams(args);
    if !args.output.json {
        print_header(&target, args, &config, &streams);
    }
    let raw_windows: Vec<Arc<dyn Window>> = target.raw.iter().map(|r| r.window.clone()).collect();
    let (raw_writers, raw_faulty) = writers(&raw_windows, rate(InjectInto::Raw), args.seed ^ 0x5A);
    let raw = raw_phase(&target, &raw_writers, args, &progress)?;
    let raw_injected = injected(&raw_faulty);
    if !args.output.json {
        print_raw(&raw, raw_injected, rate(InjectInto::Raw) > 0.0);
    }

    let (link_writers, link_faulty) =
        writers(&target.rings, rate(InjectInto::Link), args.seed ^ 0x1C);
    let peers: [Arc<dyn Window>; 2] = [link_writers[0].clone(), link_writers[1].clone()];
    let link = link_phase(&target, peers, args, &config, streams, &progress)?;
    let link_injected = injected(&link_faulty);
    if !args.output.json {
        print_link(&link, link_injected, rate(InjectInto::Link) > 0.0);
    }

    let (verdict, reason) = judge(&raw, &link, raw_injected + link_injected);
    let elapsed = started.elapsed().as_secs_f64();
    if args.output.json {
        let outcome = ValidationOutcome {
            raw,
            raw_injected,
            link,
            link_injected,
        };
        print_document(&document(
            &target,
            args,
            &outcome,
            (verdict, &reason),
            elapsed,
        ));
    } else {
        println!();
        println!("validate: {} — {reason}", verdict.name());
    }
    Ok(match verdict {
        ValidationVerdict::Pass => Status::Ok,
        ValidationVerdict::Warn if args.strict => Status::CheckFailed,
        ValidationVerdict::Warn => Status::Ok,
        ValidationVerdict::Fail => Status::CheckFailed,
    })
}

/// The checks of the options clap cannot make.
fn check(args: &ValidateArgs) -> Result<(), CommandError> {
    if !(0.0..=0.5).contains(&args.inject_faults) {
        return Err(CommandError::usage(format!(
            "--inject-faults {} is outside 0..=0.5",
            args.inject_faults
        )));
    }
    if args.messages == Some(0) || args.link_bytes == Some(0) {
        return Err(CommandError::usage(
            "--messages and --link-bytes must be at least 1",
        ));
    }
    if args.max_size < 8 {
        return Err(CommandError::usage(
            "--max-size must be at least 8 (each message carries its index)",
        ));
    }
    Ok(())
}

/// The link phase's two streams of messages, A to B and B to A.
fn streams(args: &ValidateArgs) -> [Stream; 2] {
    let count = |seed| match args.messages {
        Some(count) => count,
        None => Stream::count_for(
            seed,
            args.max_size,
            args.link_bytes
                .unwrap_or(if args.quick { 16 << 20 } else { 256 << 20 }),
        ),
    };
    let seed_ab = args.seed ^ 0xA2B0_0000_0000_0001;
    let seed_ba = args.seed ^ 0xB2A0_0000_0000_0002;
    [
        Stream {
            seed: seed_ab,
            count: count(seed_ab),
            max_size: args.max_size,
        },
        Stream {
            seed: seed_ba,
            count: count(seed_ba),
            max_size: args.max_size,
        },
    ]
}

/// A window wrapped to flip bits in writes.
type Faulty = Arc<FaultWindow<Arc<dyn Window>>>;

/// Wraps each window in a bit-flipping [`FaultWindow`] (or not), returning
/// the windows to write through and the wrappers to count faults on.
fn writers(
    windows: &[Arc<dyn Window>],
    rate: f64,
    seed: u64,
) -> (Vec<Arc<dyn Window>>, Vec<Faulty>) {
    if rate <= 0.0 {
        return (windows.to_vec(), Vec::new());
    }
    let faulty: Vec<Faulty> = windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            Arc::new(FaultWindow::new(
                w.clone(),
                FaultConfig::none().with_bit_flip(rate),
                seed ^ (i as u64 + 1).wrapping_mul(GAMMA),
            ))
        })
        .collect();
    let as_windows = faulty
        .iter()
        .map(|f| f.clone() as Arc<dyn Window>)
        .collect();
    (as_windows, faulty)
}

fn injected(faulty: &[Faulty]) -> u64 {
    faulty.iter().map(|f| f.injected().bit_flips).sum()
}
