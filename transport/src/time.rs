//! Time as the engine sees it: a number the caller hands in.
//!
//! The engine never reads a clock. Links pass a monotonic clock's reading;
//! tests pass simulated time, which makes every run reproducible.
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::{Add, AddAssign};
use std::time::Duration;

/// A point in time, in nanoseconds since an origin the caller chose.
///
/// Only differences between two `Time`s of the same origin mean anything.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);

    /// A time `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    /// Saturates at the far future rather than wrapping: a timer set "never"
    /// must not come back as "at once".
    fn add(self, rhs: Duration) -> Time {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:?}", Duration::from_nanos(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addition_saturates_instead_of_wrapping() {
        let t = Time::from_nanos(u64::MAX - 5) + Duration::from_secs(1);
        assert_eq!(t.as_nanos(), u64::MAX);
        assert_eq!(
            (Time::ZERO + Duration::MAX).as_nanos(),
            u64::MAX,
            "Duration::MAX is beyond u64 nanoseconds"
        );
    }

    #[test]
    fn duration_since_saturates_at_zero() {
        let a = Time::from_nanos(10);
        let b = Time::from_nanos(25);
        assert_eq!(b.saturating_duration_since(a), Duration::from_nanos(15));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
    }
}
