//! A link's packets over one TCP connection.
//!
//! Each packet travels as a frame: its length (u32, little-endian), a
//! CRC-32C of those four bytes (tweaked, so that a frame header is never
//! mistaken for packet bytes), then the packet as the engine wrote it, its
//! own CRC included. A length that fails its check or exceeds the largest
//! packet ends the link with an error: the byte stream cannot be trusted to
//! say where the next frame starts.
//!
//! When the link encrypts, frames travel in records of at most
//! [`MAX_RECORD_PLAINTEXT`] bytes, each sealed by the session the setup's
//! handshake made (AES-256-GCM, nonces in order): a record altered,
//! dropped, replayed or reordered on the way does not open, and the link
//! ends with an error rather than deliver anything from it. A record holds
//! whole frames (packets are at most [`MAX_SEALED_PACKET`] bytes), so each
//! is sealed where its frames were written and opened where it was read,
//! and its packets go to the engine from there: no byte is copied for the
//! cipher.
//!
//! The socket is non-blocking; a round reads what has arrived and writes
//! what the socket takes, and never waits.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use super::buffers::{self, SocketBuffers};
use super::resume::Resume;
use crate::auth::{AuthError, SEAL_OVERHEAD, Session};
use crate::crc::crc32c;
use crate::engine::{Engine, PacketError, Transmit};
use crate::link::{Intake, Medium, MediumError, STREAM_MESSAGES_FROM};
use crate::time::Time;
use crate::wire::HEADER_LEN;

/// Bytes before each packet: length and its check.
pub const FRAME_HEADER_LEN: usize = 8;
/// Bytes before each sealed record: its length.
pub const RECORD_HEADER_LEN: usize = 2;
/// Plaintext bytes a record carries at most (a Noise message is at most
/// 65,535 bytes, its tag included).
pub const MAX_RECORD_PLAINTEXT: usize = 65_535 - SEAL_OVERHEAD;
/// The largest packet of a link that encrypts: one frame fills a record.
pub const MAX_SEALED_PACKET: usize = MAX_RECORD_PLAINTEXT - FRAME_HEADER_LEN;
/// Mixed into a frame header's check.
const FRAME_TWEAK: u32 = 0x7C9A_11E5;
/// Bytes one `read` takes at most (and has room for at least).
const READ_CHUNK: usize = 128 * 1024;
/// Bytes of the receive buffer: three reads. The kernel copies into lines
/// that are still in cache from the last pass, and the payload is copied
/// out of them while still there; a partial frame moves to the front when
/// the tail runs short of a read, a copy of hot bytes. (It grows for a
/// frame longer than itself.)
const RECEIVE_BUFFER: usize = 3 * READ_CHUNK;
/// Bytes of the send queue at least.
const MIN_BUFFER: usize = 4 << 20;
/// Reads one round makes at most: a peer that sends faster than this side
/// takes its packets apart must not keep the round from returning (to
/// send, and to hand messages over).
const READS_PER_ROUND: usize = 16;
/// Pause between attempts to take the peer back.
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// Queued bytes from which a round writes them before framing more: one
/// system call for many packets (each call on loopback runs the kernel's
/// whole send path and wakes the reader, which costs more than copying
/// the packets into the queue).
const WRITE_FROM: usize = 512 * 1024;

/// The check of a frame length.
fn frame_check(len: u32) -> u32 {
    crc32c(&len.to_le_bytes()) ^ FRAME_TWEAK
}

/// The 8 bytes before a packet of `len` bytes.
pub fn frame_header(len: usize) -> [u8; FRAME_HEADER_LEN] {
    let len = u32::try_from(len).expect("packets are far below 4 GiB");
    let mut header = [0u8; FRAME_HEADER_LEN];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&frame_check(len).to_le_bytes());
    header
}

/// The length of the frame whose header begins `bytes`, once all of it is
/// there: `Ok(None)` while it is incomplete; an error for a header that
/// fails its check or announces more than `max_packet`.
pub fn next_frame(bytes: &[u8], max_packet: usize) -> Result<Option<usize>, MediumError> {
    if bytes.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    let check = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if check != frame_check(len) {
        return Err(MediumError::new(format!(
            "a TCP frame header fails its check (length {len}, check {check:#010x}): the byte stream \
             was altered on the way (a faulty NIC offload or middlebox), or the peer is not barlink"
        )));
    }
    let len = len as usize;
    if len == 0 || len > max_packet {
        return Err(MediumError::new(format!(
            "a TCP frame of {len} bytes; packets here are 1 to {max_packet}: the peer's MTU differs, \
             or it is not barlink"
        )));
    }
    Ok((bytes.len() >= FRAME_HEADER_LEN + len).then_some(len))
}

/// Hands the packet a frame carried to `engine`: its payload goes from
/// the received bytes into its message in one pass with its CRC, as out of
/// a ring slot. The engine's verdict on it.
pub fn hand_frame<B: AsRef<[u8]>>(
    engine: &mut Engine<B>,
    now: Time,
    packet: &[u8],
) -> Result<(), PacketError> {
    let (header, payload) = packet.split_at(packet.len().min(HEADER_LEN));
    let verdict = engine.handle_packet_from(
        now,
        header,
        payload.len(),
        |offset, dst, crc, message_len| {
            let src = &payload[offset..offset + dst.len()];
            match crc {
                Some(crc) => crc.copy_checked(src, dst, message_len >= STREAM_MESSAGES_FROM),
                None => dst.copy_from_slice(src),
            }
            Ok::<(), Infallible>(())
        },
    );
    match verdict {
        Ok(verdict) => verdict,
        Err(never) => match never {},
    }
}

/// Opens the sealed record that begins `bytes` where it lies, once all of
/// it is there: the bytes it took (length, ciphertext and tag) and the
/// length of its plaintext, which now follows the record's length.
/// `Ok(None)` while it is incomplete; an error for a record that does not
/// open, of which nothing may be used.
pub fn open_record(
    bytes: &mut [u8],
    cipher: &mut Session,
) -> Result<Option<(usize, usize)>, AuthError> {
    if bytes.len() < RECORD_HEADER_LEN {
        return Ok(None);
    }
    let len = usize::from(u16::from_le_bytes([bytes[0], bytes[1]]));
    let Some(record) = bytes.get_mut(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
        return Ok(None);
    };
    let plain = cipher.open_in_place(record)?;
    Ok(Some((RECORD_HEADER_LEN + len, plain)))
}

/// Hands every frame of an opened record's plaintext to `engine` (from
/// `peer`, for the errors); how many there were. A record holds whole
/// frames: one that ends inside a frame ends the connection.
pub fn hand_record<B: AsRef<[u8]>>(
    engine: &mut Engine<B>,
    now: Time,
    mut frames: &[u8],
    max_packet: usize,
    peer: &dyn fmt::Display,
) -> Result<usize, MediumError> {
    let mut handed = 0;
    while !frames.is_empty() {
        let Some(len) = next_frame(frames, max_packet)? else {
            return Err(MediumError::new(format!(
                "a sealed record from {peer} ends inside a frame: the peer does not frame records \
                 as this side does (another barlink version?)"
            )));
        };
        // A packet the engine refuses is counted there (CRC failure,
        // malformed); the link goes on.
        let _verdict = hand_frame(engine, now, &frames[FRAME_HEADER_LEN..][..len]);
        frames = &frames[FRAME_HEADER_LEN + len..];
        handed += 1;
    }
    Ok(handed)
}

/// A byte buffer read from the front and written at the back, allocated
/// once (and grown if a frame needs it), so no packet pays to zero it.
#[derive(Debug, Default)]
struct ByteQueue {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ByteQueue {
    fn with_capacity(len: usize) -> ByteQueue {
        ByteQueue {
            buf: vec![0; len],
            start: 0,
            end: 0,
        }
    }

    fn readable(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// At least `min` writable bytes at the back.
    fn space(&mut self, min: usize) -> &mut [u8] {
        if self.buf.len() - self.end < min {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() - self.end < min {
                self.buf.resize(self.end + min, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    fn commit(&mut self, n: usize) {
        self.end += n;
    }
}

/// A connection as the medium runs it: non-blocking, no Nagle delay,
/// buffers as asked.
fn configure(stream: &TcpStream, buffers: SocketBuffers) -> std::io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    buffers.apply(stream)
}

/// What a TCP medium moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Bytes handed to the socket (frames, and record headers and tags).
    pub wire_bytes_sent: u64,
    /// Bytes read from the socket.
    pub wire_bytes_received: u64,
    /// Packets sent and received.
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Records sealed and opened (encrypting only).
    pub records_sealed: u64,
    pub records_opened: u64,
    /// Connections that failed under the link, and the ones that replaced
    /// them.
    pub connections_lost: u64,
    pub reconnects: u64,
    /// Attempts to take the peer back, whatever became of them.
    pub rejoin_attempts: u64,
}

/// Packets over one TCP connection, sealed when the link encrypts.
pub struct TcpMedium {
    stream: TcpStream,
    peer: String,
    /// Applied to every connection, the first and each that replaces it.
    buffers: SocketBuffers,
    /// Seals every record when the link encrypts.
    cipher: Option<Session>,
    max_packet: usize,
    /// Wire bytes the socket has not taken yet; encrypting, the record
    /// being filled comes last (its length reserved, its frames in the
    /// clear) and is not sent before it is sealed.
    out: ByteQueue,
    /// Encrypting: plaintext bytes of the record at the back of `out` that
    /// is still being filled.
    open_record: Option<usize>,
    /// Wire bytes read and not yet used.
    wire_in: ByteQueue,
    /// Bytes queued to send past which a round stops taking packets.
    out_limit: usize,
    stats: TcpStats,
    rounds: u64,
    /// The peer closed its side: reported one round after it was seen,
    /// so that the engine first takes what came before it (a close, the
    /// last acknowledgements).
    peer_closed: bool,
    /// How a dropped connection is replaced; `None`: it ends the link.
    resume: Option<Arc<Resume>>,
    /// Since when the connection is down, and when to try again.
    down: Option<(Instant, Instant)>,
    /// The attempt to take the peer back that is under way, on a thread
    /// of its own: a connect and a handshake may each wait, and a round
    /// must not (a caller polling with no timeout, or many links driven by
    /// one thread, would stall on it).
    rejoining: Option<Receiver<Attempt>>,
}

/// What an attempt to take the peer back came to (see [`Resume::attempt`]).
type Attempt = Result<Option<(TcpStream, Option<Session>)>, String>;

/// Starts `resume`'s attempt on a thread; its outcome arrives on the
/// receiver. The thread ends with the attempt (each step of which has a
/// deadline), whether or not anyone still waits for it.
fn start_attempt(resume: Arc<Resume>) -> std::io::Result<Receiver<Attempt>> {
    let (outcome, receiver) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("barlink-tcp-rejoin".to_string())
        .spawn(move || {
            // The medium may be gone: then so is the connection made.
            let _ = outcome.send(resume.attempt());
        })?;
    Ok(receiver)
}

impl std::fmt::Debug for TcpMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpMedium")
            .field("peer", &self.peer)
            .field("encrypted", &self.cipher.is_some())
            .field("max_packet", &self.max_packet)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TcpMedium {
    /// A medium over `stream` (made non-blocking here) carrying packets of
    /// at most `max_packet` bytes, sealed by `cipher` when given.
    pub(super) fn new(
        stream: TcpStream,
        max_packet: usize,
        cipher: Option<Session>,
        resume: Option<Resume>,
        buffers: SocketBuffers,
    ) -> Result<TcpMedium, MediumError> {
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "the peer".to_string(), |a| a.to_string());
        configure(&stream, buffers).map_err(|e| {
            MediumError::new(format!("setting up the TCP connection to {peer}: {e}"))
        })?;
        if cipher.is_some() && max_packet > MAX_SEALED_PACKET {
            return Err(MediumError::new(format!(
                "packets of {max_packet} bytes; a link that encrypts carries at most \
                 {MAX_SEALED_PACKET}, one sealed record each"
            )));
        }
        let buffer = (4 * max_packet).max(MIN_BUFFER);
        Ok(TcpMedium {
            stream,
            peer,
            buffers,
            cipher,
            max_packet,
            out: ByteQueue::with_capacity(buffer),
            open_record: None,
            wire_in: ByteQueue::with_capacity(RECEIVE_BUFFER),
            out_limit: (2 * max_packet).max(1 << 20),
            stats: TcpStats::default(),
            rounds: 0,
            peer_closed: false,
            resume: resume.map(Arc::new),
            down: None,
            rejoining: None,
        })
    }

    /// What a failure of the connection does: ends the link, or (with a
    /// way to resume) drops the connection and what was in flight on it,
    /// for the engine to resend.
    fn connection_failed(&mut self, error: MediumError) -> Result<(), MediumError> {
        if self.resume.is_none() {
            return Err(error);
        }
        tracing::warn!(peer = self.peer, %error, "TCP connection lost; taking the peer back");
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        // Records sealed for the old connection's session go with it.
        for queue in [&mut self.out, &mut self.wire_in] {
            queue.start = 0;
            queue.end = 0;
        }
        self.open_record = None;
        self.peer_closed = false;
        let now = Instant::now();
        self.down = Some((now, now));
        self.stats.connections_lost += 1;
        Ok(())
    }

    /// Tries to take the peer back again after [`RETRY_EVERY`]; the
    /// connection stays down since `since`.
    fn retry_later(&mut self, since: Instant) {
        self.down = Some((since, Instant::now() + RETRY_EVERY));
    }

    /// While the connection is down, takes the peer back: starts an
    /// attempt (at most every [`RETRY_EVERY`]) or looks whether the one
    /// under way ended, never waiting for it. Whether the link has a
    /// connection again.
    fn rejoined(&mut self) -> bool {
        let Some((since, next)) = self.down else {
            return true;
        };
        let Some(resume) = &self.resume else {
            return false;
        };
        let outcome = match &self.rejoining {
            Some(pending) => match pending.try_recv() {
                Ok(outcome) => outcome,
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    Err("the attempt's thread ended without an answer".to_string())
                }
            },
            None => {
                if Instant::now() < next {
                    return false;
                }
                self.stats.rejoin_attempts += 1;
                match start_attempt(resume.clone()) {
                    Ok(pending) => self.rejoining = Some(pending),
                    Err(error) => {
                        tracing::warn!(peer = self.peer, %error, "no thread for an attempt to take the peer back");
                        self.retry_later(since);
                    }
                }
                return false;
            }
        };
        self.rejoining = None;
        match outcome {
            Ok(Some((stream, session))) => {
                if configure(&stream, self.buffers).is_err() {
                    self.retry_later(since);
                    return false;
                }
                self.stream = stream;
                if self.cipher.is_some() {
                    self.cipher = session;
                }
                self.down = None;
                self.stats.reconnects += 1;
                tracing::info!(peer = self.peer, after = ?since.elapsed(), "TCP connection replaced");
                true
            }
            Ok(None) => {
                self.retry_later(since);
                false
            }
            Err(why) => {
                tracing::warn!(
                    peer = self.peer,
                    why,
                    "a connection offered to resume the link was refused"
                );
                self.retry_later(since);
                false
            }
        }
    }

    /// What it moved so far.
    pub fn stats(&self) -> TcpStats {
        self.stats
    }

    /// How its socket buffers are sized.
    pub fn socket_buffers(&self) -> SocketBuffers {
        self.buffers
    }

    /// The send and receive buffer sizes of the connection now, as the
    /// kernel reports them (see [`buffers::buffer_sizes`]).
    pub fn buffer_sizes(&self) -> std::io::Result<(usize, usize)> {
        buffers::buffer_sizes(&self.stream)
    }

    /// Whether every packet is sealed.
    pub fn is_encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    fn lost(&self, what: &str, error: &std::io::Error) -> MediumError {
        MediumError::new(format!(
            "the TCP connection to {} failed while {what}: {error}",
            self.peer
        ))
    }

    /// Writes what the socket takes now of the bytes ready to go.
    fn flush(&mut self) -> Result<(), MediumError> {
        let keep = self.open_tail();
        flush_queue(
            &mut self.stream,
            &mut self.out,
            keep,
            &mut self.stats.wire_bytes_sent,
        )
        .map_err(|e| self.send_failed(&e))
    }

    /// Bytes at the back of `out` that the record being filled holds (its
    /// length and its frames so far): not to be sent yet.
    fn open_tail(&self) -> usize {
        self.open_record
            .map_or(0, |plain| RECORD_HEADER_LEN + plain)
    }

    /// Wire bytes queued that are ready to go (all but the open record).
    fn ready_to_send(&self) -> usize {
        self.out.len() - self.open_tail()
    }

    /// The connection failed while sending.
    fn send_failed(&self, error: &std::io::Error) -> MediumError {
        if error.kind() == ErrorKind::WriteZero {
            return MediumError::new(format!(
                "the TCP connection to {} takes no more bytes",
                self.peer
            ));
        }
        self.lost("sending", error)
    }

    /// Seals the record being filled, if any.
    fn seal_open_record(&mut self) -> Result<(), MediumError> {
        match &mut self.cipher {
            Some(cipher) => {
                let sealed = seal_record(&mut self.out, &mut self.open_record, cipher)?;
                self.stats.records_sealed += u64::from(sealed);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Reads what has arrived, at most one chunk; whether the socket may
    /// hold more.
    fn read_some(&mut self) -> Result<bool, MediumError> {
        let space = self.wire_in.space(READ_CHUNK);
        let space = &mut space[..READ_CHUNK];
        loop {
            match self.stream.read(space) {
                Ok(0) if !self.peer_closed => {
                    self.peer_closed = true;
                    return Ok(false);
                }
                Ok(0) => {
                    return Err(MediumError::new(format!(
                        "the peer at {} closed the TCP connection",
                        self.peer
                    )));
                }
                Ok(n) => {
                    let full = n == space.len();
                    self.wire_in.commit(n);
                    self.stats.wire_bytes_received += n as u64;
                    return Ok(full);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost("receiving", &e)),
            }
        }
    }

    /// Opens every complete record where it was read and hands its
    /// frames to the engine.
    fn open_records<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        let Some(cipher) = &mut self.cipher else {
            return Ok(0);
        };
        let mut delivered = 0;
        loop {
            let start = self.wire_in.start;
            let bytes = &mut self.wire_in.buf[start..self.wire_in.end];
            let opened = open_record(bytes, cipher).map_err(|e| {
                MediumError::new(format!(
                    "a sealed record from {} does not open ({e}): it was altered, dropped, replayed \
                     or reordered on the way; nothing of it was delivered",
                    self.peer
                ))
            })?;
            let Some((taken, plain)) = opened else {
                break;
            };
            let frames = &bytes[RECORD_HEADER_LEN..RECORD_HEADER_LEN + plain];
            delivered += hand_record(engine, now, frames, self.max_packet, &self.peer)?;
            self.wire_in.consume(taken);
            self.stats.records_opened += 1;
        }
        self.stats.packets_received += delivered as u64;
        Ok(delivered)
    }

    /// Hands every complete frame to the engine.
    fn deliver<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        if self.cipher.is_some() {
            return self.open_records(now, engine);
        }
        let queue = &mut self.wire_in;
        let mut delivered = 0;
        while let Some(len) = next_frame(queue.readable(), self.max_packet)? {
            let packet = &queue.readable()[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
            // A packet the engine refuses is counted there (CRC failure,
            // malformed); the link goes on.
            let _verdict = hand_frame(engine, now, packet);
            queue.consume(FRAME_HEADER_LEN + len);
            delivered += 1;
        }
        self.stats.packets_received += delivered as u64;
        Ok(delivered)
    }
}

impl Medium for TcpMedium {
    /// A socket has no cheap test for arrivals: every round looks.
    fn activity(&mut self) -> Result<[u64; 2], MediumError> {
        self.rounds += 1;
        Ok([self.rounds, 0])
    }

    fn receive<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
        _intake: Intake,
    ) -> Result<usize, MediumError> {
        // A byte stream is read in whole buffers: everything read is
        // handed over, whatever `_intake` asks.
        if !self.rejoined() {
            return Ok(0);
        }
        let mut delivered = 0;
        let result = (|| {
            for _ in 0..READS_PER_ROUND {
                let more = self.read_some()?;
                delivered += self.deliver(now, engine)?;
                if !more {
                    break;
                }
            }
            Ok(())
        })();
        if let Err(error) = result {
            self.connection_failed(error)?;
        }
        Ok(delivered)
    }

    fn transmit<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        if self.down.is_some() {
            // Nothing goes out while the connection is down: the engine
            // resends what it is owed once it is back.
            return Ok(0);
        }
        match self.transmit_on(now, engine) {
            Ok(sent) => Ok(sent),
            Err(error) => self.connection_failed(error).map(|()| 0),
        }
    }

    fn max_packet(&self) -> usize {
        self.max_packet
    }
}

impl TcpMedium {
    fn transmit_on<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        self.flush()?;
        // Once the socket refuses bytes, packets stay with the engine:
        // queued here they would only be copied, and their retransmission
        // timers would run while they wait for the socket.
        let mut refused = self.out.len() > 0;
        let mut sent = 0;
        while !refused && self.out.len() < self.out_limit {
            let (out, cipher) = (&mut self.out, &mut self.cipher);
            let (open_record, stats) = (&mut self.open_record, &mut self.stats);
            // Each packet is copied into the queue with its CRC taken in
            // the same pass (sealed: into its record, sealed there).
            let framed = engine.poll_transmit_with(now, |transmit| match cipher {
                Some(cipher) => {
                    let sealed = frame_into_record(out, open_record, cipher, transmit)?;
                    stats.records_sealed += u64::from(sealed);
                    Ok::<(), MediumError>(())
                }
                None => {
                    queue_frame(out, transmit);
                    Ok(())
                }
            });
            let Some(framed) = framed else {
                break;
            };
            framed?;
            sent += 1;
            if self.ready_to_send() >= WRITE_FROM {
                self.flush()?;
                refused = self.ready_to_send() > 0;
            }
        }
        self.seal_open_record()?;
        self.flush()?;
        self.stats.packets_sent += sent as u64;
        Ok(sent)
    }
}

/// Appends `transmit` to `queue` as a frame.
fn queue_frame(queue: &mut ByteQueue, transmit: &Transmit<'_>) {
    let len = transmit.len();
    let space = queue.space(FRAME_HEADER_LEN + len);
    space[..FRAME_HEADER_LEN].copy_from_slice(&frame_header(len));
    transmit.write_to(&mut space[FRAME_HEADER_LEN..]);
    queue.commit(FRAME_HEADER_LEN + len);
}

/// Appends `transmit`'s frame to the record being filled at the back of
/// `out` (`open` its plaintext bytes so far), sealing that record first
/// when the frame does not fit in it. Whether a record was sealed.
fn frame_into_record(
    out: &mut ByteQueue,
    open: &mut Option<usize>,
    cipher: &mut Session,
    transmit: &Transmit<'_>,
) -> Result<bool, MediumError> {
    let frame = FRAME_HEADER_LEN + transmit.len();
    if frame > MAX_RECORD_PLAINTEXT {
        return Err(MediumError::new(format!(
            "a packet of {} bytes; a link that encrypts carries at most {MAX_SEALED_PACKET}",
            transmit.len()
        )));
    }
    let mut sealed = false;
    if open.is_some_and(|plain| plain + frame > MAX_RECORD_PLAINTEXT) {
        sealed = seal_record(out, open, cipher)?;
    }
    // Room for the frame, and for the tag that follows it if the record
    // ends with it (so sealing never moves the queue's bytes).
    let plain = match *open {
        Some(plain) => plain,
        None => {
            out.space(RECORD_HEADER_LEN + frame + SEAL_OVERHEAD);
            out.commit(RECORD_HEADER_LEN);
            0
        }
    };
    let space = out.space(frame + SEAL_OVERHEAD);
    space[..FRAME_HEADER_LEN].copy_from_slice(&frame_header(transmit.len()));
    transmit.write_to(&mut space[FRAME_HEADER_LEN..frame]);
    out.commit(frame);
    *open = Some(plain + frame);
    Ok(sealed)
}

/// Seals the record being filled at the back of `out`, where it lies, and
/// appends its tag. Whether there was one.
fn seal_record(
    out: &mut ByteQueue,
    open: &mut Option<usize>,
    cipher: &mut Session,
) -> Result<bool, MediumError> {
    let Some(plain) = *open else {
        return Ok(false);
    };
    out.space(SEAL_OVERHEAD);
    let end = out.end;
    let start = end - plain;
    // Still open if sealing fails: an open record is never written.
    let tag = cipher
        .seal_in_place(&mut out.buf[start..end])
        .map_err(|e| MediumError::new(format!("sealing a record: {e}")))?;
    *open = None;
    let len = u16::try_from(plain + SEAL_OVERHEAD).expect("a record fits 64 KiB");
    out.buf[start - RECORD_HEADER_LEN..start].copy_from_slice(&len.to_le_bytes());
    out.space(SEAL_OVERHEAD)[..SEAL_OVERHEAD].copy_from_slice(&tag);
    out.commit(SEAL_OVERHEAD);
    Ok(true)
}

/// Writes what the socket takes of `queue` but its last `keep` bytes,
/// adding each write's bytes to `sent` as it goes (so an error later
/// still leaves them counted).
fn flush_queue(
    stream: &mut TcpStream,
    queue: &mut ByteQueue,
    keep: usize,
    sent: &mut u64,
) -> std::io::Result<()> {
    while queue.len() > keep {
        let ready = &queue.readable()[..queue.len() - keep];
        match stream.write(ready) {
            Ok(0) => return Err(std::io::Error::from(ErrorKind::WriteZero)),
            Ok(n) => {
                queue.consume(n);
                *sent += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_headers_check_their_length() {
        let header = frame_header(1000);
        let mut bytes = header.to_vec();
        bytes.extend_from_slice(&[7u8; 999]);
        assert_eq!(next_frame(&bytes, 4096).unwrap(), None, "one byte short");
        bytes.push(7);
        assert_eq!(next_frame(&bytes, 4096).unwrap(), Some(1000));
        assert!(
            next_frame(&bytes, 999).is_err(),
            "larger than the largest packet"
        );
        for bit in 0..64 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(next_frame(&flipped, 1 << 30).is_err(), "bit {bit} flipped");
        }
        assert_eq!(next_frame(&bytes[..7], 4096).unwrap(), None);
        assert!(next_frame(&frame_header(0), 4096).is_err());
    }

    #[test]
    fn packets_stay_with_the_engine_while_the_socket_is_full() {
        packets_stay_with_the_engine_until_the_socket_takes_them(None);
    }

    #[test]
    fn sealed_packets_stay_with_the_engine_while_the_socket_is_full() {
        packets_stay_with_the_engine_until_the_socket_takes_them(Some(sessions().0));
    }

    /// Both ends of a finished handshake (initiator, responder).
    fn sessions() -> (Session, Session) {
        use crate::auth::{PeerAuth, SecretKey, preamble, run_handshakes};
        let auth = PeerAuth::PreSharedKey {
            key: SecretKey::from_hex(&"5a".repeat(32)).unwrap(),
            source: "test".to_string(),
        };
        let (initiator, responder) =
            run_handshakes(&auth, preamble(auth.mode()), |_, _| {}).unwrap();
        (initiator.finish().unwrap(), responder.finish().unwrap())
    }

    #[test]
    fn a_sealed_record_must_hold_whole_frames() {
        let (mut sealing, opening) = sessions();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (reader, _) = listener.accept().unwrap();
        // A frame of 100 bytes announced, 50 of them in the record.
        let mut record = frame_header(100).to_vec();
        record.extend_from_slice(&[9u8; 50]);
        let sealed = sealing.seal(&record).unwrap();
        let mut wire = u16::try_from(sealed.len()).unwrap().to_le_bytes().to_vec();
        wire.extend_from_slice(&sealed);
        writer.write_all(&wire).unwrap();
        let config = crate::engine::EngineConfig::default();
        let mut engine = Engine::<Vec<u8>>::new(config.clone(), 1, Time::ZERO).unwrap();
        let mut medium = TcpMedium::new(
            reader,
            config.mtu,
            Some(opening),
            None,
            SocketBuffers::Autotuned,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let error = loop {
            match medium.receive(Time::ZERO, &mut engine, Intake::All) {
                Err(error) => break error.to_string(),
                Ok(_) if Instant::now() < deadline => std::thread::yield_now(),
                Ok(_) => panic!("a record ending inside a frame was taken"),
            }
        };
        assert!(error.contains("ends inside a frame"), "{error}");
    }

    #[test]
    fn an_encrypting_medium_refuses_packets_larger_than_a_record() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let error = TcpMedium::new(
            stream,
            MAX_SEALED_PACKET + 1,
            Some(sessions().0),
            None,
            SocketBuffers::Autotuned,
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("one sealed record each"),
            "{error}"
        );
    }

    fn packets_stay_with_the_engine_until_the_socket_takes_them(cipher: Option<Session>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Accepted and never read: the socket fills.
        let (_receiver, _) = listener.accept().unwrap();
        let sealed = cipher.is_some();
        let config = crate::engine::EngineConfig {
            mtu: if sealed { MAX_SEALED_PACKET } else { 64 * 1024 },
            ..crate::engine::EngineConfig::default()
        };
        let max_packet = config.mtu;
        let mut engine = Engine::<Vec<u8>>::new(config.clone(), 1, Time::ZERO).unwrap();
        // The two trade their opening packets: the peer's grant the credit
        // to send at all.
        let mut peer = Engine::<Vec<u8>>::new(config, 2, Time::ZERO).unwrap();
        let later = Time::from_nanos(1_000_000_000);
        let mut packet = vec![0u8; max_packet];
        for _ in 0..4 {
            peer.handle_timeout(later);
            engine.handle_timeout(later);
            while let Some(len) = peer.poll_transmit(later, &mut packet) {
                let _ = engine.handle_packet(later, &packet[..len]);
            }
            while let Some(len) = engine.poll_transmit(later, &mut packet) {
                let _ = peer.handle_packet(later, &packet[..len]);
            }
        }
        for _ in 0..256 {
            engine.send(vec![7u8; max_packet - HEADER_LEN]).unwrap();
        }
        let mut medium =
            TcpMedium::new(sender, max_packet, cipher, None, SocketBuffers::Autotuned).unwrap();
        for _ in 0..64 {
            medium.transmit(later, &mut engine).unwrap();
        }
        assert!(
            medium.stats.wire_bytes_sent > 1 << 20,
            "only {} bytes went out: the engine was not allowed to send",
            medium.stats.wire_bytes_sent
        );
        assert!(
            engine.has_unsent(),
            "the socket took 16 MiB without a reader: nothing was ever refused"
        );
        // Once a write leaves bytes behind, the round takes no more
        // packets: at most the batch it wrote, the frame (sealed: the
        // record) that crossed it, and the record it sealed at its end.
        let unit = if sealed {
            RECORD_HEADER_LEN + MAX_RECORD_PLAINTEXT + SEAL_OVERHEAD
        } else {
            FRAME_HEADER_LEN + max_packet
        };
        let most = WRITE_FROM + 2 * unit;
        assert!(
            medium.out.len() <= most,
            "{} bytes were copied to wait for the socket (at most {most})",
            medium.out.len()
        );
        assert_eq!(medium.open_record, None, "a record was left unsealed");
        assert_eq!(medium.stats.records_sealed > 0, sealed);
    }

    #[test]
    fn the_byte_queue_reuses_its_space() {
        let mut queue = ByteQueue::default();
        queue.space(5)[..5].copy_from_slice(b"hello");
        queue.commit(5);
        queue.consume(2);
        assert_eq!(queue.readable(), b"llo");
        let space = queue.space(10);
        space[..2].copy_from_slice(b"!!");
        queue.commit(2);
        assert_eq!(queue.readable(), b"llo!!");
        queue.consume(5);
        assert_eq!(queue.len(), 0);
        assert_eq!((queue.start, queue.end), (0, 0));
    }
}
