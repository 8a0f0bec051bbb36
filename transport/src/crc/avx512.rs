//! CRC-32C folded with 512-bit carry-less multiplies (AVX-512 VPCLMULQDQ),
//! fused with the copy: each 64-byte vector is loaded once, stored, and
//! folded, so a payload crosses the core once whatever the mode.
//!
//! `REGISTERS` ZMM registers of four 16-byte lanes each advance `STEP`
//! bytes a step (two multiplies and one three-way XOR per register); at the end
//! they fold into one register, its four lanes into one, and the `crc32`
//! instruction finishes the lane and the last few bytes, as in [`super::x86`],
//! whose constants and tail this module shares. Where the multiplier is
//! this wide it outruns the copy, so no `crc32` streams run beside it.
//!
//! Because every folded vector is the very register that was stored, the
//! checksum is of the bytes that landed in both modes (sending and
//! receiving): a source that changes during the copy cannot make the CRC
//! describe bytes that were not stored.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m512i, _mm_set_epi64x, _mm_sfence, _mm512_castsi512_si128, _mm512_clmulepi64_epi128,
    _mm512_extracti32x4_epi32, _mm512_loadu_si512, _mm512_set_epi64, _mm512_storeu_si512,
    _mm512_stream_si512, _mm512_ternarylogic_epi64, _mm512_xor_si512,
};
use std::sync::OnceLock;

use super::x86;

/// Registers folded side by side: enough independent chains to cover the
/// multiplier's latency.
const REGISTERS: usize = 8;
/// One step covers `REGISTERS` vectors of 64 bytes.
const STEP: usize = 64 * REGISTERS;
/// Below this the AVX2 kernel (and, below its own minimum, the `crc32`
/// instruction) is as fast and has less to set up.
pub(super) const MIN_LEN: usize = STEP;

const FOLD_STEP: (i64, i64) = x86::fold_by(STEP as u32);
const FOLD_64: (i64, i64) = x86::fold_by(64);

/// How far ahead of the stores the destination's lines are taken for
/// writing: two steps' worth (design change 57).
const WRITE_AHEAD: usize = 2 * STEP;

/// Whether this CPU can run [`copy_update`] and [`update`] (checked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        crate::cpu::isa_limit() >= crate::cpu::IsaLimit::Avx512
            && x86::available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
    })
}

/// Advances the raw CRC register `state` (no inversion) over `bytes`.
/// Only call it when [`available`] says so.
pub(super) fn update(state: u32, bytes: &[u8]) -> u32 {
    assert!(
        available(),
        "crc::avx512::update needs AVX-512F/VL, VPCLMULQDQ and SSE4.2"
    );
    // SAFETY: the CPU has every feature `fold` is compiled for (asserted
    // just above, from CPUID); `bytes` is readable for its length, and
    // without a destination nothing is written.
    unsafe { fold::<false>(state, bytes.as_ptr(), None, bytes.len()) }
}

/// Copies `len` bytes from `src` to `dst` and advances the raw register
/// over them in the same pass: over exactly the bytes stored.
///
/// # Safety
/// [`available`] must be true; `src` must be readable and `dst` writable
/// for `len` bytes, and the two ranges must not overlap.
pub(super) unsafe fn copy_update(state: u32, src: *const u8, dst: *mut u8, len: usize) -> u32 {
    // SAFETY: the caller guarantees the CPU features and both ranges.
    unsafe { fold::<false>(state, src, Some(dst), len) }
}

/// [`copy_update`] with the destination's 64-byte lines written by
/// non-temporal stores, around the cache: for a destination the caller
/// will not read soon, whose lines would otherwise first be read from
/// memory only to be overwritten. The bytes before the first 64-byte
/// boundary of `dst`, and a remainder too short for the 512-bit loop or
/// past its last whole line, are stored as usual.
/// Ends with a store fence, so the bytes are ordered before any later
/// store, as an ordinary copy's are.
///
/// # Safety
/// As [`copy_update`].
pub(super) unsafe fn copy_update_streaming(
    state: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> u32 {
    let head = dst.align_offset(64).min(len);
    // SAFETY: the caller guarantees the CPU features and both ranges;
    // `head <= len` splits them in two.
    unsafe {
        let state = fold::<false>(state, src, Some(dst), head);
        let state = fold::<true>(state, src.add(head), Some(dst.add(head)), len - head);
        _mm_sfence();
        state
    }
}

/// The kernel: `STEP`-byte steps, then 64-byte steps, then the AVX2 kernel's
/// tail for the last bytes.
///
/// # Safety
/// As [`copy_update`] (without `dst`: `src` readable for `len` bytes).
/// With `STREAM`, whole 64-byte lines go to `dst` by non-temporal
/// stores, which need `dst` 64-byte aligned.
#[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,avx2,pclmulqdq,sse4.2")]
unsafe fn fold<const STREAM: bool>(
    state: u32,
    src: *const u8,
    dst: Option<*mut u8>,
    len: usize,
) -> u32 {
    if len < MIN_LEN {
        // SAFETY: the caller's contract, passed on.
        return unsafe { x86::fold_vector(state, src, dst, len) };
    }
    // 64 bytes at `at`, stored to `dst` too when copying: the stored and
    // the folded value are the same register.
    let load64 = |at: usize| -> __m512i {
        // SAFETY: callers pass `at + 64 <= len`, so both accesses are in
        // the ranges the caller vouched for; unaligned.
        unsafe {
            let v = _mm512_loadu_si512(src.add(at).cast());
            if let Some(dst) = dst {
                if STREAM {
                    _mm512_stream_si512(dst.add(at).cast(), v);
                } else {
                    _mm512_storeu_si512(dst.add(at).cast(), v);
                }
            }
            v
        }
    };
    let mut lanes: [__m512i; REGISTERS] = std::array::from_fn(|index| load64(64 * index));
    // The register's state is added into the first four message bytes.
    lanes[0] = _mm512_xor_si512(
        lanes[0],
        _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, state.into()),
    );
    let k_step = broadcast(FOLD_STEP);
    let steps = len / STEP;
    // Ordinary stores into lines another core holds (a peer's ring slot,
    // which its reader read last) wait for each line in turn; asked for
    // ahead, the lines come in parallel where the CPU gains by it.
    // Non-temporal stores need no line.
    let write_ahead = match dst {
        Some(dst) if !STREAM && crate::cpu::writes_ahead() => Some(dst),
        _ => None,
    };
    for step in 1..steps {
        let base = step * STEP;
        if let Some(dst) = write_ahead
            && base + WRITE_AHEAD + STEP <= len
        {
            for line in 0..REGISTERS {
                // SAFETY: `base + WRITE_AHEAD + STEP <= len`: the address
                // is inside the destination range the caller vouched for;
                // the CPU has `prefetchw` (checked above).
                unsafe {
                    crate::window::mapping::prefetch_line_for_write(
                        dst.add(base + WRITE_AHEAD + 64 * line).cast_const(),
                    );
                }
            }
        }
        for (index, lane) in lanes.iter_mut().enumerate() {
            *lane = fold_register(*lane, k_step, load64(base + 64 * index));
        }
    }
    // The registers into one, oldest first, 64 bytes apart; then
    // whole 64-byte blocks of the tail the same way.
    let k64 = broadcast(FOLD_64);
    let mut folded = lanes[0];
    for &lane in &lanes[1..] {
        folded = fold_register(folded, k64, lane);
    }
    let mut at = steps * STEP;
    while at + 64 <= len {
        folded = fold_register(folded, k64, load64(at));
        at += 64;
    }
    let crc = x86::finish_lane(merge_to_one_lane(folded));
    // SAFETY: the rest of both ranges, from `at <= len`.
    unsafe {
        let rest_dst = dst.map(|dst| dst.add(at));
        x86::fold_vector(crc, src.add(at), rest_dst, len - at)
    }
}

/// A fold constant pair in each of a register's four lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn broadcast(constants: (i64, i64)) -> __m512i {
    let (low, high) = constants;
    _mm512_set_epi64(high, low, high, low, high, low, high, low)
}

/// Each lane of `lanes` advanced by the distance `constants` encode, and
/// `next` added.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold_register(lanes: __m512i, constants: __m512i, next: __m512i) -> __m512i {
    let low = _mm512_clmulepi64_epi128::<0x00>(lanes, constants);
    let high = _mm512_clmulepi64_epi128::<0x11>(lanes, constants);
    // 0x96: a ^ b ^ c.
    _mm512_ternarylogic_epi64::<0x96>(low, high, next)
}

/// The register's four 16-byte lanes folded into one, oldest first.
#[inline]
#[target_feature(enable = "avx512f,pclmulqdq")]
fn merge_to_one_lane(lanes: __m512i) -> __m128i {
    let k16 = _mm_set_epi64x(x86::FOLD_16.1, x86::FOLD_16.0);
    let parts = [
        _mm512_castsi512_si128(lanes),
        _mm512_extracti32x4_epi32::<1>(lanes),
        _mm512_extracti32x4_epi32::<2>(lanes),
        _mm512_extracti32x4_epi32::<3>(lanes),
    ];
    let mut folded = parts[0];
    for &part in &parts[1..] {
        folded = x86::fold_lane(folded, k16, part);
    }
    folded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip_without_avx512(test: &str) -> bool {
        if available() {
            return false;
        }
        eprintln!("SKIPPED crc::avx512::{test}: this CPU lacks AVX-512F/VL or VPCLMULQDQ");
        true
    }

    fn data(len: usize, shift: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> shift) as u8)
            .collect()
    }

    /// Every length to 700, every step and block boundary of the 512-bit
    /// loop, and some long ones.
    fn lengths() -> impl Iterator<Item = usize> {
        let edges = [MIN_LEN, MIN_LEN + 64, 3 * STEP, 4 * STEP, 16 * STEP]
            .into_iter()
            .flat_map(|at| [at - 64, at - 1, at, at + 1, at + 63, at + 64, at + 65]);
        (0..700).chain(edges).chain([4096, 65_456, 65_536])
    }

    #[test]
    fn the_fused_copy_copies_exactly_and_takes_the_crc_of_what_landed() {
        if skip_without_avx512("the_fused_copy_copies_exactly_and_takes_the_crc_of_what_landed") {
            return;
        }
        let data = data(70_000, 9);
        for len in lengths() {
            // SAFETY: `check_fused_copy` passes ranges within its own
            // `data` and `out`, which do not overlap; the CPU has the
            // features (checked above).
            x86::tests::check_fused_copy(&data, len, |state, src, dst, len| unsafe {
                copy_update(state, src, dst, len)
            });
        }
    }

    #[test]
    fn the_streaming_copy_copies_exactly_at_every_destination_alignment() {
        if skip_without_avx512("the_streaming_copy_copies_exactly_at_every_destination_alignment") {
            return;
        }
        let data = data(70_000, 11);
        let mut out = vec![0xEEu8; 70_000 + 256];
        // Offsets from a 64-byte boundary: every head length the kernel
        // stores before its non-temporal lines.
        let aligned = out.as_ptr().align_offset(64);
        for dst_off in 0..64 {
            let lens: Vec<usize> = if dst_off % 16 == 0 || dst_off == 63 {
                lengths().collect()
            } else {
                vec![0, 1, 63, 64, 65, 255, 256, 257, 1000, 4096, 65_536]
            };
            for len in lens {
                for src_off in [0, 5] {
                    out.fill(0xEE);
                    let at = aligned + dst_off;
                    let piece = &data[src_off..src_off + len];
                    // SAFETY: `piece` and `out[at..at + len]` are live,
                    // disjoint ranges; the CPU has the features (checked
                    // above).
                    let got = unsafe {
                        copy_update_streaming(
                            0x0BAD_F00D,
                            piece.as_ptr(),
                            out.as_mut_ptr().add(at),
                            len,
                        )
                    };
                    let label = format!("len {len} dst_off {dst_off} src_off {src_off}");
                    assert_eq!(&out[at..at + len], piece, "{label}");
                    assert!(
                        out[..at].iter().chain(&out[at + len..]).all(|&b| b == 0xEE),
                        "{label}: wrote outside"
                    );
                    assert_eq!(got, x86::tests::reference(0x0BAD_F00D, piece), "{label}");
                }
            }
        }
    }

    #[test]
    fn matches_the_bitwise_definition_for_every_length_and_offset() {
        if skip_without_avx512("matches_the_bitwise_definition_for_every_length_and_offset") {
            return;
        }
        let data = data(70_000, 13);
        for len in lengths() {
            for offset in [0, 1, 7, 31] {
                let piece = &data[offset..offset + len];
                for state in [0, !0, 0x1234_5678] {
                    assert_eq!(
                        update(state, piece),
                        x86::tests::reference(state, piece),
                        "len {len} offset {offset} state {state:#x}"
                    );
                }
            }
        }
    }
}
