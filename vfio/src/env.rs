//! [`VfioEnv`], the environment every VFIO and sysfs-BAR call runs in:
//! containers, devices and sysfs BARs all take one, so that tests can swap
//! in fixture roots and the recording mock.

use std::path::PathBuf;
use std::sync::Arc;

use crate::sys::{LinuxSys, VfioSys};

/// Where VFIO lives: the system-call layer, the sysfs root and the
/// directory of VFIO nodes. [`VfioEnv::default`] is the real system.
#[derive(Debug, Clone)]
pub struct VfioEnv {
    /// The system calls ([`LinuxSys`], or a mock).
    pub sys: Arc<dyn VfioSys>,
    /// The root sysfs paths are taken under (`/`).
    pub sysfs_root: PathBuf,
    /// The directory with `vfio` and the group nodes (`/dev/vfio`).
    pub dev_dir: PathBuf,
}

impl Default for VfioEnv {
    fn default() -> Self {
        VfioEnv {
            sys: Arc::new(LinuxSys),
            sysfs_root: PathBuf::from("/"),
            dev_dir: PathBuf::from("/dev/vfio"),
        }
    }
}

impl VfioEnv {
    /// The real system calls with other roots (fixtures).
    pub fn with_roots(sysfs_root: impl Into<PathBuf>, dev_dir: impl Into<PathBuf>) -> VfioEnv {
        VfioEnv {
            sysfs_root: sysfs_root.into(),
            dev_dir: dev_dir.into(),
            ..VfioEnv::default()
        }
    }

    /// These roots with another system-call layer.
    pub fn with_sys(mut self, sys: Arc<dyn VfioSys>) -> VfioEnv {
        self.sys = sys;
        self
    }
}
