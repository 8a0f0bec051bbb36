//! A link's requests: one per message the engine holds, oldest first,
//! marked with its outcome when the link hands its payload back, and
//! turned into completions in message order (the module comment of
//! `link` tells how).
#![forbid(unsafe_code)]

use super::LinkState;
use crate::payload::PayloadSource;
use crate::types::barlink_completion;
use crate::types::barlink_status::{BARLINK_LINK_FAILED, BARLINK_OK};

#[derive(Debug)]
pub(super) struct Request {
    pub(super) user_tag: u64,
    pub(super) len: u64,
    pub(super) source: PayloadSource,
    /// Posted (reported through poll/test) rather than sent blocking.
    pub(super) report: bool,
    /// A blocking send that lent its bytes waits for the outcome
    /// (`LinkState::loan_outcomes`).
    pub(super) awaited: bool,
    /// The link handed the payload back: whether the peer acknowledged
    /// the message.
    pub(super) returned: Option<bool>,
}

impl LinkState {
    /// Marks the requests whose payloads the link handed back with their
    /// outcome, and keeps the payloads' copies for later sends. Every
    /// collection of completions takes them first.
    pub(super) fn take_sent_back(&mut self) {
        let Some(sent_back) = self.link.as_mut().and_then(|link| link.sent_back_mut()) else {
            return;
        };
        while let Some(sent) = sent_back.pop_front() {
            let id = sent.id.0;
            // Requests are kept in the order of their ids, one per id: the
            // one is found by its distance from the first.
            let at = self.requests.front().and_then(|(first, _)| {
                let at = usize::try_from(id.checked_sub(*first)?).ok()?;
                match self.requests.get(at) {
                    Some((found, _)) if *found == id => Some(at),
                    _ => self.requests.binary_search_by_key(&id, |(id, _)| *id).ok(),
                }
            });
            debug_assert!(at.is_some(), "message {id} handed back without its request");
            if let Some(at) = at {
                self.requests[at].1.returned = Some(sent.acknowledged);
            }
            self.send_copies.give_back(sent.buf);
        }
    }

    /// Turns the requests whose payloads the link handed back (all of
    /// them once the link is gone), oldest first, into completions.
    pub(super) fn complete_returned(&mut self) {
        let link_gone = self.link.is_none();
        while let Some((_, front)) = self.requests.front() {
            let acknowledged = match front.returned {
                Some(acknowledged) => acknowledged,
                // Dropping the link dropped the payload unacknowledged.
                None if link_gone => false,
                None => break,
            };
            let (msg_id, request) = self.requests.pop_front().expect("checked above");
            let lent = request.source.was_lent();
            self.copies_held -= request.source.copy_bytes();
            self.send_copies.reclaim(request.source);
            let status = if acknowledged {
                self.message_bytes_sent += request.len;
                BARLINK_OK
            } else {
                self.any_failed = true;
                match &self.end {
                    Some((status, _)) => *status,
                    // A session ended without the link ending: the peer
                    // restarted.
                    None => BARLINK_LINK_FAILED,
                }
            };
            if lent && status == BARLINK_OK {
                self.messages_lent += 1;
            }
            if request.awaited {
                self.loan_outcomes.insert(msg_id, status);
            }
            if request.report {
                let id = msg_id + 1;
                self.done.insert(barlink_completion {
                    request: id,
                    user_tag: request.user_tag,
                    bytes: request.len,
                    status,
                    reserved: 0,
                });
            }
        }
    }

    /// Keeps the request of message `id` (`len` bytes, its payload's
    /// memory named by `source`), queued just now, until its completion:
    /// counted as copied and held where barlink made the copy, reported
    /// with `user_tag` if `report`, its outcome kept for the call that
    /// lent the bytes if they are lent.
    pub(super) fn keep_request(
        &mut self,
        id: u64,
        len: u64,
        source: PayloadSource,
        user_tag: u64,
        report: bool,
    ) {
        debug_assert!(
            self.requests.back().is_none_or(|(last, _)| *last < id),
            "the engine numbers messages in order"
        );
        self.messages_copied += u64::from(matches!(source, PayloadSource::Copy { .. }));
        self.copies_held += source.copy_bytes();
        let awaited = matches!(source, PayloadSource::Loan(_));
        self.requests.push_back((
            id,
            Request {
                user_tag,
                len,
                source,
                report,
                awaited,
                returned: None,
            },
        ));
    }
}
