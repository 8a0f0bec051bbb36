//! CRC-32C (Castagnoli), the checksum on every barlink packet.
//!
//! A thin wrapper over `crc-fast` (carry-less multiply, tens of GB/s) so the
//! rest of the crate names one type and never the algorithm enum, and so the
//! CRC can be taken chunk by chunk while data is copied (the link layer
//! checksums each chunk while it is still hot in L1).
//!
//! Copies with a CRC ([`Crc32c::copy_into`], [`Crc32c::copy_from`], behind
//! the windows' `write_crc`/`read_crc`) take one pass where the CPU allows:
//! `avx512`, 512-bit folding fused with the copy, on CPUs with AVX-512
//! VPCLMULQDQ; `x86`, 256-bit folding with `crc32` streams beside it, on
//! CPUs with VPCLMULQDQ but not AVX-512; elsewhere a copy, then the CRC.
//! A checksum alone goes to `avx512` on CPUs with AVX-512 VPCLMULQDQ (up
//! to 256 KiB), to `x86` where `crc-fast` would take its 128-bit path, else
//! to `crc-fast`; inputs under 256 bytes (packet headers, small packets,
//! the rings' index words) take the `crc32` instruction wherever SSE4.2 is.
//! `BARLINK_CPU_ISA` ([`crate::cpu::IsaLimit`]) can hold all of this below
//! what the CPU has.
#![deny(unsafe_code)]

use crc_fast::{CrcAlgorithm, Digest};

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod x86;

/// An incremental CRC-32C computation.
#[derive(Clone, Copy)]
pub struct Crc32c {
    /// The raw register (initialized to all ones, not yet inverted).
    state: u32,
}

impl Crc32c {
    /// Starts a new checksum.
    #[inline]
    pub fn new() -> Self {
        Crc32c { state: !0 }
    }

    /// Feeds more bytes.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.state = update_register(self.state, bytes);
    }

    /// The checksum of everything fed so far.
    #[inline]
    pub fn finish(&self) -> u32 {
        !self.state
    }
}

/// From this many bytes on, a checksum alone goes to `crc-fast` even where
/// our 512-bit kernel runs: its long-haul loop is faster there, ours below
/// (design change 23).
#[cfg(target_arch = "x86_64")]
const CRC_FAST_FROM: usize = 256 << 10;

/// Advances the raw CRC-32C register over `bytes`.
#[inline]
fn update_register(state: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        // Short inputs (packet headers, a small message's packet, index
        // words) take the `crc32` instruction directly: one feature test,
        // no dispatch over the wide kernels, on the latency path.
        if bytes.len() < x86::MIN_LEN && x86::has_crc32_instruction() {
            return x86::update_short(state, bytes);
        }
        if avx512::available() && (avx512::MIN_LEN..CRC_FAST_FROM).contains(&bytes.len()) {
            return avx512::update(state, bytes);
        }
        // Where the 512-bit kernel runs, `crc-fast`'s 512-bit loop beats
        // ours on what is left (the longest inputs): it takes them below.
        if x86::available() && (bytes.len() < x86::MIN_LEN || !avx512::available()) {
            return x86::update(state, bytes);
        }
    }
    // crc-fast keeps the register the same way (reflected, not inverted).
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(state));
    digest.update(bytes);
    digest.get_state() as u32
}

impl Crc32c {
    /// Copies `src` to `dst` (`src.len()` bytes) and feeds the bytes into
    /// the checksum — in one pass where the CPU allows (each vector loaded
    /// once, stored, folded), else a copy and then the CRC of `src`.
    ///
    /// This is the kernel behind the transport's own windows'
    /// [`Window::write_crc`](crate::window::Window::write_crc); windows in
    /// other crates over ordinary memory (RDMA registered buffers) get it
    /// through [`RawWindow`](crate::window::RawWindow).
    ///
    /// # Safety
    /// - `dst` must be valid for writes of `src.len()` bytes for the whole
    ///   call (mapped, writable, and not freed or unmapped meanwhile);
    /// - `dst..dst + src.len()` must not overlap `src`;
    /// - no Rust reference (`&`/`&mut`) to any byte of the destination may
    ///   be live during the call. A device or another process reading the
    ///   destination meanwhile is allowed: it may see some bytes old and
    ///   some new, as with any copy.
    ///
    /// The bytes are written with ordinary (non-volatile, possibly vector)
    /// stores in unspecified order and size; no ordering against later
    /// stores is implied (publish with a fence and a `Release` store, as
    /// [`Window`](crate::window::Window) describes).
    #[allow(unsafe_code)]
    #[inline]
    pub(crate) unsafe fn copy_into(&mut self, src: &[u8], dst: *mut u8) {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            // SAFETY: features checked just above; `src` is a live slice,
            // `dst` is writable and disjoint (this function's contract).
            self.state = unsafe { avx512::copy_update(self.state, src.as_ptr(), dst, src.len()) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: features checked just above; `src` is a live slice,
            // `dst` is writable and disjoint (this function's contract).
            self.state = unsafe {
                x86::copy_update(
                    self.state,
                    src.as_ptr(),
                    dst,
                    src.len(),
                    x86::Stable::Source,
                )
            };
            return;
        }
        // SAFETY: as above: `dst` writable for `src.len()`, disjoint.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        self.update(src);
    }

    /// Copies `dst.len()` bytes from `src` into `dst` and feeds the bytes
    /// as they landed in `dst` into the checksum, in one pass where the CPU
    /// allows.
    ///
    /// The checksum is always that of `dst` after the call, even when the
    /// source changes during it (each piece is loaded once, and the loaded
    /// value is both stored and folded): a packet torn by a concurrent
    /// writer fails its CRC instead of passing on bytes it was not taken
    /// over.
    ///
    /// # Safety
    /// - `src` must be valid for reads of `dst.len()` bytes for the whole
    ///   call (mapped and not unmapped meanwhile);
    /// - `src..src + dst.len()` must not overlap `dst`;
    /// - no `&mut` reference to any byte of the source may be live during
    ///   the call. A device or another process writing the source
    ///   meanwhile is allowed (see above).
    #[allow(unsafe_code)]
    #[inline]
    pub(crate) unsafe fn copy_from(&mut self, src: *const u8, dst: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            // SAFETY: features checked just above; `dst` is a live
            // exclusive slice, `src` readable and disjoint (contract).
            self.state =
                unsafe { avx512::copy_update(self.state, src, dst.as_mut_ptr(), dst.len()) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: features checked just above; `dst` is a live
            // exclusive slice, `src` readable and disjoint (contract).
            self.state = unsafe {
                x86::copy_update(
                    self.state,
                    src,
                    dst.as_mut_ptr(),
                    dst.len(),
                    x86::Stable::Destination,
                )
            };
            return;
        }
        // SAFETY: as above: `src` readable for `dst.len()`, disjoint.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        self.update(dst);
    }

    /// [`Crc32c::copy_from`] for a destination nobody will read soon (a
    /// large message landing): where [`streams_large_copies`], its whole
    /// 64-byte lines are written around the cache, so they are not first
    /// read from memory only to be overwritten. Elsewhere the same as
    /// `copy_from`. The bytes are ordered before later stores, as with
    /// `copy_from`.
    ///
    /// # Safety
    /// As [`Crc32c::copy_from`].
    #[allow(unsafe_code)]
    pub(crate) unsafe fn copy_from_streaming(&mut self, src: *const u8, dst: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            // SAFETY: features checked just above; `dst` is a live
            // exclusive slice, `src` readable and disjoint (contract).
            self.state = unsafe {
                avx512::copy_update_streaming(self.state, src, dst.as_mut_ptr(), dst.len())
            };
            return;
        }
        // SAFETY: the same contract.
        unsafe { self.copy_from(src, dst) }
    }
}

impl Crc32c {
    /// Copies `src` into `dst` (equal lengths) and feeds the bytes into the
    /// checksum, in one pass where the CPU allows: [`Crc32c::copy_from`]
    /// for two slices, which the borrow rules already keep apart. With
    /// `streaming`, a destination nobody will read soon (a large message
    /// landing) is written as [`Crc32c::copy_from_streaming`] writes it.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn copy_checked(&mut self, src: &[u8], dst: &mut [u8], streaming: bool) {
        assert_eq!(src.len(), dst.len(), "copy_checked: lengths differ");
        if streaming {
            // SAFETY: `src` is a live shared slice of `dst.len()` bytes, so
            // readable for the whole call and disjoint from the exclusive
            // `dst`; no `&mut` to it can exist meanwhile.
            #[allow(unsafe_code)]
            unsafe {
                self.copy_from_streaming(src.as_ptr(), dst)
            }
        } else {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            unsafe {
                self.copy_from(src.as_ptr(), dst)
            }
        }
    }
}

/// Whether copies into a large message's memory go around the cache on
/// this CPU: where the 512-bit kernels run. Measured faster on one CPU
/// kind of those so far (design change 40); not measured elsewhere.
pub fn streams_large_copies() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel behind a copy with its CRC on this CPU, for reports.
pub fn copy_kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            return if crate::cpu::writes_ahead() {
                "avx512-vpclmulqdq fused, destination lines taken ahead, non-temporal stores into large messages"
            } else {
                "avx512-vpclmulqdq fused, non-temporal stores into large messages"
            };
        }
        if x86::available() {
            return "avx2-vpclmulqdq fused, 3 crc32 streams";
        }
    }
    "copy, then crc-fast"
}

/// The kernel behind a checksum of a long buffer on this CPU, for reports.
pub fn checksum_kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            return "avx512-vpclmulqdq below 256 KiB, crc-fast above";
        }
        if x86::available() {
            return "avx2-vpclmulqdq, 3 crc32 streams";
        }
    }
    "crc-fast"
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.finish())
    }
}

/// CRC-32C of one contiguous buffer.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    !update_register(!0, bytes)
}

/// CRC-32C of `value`'s four little-endian bytes: `crc32c(&value.to_le_bytes())`
/// in one instruction where the CPU has it (the rings check every index
/// word they store and load with it).
#[inline]
pub fn crc32c_of_u32(value: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if x86::has_crc32_instruction() {
        return !x86::update_u32(!0, value);
    }
    crc32c(&value.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_u32_checks_as_its_four_little_endian_bytes() {
        for value in [0, 1, 0x8000_0000, 0xDEAD_BEEF, u32::MAX, 0x0102_0304] {
            assert_eq!(
                crc32c_of_u32(value),
                crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, &value.to_le_bytes()) as u32,
                "value {value:#x}"
            );
        }
    }

    #[test]
    fn short_inputs_check_as_crc_fast_does_up_to_the_wide_kernels() {
        let bytes: Vec<u8> = (0..600u32).map(|i| (i * 131 + 7) as u8).collect();
        for len in (0..300).chain([511, 512, 513, 600]) {
            assert_eq!(
                crc32c(&bytes[..len]),
                crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, &bytes[..len]) as u32,
                "{len} bytes"
            );
        }
    }

    #[test]
    fn check_value_matches_the_catalogue() {
        // The standard check value of CRC-32/ISCSI (CRC-32C) for "123456789".
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn the_register_path_agrees_with_crc_fast_at_every_size() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in [
            0, 1, 3, 4, 5, 255, 256, 257, 300, 4016, 16384, 65456, 65536, 70_000,
        ] {
            let mut crc = Crc32c::new();
            crc.update(&data[..len]);
            assert_eq!(
                crc.finish(),
                crc_fast::crc32_iscsi(&data[..len]) as u32,
                "len {len}"
            );
        }
    }

    #[test]
    fn random_lengths_and_splits_agree_with_crc_fast() {
        let mut rng = crate::rng::SplitMix64::new(0xC3C);
        let mut data = vec![0u8; 300_000];
        rng.fill(&mut data);
        for _ in 0..300 {
            let start = rng.below(64) as usize;
            let len = rng.below(200_000) as usize;
            let piece = &data[start..start + len];
            let mut crc = Crc32c::new();
            let mut at = 0;
            while at < len {
                let step = (rng.below(40_000) as usize).min(len - at);
                crc.update(&piece[at..at + step]);
                at += step;
            }
            assert_eq!(
                crc.finish(),
                crc_fast::crc32_iscsi(piece) as u32,
                "start {start} len {len}"
            );
        }
    }

    #[test]
    fn copy_checked_copies_and_checksums_in_both_modes() {
        let mut rng = crate::rng::SplitMix64::new(0xC0C);
        let mut data = vec![0u8; 140_000];
        rng.fill(&mut data);
        for streaming in [false, true] {
            for (start, len) in [(0, 0), (1, 1), (3, 700), (17, 4096), (5, 131_072)] {
                let src = &data[start..start + len];
                let mut dst = vec![0u8; len + 3];
                let mut crc = Crc32c::new();
                crc.update(b"head");
                crc.copy_checked(src, &mut dst[3..], streaming);
                assert_eq!(&dst[3..], src, "len {len} streaming {streaming}");
                let mut whole = b"head".to_vec();
                whole.extend_from_slice(src);
                assert_eq!(
                    crc.finish(),
                    crc32c(&whole),
                    "len {len} streaming {streaming}"
                );
            }
        }
    }

    #[test]
    fn incremental_equals_one_shot_for_any_split() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = crc32c(&data);
        for split in [0, 1, 63, 64, 65, 4096, 4999, 5000] {
            let mut crc = Crc32c::new();
            crc.update(&data[..split]);
            crc.update(&data[split..]);
            assert_eq!(crc.finish(), whole, "split at {split}");
        }
    }
}
