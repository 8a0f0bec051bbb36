//! Device buffers and pinned host buffers. Device memory is never seen as
//! a Rust reference: it is read and written only by driver copies.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

use crate::context::Context;
use crate::error::{CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED, CudaError};
use crate::sys::{
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, CUdeviceptr,
    CUipcMemHandle,
};

/// How a device buffer's memory came to this process, and so how it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// `cuMemAlloc`: freed with `cuMemFree`.
    Allocated,
    /// `cuIpcOpenMemHandle`: unmapped with `cuIpcCloseMemHandle`.
    Imported,
}

/// A range of device memory, freed (or unmapped) on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    context: Context,
    address: CUdeviceptr,
    len: usize,
    origin: Origin,
}

/// The 64 bytes another process opens a device buffer by
/// ([`Context::open_ipc`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpcHandle(..)")
    }
}

impl DeviceBuffer {
    pub(crate) fn alloc(context: Context, len: usize) -> Result<DeviceBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::OutOfBounds {
                what: "a device buffer of 0 bytes".to_string(),
            });
        }
        context.make_current()?;
        let api = context.device().cuda.api;
        let mut address: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; the context is current.
        api.check("cuMemAlloc_v2", unsafe {
            (api.mem_alloc)(&mut address, len)
        })?;
        Ok(DeviceBuffer {
            context,
            address,
            len,
            origin: Origin::Allocated,
        })
    }

    pub(crate) fn open_ipc(
        context: Context,
        handle: &IpcHandle,
        len: usize,
    ) -> Result<DeviceBuffer, CudaError> {
        context.make_current()?;
        let api = context.device().cuda.api;
        let mut address: CUdeviceptr = 0;
        let raw = CUipcMemHandle {
            reserved: handle.0.map(|b| b as std::ffi::c_char),
        };
        // SAFETY: writes one device pointer; the handle is passed by value
        // as cuda.h declares.
        let rc = unsafe {
            (api.ipc_open_mem_handle)(&mut address, raw, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        api.check("cuIpcOpenMemHandle_v2", rc)?;
        Ok(DeviceBuffer {
            context,
            address,
            len,
            origin: Origin::Imported,
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a device buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device address (for reports and for handing to other APIs).
    pub fn device_address(&self) -> u64 {
        self.address
    }

    /// The context it lives in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    fn range(&self, offset: usize, len: usize, what: &str) -> Result<CUdeviceptr, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.address + offset as u64),
            _ => Err(CudaError::OutOfBounds {
                what: format!(
                    "{what} of {len} bytes at offset {offset} in a {} byte device buffer",
                    self.len
                ),
            }),
        }
    }

    /// Copies `source` to `offset` (a copy-engine transfer; returns when
    /// `source` may be reused).
    pub fn write(&self, offset: usize, source: &[u8]) -> Result<(), CudaError> {
        let at = self.range(offset, source.len(), "a write")?;
        if source.is_empty() {
            return Ok(());
        }
        self.context.make_current()?;
        let api = self.context.device().cuda.api;
        // SAFETY: `at..at+len` is inside this allocation (checked above);
        // `source` is readable host memory of that length.
        api.check("cuMemcpyHtoD_v2", unsafe {
            (api.memcpy_htod)(at, source.as_ptr().cast::<c_void>(), source.len())
        })
    }

    /// Copies `destination.len()` bytes from `offset` into `destination`
    /// (returns when they are there).
    pub fn read(&self, offset: usize, destination: &mut [u8]) -> Result<(), CudaError> {
        let at = self.range(offset, destination.len(), "a read")?;
        if destination.is_empty() {
            return Ok(());
        }
        self.context.make_current()?;
        let api = self.context.device().cuda.api;
        // SAFETY: `at..at+len` is inside this allocation; `destination` is
        // writable host memory of that length, borrowed exclusively.
        api.check("cuMemcpyDtoH_v2", unsafe {
            (api.memcpy_dtoh)(
                destination.as_mut_ptr().cast::<c_void>(),
                at,
                destination.len(),
            )
        })
    }

    /// Copies `len` bytes from `source` at `source_offset` to `offset` of
    /// this buffer, device to device. The driver may return before the
    /// copy has run: a later copy to the host waits for it, or
    /// [`Context::synchronize`] does.
    pub fn copy_from(
        &self,
        offset: usize,
        source: &DeviceBuffer,
        source_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let to = self.range(offset, len, "a device copy's destination")?;
        let from = source.range(source_offset, len, "a device copy's source")?;
        if len == 0 {
            return Ok(());
        }
        self.context.make_current()?;
        let api = self.context.device().cuda.api;
        // SAFETY: both ranges are inside their allocations (checked above).
        api.check("cuMemcpyDtoD_v2", unsafe {
            (api.memcpy_dtod)(to, from, len)
        })
    }

    /// Sets every byte to `value`.
    pub fn fill(&self, value: u8) -> Result<(), CudaError> {
        self.context.make_current()?;
        let api = self.context.device().cuda.api;
        // SAFETY: the whole allocation, no more.
        api.check("cuMemsetD8_v2", unsafe {
            (api.memset_d8)(self.address, value, self.len)
        })?;
        self.context.synchronize()
    }

    /// A handle another process on this host opens the buffer by.
    pub fn ipc_handle(&self) -> Result<IpcHandle, CudaError> {
        if self.origin != Origin::Allocated {
            return Err(CudaError::Refused {
                what: "CUDA IPC export",
                reason: "the buffer was itself opened from an IPC handle".to_string(),
            });
        }
        self.context.make_current()?;
        let api = self.context.device().cuda.api;
        let mut raw = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: writes the 64-byte handle of a live allocation.
        let rc = unsafe { (api.ipc_get_mem_handle)(&mut raw, self.address) };
        api.check("cuIpcGetMemHandle", rc)
            .map_err(|e| refusal("CUDA IPC export", e))?;
        Ok(IpcHandle(raw.reserved.map(|c| c as u8)))
    }

    /// The buffer exported as a dma-buf file descriptor, for registration
    /// with an RDMA NIC (`ibv_reg_dmabuf_mr`). The driver refuses where
    /// the device or kernel cannot (GeForce boards, older kernels), and a
    /// buffer that is not whole host pages cannot be exported: a
    /// [`CudaError::Refused`] saying so.
    pub fn export_dma_buf(&self) -> Result<OwnedFd, CudaError> {
        let api = self.context.device().cuda.api;
        let Some(get_handle) = api.mem_get_handle_for_address_range else {
            return Err(CudaError::Refused {
                what: "dma-buf export",
                reason: format!(
                    "{} has no cuMemGetHandleForAddressRange (it needs CUDA 11.7 or later)",
                    api.library
                ),
            });
        };
        if !self
            .context
            .device()
            .attribute(crate::Attribute::DmaBufSupported)
            .is_ok_and(|v| v != 0)
        {
            return Err(CudaError::Refused {
                what: "dma-buf export",
                reason: "the device says CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0 \
                         (the open kernel modules and a data-center or workstation GPU are needed)"
                    .to_string(),
            });
        }
        // cuMemGetHandleForAddressRange takes whole host pages only, and
        // answers anything else with an invalid-value error.
        let page = rustix::param::page_size() as u64;
        if !self.address.is_multiple_of(page) || !(self.len as u64).is_multiple_of(page) {
            return Err(CudaError::Refused {
                what: "dma-buf export",
                reason: format!(
                    "the range must start and end on host page boundaries ({page} bytes); \
                     this buffer is {} bytes at {:#x}: allocate a multiple of {page} bytes",
                    self.len, self.address
                ),
            });
        }
        self.context.make_current()?;
        let mut fd: c_int = -1;
        // SAFETY: writes one int (the fd) for a range inside a live
        // allocation; no flags.
        let rc = unsafe {
            get_handle(
                (&mut fd as *mut c_int).cast::<c_void>(),
                self.address,
                self.len,
                CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        api.check("cuMemGetHandleForAddressRange", rc)
            .map_err(|e| refusal("dma-buf export", e))?;
        if fd < 0 {
            return Err(CudaError::Refused {
                what: "dma-buf export",
                reason: format!("the driver returned success and fd {fd}"),
            });
        }
        // SAFETY: the driver handed us a new descriptor that nothing else
        // owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// A driver's "not supported" or "not permitted" is a refusal of the route,
/// not a failure of the machine.
fn refusal(what: &'static str, error: CudaError) -> CudaError {
    match error.code() {
        Some(CUDA_ERROR_NOT_SUPPORTED | CUDA_ERROR_NOT_PERMITTED) => CudaError::Refused {
            what,
            reason: error.to_string(),
        },
        _ => error,
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let api = self.context.device().cuda.api;
        if let Err(e) = self.context.make_current() {
            tracing::warn!("freeing device memory: {e}");
            return;
        }
        let (call, rc) = match self.origin {
            // SAFETY: frees this allocation once; nothing else holds it.
            Origin::Allocated => ("cuMemFree_v2", unsafe { (api.mem_free)(self.address) }),
            // SAFETY: unmaps this import once.
            Origin::Imported => ("cuIpcCloseMemHandle", unsafe {
                (api.ipc_close_mem_handle)(self.address)
            }),
        };
        if let Err(e) = api.check(call, rc) {
            tracing::warn!("releasing device memory: {e}");
        }
    }
}

/// Page-locked host memory from `cuMemAllocHost`: ordinary host memory to
/// the CPU (so it may be borrowed as a slice), reached by the copy engines
/// without a bounce.
#[derive(Debug)]
pub struct PinnedBuffer {
    context: Context,
    address: *mut u8,
    len: usize,
}

// SAFETY: the buffer owns its host memory outright; moving it to another
// thread moves that ownership.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads, through `&[u8]`.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    pub(crate) fn alloc(context: Context, len: usize) -> Result<PinnedBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::OutOfBounds {
                what: "a pinned buffer of 0 bytes".to_string(),
            });
        }
        context.make_current()?;
        let api = context.device().cuda.api;
        let mut address: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; the context is current.
        api.check("cuMemAllocHost_v2", unsafe {
            (api.mem_alloc_host)(&mut address, len)
        })?;
        let address = address.cast::<u8>();
        // SAFETY: `address` is a fresh host allocation of `len` bytes that
        // only this buffer knows about; zeroing it makes every byte
        // initialised before any slice is made over it.
        unsafe { std::ptr::write_bytes(address, 0, len) };
        Ok(PinnedBuffer {
            context,
            address,
            len,
        })
    }

    /// Copies `len` bytes of `source` at `source_offset` into the start of
    /// this buffer.
    pub fn fill_from(
        &mut self,
        source: &DeviceBuffer,
        source_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if len > self.len {
            return Err(CudaError::OutOfBounds {
                what: format!("{len} bytes into a {} byte pinned buffer", self.len),
            });
        }
        source.read(source_offset, &mut self.as_mut()[..len])
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl AsRef<[u8]> for PinnedBuffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes of host memory owned by `self`,
        // borrowed for no longer than `self`.
        unsafe { std::slice::from_raw_parts(self.address, self.len) }
    }
}

impl AsMut<[u8]> for PinnedBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.address, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let api = self.context.device().cuda.api;
        if let Err(e) = self.context.make_current() {
            tracing::warn!("freeing pinned memory: {e}");
            return;
        }
        // SAFETY: frees this allocation once; no slice over it outlives
        // `self`.
        let rc = unsafe { (api.mem_free_host)(self.address.cast::<c_void>()) };
        if let Err(e) = api.check("cuMemFreeHost", rc) {
            tracing::warn!("freeing pinned memory: {e}");
        }
    }
}
