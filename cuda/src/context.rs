//! A device's primary context: what every allocation and copy runs in.
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::device::Device;
use crate::error::CudaError;
use crate::memory::{DeviceBuffer, IpcHandle, PinnedBuffer};
use crate::sys::CUcontext;

/// A retained primary context. Clones share it; the last one releases it.
/// Every call through it first makes it current on the calling thread, so
/// buffers may be used from any thread.
#[derive(Clone, Debug)]
pub struct Context {
    inner: Arc<Retained>,
}

#[derive(Debug)]
struct Retained {
    device: Device,
    raw: CUcontext,
}

// SAFETY: a CUcontext is a handle the driver allows any thread to make
// current and use; the driver serialises what it must inside.
unsafe impl Send for Retained {}
// SAFETY: as above: no call through a shared `Retained` mutates it.
unsafe impl Sync for Retained {}

impl Drop for Retained {
    fn drop(&mut self) {
        let api = self.device.cuda.api;
        // SAFETY: releases the retain taken in `retain_primary`, once.
        let rc = unsafe { (api.primary_ctx_release)(self.device.handle) };
        if let Err(e) = api.check("cuDevicePrimaryCtxRelease_v2", rc) {
            tracing::warn!("releasing the primary context: {e}");
        }
    }
}

impl Context {
    pub(crate) fn retain_primary(device: Device) -> Result<Context, CudaError> {
        let api = device.cuda.api;
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle for a valid device.
        api.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut raw, device.handle)
        })?;
        Ok(Context {
            inner: Arc::new(Retained { device, raw }),
        })
    }

    /// The device this context belongs to.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Makes this context current on the calling thread (cheap when it
    /// already is).
    pub fn make_current(&self) -> Result<(), CudaError> {
        let api = self.inner.device.cuda.api;
        // SAFETY: the context is retained for as long as `self` lives.
        api.check("cuCtxSetCurrent", unsafe {
            (api.ctx_set_current)(self.inner.raw)
        })
    }

    /// Waits for all work in this context to finish.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.make_current()?;
        let api = self.inner.device.cuda.api;
        // SAFETY: no arguments; the context is current.
        api.check("cuCtxSynchronize", unsafe { (api.ctx_synchronize)() })
    }

    /// `len` bytes of device memory (contents undefined until written).
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer, CudaError> {
        DeviceBuffer::alloc(self.clone(), len)
    }

    /// `len` bytes of page-locked host memory, zeroed, that the copy
    /// engines reach directly.
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, CudaError> {
        PinnedBuffer::alloc(self.clone(), len)
    }

    /// Device memory another process exported with
    /// [`DeviceBuffer::ipc_handle`], mapped into this one.
    pub fn open_ipc(&self, handle: &IpcHandle, len: usize) -> Result<DeviceBuffer, CudaError> {
        DeviceBuffer::open_ipc(self.clone(), handle, len)
    }
}
