//! [`ProtectionDomain`]: the scope within which queue pairs may use memory
//! regions.
#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::context::{Context, ContextInner};
use crate::error::RdmaError;
use crate::sys;

pub(super) struct PdInner {
    pub(super) raw: NonNull<sys::ibv_pd>,
    pub(super) ctx: Arc<ContextInner>,
}

// SAFETY: a PD is usable from any thread; freed once, in `drop`.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc_pd`, freed once, after every QP and
        // region of it (each holds an `Arc` of this).
        unsafe { (self.ctx.v.dealloc_pd)(self.raw.as_ptr()) };
    }
}

/// A protection domain (`ibv_alloc_pd`): create QPs and register memory
/// in it. Cheap to clone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(super) inner: Arc<PdInner>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Allocates a protection domain: the scope within which QPs may use
    /// memory regions. One per connection group is typical.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, RdmaError> {
        // SAFETY: the context is live; the PD is freed in `PdInner::drop`.
        let raw = unsafe { (self.inner.v.alloc_pd)(self.inner.raw.as_ptr()) };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_alloc_pd", sys::errno()))?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                raw,
                ctx: self.inner.clone(),
            }),
        })
    }
}

impl ProtectionDomain {
    /// Tells domains apart while this one lives (its address).
    pub(super) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.inner.ctx.name
    }
}
