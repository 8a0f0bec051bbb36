//! The targets a combining receive (`collective::Receiving` with a
//! reduction) lends the link: ranges of its buffer that combine each
//! packet of the message they name as it arrives, and, until the link
//! knows the ids of the messages to come, chunk-sized scratch buffers
//! whose chunk is combined once it has arrived whole.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use barlink_transport::{MessageId, RecvTarget};

use crate::buffer::LentRange;
use crate::link::HeldView;
use crate::reduce::{self, Dtype, Op};

/// Fewest targets lent ahead, and most, whatever the chunk; and most
/// bytes of them.
pub const LEAST_LENT: usize = 8;
pub const MOST_LENT: usize = 256;
pub const MOST_LENT_BYTES: usize = 64 << 20;

/// Chunk-sized buffers that combining receives lend the link, kept for
/// reuse across exchanges so that a chunk lands in memory that is already
/// mapped and warm. One for the process, holding no more than can be lent
/// at once: `MOST_LENT` buffers, `MOST_LENT_BYTES` in all.
static SCRATCH: Mutex<ScratchPool> = Mutex::new(ScratchPool {
    kept: Vec::new(),
    bytes: 0,
});

struct ScratchPool {
    kept: Vec<Vec<u8>>,
    /// The kept buffers' capacities' total.
    bytes: usize,
}

/// A receive target of a combining receive: the chunk lands here, checked,
/// and is combined into the buffer from here. Back to `SCRATCH` when
/// dropped, by the receive or by the link.
pub struct Scratch(Vec<u8>);

impl Scratch {
    pub fn take(len: usize) -> Scratch {
        let mut pool = SCRATCH.lock().unwrap_or_else(PoisonError::into_inner);
        // One of this length if there is one: no bytes to zero.
        let found = pool.kept.iter().rposition(|bytes| bytes.len() == len);
        let mut bytes = match found {
            Some(index) => pool.kept.swap_remove(index),
            None => pool.kept.pop().unwrap_or_default(),
        };
        pool.bytes -= bytes.capacity();
        drop(pool);
        bytes.resize(len, 0);
        Scratch(bytes)
    }
}

impl RecvTarget for Scratch {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut pool = SCRATCH.lock().unwrap_or_else(PoisonError::into_inner);
        let capacity = self.0.capacity();
        if pool.kept.len() < MOST_LENT && pool.bytes + capacity <= MOST_LENT_BYTES {
            pool.bytes += capacity;
            pool.kept.push(std::mem::take(&mut self.0));
        }
    }
}

/// A range of a combining receive's buffer, lent to the link for the one
/// message it names: each packet of that message is combined into the
/// range as it arrives, checked, from the link's packet-sized buffer
/// (`RecvTarget::combines`), so the chunk is never written whole anywhere
/// else first. A packet may end inside an element: its bytes wait in
/// `carry` for the rest of the element.
pub struct CombiningRange {
    pub range: LentRange,
    pub id: MessageId,
    pub dtype: Dtype,
    pub op: Op,
    pub carry: [u8; 8],
    pub carried: usize,
    /// Bytes combined by every target of its half.
    pub folded: Arc<AtomicUsize>,
    /// Where the range's starting values are read from, if not from the
    /// range itself: a buffer and the offset in it of the range's start.
    /// Each byte is copied from there just before it is combined.
    pub base: Option<(Arc<HeldView>, usize)>,
}

impl RecvTarget for CombiningRange {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.range.bytes_mut()
    }

    fn combines(&self) -> Option<MessageId> {
        Some(self.id)
    }

    fn combine(&mut self, at: usize, bytes: &[u8]) {
        self.folded.fetch_add(bytes.len(), Ordering::Relaxed);
        let size = self.dtype.size();
        let (dtype, op) = (self.dtype, self.op);
        let target = self.range.bytes_mut();
        if let Some((base, offset)) = &self.base {
            // Before any of these bytes is combined: an element split
            // across calls has its first bytes copied by the call before.
            let span = at..at + bytes.len();
            let start = offset + at;
            target[span].copy_from_slice(base.range(start..start + bytes.len()));
        }
        let mut bytes = bytes;
        let mut at = at;
        if self.carried > 0 {
            let take = (size - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&bytes[..take]);
            self.carried += take;
            bytes = &bytes[take..];
            at += take;
            if self.carried < size {
                return;
            }
            let start = at - size;
            combined(&mut target[start..at], &self.carry[..size], dtype, op);
            self.carried = 0;
        }
        let whole = bytes.len() - bytes.len() % size;
        combined(&mut target[at..at + whole], &bytes[..whole], dtype, op);
        let rest = &bytes[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }
}

/// `reduce::combine` of lengths that are equal and whole elements by
/// construction.
fn combined(target: &mut [u8], bytes: &[u8], dtype: Dtype, op: Op) {
    reduce::combine(target, bytes, dtype, op).expect("whole elements of one length");
}
