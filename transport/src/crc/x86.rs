//! CRC-32C by carry-less multiplication on 256-bit vectors (AVX2 +
//! VPCLMULQDQ), for x86-64 CPUs that have VPCLMULQDQ but not AVX-512: there
//! `crc-fast` takes its 128-bit path, and the CRC — which a link takes of every byte on both
//! sides — runs at about half the speed of the copy it rides on.
//!
//! The method is the folding of Intel's "Fast CRC Computation for Generic
//! Polynomials Using PCLMULQDQ": eight 16-byte lanes (four YMM registers)
//! each advanced by 128 bytes per step, then merged into one lane, which the
//! SSE4.2 `crc32` instruction finishes together with the tail. The folding
//! constants are computed below by `const fn` from the polynomial, not
//! copied from a table.
//!
//! Long inputs also keep the integer units busy. Where the carry-less
//! multiplier retires at most one YMM multiply per cycle however many lanes
//! fold, the `crc32` instruction still retires one 8-byte word per cycle on
//! a different port. So a long input is cut into four
//! regions: the vector lanes fold the first, three `crc32` streams the other
//! three, all in one loop, and the four registers are joined at the end by
//! multiplying each by x^(8·length) modulo the polynomial ([`shift`])
//! (docs/ARCHITECTURE.md, design change 17).
//!
//! This module holds the crate's only `unsafe` outside `window::mapping`:
//! the intrinsics are `unsafe` to call without the CPU feature, and the
//! loads take raw pointers. Each block says why it is sound. Results are
//! checked against `crc-fast` over every length and alignment in tests.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256i, _mm_clmulepi64_si128, _mm_crc32_u8, _mm_crc32_u16, _mm_crc32_u32,
    _mm_crc32_u64, _mm_cvtsi32_si128, _mm_cvtsi128_si64, _mm_extract_epi64, _mm_loadu_si128,
    _mm_set_epi64x, _mm_storeu_si128, _mm_xor_si128, _mm256_castsi256_si128,
    _mm256_clmulepi64_epi128, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_set_epi64x,
    _mm256_storeu_si256, _mm256_xor_si256,
};
use std::ptr;
use std::sync::OnceLock;

/// CRC-32C (Castagnoli), normal form without the x^32 term.
const POLY: u64 = 0x1EDC_6F41;

/// x^n mod P, with bit d the coefficient of x^d.
const fn x_pow_mod(n: u32) -> u64 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= (1 << 32) | POLY;
        }
        i += 1;
    }
    r
}

/// The constant that multiplies a 64-bit half of a bit-reflected 128-bit
/// lane by x^n modulo P under `clmul`: reflected into a 64-bit word, and
/// one degree lower, because the product of two reflected words comes out
/// one bit short of a reflected 128-bit value.
const fn fold_constant(n: u32) -> i64 {
    x_pow_mod(n - 1).reverse_bits() as i64
}

/// Constants to advance a lane by `bytes`: the low half of a reflected
/// lane holds the high-degree coefficients (it moves 64 degrees further).
pub(super) const fn fold_by(bytes: u32) -> (i64, i64) {
    (fold_constant(8 * bytes + 64), fold_constant(8 * bytes))
}

/// Eight lanes of 16 bytes: one step covers 128 bytes.
const STEP: usize = 128;
const FOLD_128: (i64, i64) = fold_by(STEP as u32);
pub(super) const FOLD_16: (i64, i64) = fold_by(16);

/// Below this many bytes the vector setup does not pay; the `crc32`
/// instruction alone is used.
pub(super) const MIN_LEN: usize = 2 * STEP;

/// The hybrid loop's round: 128 bytes folded by the vector lanes and 32
/// bytes by each of the three `crc32` streams: the balance at which the
/// multiplier and the `crc32` unit are both near their one-per-cycle limit
/// (the best of the mixes tried, design change 17).
const VECTOR_ROUND: usize = STEP;
const STREAM_ROUND: usize = 32;
const HYBRID_ROUND: usize = VECTOR_ROUND + 3 * STREAM_ROUND;

/// Below this many rounds the join at the end (three multiplies, one
/// constant of a few multiplies more) does not pay for itself.
const HYBRID_MIN_ROUNDS: usize = 8;

/// Multiplies two bit-reflected 32-bit polynomials `a`, `b` and reduces:
/// `a·b·x^33 mod P`. The carry-less product of two reflected words comes
/// out as a 64-bit reflected value one degree low (a factor x), and the
/// `crc32` instruction over 8 bytes from a zero register multiplies its
/// operand by x^32 and reduces.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.2")]
fn multiply_x33(a: u32, b: u32) -> u32 {
    let product =
        _mm_clmulepi64_si128::<0x00>(_mm_cvtsi32_si128(a as i32), _mm_cvtsi32_si128(b as i32));
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}

/// x^d · y mod P, with bit d the coefficient of x^d (not reflected).
const fn multiply_mod(a: u32, b: u32) -> u32 {
    let mut product: u64 = 0;
    let mut bit = 0;
    while bit < 32 {
        if (b >> bit) & 1 == 1 {
            product ^= (a as u64) << bit;
        }
        bit += 1;
    }
    let mut degree = 63;
    while degree >= 32 {
        if (product >> degree) & 1 == 1 {
            product ^= ((1 << 32) | POLY) << (degree - 32);
        }
        degree -= 1;
    }
    product as u32
}

/// `POWERS[k]` is x^(2^k - 33) mod P, bit-reflected, for k >= 6 (entries
/// below 6 are unused): under [`multiply_x33`] these multiply as
/// x^(m - 33) · x^(n - 33) · x^33 = x^(m + n - 33), so the constant for
/// any multiple of 64 bits is a product of table entries.
const POWERS: [u32; 48] = {
    let mut table = [0u32; 48];
    let x33 = x_pow_mod(33) as u32;
    // x^(2^6 - 33) = x^31.
    let mut power: u32 = 1 << 31;
    let mut k = 6;
    while k < 48 {
        table[k] = power.reverse_bits();
        // x^(2^(k+1) - 33) = (x^(2^k - 33))^2 · x^33.
        power = multiply_mod(multiply_mod(power, power), x33);
        k += 1;
    }
    table
};

/// The constant that [`multiply_x33`] turns into x^(8·bytes):
/// x^(8·bytes - 33) mod P, reflected. `bytes` is a non-zero multiple of 8.
#[target_feature(enable = "pclmulqdq,sse4.2")]
fn shift_constant(bytes: usize) -> u32 {
    debug_assert!(bytes > 0 && bytes.is_multiple_of(8));
    let mut words = (bytes / 8) as u64; // 64-bit units: bit j is 2^(j+6) bits
    let mut k = 6;
    let mut constant: Option<u32> = None;
    while words != 0 {
        if words & 1 == 1 {
            constant = Some(match constant {
                None => POWERS[k],
                Some(c) => multiply_x33(c, POWERS[k]),
            });
        }
        words >>= 1;
        k += 1;
    }
    constant.expect("bytes > 0")
}

/// Short inputs from this many bytes on run as three `crc32` streams side
/// by side: each instruction waits for the one before it in its stream,
/// while the core can start a new one every cycle, so a single stream
/// leaves it mostly idle (a packet header is such an input, on both sides
/// of every message; design change 58).
const THREE_STREAMS_FROM: usize = 48;

/// The most 8-byte words a stream of [`update_three_streams`] takes:
/// its inputs are shorter than [`MIN_LEN`].
const SHORT_STREAM_WORDS: usize = MIN_LEN / 24;

/// The join constants of [`update_three_streams`] for streams of `k`
/// words, at index `k`: what [`shift`] takes to move a register past
/// two streams (`16k` bytes) and past one (`8k` bytes).
const SHORT_JOINS: [(u32, u32); SHORT_STREAM_WORDS + 1] = {
    let mut table = [(0u32, 0u32); SHORT_STREAM_WORDS + 1];
    let mut words = 1;
    while words <= SHORT_STREAM_WORDS {
        table[words] = (shift_constant_of(16 * words), shift_constant_of(8 * words));
        words += 1;
    }
    table
};

/// [`shift_constant`] computed bit by bit, for tables built at compile
/// time.
const fn shift_constant_of(bytes: usize) -> u32 {
    (x_pow_mod(8 * bytes as u32 - 33) as u32).reverse_bits()
}

/// The raw register `crc` advanced over `bytes` zero bytes' worth of
/// position: what a register that was `crc` before a block of `bytes`
/// bytes contributes after it. `constant` is [`shift_constant`]`(bytes)`.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.2")]
fn shift(crc: u32, constant: u32) -> u32 {
    multiply_x33(crc, constant)
}

/// Which copy of the bytes the `crc32` streams read when copying: the
/// vector lanes fold the very register they store, but the streams read
/// memory, and must read memory that cannot change under them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stable {
    /// The source is the caller's own memory (sending: the destination may
    /// be a BAR, which must never be read).
    Source,
    /// The destination is (receiving: the source is shared memory a peer
    /// may still be writing; the checksum must be of what landed).
    Destination,
}

/// Whether this CPU can run [`update`] (checked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        crate::cpu::isa_limit() >= crate::cpu::IsaLimit::Avx2
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.2")
    })
}

/// Whether the CPU has the `crc32` instruction (SSE4.2): what
/// [`update_short`] and [`update_u32`] need, and nothing more; and no
/// `portable` limit ([`crate::cpu::IsaLimit`]) keeps it off. Checked once:
/// after that a load and a test.
#[inline]
pub(super) fn has_crc32_instruction() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        crate::cpu::isa_limit() > crate::cpu::IsaLimit::Portable
            && is_x86_feature_detected!("sse4.2")
    })
}

/// Advances the raw register over a short input (below [`MIN_LEN`]) with
/// the `crc32` instruction: in three streams where the input is long
/// enough and the CPU can join them (PCLMULQDQ), else in one. Only call
/// it when [`has_crc32_instruction`] says so.
#[inline]
pub(super) fn update_short(state: u32, bytes: &[u8]) -> u32 {
    debug_assert!(has_crc32_instruction());
    if (THREE_STREAMS_FROM..MIN_LEN).contains(&bytes.len()) && is_x86_feature_detected!("pclmulqdq")
    {
        // SAFETY: the CPU has SSE4.2 (the caller checked) and PCLMULQDQ
        // (checked just above, from CPUID).
        return unsafe { update_three_streams(state, bytes) };
    }
    // SAFETY: the caller checked that the CPU has SSE4.2 (from CPUID).
    unsafe { update_crc32_instruction(state, bytes) }
}

/// The register over `bytes` (from 24 bytes to below [`MIN_LEN`]) as
/// three streams: the last two of `8k` bytes each from a zero register,
/// the first (the rest, `8k` to `8k + 23` bytes) from `state`, joined by
/// moving each register past the bytes that follow it.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn update_three_streams(state: u32, bytes: &[u8]) -> u32 {
    let words = bytes.len() / 24;
    debug_assert!((1..=SHORT_STREAM_WORDS).contains(&words));
    let stream = 8 * words;
    let (first, rest) = bytes.split_at(bytes.len() - 2 * stream);
    let (second, third) = rest.split_at(stream);
    let word = |part: &[u8], index: usize| {
        u64::from_le_bytes(part[8 * index..8 * index + 8].try_into().expect("8 bytes"))
    };
    let (mut a, mut b, mut c) = (u64::from(state), 0u64, 0u64);
    for index in 0..words {
        a = _mm_crc32_u64(a, word(first, index));
        b = _mm_crc32_u64(b, word(second, index));
        c = _mm_crc32_u64(c, word(third, index));
    }
    let a = update_crc32_instruction(a as u32, &first[stream..]);
    let (past_two, past_one) = SHORT_JOINS[words];
    shift(a, past_two) ^ shift(b as u32, past_one) ^ c as u32
}

/// Advances the raw register over `value`'s four little-endian bytes.
/// Only call it when [`has_crc32_instruction`] says so.
#[inline]
pub(super) fn update_u32(state: u32, value: u32) -> u32 {
    debug_assert!(has_crc32_instruction());
    // SAFETY: the caller checked that the CPU has SSE4.2 (from CPUID).
    unsafe { crc32_u32_instruction(state, value) }
}

/// Advances the raw CRC register `state` (no inversion) over `bytes`.
/// Only call it when [`available`] says so.
pub(super) fn update(state: u32, bytes: &[u8]) -> u32 {
    assert!(
        available(),
        "crc::x86::update needs AVX2, VPCLMULQDQ and SSE4.2"
    );
    if bytes.len() < MIN_LEN {
        // Below the vector setup's break-even (the dispatch in `crc` sends
        // these to `update_short` before asking here).
        return update_short(state, bytes);
    }
    // SAFETY: the CPU has every feature `fold` is compiled for (asserted
    // just above, from CPUID); `bytes` is readable for its length, and
    // without a destination nothing is written.
    unsafe { fold(state, bytes.as_ptr(), None, bytes.len(), Stable::Source) }
}

/// Copies `len` bytes from `src` to `dst` and advances the raw register
/// over them in the same pass. The checksum is of the bytes as they are in
/// the `stable` copy: with [`Stable::Destination`], exactly the bytes that
/// were stored, even if `src` changes meanwhile.
///
/// # Safety
/// [`available`] must be true; `src` must be readable and `dst` writable
/// for `len` bytes, and the two ranges must not overlap. With
/// [`Stable::Destination`], `dst` must also be readable (ordinary memory);
/// with [`Stable::Source`], `src` must not change during the call.
pub(super) unsafe fn copy_update(
    state: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
    stable: Stable,
) -> u32 {
    // SAFETY: the caller guarantees the CPU features and both ranges.
    unsafe { fold(state, src, Some(dst), len, stable) }
}

/// The kernel behind [`update`] and [`copy_update`]: long inputs go through
/// [`fold_hybrid`], the rest through [`fold_vector`].
///
/// # Safety
/// As [`copy_update`] (without `dst`: `src` readable for `len` bytes).
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold(
    state: u32,
    src: *const u8,
    dst: Option<*mut u8>,
    len: usize,
    stable: Stable,
) -> u32 {
    let rounds = len / HYBRID_ROUND;
    if rounds < HYBRID_MIN_ROUNDS {
        // SAFETY: the caller's contract, passed on.
        return unsafe { fold_vector(state, src, dst, len) };
    }
    // One copy of the loop per mode, so that none of them tests the mode
    // inside it. SAFETY: the caller's contract, passed on; a null `dst` is
    // never used without COPY.
    unsafe {
        match (dst, stable) {
            (None, _) => fold_hybrid::<false, false>(state, src, ptr::null_mut(), len, rounds),
            (Some(dst), Stable::Source) => fold_hybrid::<true, false>(state, src, dst, len, rounds),
            (Some(dst), Stable::Destination) => {
                fold_hybrid::<true, true>(state, src, dst, len, rounds)
            }
        }
    }
}

/// The vector lanes and three `crc32` streams over four consecutive
/// regions (`rounds` rounds of [`HYBRID_ROUND`] bytes), then the tail.
/// With `COPY`, every byte is also stored to `dst`; with `FROM_DST`, the
/// streams checksum the stored bytes ([`Stable::Destination`]).
///
/// # Safety
/// As [`copy_update`] (`dst` is ignored without `COPY`);
/// `rounds * HYBRID_ROUND <= len`, `rounds >= 1`.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold_hybrid<const COPY: bool, const FROM_DST: bool>(
    state: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
    rounds: usize,
) -> u32 {
    let vector_len = rounds * VECTOR_ROUND;
    let stream_len = rounds * STREAM_ROUND;
    let load32 = |at: usize| -> __m256i {
        // SAFETY: callers pass `at + 32 <= vector_len <= len`: in range for
        // both pointers (the caller's contract); unaligned accesses.
        unsafe {
            let v = _mm256_loadu_si256(src.add(at).cast());
            if COPY {
                _mm256_storeu_si256(dst.add(at).cast(), v);
            }
            v
        }
    };
    // Stream `s` (0..3) covers `vector_len + s * stream_len ..` for
    // `stream_len` bytes; `block` copies and checksums its 32 bytes at
    // `at` (relative to the stream) into `crc`.
    let stream_start = |s: usize| vector_len + s * stream_len;
    let block = |crc: u64, start: usize, at: usize| -> u64 {
        let at = start + at;
        // SAFETY: `at + 32 <= vector_len + 3 * stream_len <= len` (the
        // loop below never passes `stream_len`): in range for both
        // pointers. What the words are read from: the destination just
        // written (ordinary memory, by the contract of
        // `Stable::Destination`), or the source, which does not change.
        unsafe {
            if COPY {
                let v = _mm256_loadu_si256(src.add(at).cast());
                _mm256_storeu_si256(dst.add(at).cast(), v);
            }
            let words = if FROM_DST {
                dst.add(at).cast_const()
            } else {
                src.add(at)
            };
            let mut crc = crc;
            for word in 0..4 {
                crc = _mm_crc32_u64(crc, words.add(8 * word).cast::<u64>().read_unaligned());
            }
            crc
        }
    };
    let mut lanes = [load32(0), load32(32), load32(64), load32(96)];
    lanes[0] = _mm256_xor_si256(lanes[0], _mm256_set_epi64x(0, 0, 0, i64::from(state)));
    let k128 = _mm256_set_epi64x(FOLD_128.1, FOLD_128.0, FOLD_128.1, FOLD_128.0);
    let starts = [stream_start(0), stream_start(1), stream_start(2)];
    let mut streams = [0u64; 3];
    for round in 0..rounds {
        if round > 0 {
            let base = round * VECTOR_ROUND;
            let next = [
                load32(base),
                load32(base + 32),
                load32(base + 64),
                load32(base + 96),
            ];
            lanes = advance_lanes(lanes, k128, next);
        }
        let at = round * STREAM_ROUND;
        for (crc, &start) in streams.iter_mut().zip(&starts) {
            *crc = block(*crc, start, at);
        }
    }
    // Each stream started from a zero register over its own region; the
    // register before a region, shifted over it, plus the region's own
    // register, is the register after it.
    let constant = shift_constant(stream_len);
    let mut crc = merge_lanes(lanes);
    for stream in streams {
        crc = shift(crc, constant) ^ stream as u32;
    }
    let done = vector_len + 3 * stream_len;
    let rest_dst = COPY.then(|| {
        // SAFETY: `done <= len`: still inside (or at the end of) `dst`.
        unsafe { dst.add(done) }
    });
    // SAFETY: the rest of both ranges, from `done <= len`.
    unsafe { fold_vector(crc, src.add(done), rest_dst, len - done) }
}

/// The four YMM lanes advanced by one 128-byte step, `next` added.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn advance_lanes(lanes: [__m256i; 4], k128: __m256i, next: [__m256i; 4]) -> [__m256i; 4] {
    let mut lanes = lanes;
    for (lane, next) in lanes.iter_mut().zip(next) {
        let low = _mm256_clmulepi64_epi128::<0x00>(*lane, k128);
        let high = _mm256_clmulepi64_epi128::<0x11>(*lane, k128);
        *lane = _mm256_xor_si256(_mm256_xor_si256(low, high), next);
    }
    lanes
}

/// The eight 16-byte lanes folded into one, oldest first, 16 bytes apart.
#[inline]
#[target_feature(enable = "avx2,pclmulqdq")]
fn merge_to_one_lane(lanes: [__m256i; 4]) -> __m128i {
    let k16 = _mm_set_epi64x(FOLD_16.1, FOLD_16.0);
    let mut halves = [_mm_set_epi64x(0, 0); 8];
    for (pair, lane) in lanes.iter().enumerate() {
        halves[2 * pair] = _mm256_castsi256_si128(*lane);
        halves[2 * pair + 1] = _mm256_extracti128_si256::<1>(*lane);
    }
    let mut folded = halves[0];
    for &half in &halves[1..] {
        folded = fold_lane(folded, k16, half);
    }
    folded
}

/// The raw register after everything the lanes hold: the folded 16 bytes
/// are congruent to it, and their CRC from a zero register is the answer.
#[inline]
#[target_feature(enable = "avx2,pclmulqdq,sse4.2")]
fn merge_lanes(lanes: [__m256i; 4]) -> u32 {
    finish_lane(merge_to_one_lane(lanes))
}

#[inline]
#[target_feature(enable = "sse4.2")]
pub(super) fn finish_lane(folded: __m128i) -> u32 {
    let crc = _mm_crc32_u64(0, _mm_cvtsi128_si64(folded) as u64);
    _mm_crc32_u64(crc, _mm_extract_epi64::<1>(folded) as u64) as u32
}

/// The vector lanes alone: folds the `len` bytes at `src` into the
/// register and, when `dst` is given, stores each vector there right after
/// loading it (so the CRC is of exactly the bytes stored).
///
/// # Safety
/// The CPU features; `src` readable for `len` bytes; `dst`, if given,
/// writable for `len` bytes and not overlapping `src`.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub(super) unsafe fn fold_vector(
    state: u32,
    src: *const u8,
    dst: Option<*mut u8>,
    len: usize,
) -> u32 {
    // Short inputs and the last < 16 bytes: word by word, each word loaded
    // once, stored, and fed to the `crc32` instruction, so that what is
    // stored and what is checksummed are the same bytes.
    let finish = |crc: u32, mut at: usize| -> u32 {
        let mut crc = u64::from(crc);
        while at + 8 <= len {
            // SAFETY: `at + 8 <= len`: in both ranges (the caller's
            // contract); unaligned accesses.
            let word = unsafe { src.add(at).cast::<u64>().read_unaligned() };
            if let Some(dst) = dst {
                // SAFETY: as above.
                unsafe { dst.add(at).cast::<u64>().write_unaligned(word) };
            }
            crc = _mm_crc32_u64(crc, word);
            at += 8;
        }
        let mut crc = crc as u32;
        while at < len {
            // SAFETY: `at < len`: in both ranges.
            let byte = unsafe { src.add(at).read() };
            if let Some(dst) = dst {
                // SAFETY: as above.
                unsafe { dst.add(at).write(byte) };
            }
            crc = _mm_crc32_u8(crc, byte);
            at += 1;
        }
        crc
    };
    if len < MIN_LEN {
        return finish(state, 0);
    }
    // 32 bytes at `at`, stored to `dst` too when copying.
    let load32 = |at: usize| -> __m256i {
        // SAFETY: callers pass `at + 32 <= len`, so both accesses are in
        // the ranges the caller vouched for; unaligned.
        unsafe {
            let v = _mm256_loadu_si256(src.add(at).cast());
            if let Some(dst) = dst {
                _mm256_storeu_si256(dst.add(at).cast(), v);
            }
            v
        }
    };
    let steps = len / STEP;
    let mut lanes = [load32(0), load32(32), load32(64), load32(96)];
    // The register's state is added into the first four message bytes.
    lanes[0] = _mm256_xor_si256(lanes[0], _mm256_set_epi64x(0, 0, 0, i64::from(state)));
    let k128 = _mm256_set_epi64x(FOLD_128.1, FOLD_128.0, FOLD_128.1, FOLD_128.0);
    for step in 1..steps {
        let base = step * STEP;
        let next = [
            load32(base),
            load32(base + 32),
            load32(base + 64),
            load32(base + 96),
        ];
        lanes = advance_lanes(lanes, k128, next);
    }
    let k16 = _mm_set_epi64x(FOLD_16.1, FOLD_16.0);
    let mut folded = merge_to_one_lane(lanes);
    // Whole 16-byte blocks of the tail fold in the same way.
    let mut at = steps * STEP;
    while at + 16 <= len {
        // SAFETY: `at + 16 <= len`: both accesses are in range; unaligned.
        let next = unsafe {
            let v = _mm_loadu_si128(src.add(at).cast());
            if let Some(dst) = dst {
                _mm_storeu_si128(dst.add(at).cast(), v);
            }
            v
        };
        folded = fold_lane(folded, k16, next);
        at += 16;
    }
    // The rest goes byte-wise.
    finish(finish_lane(folded), at)
}

/// One 128-bit lane advanced by `constants` (see [`fold_by`]) and `next`
/// added.
#[inline]
#[target_feature(enable = "pclmulqdq,sse2")]
pub(super) fn fold_lane(lane: __m128i, constants: __m128i, next: __m128i) -> __m128i {
    let low = _mm_clmulepi64_si128::<0x00>(lane, constants);
    let high = _mm_clmulepi64_si128::<0x11>(lane, constants);
    _mm_xor_si128(_mm_xor_si128(low, high), next)
}

/// The `crc32` instruction over four bytes.
#[target_feature(enable = "sse4.2")]
fn crc32_u32_instruction(state: u32, value: u32) -> u32 {
    _mm_crc32_u32(state, value)
}

/// The `crc32` instruction, eight bytes at a time.
#[target_feature(enable = "sse4.2")]
fn update_crc32_instruction(state: u32, bytes: &[u8]) -> u32 {
    let mut crc = u64::from(state);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(word.try_into().expect("8 bytes")));
    }
    let mut crc = crc as u32;
    // The last 0-7 bytes in at most three steps, not seven.
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        crc = _mm_crc32_u32(
            crc,
            u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")),
        );
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        crc = _mm_crc32_u16(
            crc,
            u16::from_le_bytes(rest[..2].try_into().expect("2 bytes")),
        );
        rest = &rest[2..];
    }
    if let Some(&byte) = rest.first() {
        crc = _mm_crc32_u8(crc, byte);
    }
    crc
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The raw register after `bytes`, computed bit by bit.
    pub(in crate::crc) fn reference(mut state: u32, bytes: &[u8]) -> u32 {
        for &byte in bytes {
            state ^= u32::from(byte);
            for _ in 0..8 {
                state = if state & 1 != 0 {
                    (state >> 1) ^ 0x82F6_3B78
                } else {
                    state >> 1
                };
            }
        }
        state
    }

    #[test]
    fn the_fused_copy_copies_exactly_and_takes_the_same_crc() {
        if !available() {
            eprintln!("SKIPPED crc::x86: this CPU lacks AVX2/VPCLMULQDQ/SSE4.2");
            return;
        }
        let data: Vec<u8> = (0..8000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
            .collect();
        let hybrid_edges = (1..4).flat_map(|rounds| {
            let at = rounds * HYBRID_MIN_ROUNDS * HYBRID_ROUND;
            [at - 1, at, at + 1, at + HYBRID_ROUND - 1, at + 200]
        });
        let lengths = (0..600).chain([1023, 1024, 1025, 4096]).chain(hybrid_edges);
        for (len, stable) in lengths
            .flat_map(|len| [Stable::Source, Stable::Destination].map(|stable| (len, stable)))
        {
            // SAFETY: `check_fused_copy` passes ranges within its own
            // `data` and `out`, which do not overlap and are ordinary
            // memory; the CPU has the features (checked above).
            check_fused_copy(&data, len, |state, src, dst, len| unsafe {
                copy_update(state, src, dst, len, stable)
            });
        }
    }

    /// Copies `len` bytes of `data` through `copy` at four source and
    /// destination alignments, and checks the bytes copied, that nothing
    /// around them was written, and the CRC against [`reference`].
    pub(in crate::crc) fn check_fused_copy(
        data: &[u8],
        len: usize,
        copy: impl Fn(u32, *const u8, *mut u8, usize) -> u32,
    ) {
        for (src_off, dst_off) in [(0, 0), (1, 3), (7, 0), (31, 17)] {
            let mut out = vec![0xEEu8; len + 64];
            let state = 0x0BAD_F00D;
            let got = copy(
                state,
                data[src_off..].as_ptr(),
                out[dst_off..].as_mut_ptr(),
                len,
            );
            let piece = &data[src_off..src_off + len];
            assert_eq!(&out[dst_off..dst_off + len], piece, "len {len}");
            assert!(
                out[..dst_off]
                    .iter()
                    .chain(&out[dst_off + len..])
                    .all(|&b| b == 0xEE),
                "len {len}: wrote outside"
            );
            assert_eq!(got, reference(state, piece), "len {len}");
        }
    }

    #[test]
    fn short_inputs_match_the_bitwise_definition_in_one_stream_and_in_three() {
        if !has_crc32_instruction() || !is_x86_feature_detected!("pclmulqdq") {
            println!(
                "SKIPPED short_inputs_match_the_bitwise_definition_in_one_stream_and_in_three: \
                 this CPU lacks SSE4.2 or PCLMULQDQ"
            );
            return;
        }
        let data: Vec<u8> = (0..MIN_LEN as u32 + 8)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in 0..MIN_LEN {
            for offset in [0, 1, 3, 7] {
                let piece = &data[offset..offset + len];
                for state in [0, !0, 0x1234_5678] {
                    let expected = reference(state, piece);
                    let label = format!("len {len} offset {offset} state {state:#x}");
                    assert_eq!(update_short(state, piece), expected, "{label}");
                    // SAFETY: the CPU has SSE4.2 and PCLMULQDQ (checked
                    // above).
                    let one_stream = unsafe { update_crc32_instruction(state, piece) };
                    assert_eq!(one_stream, expected, "one stream, {label}");
                    if len >= 24 {
                        // SAFETY: as above.
                        let three_streams = unsafe { update_three_streams(state, piece) };
                        assert_eq!(three_streams, expected, "three streams, {label}");
                    }
                }
            }
        }
        for (words, &(past_two, past_one)) in SHORT_JOINS.iter().enumerate().skip(1) {
            // SAFETY: as above.
            unsafe {
                assert_eq!(past_two, shift_constant(16 * words), "{words} words");
                assert_eq!(past_one, shift_constant(8 * words), "{words} words");
            }
        }
    }

    #[test]
    fn shift_constants_match_powers_of_x_computed_bit_by_bit() {
        if !available() {
            eprintln!("SKIPPED crc::x86: this CPU lacks AVX2/VPCLMULQDQ/SSE4.2");
            return;
        }
        for bytes in [8usize, 16, 24, 64, 96, 256, 1000, 4096, 8192, 65_504] {
            let expected = (x_pow_mod(8 * bytes as u32 - 33) as u32).reverse_bits();
            // SAFETY: the CPU has PCLMULQDQ and SSE4.2 (checked above).
            assert_eq!(unsafe { shift_constant(bytes) }, expected, "{bytes} bytes");
        }
    }

    #[test]
    fn matches_the_bitwise_definition_for_every_length_and_offset() {
        if !available() {
            eprintln!("SKIPPED crc::x86: this CPU lacks AVX2/VPCLMULQDQ/SSE4.2");
            return;
        }
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..700).chain([1023, 1024, 1025, 1791, 1792, 1793, 4096, 4960]) {
            for offset in [0, 1, 7, 31] {
                let piece = &data[offset..offset + len];
                for state in [0, !0, 0x1234_5678] {
                    assert_eq!(
                        update(state, piece),
                        reference(state, piece),
                        "len {len} offset {offset} state {state:#x}"
                    );
                }
            }
        }
    }
}
