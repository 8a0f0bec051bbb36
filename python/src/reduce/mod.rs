//! Element-wise reductions for collectives: `dst = dst op src` over two
//! equal byte ranges holding elements of one dtype, in native byte order.
//!
//! The loops read and write whole elements through `from_ne_bytes` and
//! `to_ne_bytes`, so neither range needs to be aligned and they need no
//! `unsafe`; the compiler vectorizes them, for the baseline target and,
//! for min and max, once more for AVX-512 (`x86`), chosen at run time
//! where the CPU has it. Half-precision types are widened
//! to `f32`, combined, and rounded back to nearest even, as torch does for
//! its CPU reductions: in AVX2 registers where the CPU has them (`x86`),
//! else a block at a time here.

use std::fmt;

use half::f16;
use half::slice::HalfFloatSliceExt;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Element types a collective reduces (torch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    I8,
    I16,
    I32,
    I64,
    U8,
    Bool,
}

/// How two elements combine. `AVG` is `Sum` followed by a division that
/// the caller does once, at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Product,
    Min,
    Max,
    BitAnd,
    BitOr,
    BitXor,
}

impl Dtype {
    pub fn parse(name: &str) -> Option<Dtype> {
        Some(match name {
            "float32" => Dtype::F32,
            "float64" => Dtype::F64,
            "float16" => Dtype::F16,
            "bfloat16" => Dtype::Bf16,
            "int8" => Dtype::I8,
            "int16" => Dtype::I16,
            "int32" => Dtype::I32,
            "int64" => Dtype::I64,
            "uint8" => Dtype::U8,
            "bool" => Dtype::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::Bool => 1,
            Dtype::F16 | Dtype::Bf16 | Dtype::I16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::Bf16)
    }
}

impl Op {
    pub fn parse(name: &str) -> Option<Op> {
        Some(match name {
            "sum" => Op::Sum,
            "product" => Op::Product,
            "min" => Op::Min,
            "max" => Op::Max,
            "band" => Op::BitAnd,
            "bor" => Op::BitOr,
            "bxor" => Op::BitXor,
            _ => return None,
        })
    }

    fn is_bitwise(self) -> bool {
        matches!(self, Op::BitAnd | Op::BitOr | Op::BitXor)
    }
}

/// Why a reduction was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ReduceError {
    /// The ranges differ in length, or are not whole elements.
    Lengths { dst: usize, src: usize, size: usize },
    /// A bitwise op on a floating-point dtype.
    Unsupported { op: Op, dtype: Dtype },
}

impl fmt::Display for ReduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceError::Lengths { dst, src, size } => write!(
                f,
                "cannot combine {src} bytes into {dst}: both must be the same whole number \
                 of {size}-byte elements"
            ),
            ReduceError::Unsupported { op, dtype } => {
                write!(f, "{op:?} is not defined for {dtype:?} elements")
            }
        }
    }
}

/// Integers wrap on overflow, as torch's do.
macro_rules! int {
    ($dst:expr, $src:expr, $op:expr, $t:ty) => {{
        const N: usize = std::mem::size_of::<$t>();
        let load = <$t>::from_ne_bytes;
        let store = <$t>::to_ne_bytes;
        match $op {
            Op::Sum => each::<N>($dst, $src, |a, b| store(load(a).wrapping_add(load(b)))),
            Op::Product => each::<N>($dst, $src, |a, b| store(load(a).wrapping_mul(load(b)))),
            Op::Min => each::<N>($dst, $src, |a, b| store(load(a).min(load(b)))),
            Op::Max => each::<N>($dst, $src, |a, b| store(load(a).max(load(b)))),
            Op::BitAnd => each::<N>($dst, $src, |a, b| store(load(a) & load(b))),
            Op::BitOr => each::<N>($dst, $src, |a, b| store(load(a) | load(b))),
            Op::BitXor => each::<N>($dst, $src, |a, b| store(load(a) ^ load(b))),
        }
    }};
}

/// `dst[i] = dst[i] op src[i]` for every element.
pub fn combine(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) -> Result<(), ReduceError> {
    let size = dtype.size();
    if dst.len() != src.len() || !dst.len().is_multiple_of(size) {
        return Err(ReduceError::Lengths {
            dst: dst.len(),
            src: src.len(),
            size,
        });
    }
    if op.is_bitwise() && dtype.is_float() {
        return Err(ReduceError::Unsupported { op, dtype });
    }
    if let Dtype::F16 | Dtype::Bf16 = dtype {
        let done = vector_half(dst, src, dtype, op);
        scalar_half(&mut dst[done..], &src[done..], dtype, op);
    } else if !vector_plain(dst, src, dtype, op) {
        plain(dst, src, dtype, op);
    }
    Ok(())
}

/// The loops over whole elements of a dtype the CPU has (not half
/// precision), inlined into their caller: the baseline target's here,
/// and the same code compiled for wider vectors in `x86`.
#[inline(always)]
fn plain(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) {
    match dtype {
        Dtype::F32 => float::<4, f32>(dst, src, op, f32::from_ne_bytes, f32::to_ne_bytes),
        Dtype::F64 => float::<8, f64>(dst, src, op, f64::from_ne_bytes, f64::to_ne_bytes),
        Dtype::I8 => int!(dst, src, op, i8),
        Dtype::I16 => int!(dst, src, op, i16),
        Dtype::I32 => int!(dst, src, op, i32),
        Dtype::I64 => int!(dst, src, op, i64),
        Dtype::U8 => int!(dst, src, op, u8),
        Dtype::Bool => boolean(dst, src, op),
        Dtype::F16 | Dtype::Bf16 => unreachable!("half precision is combined apart"),
    }
}

/// [`plain`] compiled for the CPU's widest vectors, where it has more
/// than the baseline target: whether it ran.
fn vector_plain(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::combine_plain(dst, src, dtype, op);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src, dtype, op);
        false
    }
}

/// Applies `f` to each pair of `N`-byte elements.
#[inline(always)]
fn each<const N: usize>(dst: &mut [u8], src: &[u8], f: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    let (dst_elements, _) = dst.as_chunks_mut::<N>();
    let (src_elements, _) = src.as_chunks::<N>();
    for (d, s) in dst_elements.iter_mut().zip(src_elements) {
        *d = f(*d, *s);
    }
}

/// Whether `x` is NaN: the one value not ordered against itself.
#[inline(always)]
fn is_nan<T: PartialOrd>(x: T) -> bool {
    x.partial_cmp(&x).is_none()
}

/// NaN wins, as in torch's `minimum`/`maximum`.
#[inline(always)]
fn float_min<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if is_nan(a) {
        a
    } else if is_nan(b) || b < a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn float_max<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if is_nan(a) {
        a
    } else if is_nan(b) || b > a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn float<const N: usize, T>(
    dst: &mut [u8],
    src: &[u8],
    op: Op,
    load: fn([u8; N]) -> T,
    store: fn(T) -> [u8; N],
) where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    match op {
        Op::Sum => each::<N>(dst, src, |a, b| store(load(a) + load(b))),
        Op::Product => each::<N>(dst, src, |a, b| store(load(a) * load(b))),
        Op::Min => each::<N>(dst, src, |a, b| store(float_min(load(a), load(b)))),
        Op::Max => each::<N>(dst, src, |a, b| store(float_max(load(a), load(b)))),
        Op::BitAnd | Op::BitOr | Op::BitXor => unreachable!("refused in combine"),
    }
}

/// `value` as bfloat16 bits, rounded to nearest even; NaN stays a quiet
/// NaN. Plain integer arithmetic, so the loop vectorizes.
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((bits >> 16) | 0x40) as u16;
    if value.is_nan() { quiet_nan } else { rounded }
}

/// Combines what the CPU's vector kernels take of two half-precision
/// ranges: the bytes done.
fn vector_half(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) -> usize {
    #[cfg(target_arch = "x86_64")]
    return x86::combine_half(dst, src, dtype, op);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src, dtype, op);
        0
    }
}

fn scalar_half(dst: &mut [u8], src: &[u8], dtype: Dtype, op: Op) {
    if dtype == Dtype::F16 {
        half_float(dst, src, op, f16_widen, f16_narrow);
    } else {
        half_float(dst, src, op, bf16_widen, bf16_narrow);
    }
}

/// Half-precision elements per widened block.
const BLOCK: usize = 512;

/// Combines half-precision elements a block at a time: `widen` turns a
/// block of 2-byte elements into `f32`s, `narrow` rounds them back.
fn half_float(
    dst: &mut [u8],
    src: &[u8],
    op: Op,
    widen: impl Fn(&[[u8; 2]], &mut [f32]),
    narrow: impl Fn(&[f32], &mut [[u8; 2]]),
) {
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK * 2).zip(src.chunks(BLOCK * 2)) {
        let n = d.len() / 2;
        let (a, b) = (&mut a[..n], &mut b[..n]);
        widen(d.as_chunks::<2>().0, a);
        widen(s.as_chunks::<2>().0, b);
        match op {
            Op::Sum => a.iter_mut().zip(b.iter()).for_each(|(x, y)| *x += y),
            Op::Product => a.iter_mut().zip(b.iter()).for_each(|(x, y)| *x *= y),
            Op::Min => a
                .iter_mut()
                .zip(b.iter())
                .for_each(|(x, y)| *x = float_min(*x, *y)),
            Op::Max => a
                .iter_mut()
                .zip(b.iter())
                .for_each(|(x, y)| *x = float_max(*x, *y)),
            Op::BitAnd | Op::BitOr | Op::BitXor => unreachable!("refused in combine"),
        }
        narrow(a, d.as_chunks_mut::<2>().0);
    }
}

fn bf16_widen(elements: &[[u8; 2]], out: &mut [f32]) {
    for (element, value) in elements.iter().zip(out) {
        *value = f32::from_bits(u32::from(u16::from_ne_bytes(*element)) << 16);
    }
}

fn bf16_narrow(values: &[f32], out: &mut [[u8; 2]]) {
    for (value, element) in values.iter().zip(out) {
        *element = bf16_bits(*value).to_ne_bytes();
    }
}

/// float16 through `half`'s slice conversions, which use the CPU's F16C
/// instructions where it has them.
fn f16_widen(elements: &[[u8; 2]], out: &mut [f32]) {
    let mut halves = [f16::ZERO; BLOCK];
    let halves = &mut halves[..elements.len()];
    for (element, half) in elements.iter().zip(halves.iter_mut()) {
        *half = f16::from_bits(u16::from_ne_bytes(*element));
    }
    halves.convert_to_f32_slice(out);
}

fn f16_narrow(values: &[f32], out: &mut [[u8; 2]]) {
    let mut halves = [f16::ZERO; BLOCK];
    let halves = &mut halves[..values.len()];
    halves.convert_from_f32_slice(values);
    for (half, element) in halves.iter().zip(out) {
        *element = half.to_bits().to_ne_bytes();
    }
}

/// Booleans as torch reduces them: sum and max are "or", product and min
/// are "and"; the result is 0 or 1.
#[inline(always)]
fn boolean(dst: &mut [u8], src: &[u8], op: Op) {
    for (d, s) in dst.iter_mut().zip(src) {
        let (a, b) = (*d != 0, *s != 0);
        *d = u8::from(match op {
            Op::Sum | Op::Max | Op::BitOr => a | b,
            Op::Product | Op::Min | Op::BitAnd => a & b,
            Op::BitXor => a ^ b,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn bytes<T: Copy, const N: usize>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|v| to(*v)).collect()
    }

    #[test]
    fn float32_ops_match_scalar_arithmetic() {
        let a = [1.5f32, -2.0, 3.0, f32::NAN, 0.0];
        let b = [2.0f32, 5.0, -1.0, 1.0, -0.0];
        for (op, want) in [
            (Op::Sum, [3.5, 3.0, 2.0, f32::NAN, 0.0]),
            (Op::Product, [3.0, -10.0, -3.0, f32::NAN, -0.0]),
            (Op::Min, [1.5, -2.0, -1.0, f32::NAN, 0.0]),
            (Op::Max, [2.0, 5.0, 3.0, f32::NAN, 0.0]),
        ] {
            let mut dst = bytes(&a, f32::to_ne_bytes);
            combine(&mut dst, &bytes(&b, f32::to_ne_bytes), Dtype::F32, op).unwrap();
            let got: Vec<f32> = dst
                .chunks(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            for (g, w) in got.iter().zip(want) {
                assert!(
                    g == &w || (g.is_nan() && w.is_nan()),
                    "{op:?}: {got:?} vs {want:?}"
                );
            }
        }
    }

    #[test]
    fn integers_wrap_and_bitwise_ops_work() {
        let mut dst = bytes(&[i32::MAX, 6, -4], i32::to_ne_bytes);
        combine(
            &mut dst,
            &bytes(&[1, 3, 4], i32::to_ne_bytes),
            Dtype::I32,
            Op::Sum,
        )
        .unwrap();
        assert_eq!(dst, bytes(&[i32::MIN, 9, 0], i32::to_ne_bytes));
        let mut dst = vec![0b1100u8, 200];
        combine(&mut dst, &[0b1010, 100], Dtype::U8, Op::BitXor).unwrap();
        assert_eq!(dst, [0b0110, 172]);
        let mut dst = vec![200u8, 3];
        combine(&mut dst, &[100, 7], Dtype::U8, Op::Sum).unwrap();
        assert_eq!(dst, [44, 10]);
    }

    #[test]
    fn half_precision_rounds_through_f32() {
        // Across more than one block, with a tail.
        let n = BLOCK * 2 + 7;
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
        let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.125).collect();
        for (dtype, widen, narrow) in [
            (
                Dtype::F16,
                (|x| f16::from_bits(x).to_f32()) as fn(u16) -> f32,
                (|x| f16::from_f32(x).to_bits()) as fn(f32) -> u16,
            ),
            (
                Dtype::Bf16,
                |x| bf16::from_bits(x).to_f32(),
                |x| bf16::from_f32(x).to_bits(),
            ),
        ] {
            let enc = |v: &[f32]| -> Vec<u8> {
                v.iter().flat_map(|x| narrow(*x).to_ne_bytes()).collect()
            };
            let mut dst = enc(&a);
            let src = enc(&b);
            combine(&mut dst, &src, dtype, Op::Sum).unwrap();
            for i in 0..n {
                let x = widen(u16::from_ne_bytes([dst[2 * i], dst[2 * i + 1]]));
                let want = widen(narrow(
                    widen(u16::from_ne_bytes([enc(&a)[2 * i], enc(&a)[2 * i + 1]]))
                        + widen(u16::from_ne_bytes([src[2 * i], src[2 * i + 1]])),
                ));
                assert_eq!(x.to_bits(), want.to_bits(), "{dtype:?} element {i}");
            }
        }
    }

    #[test]
    fn booleans_follow_torch() {
        let mut dst = vec![1u8, 0, 1, 0];
        combine(&mut dst, &[1, 1, 0, 0], Dtype::Bool, Op::Product).unwrap();
        assert_eq!(dst, [1, 0, 0, 0]);
        let mut dst = vec![1u8, 0, 2, 0];
        combine(&mut dst, &[1, 1, 0, 0], Dtype::Bool, Op::Sum).unwrap();
        assert_eq!(dst, [1, 1, 1, 0]);
    }

    #[test]
    fn refuses_ragged_lengths_and_bitwise_floats() {
        let mut dst = vec![0u8; 8];
        assert!(matches!(
            combine(&mut dst, &[0; 4], Dtype::F32, Op::Sum),
            Err(ReduceError::Lengths { .. })
        ));
        assert!(matches!(
            combine(&mut dst[..6], &[0; 6], Dtype::F32, Op::Sum),
            Err(ReduceError::Lengths { .. })
        ));
        assert_eq!(
            combine(&mut dst, &[0; 8], Dtype::F64, Op::BitAnd),
            Err(ReduceError::Unsupported {
                op: Op::BitAnd,
                dtype: Dtype::F64
            })
        );
    }

    /// Every half-precision bit pattern against partners that include
    /// zeros of both signs, infinities, NaNs, subnormals and values whose
    /// sums round: the vector kernels give the bits the scalar path gives,
    /// a NaN's payload and sign included.
    #[test]
    fn vector_half_precision_matches_the_scalar_path() {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            compare_vector_half_precision();
        } else {
            eprintln!("skipped: this CPU has no AVX2 and F16C for the vector kernels");
        }
        #[cfg(not(target_arch = "x86_64"))]
        eprintln!("skipped: the vector kernels are for x86-64");
    }

    #[cfg(target_arch = "x86_64")]
    fn compare_vector_half_precision() {
        // Of both formats: zeros, infinities and NaNs of both signs,
        // subnormals, ones, and patterns special in one format and not in
        // the other.
        let specials: [u16; 14] = [
            0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e01, 0xfe00, 0x0001, 0x83ff, 0x3c00, 0x7f80, 0xff80,
            0x7fc0, 0xffc1, 0x3f80,
        ];
        // Every pair of specials, then every pattern against pseudo-random
        // partners: three more than a whole number of vector steps.
        let pairs = specials
            .iter()
            .flat_map(|x| specials.iter().map(move |y| (*x, *y)));
        let (mut a, mut b): (Vec<u16>, Vec<u16>) = pairs.unzip();
        let mut state = 0x2545_f491_u32;
        for (i, x) in (0..=u16::MAX).chain([1, 2, 3]).enumerate() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            a.push(x);
            let special = specials[state as usize % specials.len()];
            b.push(if i % 7 == 0 { special } else { state as u16 });
        }
        let to_bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        for dtype in [Dtype::F16, Dtype::Bf16] {
            for op in [Op::Sum, Op::Product, Op::Min, Op::Max] {
                let mut vector = to_bytes(&a);
                combine(&mut vector, &to_bytes(&b), dtype, op).unwrap();
                let mut scalar = to_bytes(&a);
                scalar_half(&mut scalar, &to_bytes(&b), dtype, op);
                for (i, (v, s)) in vector.chunks(2).zip(scalar.chunks(2)).enumerate() {
                    let (v, s) = (
                        u16::from_ne_bytes([v[0], v[1]]),
                        u16::from_ne_bytes([s[0], s[1]]),
                    );
                    assert!(
                        v == s,
                        "{dtype:?} {op:?} of {:#06x} and {:#06x}: vector {v:#06x}, scalar {s:#06x}",
                        a[i],
                        b[i]
                    );
                }
            }
        }
    }

    /// Min and max of every whole-element dtype, through the AVX-512
    /// build of the loops, against the baseline build: the same bits for
    /// pseudo-random patterns (NaNs of every payload and both signs
    /// among the floats), for every pair of float specials, and for a
    /// length that is not a whole number of vector steps.
    #[test]
    fn wide_min_and_max_match_the_baseline_loops() {
        #[cfg(target_arch = "x86_64")]
        if x86::wide_available() {
            compare_wide_min_and_max();
        } else {
            eprintln!("skipped: this CPU has no AVX-512F and AVX-512BW for the wide kernels");
        }
        #[cfg(not(target_arch = "x86_64"))]
        eprintln!("skipped: the wide kernels are for x86-64");
    }

    #[cfg(target_arch = "x86_64")]
    fn compare_wide_min_and_max() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = |len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect()
        };
        let f32_specials: Vec<u8> = [0.0f32, -0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY]
            .into_iter()
            .map(f32::to_bits)
            .chain([0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 0x0000_0001])
            .flat_map(u32::to_ne_bytes)
            .collect();
        let f64_specials: Vec<u8> = [0.0f64, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY]
            .into_iter()
            .map(f64::to_bits)
            .chain([
                0x7ff8_0000_0000_0000,
                0xfff8_0000_0000_0001,
                0x7ff0_0000_0000_0001,
                1,
            ])
            .flat_map(u64::to_ne_bytes)
            .collect();
        // Every pair of specials: each against each in turn.
        let pairs = |specials: &[u8], size: usize| -> (Vec<u8>, Vec<u8>) {
            let elements: Vec<&[u8]> = specials.chunks(size).collect();
            let mut a = Vec::new();
            let mut b = Vec::new();
            for x in &elements {
                for y in &elements {
                    a.extend_from_slice(x);
                    b.extend_from_slice(y);
                }
            }
            (a, b)
        };
        let dtypes = [
            Dtype::F32,
            Dtype::F64,
            Dtype::I8,
            Dtype::I16,
            Dtype::I32,
            Dtype::I64,
            Dtype::U8,
            Dtype::Bool,
        ];
        for dtype in dtypes {
            let size = dtype.size();
            let len = (4096 + 3) * size;
            let (mut a, mut b) = (random(len), random(len));
            let specials = match dtype {
                Dtype::F32 => Some(pairs(&f32_specials, 4)),
                Dtype::F64 => Some(pairs(&f64_specials, 8)),
                _ => None,
            };
            if let Some((x, y)) = specials {
                a.extend(x);
                b.extend(y);
            }
            for op in [Op::Min, Op::Max] {
                let mut wide = a.clone();
                combine(&mut wide, &b, dtype, op).unwrap();
                let mut baseline = a.clone();
                plain(&mut baseline, &b, dtype, op);
                for (i, (w, p)) in wide.chunks(size).zip(baseline.chunks(size)).enumerate() {
                    assert_eq!(w, p, "{dtype:?} {op:?}, element {i}");
                }
            }
        }
    }
}
