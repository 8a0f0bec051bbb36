//! CRC-32C by carry-less multiplication on 256-bit vectors (AVX2 +
//! VPCLMULQDQ), for x86-64 CPUs that have VPCLMULQDQ but not AVX-512 (AMD
//! Zen 3, Intel Alder Lake and later client parts): there `crc-fast` takes
//! its 128-bit path, and the CRC — which a link takes of every byte on both
//! sides — runs at about half the speed of the copy it rides on.
//!
//! The method is the folding of Intel's "Fast CRC Computation for Generic
//! Polynomials Using PCLMULQDQ": eight 16-byte lanes (four YMM registers)
//! each advanced by 128 bytes per step, then merged into one lane, which the
//! SSE4.2 `crc32` instruction finishes together with the tail. The folding
//! constants are computed below by `const fn` from the polynomial, not
//! copied from a table.
//!
//! This module holds the crate's only `unsafe` outside `window::mapping`:
//! the intrinsics are `unsafe` to call without the CPU feature, and the
//! loads take raw pointers. Each block says why it is sound. Results are
//! checked against `crc-fast` over every length and alignment in tests.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256i, _mm_clmulepi64_si128, _mm_crc32_u8, _mm_crc32_u64, _mm_cvtsi128_si64,
    _mm_extract_epi64, _mm_loadu_si128, _mm_set_epi64x, _mm_storeu_si128, _mm_xor_si128,
    _mm256_castsi256_si128, _mm256_clmulepi64_epi128, _mm256_extracti128_si256, _mm256_loadu_si256,
    _mm256_set_epi64x, _mm256_storeu_si256, _mm256_xor_si256,
};
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
const fn fold_by(bytes: u32) -> (i64, i64) {
    (fold_constant(8 * bytes + 64), fold_constant(8 * bytes))
}

/// Eight lanes of 16 bytes: one step covers 128 bytes.
const STEP: usize = 128;
const FOLD_128: (i64, i64) = fold_by(STEP as u32);
const FOLD_16: (i64, i64) = fold_by(16);

/// Below this many bytes the vector setup does not pay; the `crc32`
/// instruction alone is used.
pub(super) const MIN_LEN: usize = 2 * STEP;

/// Whether this CPU can run [`update`] (checked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.2")
    })
}

/// Advances the raw CRC register `state` (no inversion) over `bytes`.
/// Only call it when [`available`] says so.
pub(super) fn update(state: u32, bytes: &[u8]) -> u32 {
    assert!(
        available(),
        "crc::x86::update needs AVX2, VPCLMULQDQ and SSE4.2"
    );
    if bytes.len() < MIN_LEN {
        // Packet headers: straight to the instruction, no bounce.
        // SAFETY: the CPU has SSE4.2 (asserted above, from CPUID).
        return unsafe { update_crc32_instruction(state, bytes) };
    }
    // SAFETY: the CPU has every feature `fold` is compiled for (asserted
    // just above, from CPUID); `bytes` is readable for its length, and
    // without a destination nothing is written.
    unsafe { fold(state, bytes.as_ptr(), None, bytes.len()) }
}

/// Copies `len` bytes from `src` to `dst` and advances the raw register
/// over them in the same pass: every 32-byte vector is loaded once, stored,
/// and folded — so the CRC is of exactly the bytes that were stored.
///
/// # Safety
/// [`available`] must be true; `src` must be readable and `dst` writable
/// for `len` bytes, and the two ranges must not overlap.
pub(super) unsafe fn copy_update(state: u32, src: *const u8, dst: *mut u8, len: usize) -> u32 {
    // SAFETY: the caller guarantees the CPU features and both ranges.
    unsafe { fold(state, src, Some(dst), len) }
}

/// The one kernel behind [`update`] and [`copy_update`]: folds the `len`
/// bytes at `src` into the register and, when `dst` is given, stores each
/// vector there right after loading it.
///
/// # Safety
/// The CPU features; `src` readable for `len` bytes; `dst`, if given,
/// writable for `len` bytes and not overlapping `src`.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold(state: u32, src: *const u8, dst: Option<*mut u8>, len: usize) -> u32 {
    // Short inputs and the last < 16 bytes go through a local buffer: its
    // bytes are both what is stored and what the `crc32` instruction reads.
    let finish = |crc: u32, at: usize| -> u32 {
        let rest = len - at;
        let mut bounce = [0u8; MIN_LEN];
        // SAFETY: `rest` (< MIN_LEN) bytes remain at `at` in both ranges
        // (the caller's contract); `bounce` is local.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(at), bounce.as_mut_ptr(), rest);
            if let Some(dst) = dst {
                std::ptr::copy_nonoverlapping(bounce.as_ptr(), dst.add(at), rest);
            }
        }
        update_crc32_instruction(crc, &bounce[..rest])
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
    let mut acc = [load32(0), load32(32), load32(64), load32(96)];
    // The register's state is added into the first four message bytes.
    acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi64x(0, 0, 0, i64::from(state)));
    let k128 = _mm256_set_epi64x(FOLD_128.1, FOLD_128.0, FOLD_128.1, FOLD_128.0);
    for step in 1..steps {
        let base = step * STEP;
        let next = [
            load32(base),
            load32(base + 32),
            load32(base + 64),
            load32(base + 96),
        ];
        for (acc, next) in acc.iter_mut().zip(next) {
            let low = _mm256_clmulepi64_epi128::<0x00>(*acc, k128);
            let high = _mm256_clmulepi64_epi128::<0x11>(*acc, k128);
            *acc = _mm256_xor_si256(_mm256_xor_si256(low, high), next);
        }
    }
    // Merge the eight lanes, oldest first, 16 bytes apart.
    let k16 = _mm_set_epi64x(FOLD_16.1, FOLD_16.0);
    let mut lanes = [_mm_set_epi64x(0, 0); 8];
    for (pair, acc) in acc.iter().enumerate() {
        lanes[2 * pair] = _mm256_castsi256_si128(*acc);
        lanes[2 * pair + 1] = _mm256_extracti128_si256::<1>(*acc);
    }
    let mut folded = lanes[0];
    for &lane in &lanes[1..] {
        folded = fold_lane(folded, k16, lane);
    }
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
    // The folded 16 bytes are congruent to everything so far: their CRC
    // from a zero register is the message's; the rest goes byte-wise.
    let mut crc = _mm_crc32_u64(0, _mm_cvtsi128_si64(folded) as u64);
    crc = _mm_crc32_u64(crc, _mm_extract_epi64::<1>(folded) as u64);
    finish(crc as u32, at)
}

/// One 128-bit lane advanced by `constants` (see [`fold_by`]) and `next`
/// added.
#[inline]
#[target_feature(enable = "pclmulqdq,sse2")]
fn fold_lane(lane: __m128i, constants: __m128i, next: __m128i) -> __m128i {
    let low = _mm_clmulepi64_si128::<0x00>(lane, constants);
    let high = _mm_clmulepi64_si128::<0x11>(lane, constants);
    _mm_xor_si128(_mm_xor_si128(low, high), next)
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
    for &byte in words.remainder() {
        crc = _mm_crc32_u8(crc, byte);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raw register after `bytes`, computed bit by bit.
    fn reference(mut state: u32, bytes: &[u8]) -> u32 {
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
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
            .collect();
        for len in (0..600).chain([1023, 1024, 1025, 4096, 4960]) {
            for (src_off, dst_off) in [(0, 0), (1, 3), (7, 0), (31, 17)] {
                let mut out = vec![0xEEu8; len + 64];
                let state = 0x0BAD_F00D;
                // SAFETY: the ranges are within `data` and `out`, which do
                // not overlap; the CPU has the features (checked above).
                let got = unsafe {
                    copy_update(
                        state,
                        data[src_off..].as_ptr(),
                        out[dst_off..].as_mut_ptr(),
                        len,
                    )
                };
                assert_eq!(
                    &out[dst_off..dst_off + len],
                    &data[src_off..src_off + len],
                    "len {len}"
                );
                assert!(
                    out[..dst_off]
                        .iter()
                        .chain(&out[dst_off + len..])
                        .all(|&b| b == 0xEE),
                    "len {len}: wrote outside"
                );
                assert_eq!(
                    got,
                    reference(state, &data[src_off..src_off + len]),
                    "len {len}"
                );
            }
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
        for len in (0..700).chain([1023, 1024, 1025, 4096, 4960]) {
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
