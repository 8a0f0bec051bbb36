//! Errors of the CUDA layer: each says what failed and what to check.
#![forbid(unsafe_code)]

use std::fmt;

/// `CUDA_ERROR_NO_DEVICE`: the driver loaded and found no GPU.
pub const CUDA_ERROR_NO_DEVICE: i32 = 100;
/// `CUDA_ERROR_STUB_LIBRARY`: the library loaded is the toolkit's stub,
/// standing in where the driver is not installed (a container without
/// the GPU's driver mounted).
pub const CUDA_ERROR_STUB_LIBRARY: i32 = 34;
/// `CUDA_ERROR_NOT_SUPPORTED`: the device or driver does not do this.
pub const CUDA_ERROR_NOT_SUPPORTED: i32 = 801;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const CUDA_ERROR_NOT_PERMITTED: i32 = 800;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;

/// What went wrong in the CUDA layer, and what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library could not be loaded, or lacks a symbol barlink
    /// needs: no NVIDIA driver on this machine (or an older one).
    NoDriver {
        /// The library tried and the loader's message.
        reason: String,
    },
    /// The driver loaded and has no usable GPU (`cuInit` or
    /// `cuDeviceGetCount` said so).
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// No device with this ordinal.
    DeviceOutOfRange {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A driver call failed.
    Call {
        /// The function, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The driver's name for the code (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// The driver's description of it.
        description: String,
    },
    /// The device or driver refuses a route (dma-buf export, IPC, host
    /// registration of this memory); `reason` says which and why.
    Refused {
        /// What was refused.
        what: &'static str,
        /// Why: the attribute that says no, or the driver's error.
        reason: String,
    },
    /// A range outside a buffer, or a buffer of the wrong size.
    OutOfBounds {
        /// What was asked.
        what: String,
    },
}

impl CudaError {
    /// The `CUresult` of a failed call, if this is one.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether this says the machine lacks the driver or a GPU (the
    /// command line's exit 3), rather than a call that failed on one.
    pub fn is_environment(&self) -> bool {
        matches!(
            self,
            CudaError::NoDriver { .. }
                | CudaError::NoDevice { .. }
                | CudaError::DeviceOutOfRange { .. }
        )
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver { reason } => write!(
                f,
                "no CUDA driver: {reason}; install the NVIDIA driver (it provides libcuda.so.1), \
                 or point BARLINK_CUDA_LIBRARY at the library"
            ),
            CudaError::NoDevice { reason } => write!(
                f,
                "the CUDA driver found no usable GPU: {reason}; check nvidia-smi, \
                 CUDA_VISIBLE_DEVICES and the permissions of /dev/nvidia*"
            ),
            CudaError::DeviceOutOfRange { ordinal, count } => write!(
                f,
                "no CUDA device {ordinal}: the driver lists {count} (ordinals 0..{count})"
            ),
            CudaError::Call {
                call,
                code,
                name,
                description,
            } => write!(f, "{call} failed: {name} ({code}): {description}"),
            CudaError::Refused { what, reason } => write!(f, "{what} refused: {reason}"),
            CudaError::OutOfBounds { what } => write!(f, "out of bounds: {what}"),
        }
    }
}

impl std::error::Error for CudaError {}
