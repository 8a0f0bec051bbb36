//! The driver and its devices: what a GPU is and what it allows.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};
use std::path::Path;

use crate::context::Context;
use crate::error::CudaError;
use crate::sys::{self, Api, CUdevice};

/// The loaded CUDA driver. Cheap to copy; the library stays loaded for the
/// life of the process.
#[derive(Clone, Copy, Debug)]
pub struct Cuda {
    pub(crate) api: &'static Api,
}

/// The driver's version, as `cuDriverGetVersion` gives it (12040 is 12.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl std::fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Cuda {
    /// The driver named by `BARLINK_CUDA_LIBRARY`, else `libcuda.so.1`,
    /// loaded and initialised once per process. Without a driver this is
    /// [`CudaError::NoDriver`]; with a driver and no GPU,
    /// [`CudaError::NoDevice`].
    pub fn load() -> Result<Cuda, CudaError> {
        Ok(Cuda {
            api: sys::global()?,
        })
    }

    /// The driver in the file `library`, loaded and initialised (and kept
    /// loaded for the life of the process).
    pub fn load_from(library: &Path) -> Result<Cuda, CudaError> {
        Ok(Cuda {
            api: sys::open(&library.to_string_lossy())?,
        })
    }

    /// The library file that was opened.
    pub fn library(&self) -> &str {
        &self.api.library
    }

    /// The driver's CUDA version.
    pub fn driver_version(&self) -> Result<DriverVersion, CudaError> {
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        self.api.check("cuDriverGetVersion", unsafe {
            (self.api.driver_get_version)(&mut version)
        })?;
        let version = version.max(0) as u32;
        Ok(DriverVersion {
            major: version / 1000,
            minor: version % 1000 / 10,
        })
    }

    /// How many GPUs the driver shows this process.
    pub fn device_count(&self) -> Result<usize, CudaError> {
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        self.api.check("cuDeviceGetCount", unsafe {
            (self.api.device_get_count)(&mut count)
        })?;
        Ok(count.max(0) as usize)
    }

    /// Device `ordinal` (0-based, in the driver's order, after
    /// `CUDA_VISIBLE_DEVICES`).
    pub fn device(&self, ordinal: usize) -> Result<Device, CudaError> {
        let count = self.device_count()?;
        if count == 0 {
            return Err(CudaError::NoDevice {
                reason: "cuDeviceGetCount says 0".to_string(),
            });
        }
        if ordinal >= count {
            return Err(CudaError::DeviceOutOfRange { ordinal, count });
        }
        let mut handle: CUdevice = 0;
        // SAFETY: writes one device handle; the ordinal is in range.
        self.api.check("cuDeviceGet", unsafe {
            (self.api.device_get)(&mut handle, ordinal as c_int)
        })?;
        Ok(Device {
            cuda: *self,
            handle,
            ordinal,
        })
    }
}

/// Device attributes barlink reads (`CUdevice_attribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attribute {
    /// Copy engines that run beside the SMs.
    AsyncEngineCount = 40,
    /// One address space with the host.
    UnifiedAddressing = 41,
    /// Compute capability, major.
    ComputeCapabilityMajor = 75,
    /// Compute capability, minor.
    ComputeCapabilityMinor = 76,
    /// `cuMemHostRegister` is supported.
    HostRegisterSupported = 99,
    /// GPUDirect RDMA (nvidia-peermem) is supported.
    GpuDirectRdmaSupported = 116,
    /// Device memory may be exported as a dma-buf.
    DmaBufSupported = 124,
}

/// A GPU as the driver shows it.
#[derive(Clone, Copy, Debug)]
pub struct Device {
    pub(crate) cuda: Cuda,
    pub(crate) handle: CUdevice,
    ordinal: usize,
}

/// What barlink reports about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's ordinal.
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// PCI address, lower case (`0000:01:00.0`): the key into the topology.
    pub pci_address: String,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Copy engines.
    pub copy_engines: u32,
    /// Whether device memory may be exported as a dma-buf.
    pub dma_buf: bool,
    /// Whether the driver allows GPUDirect RDMA.
    pub gpudirect_rdma: bool,
    /// Whether host memory may be registered with the device.
    pub host_register: bool,
}

impl Device {
    /// The driver's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The marketing name.
    pub fn name(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included.
        self.cuda.api.check("cuDeviceGetName", unsafe {
            (self.cuda.api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, self.handle)
        })?;
        Ok(sys::c_text(&buf))
    }

    /// The PCI address in sysfs's form (`0000:01:00.0`).
    pub fn pci_address(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the driver writes at most `len` bytes, NUL included.
        self.cuda.api.check("cuDeviceGetPCIBusId", unsafe {
            (self.cuda.api.device_get_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, self.handle)
        })?;
        Ok(sys::c_text(&buf).to_ascii_lowercase())
    }

    /// Device memory in bytes.
    pub fn total_memory(&self) -> Result<u64, CudaError> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t.
        self.cuda.api.check("cuDeviceTotalMem_v2", unsafe {
            (self.cuda.api.device_total_mem)(&mut bytes, self.handle)
        })?;
        Ok(bytes as u64)
    }

    /// One attribute's value.
    pub fn attribute(&self, attribute: Attribute) -> Result<i32, CudaError> {
        let mut value: c_int = 0;
        // SAFETY: writes one int; the attribute is a valid enum value (an
        // older driver answers CUDA_ERROR_INVALID_VALUE for newer ones).
        self.cuda.api.check("cuDeviceGetAttribute", unsafe {
            (self.cuda.api.device_get_attribute)(&mut value, attribute as c_int, self.handle)
        })?;
        Ok(value)
    }

    /// An attribute read as a yes/no; an attribute this driver does not know
    /// is a no.
    fn flag(&self, attribute: Attribute) -> Result<bool, CudaError> {
        match self.attribute(attribute) {
            Ok(value) => Ok(value != 0),
            Err(CudaError::Call { code, .. }) if code == crate::error::CUDA_ERROR_INVALID_VALUE => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Everything barlink reports about the device.
    pub fn info(&self) -> Result<DeviceInfo, CudaError> {
        Ok(DeviceInfo {
            ordinal: self.ordinal,
            name: self.name()?,
            pci_address: self.pci_address()?,
            total_memory: self.total_memory()?,
            compute_capability: (
                self.attribute(Attribute::ComputeCapabilityMajor)?.max(0) as u32,
                self.attribute(Attribute::ComputeCapabilityMinor)?.max(0) as u32,
            ),
            copy_engines: self.attribute(Attribute::AsyncEngineCount)?.max(0) as u32,
            dma_buf: self.flag(Attribute::DmaBufSupported)?,
            gpudirect_rdma: self.flag(Attribute::GpuDirectRdmaSupported)?,
            host_register: self.flag(Attribute::HostRegisterSupported)?,
        })
    }

    /// The device's primary context (the one the CUDA runtime and PyTorch
    /// share), retained until the last clone of the [`Context`] drops.
    pub fn context(&self) -> Result<Context, CudaError> {
        Context::retain_primary(*self)
    }
}
