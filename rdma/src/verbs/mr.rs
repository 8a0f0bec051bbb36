//! [`MemoryRegion`]: memory registered with the device (host memory or a
//! dma-buf), the [`Sge`]s that name parts of it in work requests, and the
//! peer's regions ([`RemoteRegion`], [`RemoteAddr`]) that RDMA WRITEs
//! target.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use super::pd::{PdInner, ProtectionDomain};
use super::values::Access;
use crate::error::RdmaError;
use crate::sys;

/// Registered memory (`ibv_mr`): what the device may access, named by
/// `lkey` locally and `rkey` by peers. Deregistered on drop.
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    pd: Arc<PdInner>,
}

// SAFETY: an MR is usable from any thread; deregistered once, in `drop`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; it is read-only after creation.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register_raw`/`register_dmabuf`,
        // deregistered once; after this the device no longer accesses the
        // memory (the kernel invalidates the key before returning).
        let rc = unsafe { (self.pd.ctx.v.dereg_mr)(self.raw.as_ptr()) };
        debug_assert_eq!(rc, 0, "ibv_dereg_mr failed");
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` with `access` (`ibv_reg_mr`).
    ///
    /// Prefer [`RegisteredMemory`](crate::verbs::RegisteredMemory), which owns its memory. This is for
    /// memory that exists already (a registration cache, a caller's
    /// buffer).
    ///
    /// # Safety
    /// `addr..addr + len` must be mapped memory of this process that stays
    /// mapped until the returned region is dropped, and while the region
    /// lives (and any work request that names it is in flight) the memory
    /// must not be accessed through Rust references: the device may read
    /// or write it at any time.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        let access_bits = c_int::try_from(access.bits()).unwrap_or(0);
        // SAFETY: the PD is live; the range is mapped and ours for the
        // region's lifetime (this function's contract); the MR is
        // deregistered in `MrInner::drop`.
        let raw = unsafe {
            (self.inner.ctx.v.reg_mr)(self.inner.raw.as_ptr(), addr.cast(), len, access_bits)
        };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_reg_mr", sys::errno()))?;
        Ok(MemoryRegion::from_raw(raw, self.inner.clone(), addr as u64))
    }

    /// Registers a dma-buf (`ibv_reg_dmabuf_mr`): `len` bytes at `offset`
    /// into the buffer behind `fd`, addressed by the device (and by
    /// [`Sge`]s and peers) as `iova` onwards. This is how GPU memory is
    /// registered for GPUDirect RDMA with current drivers (the GPU driver
    /// exports the dma-buf).
    ///
    /// [`RdmaError::Unsupported`] when libibverbs predates it (rdma-core
    /// 34, IBVERBS_1.12) or the provider/driver refuses dma-buf (soft-RoCE
    /// does); the library keeps its own reference to the dma-buf, so `fd`
    /// may be closed afterwards.
    pub fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        let v = self.inner.ctx.v;
        let Some(reg) = v.reg_dmabuf_mr else {
            return Err(RdmaError::Unsupported {
                what: format!(
                    "dma-buf registration: {} has no ibv_reg_dmabuf_mr (IBVERBS_1.12, \
                     rdma-core 34 or later)",
                    v.library
                ),
            });
        };
        let access_bits = c_int::try_from(access.bits()).unwrap_or(0);
        // SAFETY: the PD is live; `fd` is open for the call (borrowed); the
        // device maps the dma-buf itself, no memory of ours is named; the MR
        // is deregistered in `MrInner::drop`.
        let raw = unsafe {
            reg(
                self.inner.raw.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access_bits,
            )
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(MemoryRegion::from_raw(raw, self.inner.clone(), iova)),
            None => {
                let errno = sys::errno();
                if matches!(
                    errno,
                    libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT
                ) {
                    Err(RdmaError::Unsupported {
                        what: format!(
                            "dma-buf registration on {}: the provider or kernel driver refuses \
                             it ({}); soft-RoCE (rxe) and older drivers do not support dma-buf \
                             memory regions -- register a host bounce buffer instead",
                            self.inner.ctx.name,
                            crate::error::strerror(errno)
                        ),
                    })
                } else {
                    Err(RdmaError::verbs("ibv_reg_dmabuf_mr", errno))
                }
            }
        }
    }
}

impl MemoryRegion {
    fn from_raw(raw: NonNull<sys::ibv_mr>, pd: Arc<PdInner>, addr: u64) -> MemoryRegion {
        // SAFETY: the MR was just registered and is live.
        let (len, lkey, rkey) = unsafe {
            let mr = &*raw.as_ptr();
            (mr.length, mr.lkey, mr.rkey)
        };
        MemoryRegion {
            raw,
            addr,
            len,
            lkey,
            rkey,
            pd,
        }
    }

    /// The address the device uses for the region's first byte (the
    /// virtual address for host memory, the IOVA for dma-buf).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key (for [`Sge`]s).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key (for peers' RDMA WRITE/READ).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// What a peer needs to write into this region: send it out of band.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len as u64,
        }
    }

    /// A scatter/gather entry for `len` bytes at `offset` into the region,
    /// checked against its bounds (and the 4 GiB a work request can carry).
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, RdmaError> {
        check_slice(offset, len, self.len, "memory region")?;
        let length = u32::try_from(len).map_err(|_| RdmaError::InvalidArgument {
            what: format!("an SGE carries less than 4 GiB, not {len} bytes"),
        })?;
        Ok(Sge {
            addr: self.addr + offset as u64,
            length,
            lkey: self.lkey,
        })
    }
}

fn check_slice(offset: usize, len: usize, total: usize, what: &str) -> Result<(), RdmaError> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(RdmaError::InvalidArgument {
            what: format!("{len} bytes at offset {offset} lie outside the {total}-byte {what}"),
        }),
    }
}

/// A local buffer of a work request: a range of a registered region (made
/// only by [`MemoryRegion::sge`] or [`RegisteredMemory::sge`](crate::verbs::RegisteredMemory::sge), which check
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

impl Sge {
    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> u32 {
        self.length
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    pub(super) fn raw(&self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
        }
    }
}

/// A peer's registered region, as it sent it out of band: the target of
/// RDMA WRITEs. Nothing here is trusted; the peer's device checks every
/// access against its registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The peer's address of the region's first byte.
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// The target of a write of `len` bytes at `offset`, checked against
    /// the region's length (so that a bad offset fails here, not as a
    /// remote access error that kills the QP).
    pub fn at(&self, offset: u64, len: usize) -> Result<RemoteAddr, RdmaError> {
        // The fields are the peer's: the address may be anything, so its
        // sum with the offset is checked too (no overflow panic or wrap).
        let addr = self.addr.checked_add(offset);
        match (offset.checked_add(len as u64), addr) {
            (Some(end), Some(addr)) if end <= self.len => Ok(RemoteAddr {
                addr,
                rkey: self.rkey,
            }),
            _ => Err(RdmaError::InvalidArgument {
                what: format!(
                    "{len} bytes at offset {offset} lie outside the peer's {}-byte region",
                    self.len
                ),
            }),
        }
    }
}

/// Where an RDMA WRITE lands: a peer's address and remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The peer's address.
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_region_checks_bounds() {
        let r = RemoteRegion {
            addr: 0x1000,
            rkey: 5,
            len: 100,
        };
        assert_eq!(
            r.at(10, 90).unwrap(),
            RemoteAddr {
                addr: 0x100a,
                rkey: 5
            }
        );
        assert!(r.at(10, 91).is_err());
        assert!(r.at(u64::MAX, 1).is_err());
        // A peer's region whose address would wrap: an error, not a panic.
        let high = RemoteRegion {
            addr: u64::MAX - 10,
            rkey: 5,
            len: 100,
        };
        assert!(high.at(5, 1).is_ok());
        assert!(high.at(20, 1).is_err());
    }
}
