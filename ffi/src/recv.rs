//! Posted receives (`barlink_post_recv`): caller buffers lent to the link
//! until their completion is reported, matched with delivered messages in
//! the order they were posted.
//!
//! While no delivered message waits, every pending receive's buffer is
//! posted to the link in order, so the messages that come next land in
//! them with no copy after the checked one out of the ring. Once the link
//! knows the messages' ids, each buffer names the one message it takes
//! (the next not yet received, and so on down the line): a message that
//! arrived elsewhere (it began before its buffer was posted) is copied into
//! its receive's buffer, which comes back from the link alone, and the
//! later ones stay posted for their own. Without names (before the link's
//! first message), or when the first message is larger than its buffer,
//! every buffer comes back from the link first, so that nothing lands in
//! one out of turn; they are posted again once nothing waits.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use barlink::Connection;
use barlink_transport::engine::{Delivery, PostId};
use barlink_transport::{MessageId, RecvTarget};

use crate::completions::Completions;
use crate::payload::{CallerMemory, Payload};
use crate::types::barlink_completion;
use crate::types::barlink_status::{self, BARLINK_BUFFER_TOO_SMALL, BARLINK_CANCELED, BARLINK_OK};

/// Set in every receive request's id: sends' ids are message numbers, so
/// the two never meet.
pub(crate) const RECV_REQUEST: u64 = 1 << 63;

#[derive(Debug)]
struct Pending {
    request: u64,
    user_tag: u64,
    /// The caller's buffer, for copying into when the link does not hold
    /// it (`post` is `None`).
    memory: CallerMemory,
    capacity: usize,
    /// Posted to the link under this id.
    post: Option<PostId>,
    /// The message the posted buffer takes, if it names one.
    names: Option<MessageId>,
}

/// The receives posted on one link and not yet completed, oldest first.
#[derive(Debug, Default)]
pub(crate) struct PostedRecvs {
    pending: VecDeque<Pending>,
    next: u64,
    /// Receives completed by a message assembled in their own buffer,
    /// with no copy after the checked one (`barlink_stats`).
    landed: u64,
}

impl PostedRecvs {
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Receives whose message landed in their buffer as it arrived.
    pub(crate) fn landed(&self) -> u64 {
        self.landed
    }

    pub(crate) fn contains(&self, request: u64) -> bool {
        // Ids grow as receives are added, and the line keeps their order.
        self.pending
            .binary_search_by_key(&request, |p| p.request)
            .is_ok()
    }

    /// Adds a receive into `memory` (`capacity` bytes); returns its
    /// request id. It is posted to the link by the next
    /// [`PostedRecvs::settle`].
    pub(crate) fn add(&mut self, memory: CallerMemory, capacity: usize, user_tag: u64) -> u64 {
        self.next += 1;
        let request = RECV_REQUEST | self.next;
        self.pending.push_back(Pending {
            request,
            user_tag,
            memory,
            capacity,
            post: None,
            names: None,
        });
        request
    }

    /// Completes every pending receive that a delivered message is for,
    /// in order, then posts the buffers of the rest to the link if no
    /// delivered message waits.
    pub(crate) fn settle(
        &mut self,
        mut link: Option<&mut Connection<Payload>>,
        received: &mut VecDeque<Delivery>,
        done: &mut Completions,
    ) {
        while let (Some(first), Some(delivery)) = (self.pending.front(), received.front()) {
            let landed_here =
                matches!(delivery, Delivery::Landed { recv, .. } if Some(recv.id()) == first.post);
            if landed_here {
                let len = received.pop_front().map_or(0, |d| d.len());
                let first = self.pending.pop_front().expect("checked above");
                self.landed += 1;
                complete(done, &first, BARLINK_OK, len);
                continue;
            }
            // It arrived elsewhere. A buffer naming it waited in vain and
            // comes back alone (nothing else lands in it); else every buffer
            // comes back first, so that nothing lands in one out of turn
            // while this one is filled.
            let len = delivery.len();
            if len <= first.capacity && first.names == Some(delivery.id()) {
                if let Some(id) = self.pending.front_mut().and_then(|p| p.post.take()) {
                    reclaim(link.as_deref_mut(), received, id);
                }
            } else {
                self.take_back_all(link.as_deref_mut(), received);
            }
            let mut first = self.pending.pop_front().expect("checked above");
            if len > first.capacity {
                // The message stays first in line for the next receive.
                complete(done, &first, BARLINK_BUFFER_TOO_SMALL, len);
                continue;
            }
            match received.pop_front().expect("checked above") {
                Delivery::Message { data, .. } => {
                    first.memory.bytes_mut()[..len].copy_from_slice(&data);
                    if let Some(link) = link.as_deref_mut() {
                        link.recycle(data);
                    }
                }
                // Another buffer's (a barlink_recv call in progress on
                // another thread): read out before writing this one.
                Delivery::Landed { recv, .. } => {
                    let bytes = recv.into_target().bytes_mut()[..len].to_vec();
                    first.memory.bytes_mut()[..len].copy_from_slice(&bytes);
                }
            }
            complete(done, &first, BARLINK_OK, len);
        }
        if !received.is_empty() {
            return;
        }
        if let Some(link) = link {
            // Buffers are posted in order and taken back all at once (or
            // the first alone, as it completes): those not posted are the
            // last ones, found from the back without walking the line.
            let first_unposted = self
                .pending
                .iter()
                .rposition(|p| p.post.is_some())
                .map_or(0, |at| at + 1);
            debug_assert!(
                self.pending
                    .range(..first_unposted)
                    .all(|p| p.post.is_some())
            );
            if first_unposted == self.pending.len() {
                return;
            }
            // The buffers still posted name the messages before these.
            let next = link.next_message_id();
            for (ahead, pending) in self.pending.iter_mut().enumerate().skip(first_unposted) {
                pending.names = next.map(|MessageId(id)| MessageId(id.wrapping_add(ahead as u64)));
                let target = Box::new(pending.memory.naming(pending.names));
                pending.post = Some(link.post_recv(target));
            }
        }
    }

    /// Takes every posted buffer back from the link (and out of the
    /// delivered messages: one that landed there is copied out, keeping
    /// its place).
    fn take_back_all(
        &mut self,
        mut link: Option<&mut Connection<Payload>>,
        received: &mut VecDeque<Delivery>,
    ) {
        for pending in &mut self.pending {
            if let Some(id) = pending.post.take() {
                reclaim(link.as_deref_mut(), received, id);
            }
        }
    }

    /// Cancels pending receive `request`: every buffer comes back from the
    /// link (a message that began landing in one goes on in the link's
    /// memory, whole, for the next receive), and the receive completes
    /// with `BARLINK_CANCELED`; the next [`PostedRecvs::settle`] posts the
    /// rest again, in order. False if no pending receive has that id.
    pub(crate) fn cancel(
        &mut self,
        link: Option<&mut Connection<Payload>>,
        received: &mut VecDeque<Delivery>,
        done: &mut Completions,
        request: u64,
    ) -> bool {
        let Some(at) = self.pending.iter().position(|p| p.request == request) else {
            return false;
        };
        self.take_back_all(link, received);
        let cancelled = self.pending.remove(at).expect("found above");
        complete(done, &cancelled, BARLINK_CANCELED, 0);
        true
    }

    /// The link ended with `status`: every receive still pending completes
    /// with it (messages delivered before the end were matched first).
    pub(crate) fn fail_all(&mut self, status: barlink_status, done: &mut Completions) {
        for pending in self.pending.drain(..) {
            complete(done, &pending, status, 0);
        }
    }
}

fn complete(done: &mut Completions, pending: &Pending, status: barlink_status, bytes: usize) {
    done.insert(barlink_completion {
        request: pending.request,
        user_tag: pending.user_tag,
        bytes: bytes as u64,
        status,
        reserved: 0,
    });
}

/// Takes posted buffer `id` back from the link, and out of the delivered
/// messages: one that landed there and was not taken is copied out and
/// keeps its place. Afterwards barlink never writes that buffer again.
pub(crate) fn reclaim(
    link: Option<&mut Connection<Payload>>,
    received: &mut VecDeque<Delivery>,
    id: PostId,
) {
    if let Some(link) = link
        && link.unpost_recv(id).is_some()
    {
        return;
    }
    for delivery in received.iter_mut() {
        let landed_here = matches!(delivery, Delivery::Landed { recv, .. } if recv.id() == id);
        if !landed_here {
            continue;
        }
        let placeholder = Delivery::Message {
            id: delivery.id(),
            data: Vec::new(),
        };
        if let Delivery::Landed { id: msg, recv, len } = std::mem::replace(delivery, placeholder) {
            let data = recv.into_target().bytes_mut()[..len].to_vec();
            *delivery = Delivery::Message { id: msg, data };
        }
        return;
    }
}
