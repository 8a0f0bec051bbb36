//! [`HeapWindow`]: a window in this process's own memory, for tests and for
//! links between threads.
//!
//! It behaves as a shared-memory window does (page-aligned, zeroed, the same
//! checks), so a link tested over it behaves the same over shared memory.

use super::mapping::Mapping;
use super::{WindowError, window_over_mapping};

/// A zeroed, page-aligned window on the heap. Share it between threads with
/// an `Arc`.
#[derive(Debug)]
pub struct HeapWindow {
    mapping: Mapping,
}

impl HeapWindow {
    /// A zeroed window of `len` bytes (at least 1).
    pub fn new(len: usize) -> Result<HeapWindow, WindowError> {
        Ok(HeapWindow {
            mapping: Mapping::zeroed_heap(len)?,
        })
    }
}

window_over_mapping!(HeapWindow);
