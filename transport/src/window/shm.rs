//! [`ShmWindow`]: host shared memory as a window between processes.
//!
//! Two ways to share it:
//! - **memfd** ([`ShmWindow::create_memfd`]): anonymous, gone when the last
//!   process closes it, so nothing is left behind after a crash. The peer
//!   gets it as a file descriptor over a Unix socket
//!   ([`send_fd`](super::send_fd) / [`recv_fd`](super::recv_fd), then
//!   [`ShmWindow::from_fd`]). It is sealed against shrinking and growing:
//!   a mapping of a file that shrinks under it raises SIGBUS on the next
//!   access, so a receiver insists on the seal.
//! - **named** ([`ShmWindow::create_named`] / [`ShmWindow::open_named`]): a
//!   file under `/dev/shm` (or another directory), for processes that share
//!   no socket. Created with `O_EXCL` and mode 0600 — an existing name is a
//!   [`WindowError::NameInUse`], never silently reused — and removed when
//!   its creator drops it (configurable). An opener refuses a file that is
//!   not private to this user. A file cannot be sealed, so a process of the
//!   same user that truncates it makes the next access to the cut-off part
//!   raise SIGBUS: named windows trust their user, memfd windows need not.
//!
//! Huge pages ([`HugePages`]): 2 MiB pages reserved by the administrator
//! (`hugetlbfs`, `MFD_HUGETLB`) cut TLB misses for large rings and are what
//! GPU and NIC registration prefer. When none are reserved, asking for them
//! is an error that says how to reserve them; falling back to transparent
//! huge pages happens only when asked for
//! ([`HugePages::ReservedOrTransparent`]).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{MemfdFlags, OFlags, SealFlags};
use rustix::io::Errno;

use super::mapping::Mapping;
use super::{WindowError, window_over_mapping};

/// The size of a reserved huge page, the only size used.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// `statfs` magic number of hugetlbfs.
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// Where the kernel reports the administrator's reservation.
const NR_HUGEPAGES_PATH: &str = "/proc/sys/vm/nr_hugepages";
const FREE_HUGEPAGES_PATH: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

/// Longest memfd name the kernel accepts (249 bytes plus its "memfd:").
const MAX_MEMFD_NAME: usize = 249;
/// Longest file name.
const MAX_FILE_NAME: usize = 255;

/// Which pages back a shared-memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HugePages {
    /// Ordinary pages.
    #[default]
    Off,
    /// 2 MiB pages from the administrator's reservation
    /// (`/proc/sys/vm/nr_hugepages`); an error if not enough are free. The
    /// window's length is rounded up to a multiple of 2 MiB.
    Reserved,
    /// Reserved 2 MiB pages if enough are free, else transparent huge pages.
    /// [`ShmWindow::page_backing`] says which it got.
    ReservedOrTransparent,
    /// Ordinary shared memory with `madvise(MADV_HUGEPAGE)`: the kernel
    /// uses huge pages when it can (see
    /// `/sys/kernel/mm/transparent_hugepage/shmem_enabled`), without
    /// guarantee.
    Transparent,
}

/// What actually backs a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PageBacking {
    /// Ordinary pages.
    Base,
    /// Reserved 2 MiB pages (hugetlbfs).
    Reserved2MiB,
    /// Ordinary shared memory advised to use transparent huge pages.
    TransparentAdvised,
}

/// How shared-memory windows are created and opened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShmOptions {
    /// Which pages to use (default: ordinary pages).
    pub huge_pages: HugePages,
    /// The directory that holds named windows (default `/dev/shm`). A
    /// hugetlbfs mount here gives named windows reserved huge pages.
    pub dir: PathBuf,
    /// Whether the creator of a named window removes its file when it drops
    /// the window (default: yes). Openers never remove it unless told to by
    /// [`ShmWindow::set_unlink_on_drop`].
    pub unlink_on_drop: bool,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            huge_pages: HugePages::Off,
            dir: PathBuf::from("/dev/shm"),
            unlink_on_drop: true,
        }
    }
}

impl ShmOptions {
    /// These options with `huge_pages`.
    pub fn with_huge_pages(mut self, huge_pages: HugePages) -> Self {
        self.huge_pages = huge_pages;
        self
    }

    /// These options with named windows in `dir`.
    pub fn with_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = dir.into();
        self
    }

    /// These options with `unlink_on_drop`.
    pub fn with_unlink_on_drop(mut self, unlink_on_drop: bool) -> Self {
        self.unlink_on_drop = unlink_on_drop;
        self
    }

    /// The file that holds the named window `name`, after checking that
    /// `name` is a plain file name.
    pub fn path_of(&self, name: &str) -> Result<PathBuf, WindowError> {
        check_file_name(name)?;
        Ok(self.dir.join(name))
    }
}

/// The administrator's 2 MiB huge page reservation, as the kernel reports
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePageReserve {
    /// Pages reserved (`/proc/sys/vm/nr_hugepages`).
    pub total: u64,
    /// Pages not in use (`…/hugepages-2048kB/free_hugepages`).
    pub free: u64,
}

impl HugePageReserve {
    /// Reads the reservation; `None` where the kernel has no hugetlbfs.
    pub fn read() -> Option<HugePageReserve> {
        let read =
            |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
        Some(HugePageReserve {
            total: read(NR_HUGEPAGES_PATH)?,
            free: read(FREE_HUGEPAGES_PATH)?,
        })
    }
}

/// A shared-memory window: a mapping of a memfd or of a named file.
#[derive(Debug)]
pub struct ShmWindow {
    mapping: Mapping,
    file: File,
    /// What the file is called, for messages: `/memfd:NAME` or its path.
    path: PathBuf,
    backing: PageBacking,
    /// Set when dropping this window removes the named file.
    unlink_on_drop: bool,
    /// Whether `path` is a name in a directory (not a memfd's label).
    named: bool,
}

impl ShmWindow {
    /// Creates an anonymous window of `len` bytes (zeroed), sealed against
    /// resizing, to be passed to a peer by descriptor ([`fd`](Self::fd)).
    ///
    /// `name` labels it in `/proc/PID/fd` and `/proc/PID/maps` only; it need
    /// not be unique. `options.dir` and `options.unlink_on_drop` do not
    /// apply.
    pub fn create_memfd(
        name: &str,
        len: usize,
        options: &ShmOptions,
    ) -> Result<ShmWindow, WindowError> {
        if name.len() > MAX_MEMFD_NAME || name.contains('\0') {
            return Err(WindowError::InvalidName {
                name: name.to_owned(),
                reason: "a memfd name has at most 249 bytes and no NUL",
            });
        }
        check_len(len)?;
        let path = PathBuf::from(format!("/memfd:{name}"));
        match options.huge_pages {
            HugePages::Off => memfd_window(name, len, &path, PageBacking::Base),
            HugePages::Transparent => {
                memfd_window(name, len, &path, PageBacking::TransparentAdvised)
            }
            HugePages::Reserved => memfd_window(name, len, &path, PageBacking::Reserved2MiB),
            HugePages::ReservedOrTransparent => {
                match memfd_window(name, len, &path, PageBacking::Reserved2MiB) {
                    Err(WindowError::HugePagesUnavailable { .. }) => {
                        memfd_window(name, len, &path, PageBacking::TransparentAdvised)
                    }
                    other => other,
                }
            }
        }
    }

    /// Maps a window from a descriptor a peer sent (a memfd from
    /// [`create_memfd`](Self::create_memfd), or a shared-memory file); its
    /// length is the file's.
    ///
    /// Refuses what is not a regular file, an empty file, and a memfd that
    /// is not sealed against shrinking (it could be cut short under the
    /// mapping, which raises SIGBUS).
    pub fn from_fd(fd: OwnedFd) -> Result<ShmWindow, WindowError> {
        let path = describe_fd(fd.as_fd());
        let file = File::from(fd);
        let len = checked_file_len(&file, &path)?;
        match rustix::fs::fcntl_get_seals(&file) {
            Ok(seals) if !seals.contains(SealFlags::SHRINK) => {
                return Err(WindowError::NotAWindow {
                    path,
                    reason: "a memfd that is not sealed against shrinking (F_SEAL_SHRINK): \
                             its sender could truncate it under our mapping",
                });
            }
            // Sealed, or a file that does not support seals (EINVAL): a
            // named file, which only its owner can open (mode 0600).
            Ok(_) | Err(Errno::INVAL) => {}
            Err(e) => return Err(system("fcntl(F_GET_SEALS)", &path, e.raw_os_error())),
        }
        let backing = if is_hugetlbfs(&file) {
            PageBacking::Reserved2MiB
        } else {
            PageBacking::Base
        };
        let mapping = map(&file, len, &path)?;
        Ok(ShmWindow {
            mapping,
            file,
            path,
            backing,
            unlink_on_drop: false,
            named: false,
        })
    }

    /// Creates the named window `name` of `len` bytes (zeroed) in
    /// `options.dir`, private to this user (mode 0600).
    ///
    /// An existing file of that name is [`WindowError::NameInUse`]: it is
    /// never reused or truncated, since another process may be using it.
    pub fn create_named(
        name: &str,
        len: usize,
        options: &ShmOptions,
    ) -> Result<ShmWindow, WindowError> {
        let path = options.path_of(name)?;
        check_len(len)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(|e| open_error(&path, &e, "open(O_CREAT|O_EXCL)"))?;
        // From here on the file is ours: remove it again if creation fails.
        let mut window = ShmWindow::over_named_file(file, path.clone(), len, options, true)
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&path);
            })?;
        window.unlink_on_drop = options.unlink_on_drop;
        Ok(window)
    }

    /// Maps the existing named window `name` in `options.dir`; its length is
    /// the file's.
    ///
    /// Refuses a file that another user owns or that others can read or
    /// write ([`WindowError::NotPrivate`]), a symbolic link, and an empty
    /// file ([`WindowError::TooSmall`]: its creator may not have sized it
    /// yet — retry).
    pub fn open_named(name: &str, options: &ShmOptions) -> Result<ShmWindow, WindowError> {
        let path = options.path_of(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(|e| open_error(&path, &e, "open"))?;
        let metadata = file
            .metadata()
            .map_err(|e| system("fstat", &path, e.raw_os_error().unwrap_or(0)))?;
        let me = rustix::process::geteuid().as_raw();
        let mode = metadata.mode() & 0o7777;
        if metadata.uid() != me || mode & 0o077 != 0 {
            return Err(WindowError::NotPrivate {
                path,
                mode,
                owner: metadata.uid(),
                expected_owner: me,
            });
        }
        let len = checked_file_len(&file, &path)?;
        ShmWindow::over_named_file(file, path, len, options, false)
    }

    /// Sizes (when `create`), maps and advises a named file.
    fn over_named_file(
        file: File,
        path: PathBuf,
        len: usize,
        options: &ShmOptions,
        create: bool,
    ) -> Result<ShmWindow, WindowError> {
        let on_hugetlbfs = is_hugetlbfs(&file);
        let backing = match (options.huge_pages, on_hugetlbfs) {
            (_, true) => PageBacking::Reserved2MiB,
            (HugePages::Off, false) => PageBacking::Base,
            (HugePages::Transparent | HugePages::ReservedOrTransparent, false) => {
                PageBacking::TransparentAdvised
            }
            (HugePages::Reserved, false) => {
                return Err(WindowError::HugePagesUnavailable {
                    detail: format!(
                        "{} is not on hugetlbfs; for a named window on reserved huge pages set \
                         the directory to a hugetlbfs mount (e.g. /dev/hugepages), or use a \
                         memfd window",
                        path.display()
                    ),
                });
            }
        };
        let len = if create {
            let len = if on_hugetlbfs {
                round_up_to_huge_page(len)?
            } else {
                len
            };
            file.set_len(len as u64)
                .map_err(|e| system("ftruncate", &path, e.raw_os_error().unwrap_or(0)))?;
            // Make the mode exactly 0600 whatever the umask did.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| system("fchmod", &path, e.raw_os_error().unwrap_or(0)))?;
            len
        } else {
            len
        };
        let mapping = match map(&file, len, &path) {
            Err(WindowError::MapFailed { errno, .. })
                if on_hugetlbfs && errno == Errno::NOMEM.raw_os_error() =>
            {
                return Err(huge_pages_unavailable(len, &path));
            }
            other => other?,
        };
        if backing == PageBacking::TransparentAdvised {
            advise(&mapping, &path)?;
        }
        Ok(ShmWindow {
            mapping,
            file,
            path,
            backing,
            unlink_on_drop: false,
            named: true,
        })
    }

    /// The descriptor to send to a peer (memfd windows) — see
    /// [`send_fd`](super::send_fd).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The named window's file, or `/memfd:NAME` for a memfd.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which pages back the window.
    pub fn page_backing(&self) -> PageBacking {
        self.backing
    }

    /// Whether dropping this window removes its named file.
    pub fn unlinks_on_drop(&self) -> bool {
        self.unlink_on_drop
    }

    /// Sets whether dropping this window removes its named file (no effect
    /// on memfd windows, which have none). Keep it (`false`) to hand the
    /// name over to a process that outlives this one.
    pub fn set_unlink_on_drop(&mut self, unlink: bool) {
        self.unlink_on_drop = unlink && self.named;
    }
}

window_over_mapping!(ShmWindow);

impl Drop for ShmWindow {
    fn drop(&mut self) {
        if !self.unlink_on_drop {
            return;
        }
        // Remove the name only if it still names our file: after someone
        // removed it by hand and another process created the name anew,
        // that new window is not ours to delete.
        let (Ok(ours), Ok(now)) = (self.file.metadata(), std::fs::symlink_metadata(&self.path))
        else {
            return;
        };
        if ours.dev() == now.dev() && ours.ino() == now.ino() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates, sizes, seals and maps a memfd with the given backing.
fn memfd_window(
    name: &str,
    len: usize,
    path: &Path,
    backing: PageBacking,
) -> Result<ShmWindow, WindowError> {
    let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let len = if backing == PageBacking::Reserved2MiB {
        flags |= MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB;
        round_up_to_huge_page(len)?
    } else {
        len
    };
    let fd = rustix::fs::memfd_create(name, flags).map_err(|e| match e {
        // EINVAL with MFD_HUGETLB: a kernel without hugetlbfs.
        Errno::INVAL if backing == PageBacking::Reserved2MiB => WindowError::HugePagesUnavailable {
            detail: "the kernel refused MFD_HUGETLB (no hugetlbfs support); use \
                     HugePages::Transparent or Off"
                .to_owned(),
        },
        e => system("memfd_create", path, e.raw_os_error()),
    })?;
    let file = File::from(fd);
    file.set_len(len as u64)
        .map_err(|e| system("ftruncate", path, e.raw_os_error().unwrap_or(0)))?;
    // A peer that maps this must be able to trust its length: sealed, it
    // can neither shrink (SIGBUS in every mapping) nor grow, and the seals
    // themselves cannot change.
    rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(|e| system("fcntl(F_ADD_SEALS)", path, e.raw_os_error()))?;
    let mapping = match map(&file, len, path) {
        // hugetlbfs reserves the pages at mmap time: ENOMEM means not enough
        // are free.
        Err(WindowError::MapFailed { errno, .. })
            if backing == PageBacking::Reserved2MiB && errno == Errno::NOMEM.raw_os_error() =>
        {
            return Err(huge_pages_unavailable(len, path));
        }
        other => other?,
    };
    if backing == PageBacking::TransparentAdvised {
        advise(&mapping, path)?;
    }
    Ok(ShmWindow {
        mapping,
        file,
        path: path.to_owned(),
        backing,
        unlink_on_drop: false,
        named: false,
    })
}

fn map(file: &File, len: usize, path: &Path) -> Result<Mapping, WindowError> {
    Mapping::map_shared(file.as_fd(), len).map_err(|e| WindowError::MapFailed {
        path: path.to_owned(),
        len,
        errno: e.raw_os_error().unwrap_or(0),
    })
}

fn advise(mapping: &Mapping, path: &Path) -> Result<(), WindowError> {
    mapping
        .advise_huge_pages()
        .map_err(|e| WindowError::HugePagesUnavailable {
            detail: format!(
                "madvise(MADV_HUGEPAGE) on {} failed ({e}): this kernel has no transparent huge \
             pages; use HugePages::Off",
                path.display()
            ),
        })
}

/// The error for a hugetlbfs mapping that found too few free pages, with
/// the numbers and the fix.
fn huge_pages_unavailable(len: usize, path: &Path) -> WindowError {
    let pages = len.div_ceil(HUGE_PAGE_SIZE);
    let reserve = match HugePageReserve::read() {
        Some(r) => format!(
            "{NR_HUGEPAGES_PATH} is {}, {} of them free",
            r.total, r.free
        ),
        None => format!("{NR_HUGEPAGES_PATH} could not be read"),
    };
    WindowError::HugePagesUnavailable {
        detail: format!(
            "{} needs {pages} free 2 MiB pages and {reserve}; reserve more as root with \
             `echo N > {NR_HUGEPAGES_PATH}` (or `sysctl vm.nr_hugepages=N`), or ask for \
             HugePages::ReservedOrTransparent to fall back to transparent huge pages",
            path.display()
        ),
    }
}

fn is_hugetlbfs(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|fs| fs.f_type as u64 == HUGETLBFS_MAGIC)
}

fn round_up_to_huge_page(len: usize) -> Result<usize, WindowError> {
    len.checked_next_multiple_of(HUGE_PAGE_SIZE)
        .ok_or(WindowError::InvalidLength {
            len,
            reason: "too large to round up to a whole number of 2 MiB pages",
        })
}

fn check_len(len: usize) -> Result<(), WindowError> {
    if len == 0 {
        return Err(WindowError::InvalidLength {
            len,
            reason: "a window must have at least one byte",
        });
    }
    // `ftruncate` takes an `off_t`.
    if i64::try_from(len).is_err() {
        return Err(WindowError::InvalidLength {
            len,
            reason: "larger than a file can be",
        });
    }
    Ok(())
}

/// The length of a file that is to become a window: a regular file of at
/// least one byte that fits in the address space.
fn checked_file_len(file: &File, path: &Path) -> Result<usize, WindowError> {
    let metadata = file
        .metadata()
        .map_err(|e| system("fstat", path, e.raw_os_error().unwrap_or(0)))?;
    if !metadata.file_type().is_file() {
        return Err(WindowError::NotAWindow {
            path: path.to_owned(),
            reason: "not a regular file or memfd (a socket, pipe, device or directory?)",
        });
    }
    let len = usize::try_from(metadata.len()).map_err(|_| WindowError::InvalidLength {
        len: usize::MAX,
        reason: "the file is larger than the address space",
    })?;
    if len == 0 {
        return Err(WindowError::TooSmall {
            path: path.to_owned(),
            len,
            needed: 1,
        });
    }
    Ok(len)
}

/// What `/proc/self/fd` says a descriptor is (`/memfd:NAME (deleted)`, a
/// path), for messages.
fn describe_fd(fd: BorrowedFd<'_>) -> PathBuf {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    std::fs::read_link(format!("/proc/self/fd/{raw}"))
        .unwrap_or_else(|_| PathBuf::from(format!("fd {raw}")))
}

fn check_file_name(name: &str) -> Result<(), WindowError> {
    let reason = if name.is_empty() {
        "it is empty"
    } else if name == "." || name == ".." {
        "it names a directory"
    } else if name.contains('/') {
        "it contains '/' (a name, not a path: set ShmOptions::dir for another directory)"
    } else if name.contains('\0') {
        "it contains a NUL byte"
    } else if name.len() > MAX_FILE_NAME {
        "it is longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(WindowError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

fn open_error(path: &Path, error: &std::io::Error, operation: &'static str) -> WindowError {
    let errno = error.raw_os_error().unwrap_or(0);
    let path = path.to_owned();
    match Errno::from_raw_os_error(errno) {
        Errno::EXIST => WindowError::NameInUse { path },
        Errno::NOENT => WindowError::NotFound { path },
        Errno::ACCESS | Errno::PERM => WindowError::PermissionDenied { path, errno },
        Errno::LOOP => WindowError::NotAWindow {
            path,
            reason: "it is a symbolic link (windows are never opened through links)",
        },
        _ => WindowError::System {
            operation,
            path,
            errno,
        },
    }
}

fn system(operation: &'static str, path: &Path, errno: i32) -> WindowError {
    WindowError::System {
        operation,
        path: path.to_owned(),
        errno,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Window;
    use std::sync::atomic::Ordering;

    #[test]
    fn names_must_be_plain_file_names() {
        let options = ShmOptions::default();
        for bad in ["", ".", "..", "a/b", "/abs", "nul\0", &"x".repeat(256)] {
            assert!(
                matches!(options.path_of(bad), Err(WindowError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            options.path_of("barlink-0").unwrap(),
            Path::new("/dev/shm/barlink-0")
        );
    }

    #[test]
    fn memfd_is_sealed_and_maps_back() {
        let window = ShmWindow::create_memfd("unit", 8192, &ShmOptions::default()).unwrap();
        let seals = rustix::fs::fcntl_get_seals(window.fd()).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        window.store_u64(8, 77, Ordering::Release).unwrap();

        let dup = window.fd().try_clone_to_owned().unwrap();
        let peer = ShmWindow::from_fd(dup).unwrap();
        assert_eq!(peer.len(), 8192);
        assert_eq!(peer.load_u64(8, Ordering::Acquire), Ok(77));
        assert!(peer.path().to_string_lossy().contains("memfd:unit"));
    }

    #[test]
    fn unsealed_memfd_is_refused() {
        let fd = rustix::fs::memfd_create("unsealed", MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        assert!(matches!(
            ShmWindow::from_fd(fd),
            Err(WindowError::NotAWindow { .. })
        ));
    }

    #[test]
    fn round_up_never_overflows() {
        assert_eq!(round_up_to_huge_page(1), Ok(HUGE_PAGE_SIZE));
        assert_eq!(round_up_to_huge_page(HUGE_PAGE_SIZE), Ok(HUGE_PAGE_SIZE));
        assert!(round_up_to_huge_page(usize::MAX).is_err());
    }
}
