//! The copy a chain's first step makes into its `send_buf` from `fill`,
//! a chunk at a time, as the chunks go (see `Exchange::chain`).
#![forbid(unsafe_code)]

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::{BufferView, Graveyard};
use crate::link::Link;

/// A sending half's bytes still to be copied into its buffer: each chunk
/// is copied just before it is queued, once the link has sent what was
/// queued before it, so that the link reads it from the cache. Copied
/// whole up front, a buffer larger than the cache would be read back from
/// memory by the link.
#[derive(Debug)]
pub(super) struct Fill {
    /// Both views are `Option` only so that `drop` can hand them to the
    /// graveyard: the half may be dropped without the GIL.
    source: Option<BufferView>,
    /// The sending half's buffer, writable.
    buffer: Option<BufferView>,
    /// Bytes copied so far (a chunk the link's queue had no room for is
    /// not copied again).
    copied: usize,
    graveyard: Arc<Graveyard>,
}

impl Fill {
    /// Copies `range` from the source into the buffer, unless it was.
    pub(super) fn copy(&mut self, range: std::ops::Range<usize>) {
        if range.end <= self.copied {
            return;
        }
        if let (Some(source), Some(buffer)) = (&self.source, &mut self.buffer) {
            buffer
                .range_mut(range.clone())
                .copy_from_slice(source.range(range.clone()));
        }
        self.copied = range.end;
    }

    pub(super) fn source_span(&self) -> std::ops::Range<usize> {
        self.source.as_ref().map_or(0..0, BufferView::span)
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        for view in [self.source.take(), self.buffer.take()]
            .into_iter()
            .flatten()
        {
            self.graveyard.bury(view);
        }
    }
}

/// The copy a chain's first step makes from `fill` into its `send_buf`.
pub(super) fn filling(
    fill: &Bound<'_, PyAny>,
    send_buf: &Bound<'_, PyAny>,
    link: &Link,
) -> PyResult<Fill> {
    let source = BufferView::get(fill, false)?;
    let buffer = BufferView::get(send_buf, true)?;
    if source.len() != buffer.len() {
        return Err(PyValueError::new_err(format!(
            "fill has {} bytes, the first step's send_buf {}: give as many",
            source.len(),
            buffer.len()
        )));
    }
    Ok(Fill {
        source: Some(source),
        buffer: Some(buffer),
        copied: 0,
        graveyard: link.shared().graveyard.clone(),
    })
}
