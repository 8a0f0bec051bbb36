//! The RDMA link over real verbs: [`VerbsQueue`] implements
//! [`PacketQueue`] on an RC [`QueuePair`], and [`accept`] / [`connect`]
//! set up a whole [`RdmaLink`] — device, protection domain, completion
//! queues, queue pair, registered rings — with the out-of-band hello of
//! [`crate::oob`], in the manner of perftest.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::net::ToSocketAddrs;
use std::time::Duration;

use barlink_transport::EngineConfig;
use barlink_transport::link::Link;

use crate::error::RdmaError;
use crate::link::{
    CREDIT_OFFSET, Completion, InPlace, LinkSetupError, PacketQueue, PacketWrite, QueueError,
    RdmaLink, RdmaMedium, RingShape,
};
use crate::oob::{self, Hello, OobError, OobListener, OobOptions, OobStream};
use crate::verbs::{
    Access, CompletionQueue, Context, Gid, LinkLayer, Mtu, ProtectionDomain, QpConfig,
    QpConnectOptions, QpEndpoint, QueuePair, RegisteredMemory, RemoteAddr, RemoteRegion,
    SendMemory, WorkCompletion, send_memory,
};

/// Completions taken per poll call.
const POLL_BATCH: usize = 64;

/// [`PacketQueue`] over a connected RC queue pair: the staging area and
/// the receive ring are registered memory of this process; the peer's ring
/// and credit word are named by the addresses and rkeys of its hello.
#[derive(Debug)]
pub struct VerbsQueue {
    // Field order matters: the queue pair goes first, and with it every
    // request that might still read a registration held below.
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    receive: RegisteredMemory,
    staging: RegisteredMemory,
    remote_ring: RemoteRegion,
    remote_credit: RemoteAddr,
    /// Credit values for devices that cannot write 8 bytes inline: one
    /// 8-byte source per send-queue entry (a write's source must stay
    /// unchanged until it completes; entry `wr_id % depth` cannot be in use
    /// by an earlier request still outstanding).
    credit_source: Option<RegisteredMemory>,
    sq_depth: usize,
    wc: Vec<WorkCompletion>,
    /// The domain whose registrations of send memory the in-place writes
    /// name.
    pd: ProtectionDomain,
    /// What in-place writes not yet known complete hold (the program's
    /// memory and its registration), by work request.
    in_place_in_flight: VecDeque<(u64, send_memory::Hold)>,
}

impl Drop for VerbsQueue {
    fn drop(&mut self) {
        // No link of this domain sends again: its registrations of send
        // memory need not hold the device open.
        send_memory::forget_domain(&self.pd);
    }
}

fn post_error(operation: &'static str) -> impl Fn(RdmaError) -> QueueError {
    move |error| QueueError::Post {
        operation,
        detail: error.to_string(),
    }
}

fn completion(wc: &WorkCompletion) -> Completion {
    Completion {
        wr_id: wc.wr_id,
        status: wc.status,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm: wc.imm_data,
    }
}

impl VerbsQueue {
    /// The queue pair (for its state and number).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// Registers `memory` with this queue's device now, rather than at the
    /// first send from it, so that a program learns up front whether its
    /// sends from it go in place; `Err` says why the device refused it
    /// (sends from it then go through the staging area). Asked once per
    /// device: a second call answers as the first did.
    pub fn register_send_memory(&self, memory: &SendMemory) -> Result<(), RdmaError> {
        send_memory::register_in(&self.pd, memory)
    }

    fn poll(
        cq: &CompletionQueue,
        wc: &mut [WorkCompletion],
        queue: &'static str,
        mut each: impl FnMut(Completion),
    ) -> Result<(), QueueError> {
        loop {
            let n = cq.poll(wc).map_err(|error| QueueError::Poll {
                queue,
                detail: error.to_string(),
            })?;
            wc[..n].iter().for_each(|wc| each(completion(wc)));
            if n < wc.len() {
                return Ok(());
            }
        }
    }
}

impl PacketQueue for VerbsQueue {
    type Region = RegisteredMemory;

    fn receive_region(&self) -> &RegisteredMemory {
        &self.receive
    }

    fn staging(&self) -> &RegisteredMemory {
        &self.staging
    }

    fn send_queue_depth(&self) -> usize {
        self.sq_depth
    }

    fn post_write_imm(
        &mut self,
        wr_id: u64,
        local_offset: usize,
        len: usize,
        remote_offset: usize,
        imm: u32,
        signaled: bool,
    ) -> Result<(), QueueError> {
        let sge = self
            .staging
            .sge(local_offset, len)
            .map_err(post_error("an RDMA WRITE WITH IMM"))?;
        let remote = self
            .remote_ring
            .at(remote_offset as u64, len)
            .map_err(post_error("an RDMA WRITE WITH IMM"))?;
        self.qp
            .post_write_imm(wr_id, &[sge], remote, imm, signaled)
            .map_err(post_error("an RDMA WRITE WITH IMM"))
    }

    fn in_place(&self, payload: &[u8]) -> Option<InPlace> {
        let (sge, hold) = send_memory::in_place(&self.pd, payload)?;
        Some(InPlace {
            sge: Some(sge),
            hold: Some(hold),
        })
    }

    fn post_write_imm_in_place(
        &mut self,
        write: PacketWrite,
        header_len: usize,
        _payload: &[u8],
        source: InPlace,
    ) -> Result<(), QueueError> {
        let operation = "an RDMA WRITE WITH IMM in place";
        let (Some(payload), Some(hold)) = (source.sge, source.hold) else {
            return Err(QueueError::Post {
                operation,
                detail: "the payload is not in this device's send memory".to_string(),
            });
        };
        let header = self
            .staging
            .sge(write.local_offset, header_len)
            .map_err(post_error(operation))?;
        let len = header_len + payload.len() as usize;
        let remote = self
            .remote_ring
            .at(write.remote_offset as u64, len)
            .map_err(post_error(operation))?;
        self.qp
            .post_write_imm(
                write.wr_id,
                &[header, payload],
                remote,
                write.imm,
                write.signaled,
            )
            .map_err(post_error(operation))?;
        self.in_place_in_flight.push_back((write.wr_id, hold));
        Ok(())
    }

    fn post_credit(&mut self, wr_id: u64, value: u64, signaled: bool) -> Result<(), QueueError> {
        let bytes = value.to_le_bytes();
        match &self.credit_source {
            None => self
                .qp
                .post_write_inline(wr_id, &bytes, self.remote_credit, None, signaled)
                .map_err(post_error("a credit write")),
            Some(source) => {
                use barlink_transport::window::Window;
                let at = (wr_id % self.sq_depth as u64) as usize * 8;
                source.write(at, &bytes)?;
                let sge = source.sge(at, 8).map_err(post_error("a credit write"))?;
                self.qp
                    .post_write(wr_id, &[sge], self.remote_credit, signaled)
                    .map_err(post_error("a credit write"))
            }
        }
    }

    fn post_recvs(&mut self, count: usize) -> Result<(), QueueError> {
        for _ in 0..count {
            self.qp
                .post_recv(0, None)
                .map_err(post_error("a receive"))?;
        }
        Ok(())
    }

    fn poll_send(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        let mut last_done = None;
        Self::poll(&self.send_cq, &mut self.wc, "send", |c| {
            last_done = Some(c.wr_id);
            out.push(c)
        })?;
        // Requests complete in order: what a completion names and all
        // before it no longer read their registrations.
        if let Some(done) = last_done {
            while self
                .in_place_in_flight
                .front()
                .is_some_and(|(wr_id, _)| *wr_id <= done)
            {
                self.in_place_in_flight.pop_front();
            }
        }
        Ok(())
    }

    fn poll_recv(&mut self, out: &mut VecDeque<Completion>) -> Result<(), QueueError> {
        Self::poll(&self.recv_cq, &mut self.wc, "receive", |c| out.push_back(c))
    }
}

/// How to set up an RDMA link.
#[derive(Debug, Clone)]
pub struct RdmaLinkOptions {
    /// The device (`rxe0`, `mlx5_0`); `None`: the first one.
    pub device: Option<String>,
    /// The port (from 1).
    pub port: u8,
    /// The GID index; `None`: the port's RoCE v2 entry for an IPv4
    /// address (else its first RoCE v2 entry; index 0 on InfiniBand).
    pub gid_index: Option<u8>,
    /// Slots of this side's receive ring.
    pub slots: u32,
    /// Send-queue depth.
    pub send_queue_depth: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout); 14 (67 ms) on a
    /// real fabric, 18–20 under emulated soft-RoCE.
    pub qp_timeout: u8,
    /// Transport retries before a write fails with "retry exceeded" (0–7).
    pub retry_count: u8,
    /// Receiver-not-ready retries (0–7, 7 = forever).
    pub rnr_retry: u8,
    /// Timeouts and retries of the TCP setup.
    pub oob: OobOptions,
    /// The engine's settings (the peer must use the same MTU, largest
    /// message and CRC setting; the hello checks).
    pub engine: EngineConfig,
    /// This side's session (+1 per restart).
    pub epoch: u32,
}

impl Default for RdmaLinkOptions {
    fn default() -> Self {
        RdmaLinkOptions {
            device: None,
            port: 1,
            gid_index: None,
            slots: 64,
            send_queue_depth: 128,
            qp_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            oob: OobOptions::default(),
            engine: EngineConfig {
                mtu: 16 << 10,
                ..EngineConfig::default()
            },
            epoch: 1,
        }
    }
}

impl RdmaLinkOptions {
    /// These options with what `BARLINK_RDMA_DEVICE`, `BARLINK_GID_INDEX`
    /// and `BARLINK_QP_TIMEOUT` say, where set: the variables of `barlink
    /// bench --rdma`'s options, for the faces (C, Python) that have no
    /// fields for them. A value that is not one names the variable.
    pub fn with_environment(self) -> Result<RdmaLinkOptions, String> {
        self.with_variables(|name| std::env::var(name).ok())
    }

    /// [`RdmaLinkOptions::with_environment`] over any source of variables.
    pub fn with_variables(
        mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<RdmaLinkOptions, String> {
        let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        let number = |name: &str, max: u8| -> Result<Option<u8>, String> {
            set(name)
                .map(|value| {
                    value
                        .trim()
                        .parse::<u8>()
                        .ok()
                        .filter(|&n| n <= max)
                        .ok_or_else(|| format!("{name}={value:?} is not a number from 0 to {max}"))
                })
                .transpose()
        };
        if let Some(device) = set("BARLINK_RDMA_DEVICE") {
            self.device = Some(device.trim().to_string());
        }
        if let Some(gid) = number("BARLINK_GID_INDEX", u8::MAX)? {
            self.gid_index = Some(gid);
        }
        // The QP's local ACK timeout is a 5-bit exponent.
        if let Some(timeout) = number("BARLINK_QP_TIMEOUT", 31)? {
            self.qp_timeout = timeout;
        }
        Ok(self)
    }
}

/// Why an RDMA link could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum RdmaConnectError {
    /// A verbs call failed.
    Rdma {
        step: &'static str,
        error: RdmaError,
    },
    /// The TCP setup failed.
    Oob(OobError),
    /// The link could not be put together.
    Link(LinkSetupError),
    /// The options cannot work.
    Options { detail: String },
}

impl fmt::Display for RdmaConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaConnectError::Rdma { step, error } => write!(f, "{step}: {error}"),
            RdmaConnectError::Oob(error) => error.fmt(f),
            RdmaConnectError::Link(error) => error.fmt(f),
            RdmaConnectError::Options { detail } => write!(f, "RDMA link options: {detail}"),
        }
    }
}

impl std::error::Error for RdmaConnectError {}

impl From<OobError> for RdmaConnectError {
    fn from(error: OobError) -> Self {
        RdmaConnectError::Oob(error)
    }
}

impl From<barlink_transport::tcp::ChannelError> for RdmaConnectError {
    fn from(error: barlink_transport::tcp::ChannelError) -> Self {
        RdmaConnectError::Oob(OobError::from(error))
    }
}

impl From<LinkSetupError> for RdmaConnectError {
    fn from(error: LinkSetupError) -> Self {
        RdmaConnectError::Link(error)
    }
}

fn rdma(step: &'static str) -> impl Fn(RdmaError) -> RdmaConnectError {
    move |error| RdmaConnectError::Rdma { step, error }
}

/// The server side: waits at most `timeout` for a client on `listener`,
/// then sets up the link.
pub fn accept<B: AsRef<[u8]>>(
    listener: &OobListener,
    timeout: Duration,
    options: &RdmaLinkOptions,
) -> Result<RdmaLink<VerbsQueue, B>, RdmaConnectError> {
    let auth = options.oob.resolve_auth()?;
    let stream = listener.accept_authenticated(timeout, &options.oob, &auth)?;
    establish(stream, options)
}

/// The client side: connects to a server at `addr` (retrying as
/// `options.oob` says), then sets up the link.
pub fn connect<B: AsRef<[u8]>>(
    addr: impl ToSocketAddrs,
    options: &RdmaLinkOptions,
) -> Result<RdmaLink<VerbsQueue, B>, RdmaConnectError> {
    let auth = options.oob.resolve_auth()?;
    let mut stream = oob::connect(addr, &options.oob)?;
    stream.authenticate(&auth, true)?;
    establish(stream, options)
}

/// A first PSN that differs between runs, so that a stale peer's packets
/// miss.
fn random_psn() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(12)) & 0x00FF_FFFF
}

fn mtu_of_bytes(bytes: usize) -> Option<Mtu> {
    (1..=5)
        .filter_map(Mtu::from_code)
        .find(|mtu| mtu.bytes() == bytes)
}

/// Sets up the queue pair and the rings over a connected setup channel:
/// hello both ways, INIT, receives posted, RTR, RTS, then the ready byte
/// both ways, so that neither side writes before the other can take it.
fn establish<B: AsRef<[u8]>>(
    mut stream: OobStream,
    options: &RdmaLinkOptions,
) -> Result<RdmaLink<VerbsQueue, B>, RdmaConnectError> {
    let config = &options.engine;
    config
        .validate()
        .map_err(|error| RdmaConnectError::Options {
            detail: error.to_string(),
        })?;
    let local = RingShape::for_mtu(options.slots, config.mtu)?;
    let context = match &options.device {
        Some(name) => Context::open(name),
        None => Context::open_first(),
    }
    .map_err(rdma("opening the RDMA device"))?;
    let port = context
        .query_port(options.port)
        .map_err(rdma("querying the port"))?;
    let gid_index = gid_index(&context, port.link_layer, options)?;
    let path_mtu = port.active_mtu.unwrap_or(Mtu::Mtu1024);
    let side = LocalSide::create(&context, local, options)?;
    let mut qp_options = QpConnectOptions {
        port: options.port,
        sgid_index: gid_index,
        path_mtu: Some(path_mtu),
        timeout: options.qp_timeout,
        retry_cnt: options.retry_count,
        rnr_retry: options.rnr_retry,
        access: Access::RDMA,
        ..QpConnectOptions::default()
    };
    let endpoint = side
        .qp
        .local_endpoint(&qp_options, random_psn())
        .map_err(rdma("reading the port's address"))?;
    let ours = hello(
        options,
        &endpoint,
        gid_index,
        path_mtu,
        &side.receive,
        local,
    );
    let peer = stream.exchange(&ours)?;
    // The smaller of the two path MTUs.
    let shared_mtu = usize::from(peer.path_mtu).min(path_mtu.bytes());
    qp_options.path_mtu = mtu_of_bytes(shared_mtu);
    let queue = side.into_queue(&peer, options)?;
    // Posts a receive per slot (the QP is in INIT: receives may be posted).
    let medium = RdmaMedium::new(queue, local, peer.ring, config.mtu)?;
    let remote = QpEndpoint {
        qp_num: peer.qpn,
        psn: peer.psn,
        gid: Gid(peer.gid),
        lid: peer.lid,
    };
    let qp = medium.queue().qp();
    qp.to_rtr(&remote, &qp_options).map_err(rdma(
        "moving the queue pair to RTR (check the peer's GID, the GID index and the MTU)",
    ))?;
    qp.to_rts(endpoint.psn, &qp_options)
        .map_err(rdma("moving the queue pair to RTS"))?;
    stream.ready()?;
    Ok(Link::with_medium(medium, config.clone(), options.epoch).map_err(LinkSetupError::from)?)
}

/// The GID index to send from: the one the options name, else 0 on
/// InfiniBand, else the port's RoCE v2 entry (of an IPv4 address first).
fn gid_index(
    context: &Context,
    link_layer: LinkLayer,
    options: &RdmaLinkOptions,
) -> Result<u8, RdmaConnectError> {
    match options.gid_index {
        Some(index) => Ok(index),
        None if link_layer == LinkLayer::InfiniBand => Ok(0),
        None => {
            let info = crate::device::device(context.name())
                .map_err(rdma("reading the device's GID table"))?;
            let entry = info
                .ports
                .iter()
                .find(|p| p.port == options.port)
                .and_then(|p| p.roce_v2_gid())
                .ok_or_else(|| RdmaConnectError::Options {
                    detail: format!(
                        "{} port {} has no RoCE v2 GID: give the interface an IP address, or set the GID index",
                        context.name(),
                        options.port
                    ),
                })?;
            u8::try_from(entry.index).map_err(|_| RdmaConnectError::Options {
                detail: format!("GID index {} does not fit in 8 bits", entry.index),
            })
        }
    }
}

/// This side's verbs objects, made before the peer is known: what its
/// hello describes.
struct LocalSide {
    pd: ProtectionDomain,
    sq_depth: u32,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qp: QueuePair,
    receive: RegisteredMemory,
}

impl LocalSide {
    /// A protection domain, the two completion queues, the queue pair (in
    /// RESET) and the registered receive ring of shape `local`.
    fn create(
        context: &Context,
        local: RingShape,
        options: &RdmaLinkOptions,
    ) -> Result<LocalSide, RdmaConnectError> {
        let pd = context
            .alloc_pd()
            .map_err(rdma("allocating a protection domain"))?;
        let sq_depth = options.send_queue_depth.max(8);
        let send_cq = context
            .create_cq(sq_depth)
            .map_err(rdma("creating the send completion queue"))?;
        let recv_cq = context
            .create_cq(local.slots)
            .map_err(rdma("creating the receive completion queue"))?;
        let qp = pd
            .create_rc_qp(
                &send_cq,
                &recv_cq,
                &QpConfig {
                    max_send_wr: sq_depth,
                    max_recv_wr: local.slots,
                    max_inline_data: 64,
                    // A header from the staging area and a payload in place.
                    max_send_sge: 2,
                    ..QpConfig::default()
                },
            )
            .map_err(rdma("creating the queue pair"))?;
        let receive = RegisteredMemory::new(&pd, local.region_len())
            .map_err(rdma("registering the receive ring"))?;
        Ok(LocalSide {
            pd,
            sq_depth,
            send_cq,
            recv_cq,
            qp,
            receive,
        })
    }

    /// Once the peer's hello is in: the staging area for the peer's ring,
    /// the credit source when the device cannot write 8 bytes inline, the
    /// queue pair in INIT, and the queue over them all.
    fn into_queue(
        self,
        peer: &Hello,
        options: &RdmaLinkOptions,
    ) -> Result<VerbsQueue, RdmaConnectError> {
        let LocalSide {
            pd,
            sq_depth,
            send_cq,
            recv_cq,
            qp,
            receive,
        } = self;
        let staging = RegisteredMemory::new(&pd, peer.ring.slots_len())
            .map_err(rdma("registering the staging area"))?;
        let credit_source = if qp.max_inline_data() >= 8 {
            None
        } else {
            Some(
                RegisteredMemory::new(&pd, sq_depth as usize * 8)
                    .map_err(rdma("registering the credit source"))?,
            )
        };
        qp.to_init(options.port, Access::RDMA)
            .map_err(rdma("moving the queue pair to INIT"))?;
        Ok(VerbsQueue {
            sq_depth: (qp.max_send_wr().min(sq_depth)) as usize,
            qp,
            send_cq,
            recv_cq,
            receive,
            staging,
            remote_ring: RemoteRegion {
                addr: peer.ring_addr,
                rkey: peer.ring_rkey,
                len: peer.ring.region_len() as u64,
            },
            remote_credit: RemoteAddr {
                addr: peer.credit_addr,
                rkey: peer.credit_rkey,
            },
            credit_source,
            wc: vec![WorkCompletion::default(); POLL_BATCH],
            pd,
            in_place_in_flight: VecDeque::new(),
        })
    }
}

/// This side's hello: its queue pair's address, its receive ring and
/// credit word, and the engine settings the peer must share.
fn hello(
    options: &RdmaLinkOptions,
    endpoint: &QpEndpoint,
    gid_index: u8,
    path_mtu: Mtu,
    receive: &RegisteredMemory,
    ring: RingShape,
) -> Hello {
    let config = &options.engine;
    Hello {
        epoch: options.epoch.max(1),
        qpn: endpoint.qp_num,
        psn: endpoint.psn,
        lid: endpoint.lid,
        gid_index,
        gid: endpoint.gid.0,
        path_mtu: path_mtu.bytes() as u16,
        ring_addr: receive.addr(),
        ring_rkey: receive.rkey(),
        ring,
        credit_addr: receive.addr() + CREDIT_OFFSET as u64,
        credit_rkey: receive.rkey(),
        engine_mtu: config.mtu as u32,
        max_message_len: config.max_message_len,
        crc: config.crc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<RdmaLinkOptions, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RdmaLinkOptions::default().with_variables(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn the_environment_names_the_device_gid_and_qp_timeout() {
        let options = from(&[
            ("BARLINK_RDMA_DEVICE", "rxe0"),
            ("BARLINK_GID_INDEX", "1"),
            ("BARLINK_QP_TIMEOUT", " 18 "),
        ])
        .unwrap();
        assert_eq!(options.device.as_deref(), Some("rxe0"));
        assert_eq!(options.gid_index, Some(1));
        assert_eq!(options.qp_timeout, 18);
        let untouched = from(&[("BARLINK_RDMA_DEVICE", "")]).unwrap();
        assert_eq!(untouched.device, None);
        assert_eq!(untouched.qp_timeout, RdmaLinkOptions::default().qp_timeout);
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (name, value) in [
            ("BARLINK_QP_TIMEOUT", "32"),
            ("BARLINK_QP_TIMEOUT", "slow"),
            ("BARLINK_GID_INDEX", "-1"),
        ] {
            let error = from(&[(name, value)]).unwrap_err();
            assert!(error.contains(name) && error.contains(value), "{error}");
        }
    }
}
