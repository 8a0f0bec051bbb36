//! What `bench --gpu` and `validate --gpu` share: opening the GPU (exit 3,
//! saying what is missing, on a machine without a driver or a device) and
//! the lines and fields that say which GPU every figure came from.

use std::path::Path;

use barlink::gpu::{Context, Cuda, CudaError, DeviceInfo};
use barlink_topology::aperture::nvidia_bar1;
use barlink_topology::pci::PCI_DEVICES_DIR;
use barlink_topology::pci::resource::{human_bytes, parse_resource};
use serde_json::json;

use super::CommandError;

/// The GPU a command runs on.
pub struct Gpu {
    pub cuda: Cuda,
    pub context: Context,
    pub info: DeviceInfo,
    pub driver: String,
    /// BAR1's size from sysfs, or why it is unknown.
    pub bar1: Result<u64, String>,
}

/// A CUDA error as the command's error: exit 3 when the machine lacks the
/// driver or the device, 1 when a call failed on one.
pub fn command_error(context: &str, error: CudaError) -> CommandError {
    if error.is_environment() {
        CommandError::environment(format!("{context}: {error}"))
    } else {
        CommandError::new(super::Status::CheckFailed, format!("{context}: {error}"))
    }
}

/// Loads the driver and opens device `ordinal`'s primary context.
pub fn open(ordinal: usize, sysfs_root: &Path) -> Result<Gpu, CommandError> {
    let cuda = Cuda::load().map_err(|e| command_error("--gpu", e))?;
    let device = cuda
        .device(ordinal)
        .map_err(|e| command_error("--gpu", e))?;
    let info = device
        .info()
        .map_err(|e| command_error("reading the GPU", e))?;
    let context = device.context().map_err(|e| command_error("--gpu", e))?;
    let driver = cuda
        .driver_version()
        .map(|v| v.to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let bar1 = bar1_size(sysfs_root, &info.pci_address);
    Ok(Gpu {
        cuda,
        context,
        info,
        driver,
        bar1,
    })
}

/// BAR1's size as the kernel reports it (the window a peer writes the
/// GPU's memory through).
fn bar1_size(sysfs_root: &Path, address: &str) -> Result<u64, String> {
    let path = sysfs_root
        .join(PCI_DEVICES_DIR)
        .join(address)
        .join("resource");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (bars, _) = parse_resource(&text);
    nvidia_bar1(&bars)
        .filter(|bar| bar.size > 0)
        .map(|bar| bar.size)
        .ok_or_else(|| format!("{} lists no BAR1", path.display()))
}

impl Gpu {
    /// One line naming the GPU, for headers.
    pub fn describe(&self) -> String {
        let bar1 = match &self.bar1 {
            Ok(size) => human_bytes(*size),
            Err(why) => format!("unknown ({why})"),
        };
        format!(
            "{} [{}] ordinal {}, {} memory, compute {}.{}, {} copy engines, driver {} ({}), BAR1 {bar1}, dma-buf {}",
            self.info.name,
            self.info.pci_address,
            self.info.ordinal,
            human_bytes(self.info.total_memory),
            self.info.compute_capability.0,
            self.info.compute_capability.1,
            self.info.copy_engines,
            self.driver,
            self.cuda.library(),
            if self.info.dma_buf { "yes" } else { "no" },
        )
    }

    /// The fields every `--json` row and document carries about the GPU.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "gpu": self.info.name,
            "gpu_pci": self.info.pci_address,
            "gpu_ordinal": self.info.ordinal,
            "gpu_memory_bytes": self.info.total_memory,
            "gpu_compute_capability": format!("{}.{}", self.info.compute_capability.0, self.info.compute_capability.1),
            "gpu_copy_engines": self.info.copy_engines,
            "gpu_dma_buf": self.info.dma_buf,
            "gpu_bar1_bytes": self.bar1.as_ref().ok(),
            "cuda_driver": self.driver,
            "cuda_library": self.cuda.library(),
        })
    }
}
