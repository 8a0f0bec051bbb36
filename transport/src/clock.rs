//! The clock links read: the CPU's time-stamp counter where it runs at a
//! constant rate, else `Instant`.
//!
//! A link reads the clock about once per message, and on a small message
//! that read is on the latency path: `Instant::now()` goes through the
//! kernel's clock in the vDSO (paravirtual under a hypervisor) and a
//! 128-bit conversion, at over twice the cost of `rdtsc` (design change
//! 21). The counter is scaled to
//! nanoseconds by a factor measured once per process against `Instant`
//! (over 2 ms: an error of a few parts in 10^5, nothing to a timer of
//! milliseconds). Where the CPU does not promise an invariant counter
//! (CPUID leaf 0x8000_0007, EDX bit 8), or off x86-64, `Instant` it is.
//!
//! The engine tolerates a clock that steps back a little (a thread moved to
//! a core whose counter lags): every duration it takes saturates at zero.
#![deny(unsafe_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::time::Time;

/// How long the one calibration per process watches both clocks.
const CALIBRATION: Duration = Duration::from_millis(2);

/// Nanoseconds per counter tick, as a 32.32 fixed-point number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    nanos_per_tick_q32: u64,
}

/// A monotonic clock with its origin at the link's creation: the counter's
/// reading then, or the `Instant` then.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    Counter { origin: u64, scale: Scale },
    Instant(Instant),
}

impl Clock {
    /// A clock reading zero now.
    pub(crate) fn start() -> Clock {
        match counter_scale() {
            Some(scale) => Clock::Counter {
                origin: counter(),
                scale,
            },
            None => Clock::Instant(Instant::now()),
        }
    }

    /// The time since the origin.
    #[inline]
    pub(crate) fn now(&self) -> Time {
        let nanos = match *self {
            Clock::Counter { origin, scale } => {
                let ticks = counter().saturating_sub(origin);
                (u128::from(ticks) * u128::from(scale.nanos_per_tick_q32)) >> 32
            }
            Clock::Instant(origin) => origin.elapsed().as_nanos(),
        };
        Time::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// The counter's scale, measured on first use; `None` where there is no
/// invariant counter, or it does not tick.
fn counter_scale() -> Option<Scale> {
    static SCALE: OnceLock<Option<Scale>> = OnceLock::new();
    *SCALE.get_or_init(|| {
        if !invariant_counter() {
            return None;
        }
        let (start, start_ticks) = (Instant::now(), counter());
        let mut end = Instant::now();
        while end.duration_since(start) < CALIBRATION {
            std::hint::spin_loop();
            end = Instant::now();
        }
        let ticks = counter().checked_sub(start_ticks).filter(|&t| t > 0)?;
        let nanos = u64::try_from(end.duration_since(start).as_nanos()).ok()?;
        let nanos_per_tick_q32 = u64::try_from((u128::from(nanos) << 32) / u128::from(ticks))
            .ok()
            .filter(|&q| q > 0)?;
        Some(Scale { nanos_per_tick_q32 })
    })
}

/// Whether the CPU promises a counter that ticks at a constant rate in
/// every power state.
#[cfg(target_arch = "x86_64")]
fn invariant_counter() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: `cpuid` exists on every x86-64 CPU and only reads registers
    // (newer toolchains call it safe; 1.89, our oldest, does not).
    #[allow(unsafe_code, unused_unsafe)]
    let max_extended = unsafe { __cpuid(0x8000_0000) }.eax;
    if max_extended < 0x8000_0007 {
        return false;
    }
    // SAFETY: as above; the leaf exists (checked just above).
    #[allow(unsafe_code, unused_unsafe)]
    let power = unsafe { __cpuid(0x8000_0007) };
    power.edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_counter() -> bool {
    false
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
fn counter() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU, reads a register and
    // touches no memory.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn counter() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_instant() {
        let clock = Clock::start();
        let start = Instant::now();
        let first = clock.now();
        std::thread::sleep(Duration::from_millis(30));
        let second = clock.now();
        let elapsed = start.elapsed();
        let measured = second.saturating_duration_since(first);
        // Within 5% (and a millisecond of scheduling) of what Instant saw.
        assert!(
            measured <= elapsed + Duration::from_millis(1)
                && measured + elapsed / 20 + Duration::from_millis(1) >= elapsed,
            "clock measured {measured:?}, Instant {elapsed:?}"
        );
        assert!(second >= first);
    }

    /// Exactly where the CPU promises an invariant counter is it used (a
    /// calibration that failed there would be a bug), at a plausible rate.
    #[test]
    fn the_counter_is_used_where_the_cpu_promises_it() {
        match Clock::start() {
            Clock::Counter { scale, .. } => {
                assert!(invariant_counter());
                // Between 0.01 and 100 ns per tick (100 MHz..100 GHz).
                let nanos_per_tick = scale.nanos_per_tick_q32 as f64 / 2f64.powi(32);
                assert!((0.01..100.0).contains(&nanos_per_tick), "{nanos_per_tick}");
            }
            Clock::Instant(_) => assert!(
                !invariant_counter(),
                "the CPU has an invariant counter, but the clock reads Instant"
            ),
        }
    }
}
