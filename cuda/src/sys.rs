//! The CUDA driver API that this crate calls, and the loader that opens the
//! driver at run time.
//!
//! Nothing is linked at build time: `libcuda.so.1` (the driver, installed
//! with the NVIDIA kernel module, never with a toolkit) is opened with
//! `dlopen` on first use, as libibverbs is in `barlink-rdma` and as NCCL
//! and PyTorch do. `BARLINK_CUDA_LIBRARY` names another file (a driver in
//! an unusual place, or the test suite's stand-in). A missing library or
//! symbol becomes [`CudaError::NoDriver`] naming it.
//!
//! Signatures are written by hand from `cuda.h` (CUDA 12), and only for what
//! the crate uses; the `_v2` names are the ones `cuda.h`'s macros select.
#![allow(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::{CUDA_ERROR_NO_DEVICE, CUDA_ERROR_STUB_LIBRARY, CudaError};

pub(crate) type CUresult = c_int;
pub(crate) type CUdevice = c_int;
pub(crate) type CUcontext = *mut c_void;
pub(crate) type CUdeviceptr = u64;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value to
/// `cuIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUipcMemHandle {
    pub(crate) reserved: [c_char; 64],
}

pub(crate) const CUDA_SUCCESS: CUresult = 0;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
pub(crate) const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub(crate) const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// The library opened when `BARLINK_CUDA_LIBRARY` is not set.
pub(crate) const DEFAULT_LIBRARY: &str = "libcuda.so.1";
/// The variable naming another driver library.
pub const LIBRARY_VARIABLE: &str = "BARLINK_CUDA_LIBRARY";

/// The driver's entry points this crate calls, resolved once per library.
pub(crate) struct Api {
    pub(crate) init: unsafe extern "C" fn(c_uint) -> CUresult,
    pub(crate) driver_get_version: unsafe extern "C" fn(*mut c_int) -> CUresult,
    pub(crate) get_error_name: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    pub(crate) get_error_string: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    pub(crate) device_get_count: unsafe extern "C" fn(*mut c_int) -> CUresult,
    pub(crate) device_get: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult,
    pub(crate) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult,
    pub(crate) device_get_pci_bus_id:
        unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult,
    pub(crate) device_total_mem: unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult,
    pub(crate) device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult,
    pub(crate) primary_ctx_retain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult,
    pub(crate) primary_ctx_release: unsafe extern "C" fn(CUdevice) -> CUresult,
    pub(crate) ctx_set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub(crate) ctx_synchronize: unsafe extern "C" fn() -> CUresult,
    pub(crate) mem_alloc: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult,
    pub(crate) mem_free: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    pub(crate) mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CUresult,
    pub(crate) mem_free_host: unsafe extern "C" fn(*mut c_void) -> CUresult,
    pub(crate) memcpy_htod: unsafe extern "C" fn(CUdeviceptr, *const c_void, usize) -> CUresult,
    pub(crate) memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize) -> CUresult,
    pub(crate) memcpy_dtod: unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult,
    pub(crate) memset_d8: unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult,
    pub(crate) ipc_get_mem_handle:
        unsafe extern "C" fn(*mut CUipcMemHandle, CUdeviceptr) -> CUresult,
    pub(crate) ipc_open_mem_handle:
        unsafe extern "C" fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> CUresult,
    pub(crate) ipc_close_mem_handle: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    /// CUDA 11.7 and later; `None` on older drivers.
    pub(crate) mem_get_handle_for_address_range:
        Option<unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, c_int, u64) -> CUresult>,
    /// Which file was opened (for messages and reports).
    pub(crate) library: String,
    /// Keeps the library mapped for the life of the process (never closed:
    /// the driver starts threads and registers exit handlers).
    _lib: libloading::Library,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// The driver named by `BARLINK_CUDA_LIBRARY`, else `libcuda.so.1`, loaded
/// and initialised on first use; a failure is remembered, so every call
/// reports the same reason.
pub(crate) fn global() -> Result<&'static Api, CudaError> {
    static API: OnceLock<Result<&'static Api, CudaError>> = OnceLock::new();
    API.get_or_init(|| {
        let library = std::env::var(LIBRARY_VARIABLE)
            .ok()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| DEFAULT_LIBRARY.to_string());
        open(&library)
    })
    .clone()
}

/// Loads and initialises the driver in `library` (a file name the dynamic
/// loader resolves, or a path). Each library is loaded for the life of the
/// process.
pub(crate) fn open(library: &str) -> Result<&'static Api, CudaError> {
    // SAFETY: loading the driver runs its ELF constructors, which set up
    // only the driver's own state; it is the library whose entry points
    // `resolve` declares.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|e| CudaError::NoDriver {
        reason: format!("cannot load {library}: {e}"),
    })?;
    let api: &'static Api = Box::leak(Box::new(resolve(lib, library)?));
    // SAFETY: `cuInit` takes flags that must be 0 and no pointers.
    let rc = unsafe { (api.init)(0) };
    if rc != CUDA_SUCCESS {
        let error = api.error("cuInit", rc);
        // Only these say the machine has no GPU to use; anything else (a
        // driver and library of different versions, a failed system call)
        // is a fault on a machine that has one, and must not read as a skip.
        return Err(match rc {
            CUDA_ERROR_NO_DEVICE | CUDA_ERROR_STUB_LIBRARY => CudaError::NoDevice {
                reason: error.to_string(),
            },
            _ => error,
        });
    }
    Ok(api)
}

fn resolve(lib: libloading::Library, library: &str) -> Result<Api, CudaError> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is looked up by its C name, and the field
            // it is stored in has the signature cuda.h declares for it. The
            // pointer is copied out of the `Symbol` and stays valid because
            // the `Library` is kept in `Api` for the life of the process.
            match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                Ok(s) => *s,
                Err(e) => {
                    return Err(CudaError::NoDriver {
                        reason: format!(
                            "{library} lacks {}: {e} (a driver older than CUDA 11?)",
                            $name
                        ),
                    });
                }
            }
        }};
    }
    // SAFETY: as in `sym!`; a missing optional symbol is `None`.
    let range_handle = unsafe { lib.get(b"cuMemGetHandleForAddressRange\0") }
        .ok()
        .map(|s| *s);
    Ok(Api {
        init: sym!("cuInit"),
        driver_get_version: sym!("cuDriverGetVersion"),
        get_error_name: sym!("cuGetErrorName"),
        get_error_string: sym!("cuGetErrorString"),
        device_get_count: sym!("cuDeviceGetCount"),
        device_get: sym!("cuDeviceGet"),
        device_get_name: sym!("cuDeviceGetName"),
        device_get_pci_bus_id: sym!("cuDeviceGetPCIBusId"),
        device_total_mem: sym!("cuDeviceTotalMem_v2"),
        device_get_attribute: sym!("cuDeviceGetAttribute"),
        primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
        primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2"),
        ctx_set_current: sym!("cuCtxSetCurrent"),
        ctx_synchronize: sym!("cuCtxSynchronize"),
        mem_alloc: sym!("cuMemAlloc_v2"),
        mem_free: sym!("cuMemFree_v2"),
        mem_alloc_host: sym!("cuMemAllocHost_v2"),
        mem_free_host: sym!("cuMemFreeHost"),
        memcpy_htod: sym!("cuMemcpyHtoD_v2"),
        memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
        memcpy_dtod: sym!("cuMemcpyDtoD_v2"),
        memset_d8: sym!("cuMemsetD8_v2"),
        ipc_get_mem_handle: sym!("cuIpcGetMemHandle"),
        ipc_open_mem_handle: sym!("cuIpcOpenMemHandle_v2"),
        ipc_close_mem_handle: sym!("cuIpcCloseMemHandle"),
        mem_get_handle_for_address_range: range_handle,
        library: library.to_string(),
        _lib: lib,
    })
}

impl Api {
    /// `Ok` for `CUDA_SUCCESS`, else the call's error with the driver's
    /// name and description of the code.
    pub(crate) fn check(&self, call: &'static str, rc: CUresult) -> Result<(), CudaError> {
        if rc == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, rc))
        }
    }

    pub(crate) fn error(&self, call: &'static str, code: CUresult) -> CudaError {
        CudaError::Call {
            call,
            code,
            name: self.text(self.get_error_name, code, "CUDA_ERROR_UNKNOWN"),
            description: self.text(
                self.get_error_string,
                code,
                "no description from the driver",
            ),
        }
    }

    fn text(
        &self,
        lookup: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
        code: CUresult,
        otherwise: &str,
    ) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the lookup writes a pointer to a static string, or fails.
        let rc = unsafe { lookup(code, &mut text) };
        if rc != CUDA_SUCCESS || text.is_null() {
            return otherwise.to_string();
        }
        // SAFETY: on success the driver's pointer is to a NUL-terminated
        // string it owns for the life of the process.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The NUL-terminated text a driver call wrote into `buf`.
pub(crate) fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
