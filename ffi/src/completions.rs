//! Completions due to the caller (`barlink_poll`, `barlink_test`,
//! `barlink_wait`, `barlink_wait_completion`), by request id.
//!
//! Sends complete in the order they were posted, and so do receives
//! (but for a cancelled one), so each kind is a queue kept in id order:
//! a completion is appended and taken from the front, with no node to
//! allocate or tree to walk per message, which a stream of posted sends
//! feels. One taken out of turn (`barlink_test` of a later request) is
//! found by binary search.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::recv::RECV_REQUEST;
use crate::types::barlink_completion;

/// Completions not yet reported, sends' and receives' apart, each in
/// request id order.
#[derive(Debug, Default)]
pub(crate) struct Completions {
    sends: VecDeque<barlink_completion>,
    recvs: VecDeque<barlink_completion>,
}

impl Completions {
    fn queue(&self, request: u64) -> &VecDeque<barlink_completion> {
        if request & RECV_REQUEST == 0 {
            &self.sends
        } else {
            &self.recvs
        }
    }

    fn queue_mut(&mut self, request: u64) -> &mut VecDeque<barlink_completion> {
        if request & RECV_REQUEST == 0 {
            &mut self.sends
        } else {
            &mut self.recvs
        }
    }

    fn find(&self, request: u64) -> Result<usize, usize> {
        let queue = self.queue(request);
        // A caller waiting for its requests in turn asks for the oldest.
        if queue.front().is_some_and(|first| first.request == request) {
            return Ok(0);
        }
        queue.binary_search_by_key(&request, |completion| completion.request)
    }

    /// Adds `completion`, due for its request; a request completes once.
    pub(crate) fn insert(&mut self, completion: barlink_completion) {
        let queue = self.queue_mut(completion.request);
        if queue
            .back()
            .is_none_or(|last| last.request < completion.request)
        {
            queue.push_back(completion);
            return;
        }
        match self.find(completion.request) {
            Ok(at) => {
                debug_assert!(false, "request {} completed twice", completion.request);
                self.queue_mut(completion.request)[at] = completion;
            }
            Err(at) => self.queue_mut(completion.request).insert(at, completion),
        }
    }

    pub(crate) fn contains(&self, request: u64) -> bool {
        self.find(request).is_ok()
    }

    /// Takes `request`'s completion, if it is due.
    pub(crate) fn remove(&mut self, request: u64) -> Option<barlink_completion> {
        let at = self.find(request).ok()?;
        self.queue_mut(request).remove(at)
    }

    /// Takes the due completion with the lowest id: sends' before
    /// receives'.
    pub(crate) fn pop_first(&mut self) -> Option<barlink_completion> {
        self.sends.pop_front().or_else(|| self.recvs.pop_front())
    }

    pub(crate) fn len(&self) -> usize {
        self.sends.len() + self.recvs.len()
    }

    pub(crate) fn clear(&mut self) {
        self.sends.clear();
        self.recvs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::barlink_status::BARLINK_OK;

    fn completion(request: u64) -> barlink_completion {
        barlink_completion {
            request,
            user_tag: request ^ 0xff,
            bytes: 0,
            status: BARLINK_OK,
            reserved: 0,
        }
    }

    #[test]
    fn completions_come_out_lowest_id_first_whatever_order_they_came_in() {
        let mut done = Completions::default();
        for request in [3, RECV_REQUEST | 2, 1, 7, RECV_REQUEST | 1, 5] {
            done.insert(completion(request));
        }
        assert_eq!(done.len(), 6);
        let order: Vec<u64> = std::iter::from_fn(|| done.pop_first())
            .map(|c| c.request)
            .collect();
        assert_eq!(order, [1, 3, 5, 7, RECV_REQUEST | 1, RECV_REQUEST | 2]);
        assert_eq!(done.len(), 0);
    }

    #[test]
    fn one_completion_is_taken_out_of_turn_and_only_once() {
        let mut done = Completions::default();
        for request in [1, 2, 3, RECV_REQUEST | 4] {
            done.insert(completion(request));
        }
        assert!(done.contains(2));
        assert!(!done.contains(4), "a send's id is not a receive's");
        let taken = done.remove(2).expect("due");
        assert_eq!((taken.request, taken.user_tag), (2, 2 ^ 0xff));
        assert!(done.remove(2).is_none());
        assert!(!done.contains(2));
        assert_eq!(
            done.remove(RECV_REQUEST | 4).map(|c| c.request),
            Some(RECV_REQUEST | 4)
        );
        assert_eq!(done.pop_first().map(|c| c.request), Some(1));
        assert_eq!(done.pop_first().map(|c| c.request), Some(3));
        assert!(done.pop_first().is_none());
    }
}
