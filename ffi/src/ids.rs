//! Maps keyed by ids this library hands out itself (handles, held
//! messages): every call looks one up, so the hash is one multiplication
//! rather than SipHash. The keys are the library's own counters, not
//! values anyone could choose to collide.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from an id the library issued.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of a `u64` id.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(GOLDEN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_spread_over_the_high_bits() {
        // hashbrown takes its control byte from the top seven bits.
        let tops: std::collections::HashSet<u64> = (1..=128u64)
            .map(|id| {
                let mut hasher = IdHasher::default();
                hasher.write_u64(id);
                hasher.finish() >> 57
            })
            .collect();
        assert!(tops.len() > 64, "only {} distinct top bits", tops.len());
        let mut map = IdMap::default();
        for id in 0..10_000u64 {
            map.insert(id | (1 << 56), id);
        }
        assert!((0..10_000u64).all(|id| map[&(id | (1 << 56))] == id));
    }
}
