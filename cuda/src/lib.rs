//! GPU memory for barlink: the CUDA driver API loaded at run time, device
//! buffers, pinned host buffers, and the handles other processes and NICs
//! reach device memory by (CUDA IPC, dma-buf).
//!
//! The driver (`libcuda.so.1`) is opened on first use, as libibverbs is in
//! `barlink-rdma`: the build needs no CUDA, and on a machine without a
//! driver or a GPU every entry point returns [`CudaError::NoDriver`] or
//! [`CudaError::NoDevice`] with what to check. Device memory is never
//! borrowed as a Rust slice: it is read and written by driver copies only.
//! `unsafe` lives in the modules that call the driver (`sys`, `device`,
//! `context`, `memory`), each block with a SAFETY comment.
#![deny(unsafe_code)]

mod context;
mod device;
pub mod error;
mod memory;
#[doc(hidden)]
pub mod mock;
mod sys;

pub use context::Context;
pub use device::{Attribute, Cuda, Device, DeviceInfo, DriverVersion};
pub use error::CudaError;
pub use memory::{DeviceBuffer, IpcHandle, PinnedBuffer};
pub use sys::LIBRARY_VARIABLE;
