//! Errors of the RDMA layer.
#![forbid(unsafe_code)]

use std::fmt;

/// What went wrong in the RDMA layer, and what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RdmaError {
    /// libibverbs could not be loaded (or lacks a needed symbol).
    NotAvailable { reason: String },
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaError::NotAvailable { reason } => write!(
                f,
                "RDMA not available: {reason} (install libibverbs1 and ibverbs-providers)"
            ),
        }
    }
}

impl std::error::Error for RdmaError {}
