//! Half-precision reductions in AVX2 registers: the elements widened to
//! `f32` (F16C's conversion for float16; for bfloat16, zeros interleaved
//! below each), combined, and rounded back to nearest even, with the
//! results the scalar path in `super` gives. That path is what the
//! baseline x86-64 target builds: it has no F16C, and its bfloat16 loop
//! did not vectorize either. Chosen at run time, where the CPU has AVX2
//! and F16C.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{Dtype, Op};

const SUM: u8 = 0;
const PRODUCT: u8 = 1;
const MIN: u8 = 2;
const MAX: u8 = 3;

/// Whether the CPU runs these kernels.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// Combines the leading whole steps of `dst` and `src` (equal lengths,
/// 2-byte elements): the bytes done, 0 where the CPU lacks the features
/// or the dtype is not a half-precision one. The caller does the rest.
pub(super) fn combine_half(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) -> usize {
    let code = match op {
        Op::Sum => SUM,
        Op::Product => PRODUCT,
        Op::Min => MIN,
        Op::Max => MAX,
        Op::BitAnd | Op::BitOr | Op::BitXor => return 0,
    };
    if !matches!(dtype, Dtype::F16 | Dtype::Bf16) || !available() {
        return 0;
    }
    let float16 = dtype == Dtype::F16;
    // SAFETY: the CPU has AVX2 and F16C, checked above.
    unsafe {
        match (float16, code) {
            (true, SUM) => float16_steps::<SUM>(dst, src),
            (true, PRODUCT) => float16_steps::<PRODUCT>(dst, src),
            (true, MIN) => float16_steps::<MIN>(dst, src),
            (true, _) => float16_steps::<MAX>(dst, src),
            (false, SUM) => bfloat16_steps::<SUM>(dst, src),
            (false, PRODUCT) => bfloat16_steps::<PRODUCT>(dst, src),
            (false, MIN) => bfloat16_steps::<MIN>(dst, src),
            (false, _) => bfloat16_steps::<MAX>(dst, src),
        }
    }
}

/// Whether the CPU runs [`combine_plain`]'s kernels.
pub(super) fn wide_available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
}

/// Min and max of whole-element dtypes (not half precision) with
/// `super::plain` compiled for AVX-512, where the CPU has it: whether it
/// ran. The same loops, element by element, so the results are bit for
/// bit the baseline's. Only min and max: the baseline's compares and
/// branches for NaN leave its loops narrow, while its sums and products
/// already run as fast as the AVX-512 build of them (faster, on Zen 4).
pub(super) fn combine_plain(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) -> bool {
    if !matches!(op, Op::Min | Op::Max) || !wide_available() {
        return false;
    }
    // SAFETY: the CPU has AVX-512F and AVX-512BW, checked above.
    unsafe { plain_avx512(dst, src, dtype, op) };
    true
}

#[target_feature(enable = "avx512f,avx512bw")]
fn plain_avx512(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) {
    super::plain(dst, src, dtype, op);
}

/// Eight float16 elements (16 bytes) a step, through F16C's conversions.
#[target_feature(enable = "avx2,f16c")]
fn float16_steps<const OP: u8>(dst: &mut [u8], src: &[u8]) -> usize {
    let (dst_steps, _) = dst.as_chunks_mut::<16>();
    let (src_steps, _) = src.as_chunks::<16>();
    let done = dst_steps.len().min(src_steps.len()) * 16;
    for (d, s) in dst_steps.iter_mut().zip(src_steps) {
        // SAFETY: each is a 16-byte array; unaligned loads and stores.
        let (a, b) = unsafe {
            (
                _mm_loadu_si128(d.as_ptr().cast()),
                _mm_loadu_si128(s.as_ptr().cast()),
            )
        };
        let combined = lanes::<OP>(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
        let narrowed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(combined);
        // SAFETY: as above.
        unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), narrowed) };
    }
    done
}

/// Sixteen bfloat16 elements (32 bytes) a step. Interleaving each with
/// zeros makes it the upper half of an `f32`, within each 128-bit half of
/// the register (the low four elements of each half, then the high four),
/// and the saturating pack back works within halves too, so the elements
/// come back in their order with no shuffle across the register.
#[target_feature(enable = "avx2")]
fn bfloat16_steps<const OP: u8>(dst: &mut [u8], src: &[u8]) -> usize {
    let (dst_steps, _) = dst.as_chunks_mut::<32>();
    let (src_steps, _) = src.as_chunks::<32>();
    let done = dst_steps.len().min(src_steps.len()) * 32;
    let zero = _mm256_setzero_si256();
    for (d, s) in dst_steps.iter_mut().zip(src_steps) {
        // SAFETY: each is a 32-byte array; unaligned loads and stores.
        let (a, b) = unsafe {
            (
                _mm256_loadu_si256(d.as_ptr().cast()),
                _mm256_loadu_si256(s.as_ptr().cast()),
            )
        };
        let widen_low = |x| _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
        let widen_high = |x| _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
        let low = bf16_round(lanes::<OP>(widen_low(a), widen_low(b)));
        let high = bf16_round(lanes::<OP>(widen_high(a), widen_high(b)));
        let narrowed = _mm256_packus_epi32(low, high);
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), narrowed) };
    }
    done
}

/// `a op b` in each lane, with NaN winning min and max as in
/// `super::float_min`/`float_max`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes<const OP: u8>(a: __m256, b: __m256) -> __m256 {
    match OP {
        SUM => _mm256_add_ps(a, b),
        PRODUCT => _mm256_mul_ps(a, b),
        _ => {
            let a_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a);
            let b_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b);
            let b_wins = if OP == MIN {
                _mm256_cmp_ps::<_CMP_LT_OQ>(b, a)
            } else {
                _mm256_cmp_ps::<_CMP_GT_OQ>(b, a)
            };
            let take_b = _mm256_or_ps(_mm256_andnot_ps(a_nan, b_nan), b_wins);
            _mm256_blendv_ps(a, b, take_b)
        }
    }
}

/// Eight `f32`s as bfloat16 bits in the low half of each 32-bit lane,
/// rounded to nearest even; a NaN stays a quiet NaN (`super::bf16_bits`,
/// a lane at a time). Every lane ends below 2^16, so a saturating pack
/// of two such registers changes none.
#[inline]
#[target_feature(enable = "avx2")]
fn bf16_round(values: __m256) -> __m256i {
    let bits = _mm256_castps_si256(values);
    let upper = _mm256_srli_epi32::<16>(bits);
    let odd = _mm256_and_si256(upper, _mm256_set1_epi32(1));
    let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias));
    let quiet_nan = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(values, values));
    _mm256_blendv_epi8(rounded, quiet_nan, nan)
}
