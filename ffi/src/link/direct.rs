//! The direct way of a send (a short blocking one, any posted one) and a
//! receive in place on a local (host-memory) ring link
//! (docs/ARCHITECTURE.md, design changes 85, 87 and 89): the answer to a
//! small message goes through the ring link's own calls,
//! with the C face's bookkeeping kept as a step keeps it but done once the
//! message is out, and a waiting receive keeps the link's lock across its
//! idle rounds until another call waits for it.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use barlink::connect::AnyLink;
use barlink_transport::engine::MessageId;

use super::{LinkCell, LinkState, Pace, Rounds, Step};
use crate::error::Result;
use crate::held::Lent;
use crate::payload::{Payload, PayloadSource};

/// Spins a receive that gave the lock up waits for the waiting call to
/// take it, before it yields the CPU instead (a woken thread takes some
/// microseconds to run).
const WAITER_SPINS: u32 = 4096;

/// Why a blocking receive in place lets go of the lock between rounds.
enum GiveWay {
    /// Its idle rounds reached the yield ([`Pace::Yield`]).
    Yield,
    /// Another call waits for the lock.
    ToWaiter,
    /// The round was a general step's (whether anything moved).
    AfterStep { moved: bool },
}

/// What a blocking receive in place's round found
/// ([`LinkState::recv_message_round`]).
enum RecvRound {
    Delivered(Lent),
    Idle,
    /// Something else is going on: a step of the general kind decides.
    Step,
}

impl LinkCell {
    /// A blocking receive in place, waiting at most `timeout` (zero: one
    /// round). While nothing but its wait is going on it keeps the lock
    /// across idle rounds, until another call waits for it, and lends the
    /// message a round delivers to the caller at once
    /// ([`LinkState::recv_message_round`]); otherwise it steps as
    /// [`LinkCell::blocking`] does. `give_back`, a message received in
    /// place before, is released under the first round's lock first (the
    /// Rust link's `recv_into` hands its last buffer back so, in one call),
    /// and `given_back` runs once it is (at once if there is none); a
    /// refused release returns before it runs.
    pub(crate) fn recv_message(
        &self,
        timeout: Duration,
        give_back: Option<Lent>,
        given_back: impl FnOnce(),
    ) -> Result<Lent> {
        let mut rounds = Rounds::new(timeout);
        let mut give_back = give_back;
        let mut given_back = Some(given_back);
        loop {
            let mut state = self.lock()?;
            if let Some(lent) = give_back.take() {
                state.release_message(lent)?;
            }
            if let Some(given_back) = given_back.take() {
                given_back();
            }
            let give_way = loop {
                let (moved, stepped) = match state.recv_message_round(!rounds.started()) {
                    RecvRound::Delivered(lent) => return Ok(lent),
                    // The loop a waiting receive spins in: the clock, the
                    // lock's waiters and the yield every few rounds only.
                    RecvRound::Idle if rounds.skip_idle() => {
                        std::hint::spin_loop();
                        continue;
                    }
                    RecvRound::Idle => (false, false),
                    RecvRound::Step => {
                        state.waiting = rounds.started();
                        let step = state.recv_message_step();
                        state.waiting = false;
                        match step? {
                            Step::Done(lent) => return Ok(lent),
                            Step::Again { moved } => (moved, true),
                        }
                    }
                };
                let pace = rounds.after(moved)?;
                if matches!(pace, Pace::Yield) {
                    break GiveWay::Yield;
                }
                if stepped {
                    // A general step: the lock is let go after it, as
                    // `blocking` lets it go.
                    break GiveWay::AfterStep { moved };
                }
                if self.lock_waiters.load(Ordering::Relaxed) != 0 {
                    break GiveWay::ToWaiter;
                }
                if matches!(pace, Pace::Spin) {
                    std::hint::spin_loop();
                }
            };
            drop(state);
            match give_way {
                GiveWay::Yield => std::thread::yield_now(),
                GiveWay::ToWaiter => {
                    #[cfg(test)]
                    self.gave_way.fetch_add(1, Ordering::Relaxed);
                    self.let_waiter_in();
                }
                GiveWay::AfterStep { moved: false } => std::hint::spin_loop(),
                GiveWay::AfterStep { moved: true } => {}
            }
        }
    }

    /// Waits, briefly, until a call that waited for the lock has it: the
    /// mutex is not fair, and a receive that locks again at once would
    /// keep it from the other call.
    fn let_waiter_in(&self) {
        for _ in 0..WAITER_SPINS {
            if self.lock_waiters.load(Ordering::Relaxed) == 0 {
                return;
            }
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
}

impl LinkState {
    /// One round of a blocking receive in place while nothing but its
    /// wait is going on (no message delivered already, no receive
    /// posted, a ring link, open): the message the round delivered, lent
    /// to the caller at once; `Idle` when nothing moved. Completions the
    /// round brought, and whether the link ended after the message, are
    /// the next step's questions, which usually runs after the caller's
    /// answer went out. Anything else needs a step ([`RecvRound::Step`]).
    fn recv_message_round(&mut self, fresh: bool) -> RecvRound {
        if !self.received.is_empty() || !self.recvs.is_empty() {
            return RecvRound::Step;
        }
        // The ring link's own calls, not the four-way ones of
        // `Connection`: the answer's way through them is shorter.
        let Some(AnyLink::HostBounce(ring)) = self.link.as_mut().map(|link| &mut link.link) else {
            return RecvRound::Step;
        };
        // An error is kept in the link: the step's round meets it again
        // and its bookkeeping learns why the link ended.
        let Ok(moved) = ring.progress_waiting(fresh, true) else {
            return RecvRound::Step;
        };
        if let Some(delivery) = ring.take_delivery() {
            self.message_bytes_received += delivery.len() as u64;
            return RecvRound::Delivered(self.hold(delivery));
        }
        if moved || ring.has_sent_back() || ring.check_open().is_err() {
            // Completions (payloads handed back hold memory until they are
            // taken: a registered range's send, a copy), or an end: a step
            // collects them (its round finds what this one moved already).
            return RecvRound::Step;
        }
        RecvRound::Idle
    }

    /// A short send of `data` copied and queued at once by
    /// [`LinkState::queue_direct`]: a blocking one, or a posted one
    /// (`posted`: its user tag) whose completion is reported. The message
    /// id, or `None` when the general way must take it (a link of another
    /// medium, a copy past `send_queue_bytes`, bytes a blocking send
    /// would lend, a full queue for a blocking send), with nothing sent
    /// (completions may have been collected). A post that finds the queue
    /// full goes on the general way with the copy it made, which gives
    /// `BARLINK_WOULD_BLOCK` and keeps the copy for the retry.
    pub(crate) fn send_copy_direct(
        &mut self,
        data: &[u8],
        posted: Option<u64>,
    ) -> Result<Option<u64>> {
        if !self.ready_for_direct_send() {
            return Ok(None);
        }
        self.check_len(data.len())?;
        if posted.is_none() && self.lends(data) {
            return Ok(None);
        }
        if !self.copy_fits(data.len()) {
            // Acknowledgements counted since may make room.
            self.collect(None);
            if !self.copy_fits(data.len()) {
                return Ok(None);
            }
        }
        let (payload, source) = self.copy_payload(data)?;
        match self.queue_direct(payload, source, posted.unwrap_or(0), posted.is_some()) {
            Ok(id) => Ok(Some(id)),
            Err((payload, source)) => match posted {
                Some(user_tag) => self.post_queued(payload, source, user_tag).map(Some),
                None => {
                    self.keep_unsent(payload, source);
                    Ok(None)
                }
            },
        }
    }

    /// Whether a send may take [`LinkState::queue_direct`]: a ring link,
    /// open.
    pub(crate) fn ready_for_direct_send(&self) -> bool {
        let open = match self.link.as_ref().map(|link| &link.link) {
            Some(AnyLink::HostBounce(ring)) => ring.check_open().is_ok(),
            _ => false,
        };
        // The general way learns why, or waits as it does.
        open && self.end.is_none()
    }

    /// Queues a send's payload (whose memory `source` names) on a ring link
    /// through the ring link's own calls and writes what the ring takes of
    /// it in one round,
    /// then keeps its request as [`LinkState::try_send`] keeps it (a
    /// posted one `report`s its completion with `user_tag`) and collects
    /// what earlier rounds completed. The message id, or the payload back
    /// when the queue is full or the link is not a ring link or is closing
    /// (the general way then waits, or learns why).
    pub(crate) fn queue_direct(
        &mut self,
        payload: Payload,
        source: PayloadSource,
        user_tag: u64,
        report: bool,
    ) -> std::result::Result<u64, (Payload, PayloadSource)> {
        let Some(AnyLink::HostBounce(ring)) = self.link.as_mut().map(|link| &mut link.link) else {
            return Err((payload, source));
        };
        let len = payload.as_ref().len() as u64;
        let id = match ring.send(payload) {
            Ok(MessageId(id)) => id,
            Err(error) => return Err((error.into_buf(), source)),
        };
        // Out first: the bookkeeping waits until the peer has the message.
        // A round that failed, or that found the link ended (a close or a
        // lost peer, which fail what was queued), ends it here as a step
        // would, so that every request fails with why.
        let ended = ring.progress().err().or_else(|| ring.check_open().err());
        self.keep_request(id, len, source, user_tag, report);
        // The message is queued either way: an end fails it through its
        // request. Completions earlier rounds brought are collected now,
        // so that their copies come back for reuse; an end keeps what was
        // delivered before it and settles the posted receives, as a step
        // does.
        if ended.is_some() {
            self.keep_delivered();
            self.collect(ended);
            self.settle_recvs();
        } else {
            self.collect(None);
        }
        Ok(id)
    }
}
