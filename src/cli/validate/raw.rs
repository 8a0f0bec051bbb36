//! Phase 1: every pattern written over every window with plain writes,
//! fenced, read back and compared word by word.

use std::sync::Arc;
use std::time::Instant;

use barlink_transport::window::Window;

use super::args::ValidateArgs;
use super::patterns::{Pattern, word_of};
use super::progress::Progress;
use super::target::{PAGE, Target};
use crate::cli::CommandError;

/// Bytes per raw write call: a page, so that a fault injected per write
/// hits a page, as one bad TLP would.
pub const WRITE_PIECE: usize = PAGE;
/// Bytes per raw read call.
const READ_PIECE: usize = 1 << 20;
/// Bad words listed per window and pattern.
pub const FIRST_ERRORS: usize = 8;
/// Of those, shown in the text report.
pub const FIRST_ERRORS_SHOWN: usize = 3;

#[derive(Debug, Clone, Default)]
pub struct Bucket {
    pub bad_words: u64,
    pub bad_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct BadWord {
    pub offset: usize,
    pub expected: u64,
    pub found: u64,
}

#[derive(Debug)]
pub struct RawResult {
    pub window: String,
    pub pattern: Pattern,
    pub base: usize,
    pub len: usize,
    pub bucket_len: usize,
    pub buckets: Vec<Bucket>,
    pub bad_words: u64,
    pub bad_bytes: u64,
    pub flipped_bits: u64,
    pub first: Vec<BadWord>,
    pub write_s: f64,
    pub read_s: f64,
}

impl RawResult {
    /// First and last offset (in the BAR) of range `i`.
    pub fn bucket_range(&self, i: usize) -> (usize, usize) {
        let start = self.base + i * self.bucket_len;
        let end = (start + self.bucket_len).min(self.base + self.len) - 1;
        (start, end)
    }
}

/// The stream key of `pattern` in window `index`: the random pattern
/// differs per window (so windows that alias each other show), the others
/// are the same everywhere.
fn raw_key(pattern: Pattern, seed: u64, index: usize) -> u64 {
    match pattern {
        Pattern::Random => seed ^ (index as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
        _ => 0,
    }
}

/// Phase 1: every pattern written over every window, then read back.
pub fn raw_phase(
    target: &Target,
    writers: &[Arc<dyn Window>],
    args: &ValidateArgs,
    progress: &Progress,
) -> Result<Vec<RawResult>, CommandError> {
    let bucket_len = (1usize << 20).max(target.size / 16);
    // Bytes written and read, for the progress line.
    let total = (2 * target.size * target.raw.len() * Pattern::ALL.len()) as u64;
    let mut done = 0u64;
    let mut results = Vec::new();
    let mut piece = vec![0u8; WRITE_PIECE];
    let mut got = vec![0u8; READ_PIECE];
    let mut want = vec![0u8; READ_PIECE];
    let window_error = |name: &str, e: &dyn std::fmt::Display| {
        CommandError::environment(format!("window {name}: {e}"))
    };
    for pattern in Pattern::ALL {
        let mut write_s = Vec::new();
        for (index, (raw, writer)) in target.raw.iter().zip(writers).enumerate() {
            let key = raw_key(pattern, args.seed, index);
            let started = Instant::now();
            for at in (0..target.size).step_by(WRITE_PIECE) {
                let len = WRITE_PIECE.min(target.size - at);
                pattern.fill(key, (raw.base + at) as u64, &mut piece[..len]);
                writer
                    .write(at, &piece[..len])
                    .map_err(|e| window_error(&raw.name, &e))?;
                if at.is_multiple_of(16 << 20) {
                    progress.show(&format!(
                        "validate: raw {} writing {} ({:.0}%)",
                        pattern.name(),
                        raw.name,
                        100.0 * (done + at as u64) as f64 / total as f64
                    ));
                }
            }
            writer.store_fence();
            write_s.push(started.elapsed().as_secs_f64());
            done += target.size as u64;
        }
        for (index, raw) in target.raw.iter().enumerate() {
            let key = raw_key(pattern, args.seed, index);
            let started = Instant::now();
            let mut result = RawResult {
                window: raw.name.clone(),
                pattern,
                base: raw.base,
                len: target.size,
                bucket_len,
                buckets: vec![Bucket::default(); target.size.div_ceil(bucket_len)],
                bad_words: 0,
                bad_bytes: 0,
                flipped_bits: 0,
                first: Vec::new(),
                write_s: write_s[index],
                read_s: 0.0,
            };
            for at in (0..target.size).step_by(READ_PIECE) {
                let len = READ_PIECE.min(target.size - at);
                raw.window
                    .read(at, &mut got[..len])
                    .map_err(|e| window_error(&raw.name, &e))?;
                pattern.fill(key, (raw.base + at) as u64, &mut want[..len]);
                if got[..len] != want[..len] {
                    compare_words(&mut result, at, &got[..len], &want[..len]);
                }
                progress.show(&format!(
                    "validate: raw {} reading {} ({:.0}%)",
                    pattern.name(),
                    raw.name,
                    100.0 * (done + (at + len) as u64) as f64 / total as f64
                ));
            }
            done += target.size as u64;
            result.read_s = started.elapsed().as_secs_f64();
            results.push(result);
        }
    }
    progress.clear();
    Ok(results)
}

/// Counts the words that differ in a piece read at `at` (window offset).
fn compare_words(result: &mut RawResult, at: usize, got: &[u8], want: &[u8]) {
    for (i, (g, w)) in got.chunks(8).zip(want.chunks(8)).enumerate() {
        if g == w {
            continue;
        }
        let offset = at + 8 * i;
        let (found, expected) = (word_of(g), word_of(w));
        let bad_bytes = g.iter().zip(w).filter(|(a, b)| a != b).count() as u64;
        result.bad_words += 1;
        result.bad_bytes += bad_bytes;
        result.flipped_bits += u64::from((found ^ expected).count_ones());
        let bucket = &mut result.buckets[offset / result.bucket_len];
        bucket.bad_words += 1;
        bucket.bad_bytes += bad_bytes;
        if result.first.len() < FIRST_ERRORS {
            result.first.push(BadWord {
                offset: result.base + offset,
                expected,
                found,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_errors_land_in_their_offset_range() {
        let mut result = RawResult {
            window: "A".into(),
            pattern: Pattern::Random,
            base: 0x10_0000,
            len: 4 << 20,
            bucket_len: 1 << 20,
            buckets: vec![Bucket::default(); 4],
            bad_words: 0,
            bad_bytes: 0,
            flipped_bits: 0,
            first: vec![],
            write_s: 0.0,
            read_s: 0.0,
        };
        let want = vec![0u8; 64];
        let mut got = want.clone();
        got[17] = 0x81;
        compare_words(&mut result, (2 << 20) + 64, &got, &want);
        assert_eq!(
            (result.bad_words, result.bad_bytes, result.flipped_bits),
            (1, 1, 2)
        );
        assert_eq!(result.buckets[2].bad_words, 1);
        assert_eq!(result.first[0].offset, 0x10_0000 + (2 << 20) + 64 + 16);
        assert_eq!(result.bucket_range(2), (0x30_0000, 0x3f_ffff));
    }
}
