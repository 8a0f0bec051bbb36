//! [`FaultWindow`]: a window wrapper that injects the faults reported on
//! real BAR paths — flipped bits, writes that never land, writes cut short,
//! writes that land late — in the spirit of smoltcp's `FaultInjector`.
//!
//! Each fault has its own probability, decided per write from a seeded
//! generator, so a failing run replays exactly; [`InjectedFaults`] counts
//! what was done. Atomic index stores are faulted like bulk writes (bit
//! flips, drops, stalls; never torn): a ring in a peer's BAR receives its
//! index words as ordinary posted writes, which a flaky path corrupts as
//! readily as packet bytes. [`FaultConfig::fault_index_stores`] turns that
//! off, for a test that wants corrupt packets over an intact ring.
//!
//! Reads, loads and `fetch_add` are never faulted; a corrupt read is
//! modelled as a corrupt write by the peer.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::mapping::check_store_ordering;
use super::{Window, WindowError, check_range, chunks};
use crate::crc::Crc32c;
use crate::rng::SplitMix64;

/// Fault probabilities of a [`FaultWindow`], each per write, each decided
/// independently.
///
/// A dropped write is not also flipped, torn or stalled (nothing of it
/// lands). The others combine: a write may be flipped, then torn, then
/// stalled. Probabilities outside `0.0..=1.0` act as the nearest bound.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FaultConfig {
    /// One random bit of the written data flips (an index store: one of its
    /// 64 bits).
    pub bit_flip: f64,
    /// The write is silently not performed.
    pub drop: f64,
    /// Only a random prefix of the data is written (shorter than the whole;
    /// possibly nothing). Never applied to index stores, which are atomic.
    pub tear: f64,
    /// The write is held back and lands later, after writes issued after it
    /// — including, typically, the index store meant to publish it.
    pub stall: f64,
    /// A stalled write lands at the start of the `stall_calls`-th call on
    /// this window after it (at least the next one). Fences do not land
    /// stalled writes: a stall models delay past the CPU, which no CPU
    /// fence can drain.
    pub stall_calls: u32,
    /// Whether atomic index stores ([`Window::store_u64`]) are faulted too
    /// (bit flips, drops, stalls); on unless turned off. `fetch_add_u64`
    /// never is.
    pub fault_index_stores: bool,
}

impl FaultConfig {
    /// No faults: the wrapper is transparent. Probabilities set on it
    /// apply to index stores too, unless
    /// [`FaultConfig::with_fault_index_stores`] turns that off.
    pub fn none() -> FaultConfig {
        FaultConfig {
            bit_flip: 0.0,
            drop: 0.0,
            tear: 0.0,
            stall: 0.0,
            stall_calls: 1,
            fault_index_stores: true,
        }
    }

    /// These probabilities with `bit_flip`.
    pub fn with_bit_flip(mut self, p: f64) -> Self {
        self.bit_flip = p;
        self
    }

    /// These probabilities with `drop`.
    pub fn with_drop(mut self, p: f64) -> Self {
        self.drop = p;
        self
    }

    /// These probabilities with `tear`.
    pub fn with_tear(mut self, p: f64) -> Self {
        self.tear = p;
        self
    }

    /// These probabilities with `stall`, landing after `calls` calls.
    pub fn with_stall(mut self, p: f64, calls: u32) -> Self {
        self.stall = p;
        self.stall_calls = calls;
        self
    }

    /// These probabilities, applied to index stores too when `on`.
    pub fn with_fault_index_stores(mut self, on: bool) -> Self {
        self.fault_index_stores = on;
        self
    }
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig::none()
    }
}

/// What a [`FaultWindow`] has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InjectedFaults {
    /// Bulk writes (`write`, `write_with`) offered, faulted or not.
    pub bulk_writes: u64,
    /// Atomic index stores offered, faulted or not.
    pub index_stores: u64,
    /// Writes with a flipped bit.
    pub bit_flips: u64,
    /// Writes not performed.
    pub dropped: u64,
    /// Writes cut short.
    pub torn: u64,
    /// Writes held back.
    pub stalled: u64,
    /// Held-back writes that have since landed.
    pub stalls_landed: u64,
}

/// A write held back, and when it lands.
#[derive(Debug)]
struct Stalled {
    /// The call count at whose start it lands.
    due: u64,
    offset: usize,
    write: DelayedWrite,
}

#[derive(Debug)]
enum DelayedWrite {
    Bytes(Vec<u8>),
    Index { value: u64, order: Ordering },
}

#[derive(Debug)]
struct FaultState {
    config: FaultConfig,
    rng: SplitMix64,
    counts: InjectedFaults,
    /// Calls made on the window (all but `len`/`is_empty`).
    calls: u64,
    stalled: VecDeque<Stalled>,
}

/// What happens to one bulk write.
enum BulkFate {
    /// Written as given.
    Intact,
    /// Dropped, or held back: nothing lands now.
    Nothing,
    /// These bytes land now instead (flipped and/or torn).
    Changed(Vec<u8>),
}

/// A window that injects faults into writes to the window it wraps.
///
/// Share it (`Arc<FaultWindow<W>>`) like any window; every call is
/// serialized through one lock, which is fine for tests.
#[derive(Debug)]
pub struct FaultWindow<W: Window> {
    inner: W,
    state: Mutex<FaultState>,
}

impl<W: Window> FaultWindow<W> {
    /// Wraps `inner`, with faults from `config` decided by a generator
    /// seeded with `seed`.
    pub fn new(inner: W, config: FaultConfig, seed: u64) -> FaultWindow<W> {
        FaultWindow {
            inner,
            state: Mutex::new(FaultState {
                config,
                rng: SplitMix64::new(seed),
                counts: InjectedFaults::default(),
                calls: 0,
                stalled: VecDeque::new(),
            }),
        }
    }

    /// The wrapped window (writes to it directly are not faulted).
    pub fn inner(&self) -> &W {
        &self.inner
    }

    /// The probabilities in force.
    pub fn config(&self) -> FaultConfig {
        self.lock().config.clone()
    }

    /// Changes the probabilities from the next write on (writes already
    /// stalled still land).
    pub fn set_config(&self, config: FaultConfig) {
        self.lock().config = config;
    }

    /// What has been injected so far.
    pub fn injected(&self) -> InjectedFaults {
        self.lock().counts.clone()
    }

    /// How many stalled writes have not landed yet.
    pub fn pending_stalls(&self) -> usize {
        self.lock().stalled.len()
    }

    /// Lands every stalled write now, in the order they were issued, and
    /// returns how many landed.
    pub fn land_stalled(&self) -> usize {
        let mut state = self.lock();
        let due: Vec<Stalled> = state.stalled.drain(..).collect();
        self.land(&mut state, due)
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // The state stays consistent across a panic (counters, a queue), so
        // a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a call and lands the stalled writes now due.
    fn begin_call(&self) -> MutexGuard<'_, FaultState> {
        let mut state = self.lock();
        state.calls += 1;
        let now = state.calls;
        if state.stalled.iter().any(|s| s.due <= now) {
            let (due, waiting): (Vec<Stalled>, Vec<Stalled>) =
                state.stalled.drain(..).partition(|s| s.due <= now);
            state.stalled = waiting.into();
            self.land(&mut state, due);
        }
        state
    }

    fn land(&self, state: &mut FaultState, due: Vec<Stalled>) -> usize {
        let landed = due.len();
        for stalled in due {
            // Ranges, alignment and orderings were checked when the write
            // was issued, so these cannot fail.
            let result = match stalled.write {
                DelayedWrite::Bytes(bytes) => self.inner.write(stalled.offset, &bytes),
                DelayedWrite::Index { value, order } => {
                    self.inner.store_u64(stalled.offset, value, order)
                }
            };
            debug_assert!(result.is_ok(), "stalled write failed: {result:?}");
        }
        state.counts.stalls_landed += landed as u64;
        landed
    }

    /// Decides and applies the faults of a bulk write of `src` at `offset`
    /// (already range-checked); returns whether it is to be written intact
    /// by the caller.
    fn fault_bulk(&self, state: &mut FaultState, offset: usize, src: &[u8]) -> BulkFate {
        state.counts.bulk_writes += 1;
        if src.is_empty() {
            return BulkFate::Intact;
        }
        let FaultState {
            config,
            rng,
            counts,
            ..
        } = state;
        if rng.chance(config.drop) {
            counts.dropped += 1;
            return BulkFate::Nothing;
        }
        let flip = rng.chance(config.bit_flip);
        let tear = rng.chance(config.tear);
        let stall = rng.chance(config.stall);
        if !(flip || tear || stall) {
            return BulkFate::Intact;
        }
        let mut image = src.to_vec();
        if flip {
            let byte = rng.below(image.len() as u64) as usize;
            image[byte] ^= 1 << rng.below(8);
            counts.bit_flips += 1;
        }
        if tear {
            image.truncate(rng.below(image.len() as u64) as usize);
            counts.torn += 1;
        }
        if stall {
            counts.stalled += 1;
            let due = state.calls + u64::from(state.config.stall_calls.max(1));
            state.stalled.push_back(Stalled {
                due,
                offset,
                write: DelayedWrite::Bytes(image),
            });
            return BulkFate::Nothing;
        }
        BulkFate::Changed(image)
    }
}

impl<W: Window> Window for FaultWindow<W> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        let mut state = self.begin_call();
        check_range(offset, src.len(), self.inner.len())?;
        match self.fault_bulk(&mut state, offset, src) {
            BulkFate::Intact => self.inner.write(offset, src),
            BulkFate::Nothing => Ok(()),
            BulkFate::Changed(image) => self.inner.write(offset, &image),
        }
    }

    /// One fault decision for the whole write (it is one packet's payload);
    /// the closure always sees the intended source chunks, as a link's CRC
    /// would.
    fn write_with(
        &self,
        offset: usize,
        src: &[u8],
        chunk: usize,
        on_chunk: &mut dyn FnMut(&[u8]),
    ) -> Result<(), WindowError> {
        let mut state = self.begin_call();
        check_range(offset, src.len(), self.inner.len())?;
        let fate = self.fault_bulk(&mut state, offset, src);
        // Never call the caller's closure with the lock held.
        drop(state);
        match fate {
            BulkFate::Intact => return self.inner.write_with(offset, src, chunk, on_chunk),
            BulkFate::Nothing => {}
            BulkFate::Changed(image) => self.inner.write(offset, &image)?,
        }
        chunks(src, chunk).for_each(on_chunk);
        Ok(())
    }

    /// One fault decision for the whole write, as in `write_with`; an
    /// intact write keeps the inner window's one-pass copy and CRC, and the
    /// CRC is always of the intended source.
    fn write_crc(&self, offset: usize, src: &[u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        let mut state = self.begin_call();
        check_range(offset, src.len(), self.inner.len())?;
        let fate = self.fault_bulk(&mut state, offset, src);
        drop(state);
        match fate {
            BulkFate::Intact => return self.inner.write_crc(offset, src, crc),
            BulkFate::Nothing => {}
            BulkFate::Changed(image) => self.inner.write(offset, &image)?,
        }
        crc.update(src);
        Ok(())
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        let _state = self.begin_call();
        self.inner.read(offset, dst)
    }

    fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        let _state = self.begin_call();
        self.inner.read_crc(offset, dst, crc)
    }

    fn read_crc_streaming(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        let _state = self.begin_call();
        self.inner.read_crc_streaming(offset, dst, crc)
    }

    fn read_streaming(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        let _state = self.begin_call();
        self.inner.read_streaming(offset, dst)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        let _state = self.begin_call();
        self.inner.load_u64(offset, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        let mut state = self.begin_call();
        state.counts.index_stores += 1;
        if !state.config.fault_index_stores {
            return self.inner.store_u64(offset, value, order);
        }
        // Checked now, since a stalled store is performed later.
        check_store_ordering(order)?;
        check_range(offset, size_of::<u64>(), self.inner.len())?;
        if !offset.is_multiple_of(size_of::<u64>()) {
            return Err(WindowError::Misaligned {
                offset,
                align: size_of::<u64>(),
            });
        }
        let FaultState {
            config,
            rng,
            counts,
            calls,
            stalled,
        } = &mut *state;
        if rng.chance(config.drop) {
            counts.dropped += 1;
            return Ok(());
        }
        let mut value = value;
        if rng.chance(config.bit_flip) {
            value ^= 1 << rng.below(64);
            counts.bit_flips += 1;
        }
        if rng.chance(config.stall) {
            counts.stalled += 1;
            stalled.push_back(Stalled {
                due: *calls + u64::from(config.stall_calls.max(1)),
                offset,
                write: DelayedWrite::Index { value, order },
            });
            return Ok(());
        }
        self.inner.store_u64(offset, value, order)
    }

    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        let _state = self.begin_call();
        self.inner.fetch_add_u64(offset, value, order)
    }

    fn store_fence(&self) {
        let _state = self.begin_call();
        self.inner.store_fence();
    }

    fn prefetch(&self, offset: usize, len: usize) {
        // A hint: it moves no data, so there is nothing to fault.
        self.inner.prefetch(offset, len);
    }

    fn prefetch_for_write(&self, offset: usize, len: usize) {
        // A hint too: nothing to fault.
        self.inner.prefetch_for_write(offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::HeapWindow;

    #[test]
    fn torn_write_keeps_a_strict_prefix() {
        let window = FaultWindow::new(
            HeapWindow::new(256).unwrap(),
            FaultConfig::none().with_tear(1.0),
            7,
        );
        for round in 0..50u8 {
            let src = [round | 0x80; 200];
            window.inner().write(0, &[0; 200]).unwrap();
            window.write(0, &src).unwrap();
            let mut back = [0u8; 200];
            window.inner().read(0, &mut back).unwrap();
            let kept = back.iter().take_while(|&&b| b == src[0]).count();
            assert!(kept < 200);
            assert!(back[kept..].iter().all(|&b| b == 0));
        }
        assert_eq!(window.injected().torn, 50);
    }

    #[test]
    fn a_stalled_write_lands_after_later_writes() {
        let window = FaultWindow::new(
            HeapWindow::new(64).unwrap(),
            FaultConfig::none().with_stall(1.0, 2),
            1,
        );
        window.write(0, &[1; 8]).unwrap(); // call 1: stalled until call 3
        assert_eq!(window.pending_stalls(), 1);
        window.set_config(FaultConfig::none());
        window.store_u64(8, 5, Ordering::Release).unwrap(); // call 2: index visible first
        assert_eq!(window.inner().load_u64(0, Ordering::Relaxed), Ok(0));
        assert_eq!(window.load_u64(8, Ordering::Acquire), Ok(5)); // call 3: lands
        assert_eq!(
            window.inner().load_u64(0, Ordering::Relaxed),
            Ok(0x0101_0101_0101_0101)
        );
        let counts = window.injected();
        assert_eq!((counts.stalled, counts.stalls_landed), (1, 1));
    }
}
