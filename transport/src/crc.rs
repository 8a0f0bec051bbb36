//! CRC-32C (Castagnoli), the checksum on every barlink packet.
//!
//! A thin wrapper over `crc-fast` (carry-less multiply, tens of GB/s) so the
//! rest of the crate names one type and never the algorithm enum, and so the
//! CRC can be taken chunk by chunk while data is copied (the link layer
//! checksums each chunk while it is still hot in L1).
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

use crc_fast::{CrcAlgorithm, Digest};

/// An incremental CRC-32C computation.
#[derive(Clone, Copy)]
pub struct Crc32c(Digest);

impl Crc32c {
    /// Starts a new checksum.
    #[inline]
    pub fn new() -> Self {
        Crc32c(Digest::new(CrcAlgorithm::Crc32Iscsi))
    }

    /// Feeds more bytes.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The checksum of everything fed so far.
    #[inline]
    pub fn finish(&self) -> u32 {
        // CRC-32C is 32 bits wide; crc-fast returns it in a u64.
        self.0.finalize() as u32
    }
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
    crc_fast::crc32_iscsi(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_matches_the_catalogue() {
        // The standard check value of CRC-32/ISCSI (CRC-32C) for "123456789".
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
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
