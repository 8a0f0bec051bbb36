//! The raw-ring baselines: the same rings in the same kind of windows as
//! the barlink link, with no protocol.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use barlink_transport::crc::Crc32c;
use barlink_transport::ring::{self, Consumer, Producer};
use barlink_transport::window::{ShmWindow, Window};

use super::pipes::Pipe;
use super::plan::STEP_TIMEOUT;

/// The raw-ring baselines: fragments copied into slots behind a 16-byte
/// slot header (length, last-fragment flag and, for `raw-ring-crc`, the
/// slot's CRC-32C); no acknowledgement, retransmission or ordering. As a
/// link's packets do, the fragments start on a cache line of the slot.
pub(super) struct RawRingPipe {
    own: ShmWindow,
    peer: ShmWindow,
    producer: Producer,
    consumer: Consumer,
    slot_payload: usize,
    /// Take a CRC-32C of each slot's bytes while copying them, and check
    /// it on arrival (`raw-ring-crc`).
    crc: bool,
}

/// A raw slot's header: the piece's length (u64), whether it ends its
/// message (u8), and with `crc` the piece's CRC-32C (u32 at 12).
const RAW_SLOT_HEADER: usize = 16;
const RAW_CRC_AT: usize = 12;
/// Where the header lies in its slot: it ends where the slot's second
/// cache line, and the fragment, begin.
const RAW_HEADER_AT: usize = ring::SLOT_ALIGN - RAW_SLOT_HEADER;
const RAW_PIECE_AT: usize = ring::SLOT_ALIGN;

impl RawRingPipe {
    pub(super) fn new(own: ShmWindow, peer: ShmWindow, crc: bool) -> Result<Self, String> {
        let own_info = barlink_transport::link::read_ring_info(&own).map_err(|e| e.to_string())?;
        let peer_info =
            barlink_transport::link::read_ring_info(&peer).map_err(|e| e.to_string())?;
        let slot_payload = (peer_info.geometry.slot_size as usize).saturating_sub(RAW_PIECE_AT);
        if slot_payload == 0 {
            return Err(format!(
                "raw ring: slots of {} bytes leave no room for a fragment after the {RAW_PIECE_AT}-byte lead: use a larger MTU",
                peer_info.geometry.slot_size
            ));
        }
        Ok(RawRingPipe {
            slot_payload,
            producer: Producer::new(peer_info.geometry),
            consumer: Consumer::new(own_info.geometry),
            own,
            peer,
            crc,
        })
    }

    fn spin_until<T>(mut ready: impl FnMut() -> Result<Option<T>, String>) -> Result<T, String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut spins = 0u32;
        loop {
            if let Some(value) = ready()? {
                return Ok(value);
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                if Instant::now() > deadline {
                    return Err("raw ring: the peer stopped".into());
                }
                std::thread::yield_now();
            }
        }
    }
}

impl Pipe for RawRingPipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        // One piece per slot, at least one (an empty message is one empty
        // piece); no list of them, so that the baseline allocates nothing
        // per message.
        let count = message.len().div_ceil(self.slot_payload).max(1);
        for index in 0..count {
            let start = index * self.slot_payload;
            let piece = &message[start..message.len().min(start + self.slot_payload)];
            let (own, producer) = (&self.own, &mut self.producer);
            let slot = Self::spin_until(|| {
                let consumed = own
                    .load_u64(ring::offset::CONSUMED, Ordering::Acquire)
                    .map_err(|e| e.to_string())?;
                // The baseline checks nothing: the count is the word's low
                // half (the ring's zero is laid out as a checked word).
                producer
                    .on_consumed_count(consumed as u32)
                    .map_err(|e| format!("raw ring: {e}"))?;
                Ok(producer.next_slot_offset())
            })?;
            let mut header = [0u8; RAW_SLOT_HEADER];
            header[..8].copy_from_slice(&(piece.len() as u64).to_le_bytes());
            header[8] = u8::from(index + 1 == count);
            if self.crc {
                let mut crc = Crc32c::new();
                self.peer
                    .write_crc(slot + RAW_PIECE_AT, piece, &mut crc)
                    .map_err(|e| e.to_string())?;
                header[RAW_CRC_AT..].copy_from_slice(&crc.finish().to_le_bytes());
            } else {
                self.peer
                    .write(slot + RAW_PIECE_AT, piece)
                    .map_err(|e| e.to_string())?;
            }
            self.peer
                .write(slot + RAW_HEADER_AT, &header)
                .map_err(|e| e.to_string())?;
            let head = self.producer.commit();
            self.peer.store_fence();
            self.peer
                .store_u64(ring::offset::HEAD, head, Ordering::Release)
                .map_err(|e| e.to_string())?;
            // The link's hint, so that the baseline stays the limit: the
            // next slot's lines taken for writing while the peer reads.
            if let Some(slot) = self.producer.next_slot_offset() {
                self.peer.prefetch_for_write(
                    slot,
                    ring::PACKET_AT + barlink_transport::link::SMALL_PACKET,
                );
            }
        }
        Ok(())
    }

    fn recv_within(&mut self, buf: &mut Vec<u8>, _: Duration) -> Result<Option<usize>, String> {
        // `buf` keeps its length from the last message, so fragments are
        // copied over old bytes rather than over freshly zeroed ones: no
        // pass over the buffer but the copy itself.
        let mut filled = 0;
        loop {
            let (own, consumer) = (&self.own, &mut self.consumer);
            let slot = Self::spin_until(|| {
                if let Some(slot) = consumer.next_slot_offset() {
                    return Ok(Some(slot));
                }
                let head = own
                    .load_u64(ring::offset::HEAD, Ordering::Acquire)
                    .map_err(|e| e.to_string())?;
                consumer
                    .on_head_count(head as u32)
                    .map_err(|e| format!("raw ring: {e}"))?;
                Ok(consumer.next_slot_offset())
            })?;
            let mut header = [0u8; RAW_SLOT_HEADER];
            self.own
                .read(slot + RAW_HEADER_AT, &mut header)
                .map_err(|e| e.to_string())?;
            let len = (u64::from_le_bytes(header[..8].try_into().expect("8 bytes")) as usize)
                .min(self.slot_payload);
            if buf.len() < filled + len {
                buf.resize(filled + len, 0);
            }
            let piece = &mut buf[filled..filled + len];
            if self.crc {
                let mut crc = Crc32c::new();
                self.own
                    .read_crc(slot + RAW_PIECE_AT, piece, &mut crc)
                    .map_err(|e| e.to_string())?;
                let carried = u32::from_le_bytes(header[RAW_CRC_AT..].try_into().expect("4 bytes"));
                if crc.finish() != carried {
                    return Err(format!(
                        "raw ring: a slot's CRC-32C is {:#010x}, its header says {carried:#010x} (nothing corrupts this ring: check memory)",
                        crc.finish()
                    ));
                }
            } else {
                self.own
                    .read(slot + RAW_PIECE_AT, piece)
                    .map_err(|e| e.to_string())?;
            }
            filled += len;
            let consumed = self.consumer.release();
            self.peer
                .store_u64(ring::offset::CONSUMED, consumed, Ordering::Release)
                .map_err(|e| e.to_string())?;
            if header[8] == 1 {
                buf.truncate(filled);
                return Ok(Some(filled));
            }
        }
    }
}
