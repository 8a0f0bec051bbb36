//! BAR windows: a PCI BAR mapped into this process and used as a
//! [`Window`] — a link's receive ring, or the peer ring it writes.
//!
//! Two routes to the same [`BarWindow`] type, so a link can mix them:
//! - VFIO ([`VfioDevice::map_region`](crate::VfioDevice::map_region)): the
//!   device is bound to vfio-pci; the window can also be DMA-mapped for
//!   devices of any container.
//! - sysfs ([`SysfsBar::open`]): `/sys/bus/pci/devices/BDF/resourceN`
//!   (`resourceN_wc`, write-combining, when the kernel offers it) — the
//!   route for a GPU that stays bound to its vendor driver. Needs root.
//!
//! And [`DmaBuffer`]: anonymous host memory for a device to DMA into or
//! from, also a window.
//!
//! Windows share their mapping: [`BarWindow::slice`] gives a window over
//! part of a BAR (a ring at an offset), and the mapping (and the device or
//! file under it) lives while any slice does.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use barlink_topology::pci::address::Bdf;
use barlink_topology::pci::resource::{BarSpace, parse_resource};
use barlink_transport::window::{Window, WindowError};

use crate::bind;
use crate::bind::DeviceSpec;
use crate::container::DmaTarget;
use crate::container::sealed::Sealed;
use crate::env::VfioEnv;
use crate::error::VfioError;
use crate::sys::region::{Owner, Region};
use crate::sys::{Errno, Prot, VfioSys};

/// Where a window's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BarSource {
    /// A region of a device opened through VFIO.
    Vfio {
        /// The device.
        bdf: Bdf,
        /// The region (BAR) index.
        index: u32,
    },
    /// A sysfs `resourceN` file.
    Sysfs {
        /// The device.
        bdf: Bdf,
        /// The BAR.
        index: u32,
        /// The file mapped.
        path: PathBuf,
        /// Whether it was `resourceN_wc` (write-combining).
        write_combining: bool,
    },
}

impl fmt::Display for BarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BarSource::Vfio { bdf, index } => write!(f, "BAR {index} of {bdf} via VFIO"),
            BarSource::Sysfs {
                path,
                write_combining,
                ..
            } => write!(
                f,
                "{} ({})",
                path.display(),
                if *write_combining {
                    "write-combining"
                } else {
                    "uncached"
                }
            ),
        }
    }
}

/// A BAR (or part of one) mapped into this process, reached only through
/// the [`Window`] accessors and the register accessors here. Cheap to clone.
#[derive(Clone)]
pub struct BarWindow {
    region: Arc<Region>,
    offset: usize,
    len: usize,
    source: Arc<BarSource>,
}

impl fmt::Debug for BarWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarWindow")
            .field("source", &self.source)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl BarWindow {
    pub(crate) fn new(region: Arc<Region>, source: BarSource) -> BarWindow {
        BarWindow {
            len: region.len(),
            region,
            offset: 0,
            source: Arc::new(source),
        }
    }

    /// Claims this window as a link's receive ring for as long as its
    /// mapping lives (the window, and any slice or clone of it): another
    /// open of the same sysfs file that claims any of these bytes, in
    /// another process or this one, gets [`VfioError::WindowInUse`]
    /// instead of laying a second ring over a live one. Claims are file
    /// locks (open file description locks) on the file mapped, so a
    /// process that dies gives its windows back; `resourceN` and
    /// `resourceN_wc` are separate files, and barlink maps the latter
    /// whenever it exists. A child that inherits the descriptor (`fork`)
    /// holds the claim too. A window mapped through VFIO needs none: a VFIO
    /// group is open in one process at a time. `Ok(false)`: the kernel
    /// refused file locks here (`ENOLCK`, or `EINVAL` from a kernel
    /// without open file description locks), and the window goes
    /// unclaimed (the caller says so).
    pub fn claim_ring(&self) -> Result<bool, VfioError> {
        let (Some(fd), BarSource::Sysfs { path, .. }) = (self.region.fd(), &*self.source) else {
            return Ok(true);
        };
        let (offset, len) = (self.offset as u64, self.len as u64);
        match self.region.sys().lock_range(fd, offset, len) {
            Ok(()) => Ok(true),
            Err(errno) if errno.0 == libc::EAGAIN || errno.0 == libc::EACCES => {
                Err(VfioError::WindowInUse {
                    path: path.clone(),
                    offset,
                    len,
                })
            }
            Err(errno) if errno.0 == libc::ENOLCK || errno.0 == libc::EINVAL => Ok(false),
            Err(errno) => Err(VfioError::System {
                operation: "fcntl(F_OFD_SETLK)",
                target: path.display().to_string(),
                errno,
            }),
        }
    }

    /// Where the memory comes from (VFIO, or which sysfs file).
    pub fn source(&self) -> &BarSource {
        &self.source
    }

    /// Offset of this window in the BAR (non-zero for slices).
    pub fn offset_in_bar(&self) -> usize {
        self.offset
    }

    /// The whole BAR's mapped length.
    pub fn bar_len(&self) -> usize {
        self.region.len()
    }

    /// Whether the window can be written.
    pub fn writable(&self) -> bool {
        self.region.prot().write
    }

    /// A window over `len` bytes at `offset` of this one (sharing the
    /// mapping). For rings, keep `offset` a multiple of 64 (atomics need 8,
    /// cache lines 64; DMA mapping needs pages).
    pub fn slice(&self, offset: usize, len: usize) -> Result<BarWindow, WindowError> {
        let offset = self.at(offset, len)? - self.offset;
        if len == 0 {
            return Err(WindowError::InvalidLength {
                len,
                reason: "a window must have at least one byte",
            });
        }
        Ok(BarWindow {
            region: self.region.clone(),
            offset: self.offset + offset,
            len,
            source: self.source.clone(),
        })
    }

    fn at(&self, offset: usize, len: usize) -> Result<usize, WindowError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(WindowError::OutOfBounds {
                offset,
                len,
                window_len: self.len,
            }),
        }
    }

    /// Volatile 32-bit read of a register at `offset` (exact width, as
    /// device registers need).
    pub fn read_u32(&self, offset: usize) -> Result<u32, WindowError> {
        self.region.memory().read_u32(self.at(offset, 4)?)
    }

    /// Volatile 32-bit write of a register.
    pub fn write_u32(&self, offset: usize, value: u32) -> Result<(), WindowError> {
        self.region.memory().write_u32(self.at(offset, 4)?, value)
    }

    /// Volatile 64-bit read of a register.
    pub fn read_u64(&self, offset: usize) -> Result<u64, WindowError> {
        self.region.memory().read_u64(self.at(offset, 8)?)
    }

    /// Volatile 64-bit write of a register.
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), WindowError> {
        self.region.memory().write_u64(self.at(offset, 8)?, value)
    }
}

impl Window for BarWindow {
    fn len(&self) -> usize {
        self.len
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.region.memory().write(self.at(offset, src.len())?, src)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.region.memory().read(self.at(offset, dst.len())?, dst)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        self.region.memory().load_u64(self.at(offset, 8)?, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        self.region
            .memory()
            .store_u64(self.at(offset, 8)?, value, order)
    }

    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        // Refused by device memory: PCIe has no such operation.
        self.region
            .memory()
            .fetch_add_u64(self.at(offset, 8)?, value, order)
    }

    fn store_fence(&self) {
        self.region.memory().store_fence();
    }
}

/// How [`SysfsBar::open_with`] maps a BAR.
#[derive(Debug, Clone)]
pub struct SysfsBarOptions {
    /// The sysfs root (`/`) and system calls.
    pub env: VfioEnv,
    /// Map `resourceN_wc` (write-combining) when it exists (default: yes).
    /// Faster for bulk writes into a peer's ring; the ring's store fence
    /// keeps index stores behind the data.
    pub prefer_write_combining: bool,
    /// Bytes to map from the start of the BAR (default: all of it).
    pub len: Option<usize>,
}

impl Default for SysfsBarOptions {
    fn default() -> Self {
        SysfsBarOptions {
            env: VfioEnv::default(),
            prefer_write_combining: true,
            len: None,
        }
    }
}

/// The sysfs route to a BAR: `resourceN` files, for devices that stay bound
/// to their own driver (a GPU under its vendor driver). Opens return a
/// [`BarWindow`], like the VFIO route.
#[derive(Debug, Clone, Copy)]
pub struct SysfsBar;

/// Closes a file descriptor through its [`VfioSys`] when dropped (owner of
/// a sysfs mapping's file, released after the `munmap`).
struct FdGuard {
    sys: Arc<dyn VfioSys>,
    fd: i32,
}

impl Drop for FdGuard {
    fn drop(&mut self) {
        self.sys.close(self.fd);
    }
}

impl SysfsBar {
    /// Maps BAR `index` of the device named by `spec` (an address or
    /// `vendor:device`) through `/sys/bus/pci/devices/BDF/resourceN`,
    /// preferring `resourceN_wc`.
    pub fn open(spec: &str, index: u32) -> Result<BarWindow, VfioError> {
        SysfsBar::open_with(spec, index, &SysfsBarOptions::default())
    }

    /// [`SysfsBar::open`] with options (sysfs root, write-combining, length).
    ///
    /// Checks, each with its own error: the device exists; the BAR is a
    /// memory BAR with an address (an I/O BAR is [`VfioError::IoSpaceBar`]);
    /// the file exists; it is at least as long as asked; the open and the
    /// mapping are allowed.
    pub fn open_with(
        spec: &str,
        index: u32,
        options: &SysfsBarOptions,
    ) -> Result<BarWindow, VfioError> {
        let root = &options.env.sysfs_root;
        let bdf = spec.parse::<DeviceSpec>()?.resolve(root)?;
        let dir = bind::device_dir(root, bdf);
        check_memory_bar(&dir, bdf, index)?;
        let plain = dir.join(format!("resource{index}"));
        let wc = dir.join(format!("resource{index}_wc"));
        let (path, write_combining) = if options.prefer_write_combining && wc.exists() {
            (wc, true)
        } else {
            (plain, false)
        };
        if !path.exists() {
            return Err(VfioError::ResourceMissing { path });
        }
        let sys = options.env.sys.clone();
        let fd = sys.open(&path).map_err(|errno| open_error(&path, errno))?;
        let guard = FdGuard {
            sys: sys.clone(),
            fd,
        };
        let size = sys.file_size(fd).map_err(|errno| VfioError::System {
            operation: "fstat",
            target: path.display().to_string(),
            errno,
        })?;
        let len = match options.len {
            Some(len) => len,
            None => usize::try_from(size).unwrap_or(usize::MAX),
        };
        if len == 0 || len as u64 > size {
            return Err(VfioError::BarTooSmall {
                path,
                size,
                requested: len as u64,
            });
        }
        let owner: Owner = Arc::new(guard);
        let region =
            Region::map(sys, Some(fd), len, 0, Prot::READ_WRITE, Some(owner)).map_err(|errno| {
                VfioError::MapFailed {
                    what: path.display().to_string(),
                    len,
                    errno,
                }
            })?;
        Ok(BarWindow::new(
            Arc::new(region),
            BarSource::Sysfs {
                bdf,
                index,
                path,
                write_combining,
            },
        ))
    }
}

/// Refuses a BAR that the `resource` file shows as absent, unassigned or
/// I/O space (a missing or unreadable `resource` file is left to the open
/// of `resourceN` to report).
fn check_memory_bar(dir: &Path, bdf: Bdf, index: u32) -> Result<(), VfioError> {
    let Ok(text) = std::fs::read_to_string(dir.join("resource")) else {
        return Ok(());
    };
    let (bars, _) = parse_resource(&text);
    let bar = bars.iter().find(|b| u32::from(b.index) == index);
    match bar {
        Some(bar) if bar.space == BarSpace::Io => Err(VfioError::IoSpaceBar { bdf, index }),
        Some(bar) if bar.size == 0 || bar.unassigned => Err(VfioError::RegionNotMappable {
            bdf,
            index,
            flags: 0,
            size: bar.size,
            reason: "the BAR has no address assigned (too little MMIO space: enable \
                     \"Above 4G decoding\" in firmware, or pci=realloc)"
                .into(),
        }),
        Some(_) => Ok(()),
        None if index < 6 => Err(VfioError::RegionNotMappable {
            bdf,
            index,
            flags: 0,
            size: 0,
            reason: "the device has no BAR at this index (see its `resource` file)".into(),
        }),
        None => Err(VfioError::ResourceMissing {
            path: dir.join(format!("resource{index}")),
        }),
    }
}

fn open_error(path: &Path, errno: Errno) -> VfioError {
    if errno.is_permission() {
        VfioError::PermissionDenied {
            path: path.to_path_buf(),
            errno,
        }
    } else if errno.0 == libc::ENOENT {
        VfioError::ResourceMissing {
            path: path.to_path_buf(),
        }
    } else {
        VfioError::System {
            operation: "open",
            target: path.display().to_string(),
            errno,
        }
    }
}

/// Anonymous, page-aligned host memory for devices to DMA into or from
/// (map it with [`Container::map_dma`](crate::Container::map_dma)); a
/// window too, since a device may write it at any time.
#[derive(Clone)]
pub struct DmaBuffer {
    region: Arc<Region>,
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("len", &self.region.len())
            .finish_non_exhaustive()
    }
}

impl DmaBuffer {
    /// `len` bytes (rounded up to whole pages) of zeroed memory.
    pub fn new(len: usize) -> Result<DmaBuffer, VfioError> {
        DmaBuffer::new_in(&VfioEnv::default(), len)
    }

    /// [`DmaBuffer::new`] with another system-call layer.
    pub fn new_in(env: &VfioEnv, len: usize) -> Result<DmaBuffer, VfioError> {
        let page = crate::sys::page_size();
        let Some(len) = len.max(1).checked_next_multiple_of(page) else {
            return Err(VfioError::MapFailed {
                what: "anonymous memory".into(),
                len,
                errno: Errno(libc::ENOMEM),
            });
        };
        let region = Region::map(env.sys.clone(), None, len, 0, Prot::READ_WRITE, None).map_err(
            |errno| VfioError::MapFailed {
                what: "anonymous memory".into(),
                len,
                errno,
            },
        )?;
        Ok(DmaBuffer {
            region: Arc::new(region),
        })
    }
}

impl Window for DmaBuffer {
    fn len(&self) -> usize {
        self.region.len()
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.region.memory().write(offset, src)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.region.memory().read(offset, dst)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        self.region.memory().load_u64(offset, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        self.region.memory().store_u64(offset, value, order)
    }

    fn fetch_add_u64(
        &self,
        _offset: usize,
        _value: u64,
        _order: Ordering,
    ) -> Result<u64, WindowError> {
        Err(WindowError::Unsupported {
            operation: "fetch_add_u64",
            reason: "a DMA buffer is shared with a device, which cannot take part in a CPU's \
                     atomic read-modify-write",
        })
    }

    fn store_fence(&self) {
        self.region.memory().store_fence();
    }
}

impl Sealed for BarWindow {}
impl Sealed for DmaBuffer {}

impl DmaTarget for BarWindow {
    fn dma_range(&self) -> (&Arc<Region>, usize, usize) {
        (&self.region, self.offset, self.len)
    }
}

impl DmaTarget for DmaBuffer {
    fn dma_range(&self) -> (&Arc<Region>, usize, usize) {
        (&self.region, 0, self.region.len())
    }
}
