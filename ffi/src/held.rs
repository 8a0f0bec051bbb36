//! Messages received in place (`barlink_recv_message`): the engine's
//! buffer itself is handed to the caller, who reads it where it lies and
//! gives it back with `barlink_release_message`. This is the Rust link's
//! receive (a `Vec` taken, then recycled) for C: no copy after the checked
//! one out of the ring.
//!
//! Each held message is identified by an id the caller passes back with
//! the address and length it was given, so a release of something never
//! handed out, or handed out by another link, is refused rather than
//! freeing the wrong memory.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::types::barlink_message;

/// The messages a link's caller holds, by id: in the order they were
/// handed out, which is the order of their ids. A receiver usually gives
/// each back before or with the next (the first is the one), and holds
/// few at a time: a search among them costs less than a hash.
#[derive(Debug, Default)]
pub(crate) struct HeldMessages {
    messages: VecDeque<(u64, Vec<u8>)>,
    next_id: u64,
}

/// What the caller is told of a held message: where it lies (a pointer
/// the caller may read through, not merely an address), its length, and
/// its id. On the way back only the address is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lent {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) id: u64,
}

/// What the caller passes back describes the message it was lent.
impl From<barlink_message> for Lent {
    fn from(message: barlink_message) -> Lent {
        Lent {
            ptr: message.data.cast(),
            len: message.len,
            id: message.id,
        }
    }
}

/// What the caller is told of a message lent to it.
impl From<Lent> for barlink_message {
    fn from(lent: Lent) -> barlink_message {
        barlink_message {
            data: lent.ptr.cast(),
            len: lent.len,
            id: lent.id,
        }
    }
}

impl HeldMessages {
    /// Hands `data` to the caller. Its heap buffer does not move while
    /// held (the `Vec` moves, its allocation does not).
    pub(crate) fn hold(&mut self, data: Vec<u8>) -> Lent {
        self.next_id += 1;
        let lent = Lent {
            ptr: data.as_ptr(),
            len: data.len(),
            id: self.next_id,
        };
        self.messages.push_back((lent.id, data));
        lent
    }

    /// Takes back the message the caller describes, if this link lent it
    /// exactly so.
    pub(crate) fn release(&mut self, lent: Lent) -> Result<Vec<u8>> {
        let at = match self.messages.front() {
            Some((first, _)) if *first == lent.id => Some(0),
            _ => self
                .messages
                .binary_search_by_key(&lent.id, |(id, _)| *id)
                .ok(),
        };
        let matches = at.is_some_and(|at| {
            let data = &self.messages[at].1;
            data.as_ptr().addr() == lent.ptr.addr() && data.len() == lent.len
        });
        match at {
            Some(at) if matches => Ok(self.messages.remove(at).expect("found above").1),
            _ => Err(Error::invalid(format!(
                "message {} ({} bytes) is not held from this link: released already, or from another link",
                lent.id, lent.len
            ))),
        }
    }

    /// How many the caller holds.
    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_comes_back_once_and_only_as_lent() {
        let mut held = HeldMessages::default();
        let first = held.hold(vec![1, 2, 3]);
        let second = held.hold(Vec::new());
        assert_ne!(first.id, second.id);
        assert_eq!(held.len(), 2);
        let wrong_len = Lent { len: 2, ..first };
        assert!(held.release(wrong_len).is_err());
        let wrong_addr = Lent {
            ptr: first.ptr.wrapping_add(1),
            ..first
        };
        assert!(held.release(wrong_addr).is_err());
        assert_eq!(held.release(first).unwrap(), vec![1, 2, 3]);
        let again = held.release(first).unwrap_err();
        assert!(
            format!("{again:?}").contains("released already"),
            "{again:?}"
        );
        assert_eq!(held.release(second).unwrap(), Vec::<u8>::new());
        assert_eq!(held.len(), 0);
    }

    #[test]
    fn messages_come_back_in_any_order() {
        let mut held = HeldMessages::default();
        let lent: Vec<Lent> = (0..6u8).map(|n| held.hold(vec![n; 4])).collect();
        for &at in &[3, 0, 5, 1, 4, 2] {
            assert_eq!(held.release(lent[at]).unwrap(), vec![at as u8; 4]);
            assert!(held.release(lent[at]).is_err(), "released twice");
        }
        assert_eq!(held.len(), 0);
        let later = held.hold(vec![9]);
        assert!(later.id > lent[5].id, "ids keep growing");
        assert!(held.release(lent[2]).is_err());
        assert_eq!(held.release(later).unwrap(), vec![9]);
    }
}
