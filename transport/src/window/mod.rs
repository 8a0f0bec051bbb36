//! Windows: mapped byte regions that a process writes into (a peer's
//! receive ring) or reads from (its own ring), reached only through checked
//! copies and atomics.
//!
//! Across PCIe a window is device memory behind a BAR: CPU writes are
//! write-combined and fast, reads are uncached and slow, and another
//! process or the device may write it at any time. So a window never lends
//! out `&[u8]` or `&mut [u8]` into its memory: data goes in and out by copy,
//! ring indices by 64-bit atomics, and every offset — which may come from a
//! peer — is checked, with a typed [`WindowError`] instead of a panic.
//!
//! What each module owns:
//! - this module — the [`Window`] trait that links are written against, the
//!   range check every implementation shares, and forwarding impls for
//!   `&W`, `Box<W>` and `Arc<W>`;
//! - [`error`] — [`WindowError`];
//! - `mapping` (private) — the raw region behind every window here (an
//!   `mmap` or a page-aligned heap allocation) and its accessors — the only
//!   module of the transport with `unsafe` code;
//! - [`heap`] — [`HeapWindow`], an in-process window for tests and threads;
//! - [`shm`] — [`ShmWindow`], host shared memory between processes: a memfd
//!   or a named file under `/dev/shm`, optionally on 2 MiB huge pages;
//! - [`fd_passing`] — handing a memfd window's descriptor to another process
//!   over a Unix socket (`SCM_RIGHTS`), with timeouts;
//! - [`fault`] — [`FaultWindow`], a wrapper that injects bit flips, lost,
//!   torn and stalled writes, driven by a seed.
//!
//! BAR windows (VFIO regions, sysfs `resourceN`) live in `barlink-vfio` and
//! implement the same trait.

pub mod error;
pub mod fault;
pub mod fd_passing;
pub mod heap;
#[allow(unsafe_code)]
pub(crate) mod mapping;
pub mod scribbler;
pub mod shm;

use std::sync::Arc;

use crate::crc::Crc32c;
use std::sync::atomic::Ordering;

pub use error::WindowError;
pub use fault::{FaultConfig, FaultWindow, InjectedFaults};
pub use fd_passing::{recv_fd, send_fd, try_recv_fd};
pub use heap::HeapWindow;
pub use mapping::{DeviceAccess, DeviceMemory, RawWindow, copy_kernel};
pub use scribbler::{ScribbleConfig, Scribbled, Scribbler};
pub use shm::{HugePageReserve, HugePages, PageBacking, ShmOptions, ShmWindow};

/// A mapped byte region shared with a peer, accessed only by copies and
/// atomics, every offset checked.
///
/// All methods take `&self`: a window is shared between threads (and, in
/// its memory, with other processes), and each access is self-contained.
/// Data written by [`write`](Window::write) becomes visible to a reader that
/// acquires an index stored after it with [`store_fence`](Window::store_fence)
/// and a `Release` [`store_u64`](Window::store_u64); bytes that are written
/// while being read may be seen half old, half new (the packet CRC catches
/// that). Bulk copies and atomics must not be mixed on the same bytes.
pub trait Window: Send + Sync {
    /// The window's length in bytes.
    fn len(&self) -> usize;

    /// Whether the window has no bytes (no window created here does).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `src` into the window at `offset`.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError>;

    /// Copies `dst.len()` bytes at `offset` out of the window.
    ///
    /// Across PCIe this is slow (uncached reads): a link reads only its own
    /// receive window, which lives in local memory.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError>;

    /// Copies `src` into the window at `offset` in chunks of `chunk` bytes
    /// (the last may be shorter; 0 means one chunk), calling `on_chunk`
    /// with each *source* chunk right after it is copied.
    ///
    /// This is how a link takes the CRC of a payload in the same pass that
    /// copies it: the chunk the closure sees is still in L1, and the
    /// window's memory (possibly across PCIe) is never read back. The whole
    /// range is checked before anything is copied, so on error nothing is
    /// written and the closure is not called.
    fn write_with(
        &self,
        offset: usize,
        src: &[u8],
        chunk: usize,
        on_chunk: &mut dyn FnMut(&[u8]),
    ) -> Result<(), WindowError> {
        check_range(offset, src.len(), self.len())?;
        let mut at = offset;
        for piece in chunks(src, chunk) {
            self.write(at, piece)?;
            on_chunk(piece);
            at += piece.len();
        }
        Ok(())
    }

    /// Copies `src` into the window at `offset` and feeds it into `crc` —
    /// the CRC a link sends with a packet, taken while the bytes are copied.
    /// Windows over host memory do both in one pass (each vector loaded
    /// once); the default copies in pieces and takes the CRC of each source
    /// piece right after it is copied, through [`Window::write_with`] (so a
    /// wrapper's faults there apply). On error nothing is written.
    fn write_crc(&self, offset: usize, src: &[u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.write_with(offset, src, CRC_PIECE, &mut |piece| crc.update(piece))
    }

    /// Copies `dst.len()` bytes at `offset` out of the window and feeds
    /// them, as they landed in `dst`, into `crc`. The default reads in
    /// pieces and takes the CRC of each piece right after it is read.
    fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        check_range(offset, dst.len(), self.len())?;
        let mut at = offset;
        for piece in dst.chunks_mut(CRC_PIECE) {
            self.read(at, piece)?;
            crc.update(piece);
            at += piece.len();
        }
        Ok(())
    }

    /// [`Window::read_crc`] into a destination nobody will read soon (a
    /// large message landing): a window over memory the CPU maps may write
    /// `dst`'s lines around the cache, so they are not first read from
    /// memory only to be overwritten. The default is `read_crc`.
    fn read_crc_streaming(
        &self,
        offset: usize,
        dst: &mut [u8],
        crc: &mut Crc32c,
    ) -> Result<(), WindowError> {
        self.read_crc(offset, dst, crc)
    }

    /// [`Window::read`] into a destination nobody will read soon; the
    /// default is `read`.
    fn read_streaming(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.read(offset, dst)
    }

    /// Atomically loads the 8-byte word at `offset` (a multiple of 8) with
    /// `order` (`Relaxed`, `Acquire` or `SeqCst`).
    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError>;

    /// Atomically stores `value` to the 8-byte word at `offset` (a multiple
    /// of 8) with `order` (`Relaxed`, `Release` or `SeqCst`).
    ///
    /// To publish data written with [`write`](Window::write), call
    /// [`store_fence`](Window::store_fence) first, then store the index with
    /// `Release`.
    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError>;

    /// Atomically adds `value` to the word at `offset`, returning the
    /// previous value.
    ///
    /// For host memory only: PCIe has no read-modify-write that a CPU can
    /// issue to a peer's BAR, so BAR windows may return
    /// [`WindowError::Unsupported`], and ring protocols keep each index
    /// single-writer (plain stores) instead.
    fn fetch_add_u64(&self, offset: usize, value: u64, order: Ordering)
    -> Result<u64, WindowError>;

    /// Makes every store issued before it visible before any store issued
    /// after it — `sfence` strength on x86_64.
    ///
    /// Why a `Release` store of the index is not enough: on x86, `Release`
    /// is an ordinary `mov`, ordered after earlier stores only for normal
    /// write-back memory. A BAR mapped write-combining buffers stores in
    /// the CPU's WC buffers and may let the index store reach the device
    /// before earlier payload bytes; `sfence` drains them first. Host
    /// memory does not need it: the windows over a host mapping (shared
    /// memory, heap, registered buffers) make this a compiler fence only,
    /// and the default, for a window that may be device memory, is the
    /// real fence.
    fn store_fence(&self) {
        mapping::store_fence();
    }

    /// A hint that `len` bytes at `offset` will be read soon: windows over
    /// host memory start fetching their cache lines, so that a small
    /// packet's header and payload lines arrive together instead of one
    /// after the other. Out-of-range parts are ignored; the default does
    /// nothing (and must stay so for device memory, where a read is a slow
    /// PCIe round trip of its own).
    fn prefetch(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }

    /// A hint that `len` bytes at `offset` will be written soon: windows
    /// over host memory take their cache lines for this core now (the
    /// peer's core last read them), so that the writes need not wait, one
    /// line after another, for that core to give them up. Call it while
    /// nothing waits on this core, e.g. right after publishing a packet,
    /// for the slot the next one goes into. Out-of-range parts are
    /// ignored; the default does nothing (and must stay so for device
    /// memory).
    fn prefetch_for_write(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
}

/// Bytes copied between CRC updates by the default [`Window::write_crc`]
/// and [`Window::read_crc`]: small enough to stay in L1/L2 until the CRC
/// reads them, large enough that the CRC's cost per call does not show.
pub const CRC_PIECE: usize = 16 << 10;

/// `src` cut into pieces of `chunk` bytes (0: one piece). An empty `src`
/// gives no pieces.
pub(crate) fn chunks(src: &[u8], chunk: usize) -> std::slice::Chunks<'_, u8> {
    src.chunks(if chunk == 0 { src.len().max(1) } else { chunk })
}

/// Checks that `offset..offset + len` lies within a window of `window_len`
/// bytes, without overflowing: the one range check that every window and
/// wrapper uses before touching memory.
pub(crate) fn check_range(offset: usize, len: usize, window_len: usize) -> Result<(), WindowError> {
    match offset.checked_add(len) {
        Some(end) if end <= window_len => Ok(()),
        _ => Err(WindowError::OutOfBounds {
            offset,
            len,
            window_len,
        }),
    }
}

/// Forwards every method, including the provided ones, so that a wrapper's
/// overrides (e.g. [`FaultWindow::write_with`]) survive being shared.
macro_rules! forward_window {
    ($($ty:ty),*) => {$(
        impl<W: Window + ?Sized> Window for $ty {
            fn len(&self) -> usize {
                (**self).len()
            }
            fn is_empty(&self) -> bool {
                (**self).is_empty()
            }
            fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
                (**self).write(offset, src)
            }
            fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
                (**self).read(offset, dst)
            }
            fn write_with(
                &self,
                offset: usize,
                src: &[u8],
                chunk: usize,
                on_chunk: &mut dyn FnMut(&[u8]),
            ) -> Result<(), WindowError> {
                (**self).write_with(offset, src, chunk, on_chunk)
            }
            fn write_crc(&self, offset: usize, src: &[u8], crc: &mut Crc32c) -> Result<(), WindowError> {
                (**self).write_crc(offset, src, crc)
            }
            fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
                (**self).read_crc(offset, dst, crc)
            }
            fn read_crc_streaming(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
                (**self).read_crc_streaming(offset, dst, crc)
            }
            fn read_streaming(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
                (**self).read_streaming(offset, dst)
            }
            fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
                (**self).load_u64(offset, order)
            }
            fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
                (**self).store_u64(offset, value, order)
            }
            fn fetch_add_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<u64, WindowError> {
                (**self).fetch_add_u64(offset, value, order)
            }
            fn store_fence(&self) {
                (**self).store_fence()
            }
            fn prefetch(&self, offset: usize, len: usize) {
                (**self).prefetch(offset, len)
            }
            fn prefetch_for_write(&self, offset: usize, len: usize) {
                (**self).prefetch_for_write(offset, len)
            }
        }
    )*};
}

forward_window!(&W, Box<W>, Arc<W>);

/// Implements [`Window`] for a type whose `mapping` field is a
/// [`mapping::Mapping`] that holds the whole window.
macro_rules! window_over_mapping {
    ($ty:ty) => {
        impl $crate::window::Window for $ty {
            #[inline]
            fn len(&self) -> usize {
                self.mapping.len()
            }
            #[inline]
            fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
                self.mapping.write(offset, src)
            }
            #[inline]
            fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
                self.mapping.read(offset, dst)
            }
            #[inline]
            fn write_crc(
                &self,
                offset: usize,
                src: &[u8],
                crc: &mut $crate::crc::Crc32c,
            ) -> Result<(), WindowError> {
                self.mapping.write_crc(offset, src, crc)
            }
            #[inline]
            fn read_crc(
                &self,
                offset: usize,
                dst: &mut [u8],
                crc: &mut $crate::crc::Crc32c,
            ) -> Result<(), WindowError> {
                self.mapping.read_crc(offset, dst, crc)
            }
            #[inline]
            fn read_crc_streaming(
                &self,
                offset: usize,
                dst: &mut [u8],
                crc: &mut $crate::crc::Crc32c,
            ) -> Result<(), WindowError> {
                self.mapping.read_crc_streaming(offset, dst, crc)
            }
            #[inline]
            fn read_streaming(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
                self.mapping.read_streaming(offset, dst)
            }
            #[inline]
            fn load_u64(
                &self,
                offset: usize,
                order: std::sync::atomic::Ordering,
            ) -> Result<u64, WindowError> {
                self.mapping.load_u64(offset, order)
            }
            #[inline]
            fn store_u64(
                &self,
                offset: usize,
                value: u64,
                order: std::sync::atomic::Ordering,
            ) -> Result<(), WindowError> {
                self.mapping.store_u64(offset, value, order)
            }
            #[inline]
            fn fetch_add_u64(
                &self,
                offset: usize,
                value: u64,
                order: std::sync::atomic::Ordering,
            ) -> Result<u64, WindowError> {
                self.mapping.fetch_add_u64(offset, value, order)
            }
            #[inline]
            fn prefetch(&self, offset: usize, len: usize) {
                self.mapping.prefetch(offset, len)
            }
            #[inline]
            fn prefetch_for_write(&self, offset: usize, len: usize) {
                self.mapping.prefetch_for_write(offset, len)
            }
            #[inline]
            fn store_fence(&self) {
                // Host memory: the index's Release store orders the rest.
                $crate::window::mapping::host_store_fence()
            }
        }
    };
}
pub(crate) use window_over_mapping;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_check_never_overflows() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(10, 0, 10).is_ok());
        assert!(check_range(11, 0, 10).is_err());
        assert!(check_range(usize::MAX, 1, 10).is_err());
        assert!(check_range(1, usize::MAX, 10).is_err());
        assert!(check_range(usize::MAX, usize::MAX, usize::MAX).is_err());
        assert!(check_range(usize::MAX, 0, usize::MAX).is_ok());
    }

    #[test]
    fn chunking_covers_the_source_once() {
        let src: Vec<u8> = (0..10).collect();
        let lens: Vec<usize> = chunks(&src, 4).map(<[u8]>::len).collect();
        assert_eq!(lens, [4, 4, 2]);
        assert_eq!(chunks(&src, 0).count(), 1);
        assert_eq!(chunks(&[], 0).count(), 0);
        assert_eq!(chunks(&[], 4).count(), 0);
    }

    #[test]
    fn trait_is_object_safe_and_forwarding_keeps_overrides() {
        let heap = HeapWindow::new(64).unwrap();
        let shared: Arc<dyn Window> = Arc::new(heap);
        shared.write(0, &[1, 2, 3]).unwrap();
        let by_ref: &dyn Window = &shared;
        let mut back = [0u8; 3];
        by_ref.read(0, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
    }
}
