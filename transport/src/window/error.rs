//! [`WindowError`]: every way a window operation can fail, each variant
//! carrying what is needed to act on it, with a hand-written message that
//! names what to check.
//!
//! Offsets and lengths in a window often come from a peer, so a bad one is
//! an ordinary error here, never a panic.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Why a window operation failed.
///
/// System call failures keep the raw `errno` (not an `io::Error`) so that the
/// error stays `Clone + Eq` and can be matched in tests; the message renders
/// it with the system's text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowError {
    /// `offset..offset + len` does not lie within the window (this includes
    /// `offset + len` overflowing `usize`).
    OutOfBounds {
        /// Where the access started.
        offset: usize,
        /// How many bytes it covered.
        len: usize,
        /// The window's length.
        window_len: usize,
    },
    /// An atomic access at an offset that is not a multiple of its size.
    Misaligned {
        /// The offset asked for.
        offset: usize,
        /// The alignment an atomic access of this width needs.
        align: usize,
    },
    /// A memory ordering that the operation cannot have (a load with
    /// `Release`, a store with `Acquire`; `AcqRel` for either).
    InvalidOrdering {
        /// `"load"` or `"store"`.
        operation: &'static str,
        /// The ordering that was asked for.
        ordering: Ordering,
    },
    /// A window length that cannot be created (zero, or too large to map).
    InvalidLength {
        /// The length asked for.
        len: usize,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// A shared-memory name that is not a single plain file name.
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An existing shared-memory object is shorter than needed (its creator
    /// may not have sized it yet).
    TooSmall {
        /// The object.
        path: PathBuf,
        /// Its length.
        len: usize,
        /// The least length that is usable.
        needed: usize,
    },
    /// The shared-memory name already exists.
    NameInUse {
        /// The file that exists.
        path: PathBuf,
    },
    /// The shared-memory name (or its directory) does not exist.
    NotFound {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// The system refused access.
    PermissionDenied {
        /// The file.
        path: PathBuf,
        /// The `errno` of the refusal.
        errno: i32,
    },
    /// An existing shared-memory file that other users could read or write,
    /// or that another user owns: it is not used, since whoever can open it
    /// can read and corrupt every message.
    NotPrivate {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// The user this process runs as.
        expected_owner: u32,
    },
    /// A file descriptor or file that cannot be a window.
    NotAWindow {
        /// What it is (a path, or `/proc/self/fd` text for a descriptor).
        path: PathBuf,
        /// Why not.
        reason: &'static str,
    },
    /// Huge pages were required and none could be had.
    HugePagesUnavailable {
        /// What was asked, what the system has, and how to reserve more.
        detail: String,
    },
    /// `mmap` failed.
    MapFailed {
        /// What was being mapped.
        path: PathBuf,
        /// How many bytes.
        len: usize,
        /// The `errno` of the failure.
        errno: i32,
    },
    /// Another system call failed.
    System {
        /// The call, in words (`"ftruncate"`, `"fstat"`, …).
        operation: &'static str,
        /// The file it was applied to.
        path: PathBuf,
        /// The `errno` of the failure.
        errno: i32,
    },
    /// A heap window's memory could not be allocated.
    AllocationFailed {
        /// How many bytes were asked for.
        len: usize,
    },
    /// Passing a file descriptor over a Unix socket failed.
    Socket {
        /// What was being done.
        operation: &'static str,
        /// The `errno` of the failure.
        errno: i32,
    },
    /// A message arrived on the socket without exactly the one descriptor
    /// that a window message carries.
    NoFdReceived {
        /// What arrived instead.
        reason: &'static str,
    },
    /// Nothing happened within the time allowed.
    Timeout {
        /// What was being waited for.
        operation: &'static str,
        /// How long was waited.
        after: Duration,
    },
    /// The other end of the socket closed.
    PeerClosed {
        /// What was being done.
        operation: &'static str,
    },
    /// This kind of window cannot do the operation (e.g. an atomic
    /// read-modify-write on a peer's BAR, which PCIe cannot carry).
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// Why this window cannot do it, and what to use instead.
        reason: &'static str,
    },
}

/// The system's text for `errno`, e.g. "Permission denied (os error 13)".
fn errno_text(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::OutOfBounds { .. }
            | WindowError::Misaligned { .. }
            | WindowError::InvalidOrdering { .. }
            | WindowError::InvalidLength { .. }
            | WindowError::AllocationFailed { .. }
            | WindowError::Unsupported { .. } => self.fmt_access(f),
            WindowError::InvalidName { .. }
            | WindowError::TooSmall { .. }
            | WindowError::NameInUse { .. }
            | WindowError::NotFound { .. }
            | WindowError::PermissionDenied { .. }
            | WindowError::NotPrivate { .. }
            | WindowError::NotAWindow { .. }
            | WindowError::HugePagesUnavailable { .. }
            | WindowError::MapFailed { .. }
            | WindowError::System { .. } => self.fmt_file(f),
            WindowError::Socket { .. }
            | WindowError::NoFdReceived { .. }
            | WindowError::Timeout { .. }
            | WindowError::PeerClosed { .. } => self.fmt_socket(f),
        }
    }
}

impl WindowError {
    /// Errors of an access or of a window's creation.
    fn fmt_access(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::OutOfBounds {
                offset,
                len,
                window_len,
            } => write!(
                f,
                "window access out of bounds: {len} bytes at offset {offset} do not fit in a \
                 window of {window_len} bytes (check offsets and lengths, especially any a peer wrote)"
            ),
            WindowError::Misaligned { offset, align } => write!(
                f,
                "atomic window access at offset {offset} is not {align}-byte aligned \
                 (ring indices must sit at multiples of {align})"
            ),
            WindowError::InvalidOrdering {
                operation,
                ordering,
            } => write!(
                f,
                "an atomic {operation} cannot use {ordering:?} ordering \
                 (loads take Relaxed/Acquire/SeqCst, stores Relaxed/Release/SeqCst)"
            ),
            WindowError::InvalidLength { len, reason } => {
                write!(f, "cannot create a window of {len} bytes: {reason}")
            }
            WindowError::AllocationFailed { len } => {
                write!(f, "could not allocate a heap window of {len} bytes")
            }
            WindowError::Unsupported { operation, reason } => {
                write!(f, "this window does not support {operation}: {reason}")
            }
            _ => unreachable!("fmt dispatches only these variants here"),
        }
    }

    /// Errors of a named shared-memory file or its mapping.
    fn fmt_file(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::InvalidName { name, reason } => write!(
                f,
                "invalid shared-memory name {name:?}: {reason} \
                 (use a plain file name such as \"barlink-rank0\")"
            ),
            WindowError::TooSmall { path, len, needed } => write!(
                f,
                "{} is {len} bytes, at least {needed} are needed \
                 (has its creator finished sizing it? retry, or check it is the right name)",
                path.display()
            ),
            WindowError::NameInUse { path } => write!(
                f,
                "shared-memory name {} is already in use: another barlink process may own it; \
                 open it instead of creating it, or, if no process uses it (a crash left it \
                 behind), remove it with `rm {}`",
                path.display(),
                path.display()
            ),
            WindowError::NotFound { path } => write!(
                f,
                "{} does not exist (has the creating process started? is the name right? \
                 does the directory exist?)",
                path.display()
            ),
            WindowError::PermissionDenied { path, errno } => write!(
                f,
                "permission denied for {}: {} (windows are private to the user that created \
                 them: run both processes as the same user; check `ls -l {}`)",
                path.display(),
                errno_text(*errno),
                path.display()
            ),
            WindowError::NotPrivate {
                path,
                mode,
                owner,
                expected_owner,
            } => write!(
                f,
                "{} has mode {mode:04o} and owner uid {owner}; a window must be private \
                 (mode 0600, owned by uid {expected_owner}) because anyone who can open it can \
                 read and corrupt every message; remove it with `rm {}` and let barlink create it",
                path.display(),
                path.display()
            ),
            WindowError::NotAWindow { path, reason } => {
                write!(f, "{} cannot be a window: {reason}", path.display())
            }
            WindowError::HugePagesUnavailable { detail } => {
                write!(f, "huge pages unavailable: {detail}")
            }
            WindowError::MapFailed { path, len, errno } => write!(
                f,
                "mmap of {len} bytes of {} failed: {} (check the address-space and memlock \
                 limits, `ulimit -v`/`ulimit -l`, and that the file is at least that long)",
                path.display(),
                errno_text(*errno)
            ),
            WindowError::System {
                operation,
                path,
                errno,
            } => write!(
                f,
                "{operation} on {} failed: {}",
                path.display(),
                errno_text(*errno)
            ),
            _ => unreachable!("fmt dispatches only these variants here"),
        }
    }

    /// Errors of the Unix socket that passes a window to the peer.
    fn fmt_socket(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::Socket { operation, errno } => write!(
                f,
                "could not {operation} over the Unix socket: {}",
                errno_text(*errno)
            ),
            WindowError::NoFdReceived { reason } => write!(
                f,
                "the peer's message carried no window file descriptor: {reason} \
                 (is the peer a barlink process of the same version?)"
            ),
            WindowError::Timeout { operation, after } => write!(
                f,
                "timed out after {after:?} waiting to {operation} (is the peer process alive \
                 and connected to the same socket?)"
            ),
            WindowError::PeerClosed { operation } => write!(
                f,
                "the peer closed the Unix socket before we could {operation} \
                 (did the peer process exit? check its log)"
            ),
            _ => unreachable!("fmt dispatches only these variants here"),
        }
    }
}

impl std::error::Error for WindowError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_to_check() {
        let in_use = WindowError::NameInUse {
            path: PathBuf::from("/dev/shm/x"),
        };
        let text = in_use.to_string();
        assert!(
            text.contains("/dev/shm/x") && text.contains("rm /dev/shm/x"),
            "{text}"
        );

        let oob = WindowError::OutOfBounds {
            offset: usize::MAX,
            len: 8,
            window_len: 4096,
        };
        let text = oob.to_string();
        assert!(text.contains(&usize::MAX.to_string()) && text.contains("4096"));

        let map = WindowError::MapFailed {
            path: PathBuf::from("/memfd:ring"),
            len: 4096,
            errno: 12,
        };
        assert!(map.to_string().contains("os error 12"), "{map}");
    }
}
