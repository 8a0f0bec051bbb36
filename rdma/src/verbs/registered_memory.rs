//! [`RegisteredMemory`]: page-aligned memory of our own, mapped here and
//! registered with the device, read and written through the [`Window`]
//! accessors only.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

use barlink_transport::crc::Crc32c;
use barlink_transport::window::{RawWindow, Window, WindowError};

use super::mr::{MemoryRegion, RemoteRegion, Sge};
use super::pd::ProtectionDomain;
use super::values::Access;
use crate::error::RdmaError;
use crate::sys;

/// How [`RegisteredMemory`] backs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePolicy {
    /// Ordinary 4 KiB pages.
    #[default]
    Never,
    /// 2 MiB huge pages (`MAP_HUGETLB`) when some are reserved, else
    /// ordinary pages.
    Prefer,
    /// 2 MiB huge pages or an error (reserve some: `/proc/sys/vm/nr_hugepages`).
    Require,
}

/// Options of [`RegisteredMemory::with_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Page backing.
    pub huge_pages: HugePolicy,
    /// Access rights of the registration.
    pub access: Access,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            huge_pages: HugePolicy::Never,
            access: Access::RDMA,
        }
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// An anonymous private mapping, unmapped on drop.
struct AnonMap {
    base: NonNull<u8>,
    mapped_len: usize,
}

// SAFETY: owned exclusively; accessed only through raw pointers and atomics.
unsafe impl Send for AnonMap {}
// SAFETY: as above.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    fn new(len: usize, huge: bool) -> Result<AnonMap, RdmaError> {
        let unit = if huge { HUGE_PAGE } else { page_size() };
        let mapped_len = len.max(1).checked_next_multiple_of(unit).ok_or_else(|| {
            RdmaError::InvalidArgument {
                what: format!("{len} bytes is more than the address space holds"),
            }
        })?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if huge {
            flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        }
        // SAFETY: a null hint lets the kernel choose the address, so no
        // existing mapping is replaced; the mapping is owned by the returned
        // value and unmapped only in its `drop`.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(RdmaError::verbs("mmap", sys::errno()));
        }
        let base = NonNull::new(raw.cast::<u8>()).ok_or_else(|| RdmaError::verbs("mmap", 0))?;
        Ok(AnonMap { base, mapped_len })
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, owned by this value;
        // no reference into it exists (none is ever handed out), and the
        // registration over it was dropped first (field order of
        // `RegisteredMemory`).
        unsafe { libc::munmap(self.base.as_ptr().cast::<c_void>(), self.mapped_len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Zeroed, page-aligned memory of our own, registered with the device:
/// the buffers RDMA reads from and the rings peers write into.
///
/// The device (and peers, through it) writes this memory at any time, so
/// it is reached only through the [`Window`] accessors (copies and 64-bit
/// atomics, every offset checked) — never as `&[u8]`. Work requests name
/// parts of it with [`RegisteredMemory::sge`]; peers get
/// [`RegisteredMemory::remote`].
pub struct RegisteredMemory {
    // Field order matters: the registration is dropped before the memory.
    mr: MemoryRegion,
    /// The transport's checked accessors over the first `len` bytes of
    /// `map` (copies, the fused copy+CRC, 64-bit atomics); it owns nothing.
    view: RawWindow,
    /// Owns the pages `view` reaches: read by nothing, unmapped on drop,
    /// after the registration.
    _map: AnonMap,
    len: usize,
    huge: bool,
}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("len", &self.len)
            .field("huge_pages", &self.huge)
            .field("mr", &self.mr)
            .finish()
    }
}

impl RegisteredMemory {
    /// `len` bytes (at least 1) of zeroed memory on ordinary pages,
    /// registered in `pd` with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    pub fn new(pd: &ProtectionDomain, len: usize) -> Result<RegisteredMemory, RdmaError> {
        RegisteredMemory::with_options(pd, len, &MemoryOptions::default())
    }

    /// [`RegisteredMemory::new`] with a page backing and access rights.
    pub fn with_options(
        pd: &ProtectionDomain,
        len: usize,
        options: &MemoryOptions,
    ) -> Result<RegisteredMemory, RdmaError> {
        let len = len.max(1);
        let (map, huge) = match options.huge_pages {
            HugePolicy::Never => (AnonMap::new(len, false)?, false),
            HugePolicy::Require => (
                AnonMap::new(len, true).map_err(|e| match e {
                    RdmaError::Verbs { errno, .. } => RdmaError::Unsupported {
                        what: format!(
                            "2 MiB huge pages for {len} bytes: {} (reserve some: echo N > \
                             /proc/sys/vm/nr_hugepages)",
                            crate::error::strerror(errno)
                        ),
                    },
                    other => other,
                })?,
                true,
            ),
            HugePolicy::Prefer => match AnonMap::new(len, true) {
                Ok(m) => (m, true),
                Err(_) => (AnonMap::new(len, false)?, false),
            },
        };
        // SAFETY: `map` is a live private mapping of at least `len` bytes,
        // kept alive by the returned value until after the registration
        // (field order), and never referenced as a Rust slice.
        let mr = unsafe { pd.register_raw(map.base.as_ptr(), len, options.access)? };
        // SAFETY: the first `len` bytes of `map` stay mapped while `view`
        // lives (both are fields of the returned value, and `map` is
        // dropped last), and no Rust reference into them is ever formed:
        // all access goes through the window's accessors.
        let view = unsafe { RawWindow::new(map.base, len) };
        Ok(RegisteredMemory {
            mr,
            view,
            _map: map,
            len,
            huge,
        })
    }

    /// The registration (keys, address).
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The address of the first byte (what [`Sge`]s and peers use).
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Whether 2 MiB huge pages back it.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, RdmaError> {
        self.mr.sge(offset, len)
    }

    /// What a peer needs to write into this memory.
    pub fn remote(&self) -> RemoteRegion {
        self.mr.remote()
    }
}

impl Window for RegisteredMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.view.write(offset, src)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.view.read(offset, dst)
    }

    /// One pass: each piece of `src` is loaded once, stored into the
    /// registered memory and folded into the CRC (the transport's fused
    /// kernel, as its own windows use).
    fn write_crc(&self, offset: usize, src: &[u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.view.write_crc(offset, src, crc)
    }

    /// One pass, and the CRC is of the bytes as they landed in `dst` even
    /// if the device writes the source meanwhile.
    fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.view.read_crc(offset, dst, crc)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        self.view.load_u64(offset, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        self.view.store_u64(offset, value, order)
    }

    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        self.view.fetch_add_u64(offset, value, order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The accessors behind `RegisteredMemory`'s `Window` (no device
    /// needed: the same code over the same kind of mapping).
    #[test]
    fn registered_memory_accessors_check_ranges_and_crc_in_one_pass() {
        use barlink_transport::crc::crc32c;
        let map = AnonMap::new(10_000, false).unwrap();
        assert!(map.mapped_len >= 10_000);
        // SAFETY: `map` outlives `w` (both locals, `w` dropped first) and
        // nothing references its bytes.
        let w = unsafe { RawWindow::new(map.base, 10_000) };
        let data: Vec<u8> = (0..9_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        // One-pass copy + CRC, both ways, at an odd offset.
        let mut crc = Crc32c::new();
        w.write_crc(123, &data, &mut crc).unwrap();
        assert_eq!(crc.finish(), crc32c(&data));
        let mut back = vec![0u8; data.len()];
        let mut crc = Crc32c::new();
        w.read_crc(123, &mut back, &mut crc).unwrap();
        assert_eq!(back, data);
        assert_eq!(crc.finish(), crc32c(&data));
        // Ranges: the logical length bounds, not the (larger) mapping.
        let mut crc = Crc32c::new();
        assert!(matches!(
            w.write_crc(1_001, &data, &mut crc),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(w.read(9_999, &mut [0u8; 2]).is_err());
        assert!(w.read(usize::MAX, &mut [0u8; 1]).is_err());
        assert!(w.write(10_000, &[]).is_ok());
        assert!(w.write(10_001, &[]).is_err());
        // Words: aligned and in range.
        assert!(matches!(
            w.load_u64(4, Ordering::Acquire),
            Err(WindowError::Misaligned { .. })
        ));
        assert!(w.load_u64(9_992, Ordering::Acquire).is_ok());
        assert!(w.load_u64(9_996, Ordering::Acquire).is_err());
        w.store_u64(8, 0x0102_0304_0506_0708, Ordering::Release)
            .unwrap();
        let mut bytes = [0u8; 8];
        w.read(8, &mut bytes).unwrap();
        assert_eq!(u64::from_le_bytes(bytes), 0x0102_0304_0506_0708);
    }
}
