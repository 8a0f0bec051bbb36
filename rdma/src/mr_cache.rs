//! [`MrCache`]: a registration cache keyed by address range, so that
//! sending from the same (or part of the same) buffer again does not
//! register it again — registration pins pages and costs a system call
//! and device work.
//!
//! - A lookup of a range inside a cached registration hits and returns it.
//! - A range that is not inside one registers anew: the union of the range
//!   and every cached entry it overlaps or touches, which then replaces
//!   those entries (so growing buffers converge on one registration).
//!   Replaced entries stay valid for whoever still holds them (`Arc`).
//! - [`MrCache::invalidate`] drops the entries overlapping a range: call it
//!   before memory is unmapped or freed (a stale registration would pin
//!   the old pages and give the device the wrong ones).
//! - The cache is bounded: past `capacity` entries it evicts the least
//!   recently used entry that nobody else holds; when every entry is in
//!   use, the new registration is returned uncached.
//!
//! The registration itself is a closure, so the cache is tested on any
//! host and serves any region type (in use: a
//! [`MemoryRegion`](crate::verbs::MemoryRegion) from
//! [`ProtectionDomain::register_raw`](crate::verbs::ProtectionDomain::register_raw)).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::error::RdmaError;

/// Counters of a [`MrCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Entries evicted for room.
    pub evictions: u64,
    /// Entries dropped by [`MrCache::invalidate`].
    pub invalidations: u64,
    /// Registrations handed out uncached (every entry was in use).
    pub uncached: u64,
}

#[derive(Debug)]
struct Entry<R> {
    start: usize,
    end: usize,
    region: Arc<R>,
    last_used: u64,
}

/// A registration cache over address ranges; see the module docs.
#[derive(Debug)]
pub struct MrCache<R> {
    entries: Vec<Entry<R>>,
    capacity: usize,
    clock: u64,
    stats: CacheStats,
}

/// A registration handed out by the cache: the region and the range it
/// covers (which may be larger than asked for).
#[derive(Debug)]
pub struct CachedRegion<R> {
    /// The registration.
    pub region: Arc<R>,
    /// First address it covers.
    pub start: usize,
    /// Bytes it covers.
    pub len: usize,
}

impl<R> Clone for CachedRegion<R> {
    fn clone(&self) -> Self {
        CachedRegion {
            region: self.region.clone(),
            start: self.start,
            len: self.len,
        }
    }
}

impl<R> MrCache<R> {
    /// An empty cache holding at most `capacity` (at least 1) registrations.
    pub fn new(capacity: usize) -> MrCache<R> {
        MrCache {
            entries: Vec::new(),
            capacity: capacity.max(1),
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    /// Registrations cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The cached registration containing `addr..addr + len`, if any
    /// (counts as a hit and as a use). A zero-length range is contained
    /// where its address is.
    pub fn lookup(&mut self, addr: usize, len: usize) -> Option<CachedRegion<R>> {
        let end = addr.checked_add(len)?;
        self.clock += 1;
        let clock = self.clock;
        let e = self
            .entries
            .iter_mut()
            .find(|e| e.start <= addr && end <= e.end)?;
        e.last_used = clock;
        self.stats.hits += 1;
        Some(CachedRegion {
            region: e.region.clone(),
            start: e.start,
            len: e.end - e.start,
        })
    }

    /// The registration covering `addr..addr + len`: a cached one, or one
    /// made by `register(start, len)` for the range to register (the
    /// requested range merged with the cached entries it overlaps).
    pub fn get_or_register<F>(
        &mut self,
        addr: usize,
        len: usize,
        register: F,
    ) -> Result<CachedRegion<R>, RdmaError>
    where
        F: FnOnce(usize, usize) -> Result<R, RdmaError>,
    {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| RdmaError::InvalidArgument {
                what: format!("{len} bytes at {addr:#x} overflow the address space"),
            })?;
        if let Some(hit) = self.lookup(addr, len) {
            return Ok(hit);
        }
        self.stats.misses += 1;
        // Grow over the entries this range overlaps (or abuts).
        let (mut start, mut stop) = (addr, end);
        for e in &self.entries {
            if e.start <= end && addr <= e.end {
                start = start.min(e.start);
                stop = stop.max(e.end);
            }
        }
        let region = Arc::new(register(start, stop - start)?);
        self.entries
            .retain(|e| !(e.start >= start && e.end <= stop));
        self.clock += 1;
        let handed = CachedRegion {
            region: region.clone(),
            start,
            len: stop - start,
        };
        if self.entries.len() >= self.capacity && !self.evict_one() {
            self.stats.uncached += 1;
            return Ok(handed);
        }
        self.entries.push(Entry {
            start,
            end: stop,
            region,
            last_used: self.clock,
        });
        Ok(handed)
    }

    /// Evicts the least recently used entry nobody else holds; false when
    /// every entry is in use.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| Arc::strong_count(&e.region) == 1)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                self.entries.swap_remove(i);
                self.stats.evictions += 1;
                true
            }
            None => false,
        }
    }

    /// Drops every cached entry overlapping `addr..addr + len`; returns how
    /// many. Holders of those registrations keep them until they drop them.
    pub fn invalidate(&mut self, addr: usize, len: usize) -> usize {
        let end = addr.saturating_add(len);
        let before = self.entries.len();
        // A zero-length range invalidates the entry containing its address.
        let overlaps = |e: &Entry<R>| {
            if len == 0 {
                e.start <= addr && addr < e.end
            } else {
                e.start < end && addr < e.end
            }
        };
        self.entries.retain(|e| !overlaps(e));
        let dropped = before - self.entries.len();
        self.stats.invalidations += dropped as u64;
        dropped
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.stats.invalidations += self.entries.len() as u64;
        self.entries.clear();
    }
}
