//! When a blocking send that reads the caller's bytes in place gives up
//! waiting for the peer's acknowledgement, copies them and returns: the
//! rule the C face's `barlink_send` and the Python package's `Link.send`
//! share (design changes 62 and 64).
//!
//! A copy of a long message costs about what moving it does; waiting for
//! its acknowledgement costs about one packet's time. So a message of
//! [`LOAN_FROM_PACKETS`] packets or more is lent, and the send waits for
//! the acknowledgement while the message moves, copying it only once it
//! has stopped moving for about as long as the copy would take, or has
//! moved slowly for long. Where the link can say what of the message it
//! still reads, the send returns sooner, with a copy of the last packets
//! only ([`copies_tail`]).

use std::time::{Duration, Instant};

use barlink_transport::Stats;

/// Packets a message fills at least for a blocking send to read it in
/// place rather than copy it.
pub const LOAN_FROM_PACKETS: usize = 4;

/// A message that does not move (no new packet of it goes out, no
/// acknowledgement comes) is copied after about as long as copying it
/// takes, at this many bytes a nanosecond: a peer slow to answer costs a
/// send about twice its copy.
const QUIET_BYTES_PER_NS: u64 = 8;

/// The quiet wait's cap, for very long messages: below the engine's
/// shortest retransmission timeout, so that a lost packet's resend does
/// not make a send wait on it.
const QUIET_MAX: Duration = Duration::from_millis(10);

/// A message moving slower than this many bytes a nanosecond (a slow
/// network, a receiver that reads slowly) is copied once it has taken as
/// long as moving it at that speed would, as if it had been copied from
/// the start.
const MOVING_BYTES_PER_NS: u64 = 1;

/// Whether a blocking send that lent its bytes copies the `unacknowledged`
/// bytes at its message's end and returns, on a link whose packets carry
/// `max_payload` bytes: when they are no more than the last full packet and
/// the short one after it (what is left once the peer acknowledged the
/// packet before them, which `Engine::ack_before_tail` asks for).
/// Waiting instead costs the peer's check of those packets and the
/// acknowledgement's way back, idle on both sides; the copy costs less, and
/// the next message goes meanwhile.
pub fn copies_tail(unacknowledged: u64, max_payload: u64) -> bool {
    unacknowledged < max_payload.saturating_mul(2)
}

/// The shortest message a blocking send lends, on a link whose packets
/// carry `max_payload` bytes.
pub fn lend_from(max_payload: usize) -> usize {
    max_payload.saturating_mul(LOAN_FROM_PACKETS)
}

/// The wait of one blocking send whose bytes are lent: started when the
/// message was queued, it says when to stop waiting and copy.
#[derive(Debug, Clone)]
pub struct LoanWait {
    quiet: Duration,
    longest: Duration,
    started: Instant,
    quiet_since: Instant,
    last: Option<(u64, u64)>,
}

impl LoanWait {
    /// The wait for a lent message of `len` bytes, from `started`.
    pub fn new(len: usize, started: Instant) -> LoanWait {
        let quiet = Duration::from_nanos(len as u64 / QUIET_BYTES_PER_NS).min(QUIET_MAX);
        let moving = Duration::from_nanos(len as u64 / MOVING_BYTES_PER_NS);
        LoanWait {
            quiet,
            longest: moving.max(quiet),
            started,
            quiet_since: started,
            last: None,
        }
    }

    /// Whether the send should copy its bytes and return now, given the
    /// link's counters: its message has not moved (first sends of data
    /// packets, messages acknowledged; heartbeats and resends are not
    /// progress) for the quiet wait, or the wait has lasted its longest.
    pub fn should_copy(&mut self, stats: &Stats, now: Instant) -> bool {
        let seen = (
            stats.data_packets_sent.saturating_sub(stats.retransmits()),
            stats.messages_sent,
        );
        if self.last != Some(seen) {
            self.last = Some(seen);
            self.quiet_since = now;
        } else if now - self.quiet_since >= self.quiet {
            return true;
        }
        now - self.started >= self.longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_that_stops_moving_is_copied_after_its_quiet_wait() {
        let started = Instant::now();
        // 8 MiB: a quiet wait of about 1 ms, a longest of about 8 ms.
        let mut wait = LoanWait::new(8 << 20, started);
        let mut stats = Stats::default();
        assert!(!wait.should_copy(&stats, started));
        // Moving: a new packet at every look, well past the quiet wait.
        for step in 1..=7u64 {
            stats.data_packets_sent += 1;
            assert!(!wait.should_copy(&stats, started + Duration::from_millis(step)));
        }
        // Still for less than the quiet wait, then for more.
        let stalled = started + Duration::from_millis(7);
        assert!(!wait.should_copy(&stats, stalled + Duration::from_micros(500)));
        assert!(wait.should_copy(&stats, stalled + Duration::from_micros(1100)));
    }

    #[test]
    fn a_message_that_moves_slowly_is_copied_after_its_longest_wait() {
        let started = Instant::now();
        let mut wait = LoanWait::new(8 << 20, started);
        let mut stats = Stats::default();
        let mut now = started;
        while now - started < Duration::from_millis(8) {
            stats.messages_sent += 1;
            assert!(!wait.should_copy(&stats, now));
            now += Duration::from_micros(500);
        }
        stats.messages_sent += 1;
        assert!(wait.should_copy(&stats, started + Duration::from_millis(9)));
    }

    #[test]
    fn resends_are_not_progress() {
        let started = Instant::now();
        let mut wait = LoanWait::new(1 << 20, started);
        let mut stats = Stats {
            data_packets_sent: 8,
            ..Stats::default()
        };
        assert!(!wait.should_copy(&stats, started));
        // A resend counts as a data packet and as a retransmission.
        stats.data_packets_sent += 1;
        stats.retransmits_timeout += 1;
        assert!(wait.should_copy(&stats, started + Duration::from_millis(1)));
    }

    #[test]
    fn only_the_last_full_packet_and_the_short_one_after_it_are_copied() {
        let full = 130_992;
        assert!(copies_tail(0, full));
        assert!(
            copies_tail(full + 640, full),
            "one full packet and a short one"
        );
        assert!(copies_tail(2 * full - 1, full));
        assert!(!copies_tail(2 * full, full), "two full packets");
        assert!(!copies_tail(1 << 20, full));
    }

    #[test]
    fn short_messages_wait_briefly_and_long_ones_at_most_the_cap() {
        assert_eq!(lend_from(131_000), 524_000);
        let started = Instant::now();
        let mut long = LoanWait::new(1 << 30, started);
        let stats = Stats::default();
        assert!(!long.should_copy(&stats, started));
        assert!(long.should_copy(&stats, started + QUIET_MAX));
    }
}
