//! Errors of the RDMA layer: each says what failed and what to check.
#![forbid(unsafe_code)]

use std::fmt;
use std::time::Duration;

use crate::wc_status::WcStatus;

/// What went wrong in the RDMA layer, and what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RdmaError {
    /// libibverbs could not be loaded (or lacks a needed symbol).
    NotAvailable {
        /// Which library or symbol, and the loader's message.
        reason: String,
    },
    /// The library loaded, but the host has no RDMA device (or the kernel
    /// has no `ib_uverbs`).
    NoDevice {
        /// What the library said (empty device list, or its errno).
        reason: String,
    },
    /// No device of this name; `available` lists the ones there are.
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The devices that exist.
        available: Vec<String>,
    },
    /// An `ibv_*` call (or a system call the verbs layer makes) failed.
    Verbs {
        /// The function, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// Its error number.
        errno: i32,
    },
    /// A work request completed with an error status.
    Completion {
        /// The completion's status.
        status: WcStatus,
        /// The provider-specific error code.
        vendor_err: u32,
        /// The work request's id.
        wr_id: u64,
    },
    /// The device, provider or library does not do this.
    Unsupported {
        /// What, and why when known.
        what: String,
    },
    /// An argument was out of range (a slice beyond a region, inline data
    /// beyond `max_inline_data`, ...).
    InvalidArgument {
        /// What was wrong.
        what: String,
    },
    /// A bounded wait ended before what it waited for happened.
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
}

impl RdmaError {
    /// Shorthand for [`RdmaError::Verbs`].
    pub(crate) fn verbs(call: &'static str, errno: i32) -> RdmaError {
        RdmaError::Verbs { call, errno }
    }
}

/// `strerror(errno)`, without the " (os error N)" that `io::Error` adds.
pub(crate) fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// What to check when `call` failed with `errno`.
fn verbs_hint(call: &str, errno: i32) -> &'static str {
    match (call, errno) {
        ("ibv_reg_mr" | "ibv_reg_dmabuf_mr" | "mmap", libc::ENOMEM) => {
            " (locked-memory limit too low? check `ulimit -l`; registration pins pages)"
        }
        ("ibv_reg_mr", libc::EFAULT) => {
            " (the range is not registrable memory: device mmaps such as VFIO BARs need dma-buf)"
        }
        ("ibv_post_send" | "ibv_post_recv", libc::ENOMEM) => {
            " (the queue is full: poll completions before posting more, or create the QP deeper)"
        }
        ("ibv_post_send" | "ibv_post_recv", libc::EINVAL) => {
            " (the QP is in the wrong state, or a field exceeds its capabilities)"
        }
        ("ibv_modify_qp", libc::EINVAL) => {
            " (an attribute is invalid for this transition: GID index, MTU above the port's, \
             remote QP number)"
        }
        ("ibv_open_device" | "ibv_get_device_list", libc::EACCES | libc::EPERM) => {
            " (no permission on /dev/infiniband/uverbs*)"
        }
        ("ibv_create_qp" | "ibv_create_cq", libc::EINVAL) => {
            " (a size exceeds the device's limits: see `ibv_devinfo -v`)"
        }
        _ => "",
    }
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaError::NotAvailable { reason } => write!(
                f,
                "RDMA not available: {reason} (install libibverbs1 and ibverbs-providers)"
            ),
            RdmaError::NoDevice { reason } => write!(
                f,
                "no RDMA device: {reason} (check `ibv_devices` and that ib_uverbs and the NIC's \
                 driver are loaded; for soft-RoCE on an Ethernet interface: `modprobe rdma_rxe` \
                 and `rdma link add rxe0 type rxe netdev eth0`)"
            ),
            RdmaError::DeviceNotFound { name, available } => {
                write!(f, "no RDMA device named {name:?}; ")?;
                if available.is_empty() {
                    write!(f, "there are none (check `ibv_devices`)")
                } else {
                    write!(f, "available: {} (see `ibv_devices`)", available.join(", "))
                }
            }
            RdmaError::Verbs { call, errno } => write!(
                f,
                "{call} failed: {} (errno {errno}){}",
                strerror(*errno),
                verbs_hint(call, *errno)
            ),
            RdmaError::Completion {
                status,
                vendor_err,
                wr_id,
            } => write!(
                f,
                "work request {wr_id} completed with {} (status {}, vendor error {vendor_err:#x}): {}",
                status.name(),
                status.code(),
                status.what_to_check()
            ),
            RdmaError::Unsupported { what } => write!(f, "not supported: {what}"),
            RdmaError::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            RdmaError::Timeout { what, after } => {
                write!(f, "timed out after {after:?} waiting for {what}")
            }
        }
    }
}

impl std::error::Error for RdmaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_errors_name_the_status_and_what_to_check() {
        let e = RdmaError::Completion {
            status: WcStatus::RemAccessErr,
            vendor_err: 0,
            wr_id: 7,
        };
        let text = e.to_string();
        assert!(
            text.contains("IBV_WC_REM_ACCESS_ERR") && text.contains("rkey"),
            "{text}"
        );
    }
}
