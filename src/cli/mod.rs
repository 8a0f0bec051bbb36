//! The subcommands, each in its own module, and the exit status convention
//! they share.

pub mod args;
pub mod bench;
pub mod doctor;
pub mod gpu;
pub mod keygen;
pub mod soak;
pub mod topo;
pub mod validate;

use std::fmt;
use std::process::ExitCode;

/// How a command ended, as the shell sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Everything passed.
    Ok = 0,
    /// A check or a verification failed.
    CheckFailed = 1,
    /// The command line was wrong (clap also exits 2 on its own errors).
    Usage = 2,
    /// The environment is missing something: a device, a permission, a library.
    Environment = 3,
}

impl From<Status> for ExitCode {
    fn from(status: Status) -> ExitCode {
        ExitCode::from(status as u8)
    }
}

/// An error that ends a command, with the status it maps to.
#[derive(Debug)]
pub struct CommandError {
    status: Status,
    message: String,
}

impl CommandError {
    pub fn usage(message: impl Into<String>) -> Self {
        CommandError {
            status: Status::Usage,
            message: message.into(),
        }
    }

    pub fn new(status: Status, message: impl Into<String>) -> Self {
        CommandError {
            status,
            message: message.into(),
        }
    }

    pub fn environment(message: impl Into<String>) -> Self {
        CommandError {
            status: Status::Environment,
            message: message.into(),
        }
    }

    pub fn status(&self) -> Status {
        self.status
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Prints one JSON document (`--json` of the commands whose output is not
/// rows).
pub fn print_document(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialize")
    );
}

pub use barlink_transport::units::parse_size;

/// Prints a size the way nccl-tests does: plain bytes.
pub fn human_size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_compactly() {
        assert_eq!(human_size(8), "8");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(1 << 20), "1M");
        assert_eq!(human_size(1000), "1000");
    }
}
