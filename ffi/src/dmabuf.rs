//! [`DmaBuf`]: a range of a dma-buf (memory another driver exported as a
//! file descriptor: a GPU's, a DRM buffer, a udmabuf) mapped for the CPU,
//! so that a registered buffer can be sent from it.
//!
//! barlink takes every payload's CRC on the CPU, so a buffer it sends
//! from must be readable by the CPU. A dma-buf is when its exporter lets
//! it be mapped (`mmap` on the fd); NVIDIA's exports of device memory do
//! not, and registering one is answered `BARLINK_NOT_AVAILABLE` with the
//! kernel's reason. Reads are bracketed by `DMA_BUF_IOCTL_SYNC`, as the
//! kernel asks of every CPU access, so that an exporter with caches to
//! keep coherent (or fences to wait for) is told.
//!
//! An RDMA link may also register the same range with its NIC
//! (`ibv_reg_dmabuf_mr`, through [`SendMemory`]): the NIC then reads the
//! dma-buf itself and the CPU reads it only for the CRC.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use barlink::rdma::SendMemory;
use rustix::fs::SeekFrom;
use rustix::ioctl::{Setter, ioctl, opcode};
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{Error, Result};
use crate::types::barlink_status::{BARLINK_NOT_AVAILABLE, BARLINK_OUT_OF_MEMORY};

/// `DMA_BUF_MAGIC`: the `f_type` of the dma-buf pseudo file system.
const DMA_BUF_MAGIC: u64 = 0x444d_4142;
/// `DMA_BUF_IOCTL_SYNC`: `_IOW('b', 0, struct dma_buf_sync { __u64 flags; })`.
const DMA_BUF_IOCTL_SYNC: rustix::ioctl::Opcode = opcode::write::<u64>(b'b', 0);
const DMA_BUF_SYNC_READ: u64 = 1;
const DMA_BUF_SYNC_START: u64 = 0;
const DMA_BUF_SYNC_END: u64 = 4;

/// A dma-buf range mapped read-only for the CPU; unmapped on drop.
pub(crate) struct DmaBuf {
    /// barlink's own reference to the dma-buf (the caller may close theirs).
    fd: OwnedFd,
    /// Where the mapping starts: the dma-buf's first byte.
    map: NonNull<u8>,
    map_len: usize,
    /// The registered range: `len` bytes from `map + head` (`head` is the
    /// offset).
    head: usize,
    len: usize,
    offset: u64,
}

// SAFETY: `DmaBuf` owns its mapping (unmapped only in `drop`) and its fd;
// the mapping is read only through raw pointers under the registration's
// contract, which does not depend on the thread.
unsafe impl Send for DmaBuf {}
// SAFETY: as for `Send`; shared access reads immutable fields or makes
// ioctls, which the kernel serializes.
unsafe impl Sync for DmaBuf {}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DmaBuf {
    /// Maps `len` bytes at `offset` of the dma-buf behind `fd` for the CPU.
    /// The caller checked that `len > 0`.
    pub(crate) fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<DmaBuf> {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // Every check and the mapping are made on barlink's own duplicate:
        // the caller's number could name another file by the time it is
        // used again.
        let fd = fd.try_clone_to_owned().map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::BADF.raw_os_error()) {
                Error::invalid(format!("fd {raw} is not an open file ({e})"))
            } else {
                Error::new(BARLINK_NOT_AVAILABLE, format!("dup of fd {raw}: {e}"))
            }
        })?;
        let stat = rustix::fs::fstatfs(&fd)
            .map_err(|e| Error::invalid(format!("fd {raw} is not an open file ({e})")))?;
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        let magic = stat.f_type as u64;
        if magic != DMA_BUF_MAGIC {
            return Err(Error::invalid(format!(
                "fd {raw} is not a dma-buf (its file system's magic is {magic:#x}, a dma-buf's is \
                 {DMA_BUF_MAGIC:#x}): pass the fd an exporter gave (the GPU driver, DRM PRIME, \
                 /dev/udmabuf); register host memory with barlink_register_buffer"
            )));
        }
        // A dma-buf's size is where SEEK_END lands; only (0, SEEK_END) and
        // (0, SEEK_SET) are allowed on it.
        let size = rustix::fs::seek(&fd, SeekFrom::End(0)).map_err(|e| {
            Error::new(
                BARLINK_NOT_AVAILABLE,
                format!("the dma-buf's size (lseek SEEK_END on fd {raw}): {e}"),
            )
        })?;
        let end = offset.checked_add(len as u64).filter(|&end| end <= size);
        if end.is_none() {
            return Err(Error::invalid(format!(
                "the range of {len} bytes at offset {offset} lies outside the dma-buf of {size} bytes"
            )));
        }
        // Mapped from the dma-buf's first byte, never at a page offset:
        // some exporters' fault handlers ignore the mapping's offset and
        // would show the first pages at any (design change 88). The pages
        // before the range are address space only, never read.
        let head = usize::try_from(offset)
            .map_err(|_| Error::invalid(format!("offset {offset} runs past the address space")))?;
        let map_len = head
            .checked_add(len)
            .ok_or_else(|| Error::invalid(format!("len {len} runs past the address space")))?;
        // SAFETY: a new shared read-only mapping chosen by the kernel (no
        // address of ours is named or replaced). It is unmapped in `drop`;
        // payloads read it under the contract of `barlink_register_dmabuf`.
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::READ,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| {
            if e == rustix::io::Errno::NOMEM {
                return Error::new(
                    BARLINK_OUT_OF_MEMORY,
                    format!(
                        "mapping {map_len} bytes of the dma-buf (the range and the {head} bytes \
                         before it) for the CPU: {e}"
                    ),
                );
            }
            Error::new(
                BARLINK_NOT_AVAILABLE,
                format!(
                    "the kernel refuses to map this dma-buf for the CPU (mmap: {e}): its exporter \
                     gives the CPU no access (NVIDIA's exports of device memory do not), and \
                     barlink takes every payload's CRC on the CPU. Copy the data into host \
                     memory and register that (barlink_register_buffer)"
                ),
            )
        })?;
        let map = NonNull::new(map.cast::<u8>()).ok_or_else(|| {
            Error::new(BARLINK_NOT_AVAILABLE, "mmap of the dma-buf returned NULL")
        })?;
        let dmabuf = DmaBuf {
            fd,
            map,
            map_len,
            head,
            len,
            offset,
        };
        // An exporter that refuses CPU access says so here, not at the
        // first send.
        dmabuf.begin_read()?;
        dmabuf.end_read();
        Ok(dmabuf)
    }

    /// The first byte of the registered range in the CPU's mapping.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr().wrapping_add(self.head)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// What lets RDMA links read the range in place: the NIC registers the
    /// dma-buf itself, at the addresses of the CPU's mapping.
    pub(crate) fn send_memory(&self) -> Option<SendMemory> {
        let fd = self.fd.try_clone().ok()?;
        // SAFETY: the range stays mapped until the region's deregistration
        // (`Region::retire`), which is refused while a write from the
        // `SendMemory` is in flight (its `in_flight` above 0) or a
        // registration of it is in progress, and drops the `SendMemory`
        // before this mapping; and no range is modified while a send from
        // it is in flight (the contract of `barlink_register_dmabuf`).
        unsafe { SendMemory::register_dmabuf_raw(self.as_ptr(), self.len, fd, self.offset) }.ok()
    }

    /// Opens a CPU read of the range (`DMA_BUF_IOCTL_SYNC` start): the
    /// exporter makes its memory coherent for the CPU first.
    pub(crate) fn begin_read(&self) -> Result<()> {
        self.sync(DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ)
            .map_err(|e| {
                Error::new(
                    BARLINK_NOT_AVAILABLE,
                    format!(
                        "the dma-buf's exporter refuses CPU access (DMA_BUF_IOCTL_SYNC start: {e})"
                    ),
                )
            })
    }

    /// Closes a CPU read opened by [`DmaBuf::begin_read`]. A failure here
    /// loses nothing (the bytes were read and their CRC taken), so it is
    /// only logged.
    pub(crate) fn end_read(&self) {
        if let Err(error) = self.sync(DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ) {
            tracing::debug!(%error, "DMA_BUF_IOCTL_SYNC end");
        }
    }

    fn sync(&self, flags: u64) -> rustix::io::Result<()> {
        loop {
            // SAFETY: `DMA_BUF_IOCTL_SYNC` reads one `struct dma_buf_sync`
            // (a `__u64`), which `Setter` passes by pointer; the fd is ours.
            match unsafe { ioctl(&self.fd, Setter::<DMA_BUF_IOCTL_SYNC, u64>::new(flags)) } {
                // A signal while the exporter waited for its fences.
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                done => return done,
            }
        }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length, unmapped once;
        // nothing reads through a pointer into it once the last `Arc` to
        // this value goes: the region holds one until its deregistration,
        // which is refused while payloads from it are in flight, marks it
        // dead so that no new payload reads it, and each payload's CPU
        // read holds another.
        if let Err(error) = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), self.map_len) } {
            tracing::warn!(%error, "munmap of a dma-buf mapping");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::types::barlink_status::BARLINK_INVALID_ARGUMENT;

    #[test]
    fn a_file_that_is_not_a_dmabuf_is_refused_with_what_to_pass() {
        let file =
            rustix::fs::memfd_create("not-a-dmabuf", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&file, 8192).unwrap();
        let error = DmaBuf::map(file.as_fd(), 0, 4096).unwrap_err();
        assert_eq!(error.status, BARLINK_INVALID_ARGUMENT);
        let text = error.text();
        assert!(text.contains("is not a dma-buf"), "{text}");
        assert!(text.contains("barlink_register_buffer"), "{text}");
    }
}
