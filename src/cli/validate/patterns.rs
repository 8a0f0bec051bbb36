//! The test patterns: walking ones, address in address, seeded random —
//! streams of 8-byte words that can be started at any word.

use barlink_transport::rng::SplitMix64;

/// Added per word to the random pattern's SplitMix64 state (its own
/// increment), so that any word of the stream can be started at.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Word n holds a single one bit at position (n + key) mod 64: every
    /// data line carries a lone one in turn.
    WalkingOnes,
    /// Each word holds its own byte offset (XOR the key): a write that
    /// lands at the wrong address shows where it came from.
    AddressInAddress,
    /// SplitMix64 output; word n of a stream is independent of the others.
    Random,
}

impl Pattern {
    pub const ALL: [Pattern; 3] = [
        Pattern::WalkingOnes,
        Pattern::AddressInAddress,
        Pattern::Random,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::WalkingOnes => "walking-ones",
            Pattern::AddressInAddress => "address-in-address",
            Pattern::Random => "random",
        }
    }

    /// Fills `buf` with the words of the stream `key` that start at byte
    /// offset `at` (a multiple of 8); a last partial word is cut short.
    pub fn fill(self, key: u64, at: u64, buf: &mut [u8]) {
        debug_assert!(at.is_multiple_of(8));
        let first = at / 8;
        match self {
            Pattern::WalkingOnes => {
                for (i, word) in buf.chunks_mut(8).enumerate() {
                    let bit = (first + i as u64).wrapping_add(key) % 64;
                    put(word, 1u64 << bit);
                }
            }
            Pattern::AddressInAddress => {
                for (i, word) in buf.chunks_mut(8).enumerate() {
                    put(word, (at + 8 * i as u64) ^ key);
                }
            }
            Pattern::Random => {
                let mut rng = SplitMix64::new(key.wrapping_add(first.wrapping_mul(GAMMA)));
                for word in buf.chunks_mut(8) {
                    put(word, rng.next_u64());
                }
            }
        }
    }
}

fn put(word: &mut [u8], value: u64) {
    let len = word.len();
    word.copy_from_slice(&value.to_le_bytes()[..len]);
}

/// The little-endian word of up to 8 bytes.
pub fn word_of(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_the_same_filled_whole_or_in_pieces() {
        for pattern in Pattern::ALL {
            let mut whole = vec![0u8; 4096];
            pattern.fill(7, 8192, &mut whole);
            let mut pieces = vec![0u8; 4096];
            for at in (0..4096).step_by(512) {
                pattern.fill(7, 8192 + at as u64, &mut pieces[at..at + 512]);
            }
            assert_eq!(whole, pieces, "{}", pattern.name());
        }
    }

    #[test]
    fn patterns_hold_what_their_names_say() {
        let mut buf = vec![0u8; 80];
        Pattern::AddressInAddress.fill(0, 0x1000, &mut buf);
        assert_eq!(word_of(&buf[8..16]), 0x1008);
        Pattern::WalkingOnes.fill(0, 0, &mut buf);
        assert_eq!(word_of(&buf[..8]), 1);
        assert_eq!(word_of(&buf[24..32]), 8);
        assert!(buf.chunks(8).all(|w| word_of(w).count_ones() == 1));
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        Pattern::Random.fill(1, 0, &mut a);
        Pattern::Random.fill(2, 0, &mut b);
        assert_ne!(a, b);
    }
}
