//! `validate`'s report: the verdict and its reason, the tables for people
//! and the JSON document.

use std::fmt::Write as _;

use barlink_transport::EngineConfig;
use serde_json::{Value, json};

use super::args::{InjectInto, ValidateArgs};
use super::link::{Direction, LinkResult, Stream};
use super::patterns::Pattern;
use super::progress::mib;
use super::raw::{FIRST_ERRORS, FIRST_ERRORS_SHOWN, RawResult, WRITE_PIECE};
use super::target::Target;
use crate::cli::human_size;

/// What both phases found, and the bit flips injected into each.
pub struct ValidationOutcome {
    pub raw: Vec<RawResult>,
    pub raw_injected: u64,
    pub link: LinkResult,
    pub link_injected: u64,
}

// ------------------------------------------------------------------ the run

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationVerdict {
    Pass,
    Warn,
    Fail,
}

impl ValidationVerdict {
    pub fn name(self) -> &'static str {
        match self {
            ValidationVerdict::Pass => "PASS",
            ValidationVerdict::Warn => "WARN",
            ValidationVerdict::Fail => "FAIL",
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn judge(raw: &[RawResult], link: &LinkResult, injected: u64) -> (ValidationVerdict, String) {
    let raw_bad: u64 = raw.iter().map(|r| r.bad_words).sum();
    let raw_bytes: u64 = raw.iter().map(|r| r.len as u64).sum();
    let caught = link.sum(|d| d.crc_failures);
    let messages = link.sum(|d| d.messages);
    let bytes = link.sum(|d| d.bytes);
    let wrong = link.wrong();
    let mut fail = Vec::new();
    if wrong > 0 {
        fail.push(format!(
            "THE LINK DELIVERED {} LOST, {} CORRUPTED AND {} DUPLICATED MESSAGES. This must be \
             impossible (every packet carries a CRC-32C, every message a sequence number): \
             please report it with this output",
            link.sum(|d| d.lost),
            link.sum(|d| d.corrupted),
            link.sum(|d| d.duplicated)
        ));
    }
    if raw_bad > 0 {
        let patterns: Vec<&str> = Pattern::ALL
            .iter()
            .filter(|p| raw.iter().any(|r| r.pattern == **p && r.bad_words > 0))
            .map(|p| p.name())
            .collect();
        fail.push(format!(
            "{raw_bad} of {} words read back wrong after raw writes ({}): this path corrupts \
             data; do not move data over it without an end-to-end check",
            raw_bytes / 8,
            patterns.join(", ")
        ));
    }
    if let Some(error) = &link.error {
        fail.push(format!(
            "the link failed: {error} ({} messages were not delivered: failed with that error, not lost silently)",
            link.sum(|d| d.undelivered)
        ));
    }
    let note = if injected > 0 {
        format!(" ({injected} bit flips were injected on purpose by --inject-faults)")
    } else {
        String::new()
    };
    if !fail.is_empty() {
        if caught > 0 {
            fail.push(format!(
                "the link caught {caught} corrupt packets and resent them"
            ));
        }
        return (
            ValidationVerdict::Fail,
            format!("{}{note}", fail.join("; ")),
        );
    }
    let summary = format!(
        "{} written and read back raw with no error; {messages} messages ({}) through the link, every byte verified",
        mib(raw_bytes),
        mib(bytes)
    );
    if caught > 0 {
        return (
            ValidationVerdict::Warn,
            format!(
                "{summary}, but the link caught {caught} corrupt packets and resent them: \
                 this path corrupts data under load. barlink delivered everything intact; \
                 software without an end-to-end check would not{note}"
            ),
        );
    }
    (
        ValidationVerdict::Pass,
        format!("{summary}, no corrupt packet{note}"),
    )
}

pub fn print_header(
    target: &Target,
    args: &ValidateArgs,
    config: &EngineConfig,
    streams: &[Stream; 2],
) {
    let what = match target.kind {
        "shm" => "shared memory (two memfd windows in this process)".to_string(),
        _ if target.raw.len() == 1 => format!("one BAR, {} tested", human_size(target.size)),
        _ => format!("two BARs, {} of each tested", human_size(target.size)),
    };
    println!("# barlink validate: {what}");
    for line in &target.description {
        println!("#   {line}");
    }
    println!(
        "# seed {}; link: MTU {}, messages 8 B..{} ({} A->B, {} B->A)",
        args.seed,
        human_size(config.mtu),
        human_size(args.max_size),
        streams[0].count,
        streams[1].count
    );
    if args.inject_faults > 0.0 {
        println!(
            "# --inject-faults {}: one bit flipped in that fraction of the writes ({})",
            args.inject_faults,
            match args.inject_into {
                InjectInto::Both => "raw and link phases",
                InjectInto::Raw => "raw phase only",
                InjectInto::Link => "link phase only",
            }
        );
    }
}

pub fn print_raw(raw: &[RawResult], injected: u64, injecting: bool) {
    println!();
    println!(
        "phase 1: raw window writes ({} pieces, store fence, read back, 8-byte words compared)",
        human_size(WRITE_PIECE)
    );
    let width = raw.iter().map(|r| r.window.len()).max().unwrap_or(6).max(6);
    println!(
        "  {:<width$}  {:<18} {:>8} {:>10} {:>10} {:>13} {:>9} {:>9}  result",
        "window", "pattern", "bytes", "bad words", "bad bytes", "bits flipped", "write s", "read s"
    );
    for r in raw {
        println!(
            "  {:<width$}  {:<18} {:>8} {:>10} {:>10} {:>13} {:>9.3} {:>9.3}  {}",
            r.window,
            r.pattern.name(),
            human_size(r.len),
            r.bad_words,
            r.bad_bytes,
            r.flipped_bits,
            r.write_s,
            r.read_s,
            if r.bad_words == 0 { "ok" } else { "ERRORS" }
        );
    }
    if injecting {
        println!("  injected: {injected} bit flips");
    }
    if raw.iter().any(|r| r.bad_words > 0) {
        println!("  errors by offset range:");
        for r in raw.iter().filter(|r| r.bad_words > 0) {
            for (i, bucket) in r.buckets.iter().enumerate() {
                if bucket.bad_words > 0 {
                    let (start, end) = r.bucket_range(i);
                    println!(
                        "    {:<width$}  {:<18}  {start:#010x}-{end:#010x}  {} bad words, {} bad bytes",
                        r.window,
                        r.pattern.name(),
                        bucket.bad_words,
                        bucket.bad_bytes
                    );
                }
            }
        }
        println!(
            "  first bad words (up to {FIRST_ERRORS_SHOWN} per window and pattern; --json has {FIRST_ERRORS}):"
        );
        for r in raw.iter().filter(|r| r.bad_words > 0) {
            for w in r.first.iter().take(FIRST_ERRORS_SHOWN) {
                println!(
                    "    {:<width$}  {:<18}  at {:#010x}: expected {:#018x} found {:#018x} (differs {:#018x})",
                    r.window,
                    r.pattern.name(),
                    w.offset,
                    w.expected,
                    w.found,
                    w.expected ^ w.found
                );
            }
        }
    }
}

pub fn print_link(link: &LinkResult, injected: u64, injecting: bool) {
    println!();
    println!(
        "phase 2: through the link (a ring in each window, one thread per side, CRC-32C on every packet; {:.1} s)",
        link.elapsed_s
    );
    let mut table = String::new();
    let _ = writeln!(
        table,
        "  {:<9} {:>9} {:>12} {:>11} {:>12} {:>6} {:>10} {:>11}",
        "direction",
        "messages",
        "bytes",
        "crc caught",
        "retransmits",
        "lost",
        "corrupted",
        "duplicated"
    );
    let mut row = |name: &str, d: [u64; 7]| {
        let _ = writeln!(
            table,
            "  {:<9} {:>9} {:>12} {:>11} {:>12} {:>6} {:>10} {:>11}",
            name,
            d[0],
            mib(d[1]),
            d[2],
            d[3],
            d[4],
            d[5],
            d[6]
        );
    };
    for d in &link.directions {
        row(
            d.name,
            [
                d.messages,
                d.bytes,
                d.crc_failures,
                d.retransmits,
                d.lost,
                d.corrupted,
                d.duplicated,
            ],
        );
    }
    row(
        "total",
        [
            link.sum(|d| d.messages),
            link.sum(|d| d.bytes),
            link.sum(|d| d.crc_failures),
            link.sum(|d| d.retransmits),
            link.sum(|d| d.lost),
            link.sum(|d| d.corrupted),
            link.sum(|d| d.duplicated),
        ],
    );
    print!("{table}");
    if injecting {
        println!("  injected: {injected} bit flips into the link's writes");
    }
    for d in &link.directions {
        if let Some(first) = &d.first_wrong {
            println!("  {}: first wrong delivery: {first}", d.name);
        }
    }
    if let Some(error) = &link.error {
        println!(
            "  the link failed: {error}; {} messages not delivered (failed with that error)",
            link.sum(|d| d.undelivered)
        );
    }
}

/// The `--json` document.
pub fn document(
    target: &Target,
    args: &ValidateArgs,
    outcome: &ValidationOutcome,
    (verdict, reason): (ValidationVerdict, &str),
    elapsed: f64,
) -> Value {
    let ValidationOutcome {
        raw,
        raw_injected,
        link,
        link_injected,
    } = outcome;
    json!({
        "command": "validate",
        "target": target.kind,
        "devices": target.devices,
        "windows": target.raw.iter().map(|r| json!({"name": r.name, "offset": r.base, "size_bytes": target.size})).collect::<Vec<_>>(),
        "size_bytes": target.size,
        "seed": args.seed,
        "inject_faults": args.inject_faults,
        "inject_into": match args.inject_into { InjectInto::Both => "both", InjectInto::Raw => "raw", InjectInto::Link => "link" },
        "raw": {
            "patterns": raw.iter().map(raw_json).collect::<Vec<_>>(),
            "bad_words": raw.iter().map(|r| r.bad_words).sum::<u64>(),
            "bad_bytes": raw.iter().map(|r| r.bad_bytes).sum::<u64>(),
            "injected_bit_flips": raw_injected,
        },
        "link": {
            "mtu": link.mtu,
            "messages": link.sum(|d| d.messages),
            "bytes": link.sum(|d| d.bytes),
            "crc_failures_caught": link.sum(|d| d.crc_failures),
            "retransmits": link.sum(|d| d.retransmits),
            "index_words_missed": link.sum(|d| d.index_missed),
            "lost": link.sum(|d| d.lost),
            "undelivered": link.sum(|d| d.undelivered),
            "corrupted": link.sum(|d| d.corrupted),
            "duplicated": link.sum(|d| d.duplicated),
            "error": link.error,
            "elapsed_s": round3(link.elapsed_s),
            "injected_bit_flips": link_injected,
            "directions": link.directions.iter().map(direction_json).collect::<Vec<_>>(),
        },
        "verdict": verdict.name(),
        "reason": reason,
        "elapsed_s": round3(elapsed),
    })
}

fn raw_json(result: &RawResult) -> Value {
    let ranges: Vec<Value> = result
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (start, end) = result.bucket_range(i);
            json!({
                "start": start,
                "end": end,
                "bad_words": b.bad_words,
                "bad_bytes": b.bad_bytes,
            })
        })
        .collect();
    let first: Vec<Value> = result
        .first
        .iter()
        .map(|w| {
            json!({
                "offset": w.offset,
                "expected": format!("{:#018x}", w.expected),
                "found": format!("{:#018x}", w.found),
            })
        })
        .collect();
    json!({
        "window": result.window,
        "pattern": result.pattern.name(),
        "offset": result.base,
        "bytes": result.len,
        "bad_words": result.bad_words,
        "bad_bytes": result.bad_bytes,
        "flipped_bits": result.flipped_bits,
        "write_s": round3(result.write_s),
        "read_s": round3(result.read_s),
        "ranges": ranges,
        "first_errors": first,
    })
}

fn direction_json(direction: &Direction) -> Value {
    json!({
        "direction": direction.name,
        "messages_sent": direction.messages_sent,
        "messages": direction.messages,
        "bytes": direction.bytes,
        "crc_failures_caught": direction.crc_failures,
        "naks": direction.naks,
        "retransmits": direction.retransmits,
        "retransmits_nak": direction.retransmits_by[0],
        "retransmits_timeout": direction.retransmits_by[1],
        "retransmits_sack": direction.retransmits_by[2],
        "index_words_missed": direction.index_missed,
        "lost": direction.lost,
        "undelivered": direction.undelivered,
        "corrupted": direction.corrupted,
        "duplicated": direction.duplicated,
        "first_wrong_delivery": direction.first_wrong,
    })
}
