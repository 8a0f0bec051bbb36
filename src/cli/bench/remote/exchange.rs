//! What both remote benches time over the link: the client's windows of
//! messages, each closed by the server's "got them all", and round trips
//! the server echoes.

use std::time::Instant;

use barlink_transport::link::{Link, Medium};

use super::control::{done_message, parse_done};
use super::{STEP_TIMEOUT, counters, link_error, message_of};
use crate::cli::CommandError;

/// Bytes the untimed windows before each size's timed ones move at least:
/// a new connection runs slower for its first tens of milliseconds (the
/// kernel's buffers and the CPUs come up to speed), which iperf3's baseline
/// omits too (`-O`).
const WARMUP_BYTES: usize = 256 << 20;
/// Untimed windows at most, for sizes whose windows are small.
const MAX_WARMUP_WINDOWS: usize = 8;

/// How many untimed windows of `count` messages of `size` bytes come
/// first; both sides reckon it from the plan.
pub fn warmup_windows(size: usize, count: usize) -> usize {
    WARMUP_BYTES
        .div_ceil(size.max(1) * count.max(1))
        .clamp(1, MAX_WARMUP_WINDOWS)
}

/// What barlink's windows of one size measured.
pub struct Windows {
    pub gbps: Vec<f64>,
    pub sent: u64,
    pub received: u64,
    /// This side's (retransmits, CRC errors) after the warm-up.
    pub client_before: (u64, u64),
    /// The server's (retransmits, CRC errors) after the warm-up and at the end.
    pub server_before: (u64, u64),
    pub server_now: (u64, u64),
}

/// The warm-up and `windows` timed windows of `count` copies of
/// `message`, each closed by the server's "got them all". The copies are
/// made before the clock starts; with a shared buffer (`Arc<[u8]>`) they
/// are references, and the link reads the one buffer as iperf3 and
/// perftest do.
pub fn send_windows<M: Medium, B: AsRef<[u8]> + Clone>(
    link: &mut Link<M, B>,
    message: &B,
    count: usize,
    windows: usize,
) -> Result<Windows, CommandError> {
    let size = message.as_ref().len();
    let mut out = Windows {
        gbps: Vec::with_capacity(windows),
        sent: 0,
        received: 0,
        client_before: (0, 0),
        server_before: (0, 0),
        server_now: (0, 0),
    };
    let warmup = warmup_windows(size, count);
    for window in 0..warmup + windows {
        let copies: Vec<B> = (0..count).map(|_| message.clone()).collect();
        let start = Instant::now();
        for copy in copies {
            link.send_blocking(copy, STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: sending")))?;
            out.sent += 1;
        }
        let done = link
            .recv(STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: waiting for the server")))?;
        let seconds = start.elapsed().as_secs_f64();
        let (retransmits, crc_errors, got) = parse_done(&done).ok_or_else(|| {
            CommandError::environment(format!(
                "bench: size {size}: the server's answer is not \"got them all\" \
                 ({} bytes): the sides are out of step",
                done.len()
            ))
        })?;
        if window + 1 == warmup {
            out.client_before = counters(link);
            out.server_before = (retransmits, crc_errors);
        }
        out.server_now = (retransmits, crc_errors);
        out.received = got;
        link.recycle(done);
        if window >= warmup {
            out.gbps.push((size * count) as f64 / seconds / 1e9);
        }
    }
    Ok(out)
}

/// `iters` round trips of `message` (the server echoes each): one-way
/// times in microseconds. Every echo is compared, after the clock stopped;
/// any that differ set `failed`, and one note names how many and the first.
pub fn round_trips<M: Medium, B: AsRef<[u8]> + Clone>(
    link: &mut Link<M, B>,
    message: &B,
    iters: usize,
    failed: &mut bool,
    note: &dyn Fn(&str),
) -> Result<Vec<f64>, CommandError> {
    let expected = message.as_ref();
    let size = expected.len();
    let mut latencies = Vec::new();
    let mut wrong = 0usize;
    let mut first_wrong = None;
    for i in 0..iters {
        let outgoing = message.clone();
        let start = Instant::now();
        link.send_blocking(outgoing, STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: latency")))?;
        let echo = link
            .recv(STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: latency echo")))?;
        latencies.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
        if echo != expected {
            wrong += 1;
            first_wrong.get_or_insert((i, echo.len()));
        }
        link.recycle(echo);
    }
    if let Some((index, len)) = first_wrong {
        *failed = true;
        let what = if len == size {
            "different bytes"
        } else {
            "another length"
        };
        note(&format!(
            "size {size}: {wrong} of {iters} echoes differed from what was sent; the first, \
             echo {index}, came back with {len} bytes ({what})"
        ));
    }
    Ok(latencies)
}

/// The server's side of [`send_windows`]: every message's length checked,
/// the first of each window and all of the warm-up byte for byte; each
/// window answered with "got them all".
pub fn receive_windows<M: Medium>(
    link: &mut Link<M>,
    size: usize,
    count: usize,
    windows: usize,
    failed: &mut bool,
    note: &dyn Fn(&str),
) -> Result<(), CommandError> {
    let expected = message_of(size);
    let mut received = 0u64;
    let warmup = warmup_windows(size, count);
    for window in 0..warmup + windows {
        for index in 0..count {
            let data = link
                .recv(STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: receiving")))?;
            let check_bytes = window < warmup || index == 0;
            if data.len() != size || (check_bytes && data != expected) {
                *failed = true;
                note(&format!(
                    "size {size}: message {index} of window {window} arrived with {} bytes{}",
                    data.len(),
                    if data.len() == size {
                        ", different ones"
                    } else {
                        ""
                    }
                ));
            }
            received += 1;
            link.recycle(data);
        }
        let (retransmits, crc_errors) = counters(link);
        link.send_blocking(
            done_message(retransmits, crc_errors, received),
            STEP_TIMEOUT,
        )
        .map_err(link_error(&format!("size {size}: answering")))?;
    }
    Ok(())
}

/// Sends back each of the client's `iters` latency messages.
pub fn echo<M: Medium>(link: &mut Link<M>, size: usize, iters: usize) -> Result<(), CommandError> {
    for _ in 0..iters {
        let data = link
            .recv(STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: latency")))?;
        link.send_blocking(data, STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: echo")))?;
    }
    Ok(())
}
