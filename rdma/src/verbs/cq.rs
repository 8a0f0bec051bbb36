//! [`CompletionQueue`]: where finished work requests are reported, polled
//! without blocking or waited on with a bound.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::context::{Context, ContextInner};
use super::work_completion::WorkCompletion;
use crate::error::RdmaError;
use crate::sys;

pub(super) struct CqInner {
    pub(super) raw: NonNull<sys::ibv_cq>,
    depth: u32,
    pub(super) ctx: Arc<ContextInner>,
}

// SAFETY: a CQ may be polled from any thread (providers lock internally);
// destroyed once, in `drop`.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created in `create_cq`, destroyed once, after every QP
        // that uses it (each holds an `Arc` of this).
        unsafe { (self.ctx.v.destroy_cq)(self.raw.as_ptr()) };
    }
}

/// A completion queue: where finished work requests are reported. Poll it
/// with [`CompletionQueue::poll`] (never blocks) or
/// [`CompletionQueue::wait`] (bounded). Cheap to clone.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(super) inner: Arc<CqInner>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.inner.depth)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Creates a completion queue of at least `depth` entries (the device
    /// may round up). Give it room for every signaled send and every posted
    /// receive of the QPs that use it: an overflowing CQ kills them.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, RdmaError> {
        let cqe = c_int::try_from(depth.max(1)).map_err(|_| RdmaError::InvalidArgument {
            what: format!("CQ depth {depth} out of range"),
        })?;
        // SAFETY: the context is live; no completion channel, no context
        // pointer, vector 0; the CQ is destroyed in `CqInner::drop`.
        let raw = unsafe {
            (self.inner.v.create_cq)(
                self.inner.raw.as_ptr(),
                cqe,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_create_cq", sys::errno()))?;
        // SAFETY: the CQ was just created and is live.
        let actual = unsafe { (*raw.as_ptr()).cqe };
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                raw,
                depth: u32::try_from(actual).unwrap_or(depth),
                ctx: self.inner.clone(),
            }),
        })
    }
}

/// Completions fetched by one call into the provider.
const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// Entries the CQ holds (at least what was asked for).
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Moves up to `out.len()` finished work requests into `out`, returning
    /// how many; 0 when none are ready. Never blocks. Error completions are
    /// returned like others (check [`WorkCompletion::result`]); `Err` only
    /// when the poll itself failed.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, RdmaError> {
        let mut raw = [sys::ibv_wc::default(); POLL_BATCH];
        let mut filled = 0;
        // SAFETY: the CQ and its context are live (held by `self`).
        let poll_cq = unsafe { (*(*self.inner.raw.as_ptr()).context).ops.poll_cq }.ok_or(
            RdmaError::Unsupported {
                what: "the provider has no poll_cq".into(),
            },
        )?;
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: the CQ is live; `raw` has room for `want` entries of
            // the layout the provider writes.
            let n = unsafe { poll_cq(self.inner.raw.as_ptr(), want as c_int, raw.as_mut_ptr()) };
            // A negative return is a provider error code, not an errno
            // (mlx5 returns -2 for any failure): report EIO, not "ENOENT".
            let Ok(n) = usize::try_from(n) else {
                return Err(RdmaError::verbs("ibv_poll_cq", libc::EIO));
            };
            // The provider wrote at most `want` entries; a larger count
            // (a broken provider) must not index beyond them.
            let n = n.min(want);
            for (dst, wc) in out[filled..].iter_mut().zip(&raw[..n]) {
                *dst = WorkCompletion::from_raw(wc);
            }
            filled += n;
            if n < want {
                break;
            }
        }
        Ok(filled)
    }

    /// Polls until at least `min` completions (at most `out.len()`) are in
    /// `out` or `timeout` passes; returns how many. Spins briefly, then
    /// yields between polls. [`RdmaError::Timeout`] if fewer than `min`
    /// arrived (those that did are in `out`, and the error says how many).
    pub fn wait(
        &self,
        out: &mut [WorkCompletion],
        min: usize,
        timeout: Duration,
    ) -> Result<usize, RdmaError> {
        let min = min.min(out.len());
        let start = Instant::now();
        let mut got = 0;
        let mut idle = 0u32;
        loop {
            let n = self.poll(&mut out[got..])?;
            got += n;
            if got >= min {
                return Ok(got);
            }
            if n == 0 {
                idle += 1;
                if idle.is_multiple_of(64) {
                    if start.elapsed() >= timeout {
                        return Err(RdmaError::Timeout {
                            what: format!("{min} completions ({got} arrived)"),
                            after: timeout,
                        });
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}
