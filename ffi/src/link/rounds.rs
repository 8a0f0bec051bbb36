//! The clock and pace of a blocking call's rounds, shared by the general
//! blocking loop ([`super::LinkCell::blocking`]) and the waiting receive
//! in place ([`super::direct`]).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::{CLOCK_EVERY_IDLE_ROUNDS, SPINS_BEFORE_YIELD};
use crate::error::{Error, Result};

/// The clock and pace of a blocking call's rounds.
pub(crate) struct Rounds {
    timeout: Duration,
    /// Read when the first round cannot finish the call: a call that
    /// completes at once reads no clock.
    start: Option<Instant>,
    /// Rounds since one last moved anything.
    idle: u32,
}

/// What a blocking call does before its next round.
pub(crate) enum Pace {
    /// Packets moved: go on at once.
    Go,
    /// Idle: a `pause`, and on.
    Spin,
    /// Idle for `SPINS_BEFORE_YIELD` rounds: give the CPU up once (a
    /// yield is a system call, longer than a small message's way).
    Yield,
}

impl Rounds {
    pub(crate) fn new(timeout: Duration) -> Rounds {
        Rounds {
            timeout,
            start: None,
            idle: 0,
        }
    }

    /// Whether a round already failed to finish the call (later rounds
    /// may reuse the clock of the idle rounds before them).
    pub(crate) fn started(&self) -> bool {
        self.start.is_some()
    }

    /// After a round that did not finish the call (`moved`: whether it
    /// moved packets): why the call ends if its time is up (a timeout of
    /// 0 is one round, with no clock read), else how it goes on. While
    /// idle the clock is read every `CLOCK_EVERY_IDLE_ROUNDS` rounds only.
    pub(crate) fn after(&mut self, moved: bool) -> Result<Pace> {
        if self.timeout.is_zero() {
            return Err(Error::timed_out(0));
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        if moved {
            self.idle = 0;
        } else {
            self.idle = self.idle.wrapping_add(1);
        }
        if (moved || self.idle.is_multiple_of(CLOCK_EVERY_IDLE_ROUNDS))
            && start.elapsed() >= self.timeout
        {
            return Err(Error::timed_out(self.timeout.as_millis()));
        }
        Ok(if moved {
            Pace::Go
        } else if self.idle.is_multiple_of(SPINS_BEFORE_YIELD) {
            Pace::Yield
        } else {
            Pace::Spin
        })
    }

    /// Counts an idle round without the checks of [`Rounds::after`], if
    /// the next idle round is not one that reads the clock: the loop a
    /// waiting receive spins in. Whether it was counted.
    pub(crate) fn skip_idle(&mut self) -> bool {
        let next = self.idle.wrapping_add(1);
        if self.start.is_none() || next.is_multiple_of(CLOCK_EVERY_IDLE_ROUNDS) {
            return false;
        }
        self.idle = next;
        true
    }
}
