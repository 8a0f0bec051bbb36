//! Device memory as a link's message source and destination.
//!
//! The route built today is the **staged host bounce**: the sender's copy
//! engine moves a device range into pinned host memory ([`StagingPool`],
//! [`Staged`]), and the link's fused copy+CRC moves it into the peer's
//! slots; the receiver checks every packet's CRC as it copies the message
//! out of its ring, and its copy engine moves the message into the device
//! buffer ([`recv_into_device`]). No SM is used. The direct routes — the
//! copy engine writing straight into registered ring slots, and rings in a
//! GPU's BAR1 — come next, measured against this one on a GPU
//! (`docs/GPU.md`).
//!
//! Everything here needs the CUDA driver, loaded at run time
//! ([`Cuda::load`]); without it the calls return [`CudaError::NoDriver`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use barlink_cuda::{
    Attribute, Context, Cuda, CudaError, Device, DeviceBuffer, DeviceInfo, DriverVersion,
    IpcHandle, PinnedBuffer,
};
use barlink_transport::link::IoError;

use crate::Connection;

/// Pinned host buffers kept for staging device ranges, reused once the
/// peer acknowledged what was staged in them (allocating pinned memory
/// takes the driver milliseconds).
#[derive(Debug)]
pub struct StagingPool {
    context: Context,
    spares: Mutex<Vec<PinnedBuffer>>,
    keep_bytes: usize,
}

/// A device range staged in pinned host memory: the message type of a
/// [`Connection<Staged>`]. Dropped (when the peer acknowledged it), its
/// buffer goes back to the pool.
#[derive(Debug)]
pub struct Staged {
    buffer: Option<PinnedBuffer>,
    len: usize,
    pool: Arc<StagingPool>,
}

/// The smallest pinned buffer the pool allocates.
const MIN_STAGING: usize = 4096;

impl StagingPool {
    /// A pool in `context` that keeps at most `keep_bytes` of spare
    /// buffers (64 MiB is ample for a link's window of 1 MiB messages).
    pub fn new(context: Context, keep_bytes: usize) -> Arc<StagingPool> {
        Arc::new(StagingPool {
            context,
            spares: Mutex::new(Vec::new()),
            keep_bytes,
        })
    }

    /// Copies `len` bytes of `source` at `offset` into a pinned buffer (a
    /// copy-engine transfer that has finished when this returns).
    pub fn stage(
        self: &Arc<Self>,
        source: &DeviceBuffer,
        offset: usize,
        len: usize,
    ) -> Result<Staged, CudaError> {
        let mut buffer = self.take(len)?;
        if len > 0 {
            buffer.fill_from(source, offset, len)?;
        }
        Ok(Staged {
            buffer: Some(buffer),
            len,
            pool: Arc::clone(self),
        })
    }

    /// Bytes held in spare buffers now.
    pub fn spare_bytes(&self) -> usize {
        let spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        spares.iter().map(|b| b.as_ref().len()).sum()
    }

    fn take(&self, len: usize) -> Result<PinnedBuffer, CudaError> {
        {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            let best = spares
                .iter()
                .enumerate()
                .filter(|(_, b)| b.as_ref().len() >= len)
                .min_by_key(|(_, b)| b.as_ref().len())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(spares.swap_remove(i));
            }
        }
        let capacity = len
            .max(MIN_STAGING)
            .checked_next_power_of_two()
            .unwrap_or(len);
        self.context.alloc_pinned(capacity)
    }

    fn give_back(&self, buffer: PinnedBuffer) {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = spares.iter().map(|b| b.as_ref().len()).sum();
        if held + buffer.as_ref().len() <= self.keep_bytes {
            spares.push(buffer);
        }
    }
}

impl AsRef<[u8]> for Staged {
    fn as_ref(&self) -> &[u8] {
        match &self.buffer {
            Some(buffer) => &buffer.as_ref()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.give_back(buffer);
        }
    }
}

/// Why a device send did not go.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceSendError {
    /// Staging the device range failed (nothing was queued).
    Cuda(CudaError),
    /// The link refused or timed out (nothing was queued).
    Link(IoError),
}

impl std::fmt::Display for DeviceSendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSendError::Cuda(e) => write!(f, "staging the device range: {e}"),
            DeviceSendError::Link(e) => write!(f, "sending the staged message: {e}"),
        }
    }
}

impl std::error::Error for DeviceSendError {}

/// Sends `len` bytes of `source` at `offset` as one message, waiting at
/// most `timeout` for room on the link.
pub fn send_from_device(
    link: &mut Connection<Staged>,
    pool: &Arc<StagingPool>,
    source: &DeviceBuffer,
    offset: usize,
    len: usize,
    timeout: Duration,
) -> Result<(), DeviceSendError> {
    let staged = pool
        .stage(source, offset, len)
        .map_err(DeviceSendError::Cuda)?;
    link.send(staged, timeout).map_err(DeviceSendError::Link)
}

/// Why a device receive did not land; a message that arrived is handed
/// back in the error, never lost.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceRecvError {
    /// Nothing arrived, or the link failed.
    Link(IoError),
    /// The message is larger than the room at the offset.
    TooLarge {
        /// The message, checked and intact.
        message: Vec<u8>,
        /// Bytes of room from the offset to the buffer's end.
        room: usize,
    },
    /// The copy into the device failed.
    Cuda {
        /// The driver's error.
        error: CudaError,
        /// The message, checked and intact.
        message: Vec<u8>,
    },
}

impl std::fmt::Display for DeviceRecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRecvError::Link(e) => write!(f, "receiving: {e}"),
            DeviceRecvError::TooLarge { message, room } => write!(
                f,
                "a {} byte message does not fit the {room} bytes of the device buffer \
                 from the offset (the message is returned with this error)",
                message.len()
            ),
            DeviceRecvError::Cuda { error, .. } => write!(
                f,
                "copying the received message into the device: {error} \
                 (the message is returned with this error)"
            ),
        }
    }
}

impl std::error::Error for DeviceRecvError {}

/// Receives the next message into `destination` at `offset`, waiting at
/// most `timeout`; its length. The message's packets were CRC-checked as
/// they were copied out of the ring; the copy engine moves it to the
/// device.
pub fn recv_into_device<B: AsRef<[u8]>>(
    link: &mut Connection<B>,
    destination: &DeviceBuffer,
    offset: usize,
    timeout: Duration,
) -> Result<usize, DeviceRecvError> {
    let message = link.recv(timeout).map_err(DeviceRecvError::Link)?;
    let room = destination.len().saturating_sub(offset);
    if message.len() > room {
        return Err(DeviceRecvError::TooLarge { message, room });
    }
    if let Err(error) = destination.write(offset, &message) {
        return Err(DeviceRecvError::Cuda { error, message });
    }
    let len = message.len();
    link.recycle(message);
    Ok(len)
}
