//! `barlink validate --gpu`: the same two phases as over windows, with a
//! GPU's memory as what is tested.
//!
//! 1. **Raw copies.** Each pattern is written over the tested range of a
//!    device buffer by the copy engine (host → device), copied device to
//!    device into a second buffer, and both are read back (device → host)
//!    and compared word by word.
//! 2. **Through the link.** Messages of mixed sizes carrying the patterns go
//!    from one device buffer to another over a link between two threads
//!    (the staged route of [`barlink::gpu`]); each is read back from the
//!    device it landed in and checked byte for byte.
//!
//! Verdicts as for windows: PASS, WARN (the link caught corrupt packets
//! and resent them), FAIL (a raw copy read back wrong, the link failed, or
//! a delivery was wrong).

use std::thread;
use std::time::{Duration, Instant};

use barlink::gpu::{DeviceBuffer, DeviceLanding, Staged, StagingPool, send_from_device};
use barlink::{ConnectOptions, Peer, Role, connect};
use serde_json::json;

use super::ValidateArgs;
use super::link::Stream;
use super::patterns::{Pattern, word_of};
use crate::cli::gpu::{self, Gpu};
use crate::cli::{CommandError, Status, human_size, print_document};

/// Bytes moved per copy in the raw phase.
const CHUNK: usize = 4 << 20;

/// One pattern's raw result.
struct RawResult {
    pattern: Pattern,
    bad_words: u64,
    first_bad: Option<String>,
}

/// The link phase's result.
struct LinkResult {
    messages: u64,
    bytes: u64,
    wrong: u64,
    first_wrong: Option<String>,
    crc_failures: u64,
    retransmits: u64,
    error: Option<String>,
}

pub fn run(args: &ValidateArgs, stream: Stream) -> Result<Status, CommandError> {
    let gpu = gpu::open(args.gpu_device.ordinal, &args.sysfs.sysfs_root)?;
    let size = args
        .size
        .unwrap_or(if args.quick { 16 << 20 } else { 256 << 20 });
    if size == 0 || !size.is_multiple_of(8) {
        return Err(CommandError::usage(format!(
            "--size {size}: must be a positive multiple of 8 with --gpu"
        )));
    }
    let started = Instant::now();
    if !args.output.json {
        println!("# barlink validate --gpu: raw copies and the link, in device memory");
        println!("# gpu: {}", gpu.describe());
        println!(
            "# raw: {} per pattern, host -> device, device -> device, read back; link: {} messages up to {} each, device -> device",
            human_size(size),
            stream.count,
            human_size(stream.max_size)
        );
    }
    let cuda = |e: barlink::gpu::CudaError| gpu::command_error("validate --gpu", e);
    let first = gpu.context.alloc(size).map_err(cuda)?;
    let second = gpu.context.alloc(size).map_err(cuda)?;
    let mut raw = Vec::new();
    for pattern in Pattern::ALL {
        raw.push(raw_pattern(pattern, args.seed, &first, &second).map_err(cuda)?);
    }
    drop((first, second));
    let link = link_phase(&gpu, args, stream);
    let (verdict, reason) = judge(&raw, &link);
    if args.output.json {
        print_document(&document(&gpu, &raw, &link, verdict, &reason, started));
    } else {
        for r in &raw {
            println!(
                "raw {:<20} {} bad words{}",
                r.pattern.name(),
                r.bad_words,
                r.first_bad
                    .as_deref()
                    .map(|f| format!("; first: {f}"))
                    .unwrap_or_default()
            );
        }
        println!(
            "link: {} messages, {:.1} MiB delivered, {} wrong, {} CRC failures caught, {} retransmits{}",
            link.messages,
            link.bytes as f64 / f64::from(1 << 20),
            link.wrong,
            link.crc_failures,
            link.retransmits,
            link.error
                .as_deref()
                .map(|e| format!("; error: {e}"))
                .unwrap_or_default()
        );
        println!();
        println!("validate: {verdict} — {reason}");
    }
    Ok(match verdict {
        "PASS" => Status::Ok,
        "WARN" if !args.strict => Status::Ok,
        _ => Status::CheckFailed,
    })
}

/// Writes `pattern` over `first` in chunks, copies it device to device
/// into `second`, reads both back and counts the words that differ.
fn raw_pattern(
    pattern: Pattern,
    seed: u64,
    first: &DeviceBuffer,
    second: &DeviceBuffer,
) -> Result<RawResult, barlink::gpu::CudaError> {
    let size = first.len();
    let mut chunk = vec![0u8; CHUNK.min(size)];
    for at in (0..size).step_by(CHUNK) {
        let len = CHUNK.min(size - at);
        pattern.fill(seed, at as u64, &mut chunk[..len]);
        first.write(at, &chunk[..len])?;
    }
    second.copy_from(0, first, 0, size)?;
    let mut expected = vec![0u8; chunk.len()];
    let mut result = RawResult {
        pattern,
        bad_words: 0,
        first_bad: None,
    };
    for (name, buffer) in [("host->device", first), ("device->device", second)] {
        for at in (0..size).step_by(CHUNK) {
            let len = CHUNK.min(size - at);
            buffer.read(at, &mut chunk[..len])?;
            pattern.fill(seed, at as u64, &mut expected[..len]);
            for (i, (found, want)) in chunk[..len]
                .chunks(8)
                .zip(expected[..len].chunks(8))
                .enumerate()
            {
                if found != want {
                    result.bad_words += 1;
                    result.first_bad.get_or_insert_with(|| {
                        format!(
                            "{name} offset {:#x}: expected {:#018x}, found {:#018x}",
                            at + 8 * i,
                            word_of(want),
                            word_of(found)
                        )
                    });
                }
            }
        }
    }
    Ok(result)
}

/// Sends the stream from one device buffer to another over a link between
/// two threads, checking each message where it landed.
fn link_phase(gpu: &Gpu, args: &ValidateArgs, stream: Stream) -> LinkResult {
    let timeout = Duration::from_secs(args.timeout.unwrap_or(if args.quick { 60 } else { 600 }));
    let peer = Peer::Local {
        name: format!("barlink-validate-gpu-{}", std::process::id()),
    };
    let options = ConnectOptions {
        engine: barlink::EngineConfig {
            mtu: args.mtu,
            max_message_len: (stream.max_size as u64).max(1 << 20),
            ..barlink::EngineConfig::default()
        },
        ..ConnectOptions::default()
    };
    let max = stream.max_size.max(8);
    let sender = {
        let (peer, options, context) = (peer.clone(), options.clone(), gpu.context.clone());
        thread::spawn(move || -> Result<(), String> {
            let mut link =
                connect::<Staged>(&peer, Role::Connect, &options).map_err(|e| e.to_string())?;
            let pool = StagingPool::new(context.clone(), 64 << 20);
            let source = context.alloc(max).map_err(|e| e.to_string())?;
            let mut message = Vec::new();
            for index in 0..stream.count {
                stream.message(index, &mut message);
                source.write(0, &message).map_err(|e| e.to_string())?;
                send_from_device(&mut link, &pool, &source, 0, message.len(), timeout)
                    .map_err(|e| e.to_string())?;
            }
            link.flush(timeout).map_err(|e| e.to_string())?;
            link.close(timeout).map_err(|e| e.to_string())
        })
    };
    let mut result = LinkResult {
        messages: 0,
        bytes: 0,
        wrong: 0,
        first_wrong: None,
        crc_failures: 0,
        retransmits: 0,
        error: None,
    };
    if let Err(error) = receive(gpu, &peer, &options, &stream, timeout, &mut result) {
        result.error = Some(error);
    }
    match sender.join() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            result.error.get_or_insert(format!("sender: {error}"));
        }
        Err(_) => {
            result
                .error
                .get_or_insert("the sending thread panicked".to_string());
        }
    }
    result
}

fn receive(
    gpu: &Gpu,
    peer: &Peer,
    options: &ConnectOptions,
    stream: &Stream,
    timeout: Duration,
    result: &mut LinkResult,
) -> Result<(), String> {
    let mut link = connect::<Vec<u8>>(peer, Role::Accept, options).map_err(|e| e.to_string())?;
    let landing = gpu
        .context
        .alloc(stream.max_size.max(8))
        .map_err(|e| e.to_string())?;
    let mut receiver = DeviceLanding::new(gpu.context.clone(), stream.max_size.max(8), 4);
    let (mut expected, mut landed) = (Vec::new(), Vec::new());
    for index in 0..stream.count {
        let len = receiver
            .recv(&mut link, &landing, 0, timeout)
            .map_err(|e| e.to_string())?;
        stream.message(index, &mut expected);
        landed.resize(len, 0);
        landing.read(0, &mut landed).map_err(|e| e.to_string())?;
        result.messages += 1;
        result.bytes += len as u64;
        if landed != expected {
            result.wrong += 1;
            result.first_wrong.get_or_insert_with(|| {
                format!(
                    "message {index}: {len} bytes landed, {} expected{}",
                    expected.len(),
                    landed
                        .get(..8)
                        .map(|b| format!(", index field {}", word_of(b)))
                        .unwrap_or_default()
                )
            });
        }
    }
    let stats = link.stats();
    result.crc_failures = stats.crc_failures;
    result.retransmits = stats.retransmits_nak + stats.retransmits_timeout + stats.retransmits_sack;
    link.close(timeout).map_err(|e| e.to_string())
}

fn judge(raw: &[RawResult], link: &LinkResult) -> (&'static str, String) {
    let bad_words: u64 = raw.iter().map(|r| r.bad_words).sum();
    if bad_words > 0 {
        return (
            "FAIL",
            format!("{bad_words} words of device memory read back wrong"),
        );
    }
    if let Some(error) = &link.error {
        return ("FAIL", format!("the link failed: {error}"));
    }
    if link.wrong > 0 {
        return (
            "FAIL",
            format!("{} messages landed wrong in device memory", link.wrong),
        );
    }
    if link.crc_failures > 0 {
        return (
            "WARN",
            format!(
                "raw copies were clean, but the link caught {} corrupt packets and resent them",
                link.crc_failures
            ),
        );
    }
    (
        "PASS",
        "every raw copy and every message landed intact".to_string(),
    )
}

fn document(
    gpu: &Gpu,
    raw: &[RawResult],
    link: &LinkResult,
    verdict: &str,
    reason: &str,
    started: Instant,
) -> serde_json::Value {
    json!({
        "verdict": verdict,
        "reason": reason,
        "target": "gpu",
        "device": gpu.json(),
        "raw": raw.iter().map(|r| json!({
            "pattern": r.pattern.name(),
            "bad_words": r.bad_words,
            "first_bad": r.first_bad,
        })).collect::<Vec<_>>(),
        "link": {
            "messages": link.messages,
            "bytes": link.bytes,
            "wrong": link.wrong,
            "first_wrong": link.first_wrong,
            "crc_failures": link.crc_failures,
            "retransmits": link.retransmits,
            "error": link.error,
        },
        "elapsed_s": started.elapsed().as_secs_f64(),
    })
}
