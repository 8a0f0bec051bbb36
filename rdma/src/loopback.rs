//! A software queue pair: two [`PacketQueue`] endpoints in one process,
//! whose "adapter" copies a staging slot into the peer's receive region
//! and queues the completions a reliable connection would — so the whole
//! RDMA link (engine, medium, blocking API) runs in tests on any host.
//!
//! Faults can be injected per direction: a write's bytes corrupted (one
//! bit flipped) or lost (the completion still comes, the slot keeps its
//! old bytes — what a broken DMA path would do), and an endpoint can die:
//! silently (nothing it is sent completes, as when a peer process is
//! SIGKILLed before the adapter's retries run out) or with
//! `RetryExceeded` completions (what an RC queue pair reports once its
//! retries are spent).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use barlink_transport::rng::SplitMix64;
use barlink_transport::window::{HeapWindow, Window};

use crate::link::{
    CREDIT_OFFSET, Completion, InPlace, PacketQueue, PacketWrite, QueueError, RingShape, WcStatus,
};
use crate::verbs::send_memory;

/// Faults applied to the writes one endpoint sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopbackFaults {
    /// Seeds the choice of faulted writes and flipped bits.
    pub seed: u64,
    /// Probability that a packet write, or a credit write, lands with one
    /// bit flipped.
    pub corrupt: f64,
    /// Probability that a packet write's bytes, or a credit write's word,
    /// never land (its completion still comes).
    pub lose: f64,
}

impl LoopbackFaults {
    /// No faults.
    pub fn none() -> Self {
        LoopbackFaults {
            seed: 0,
            corrupt: 0.0,
            lose: 0.0,
        }
    }
}

/// How an endpoint dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// Nothing sent to it completes, and it sends nothing.
    Silent,
    /// Work requests sent to it complete with `RetryExceeded`.
    RetryExceeded,
}

/// Counts of what was injected into one endpoint's writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected {
    /// Packet writes that landed with a flipped bit.
    pub corrupted: u64,
    /// Packet writes whose bytes never landed.
    pub lost: u64,
    /// Credit writes that landed with a flipped bit.
    pub credits_corrupted: u64,
    /// Credit writes whose word never landed.
    pub credits_lost: u64,
}

#[derive(Debug)]
struct Endpoint {
    recv_cq: VecDeque<Completion>,
    send_cq: VecDeque<Completion>,
    recvs_posted: usize,
    death: Option<Death>,
    faults: LoopbackFaults,
    rng: SplitMix64,
    injected: Injected,
}

impl Endpoint {
    fn new() -> Self {
        Endpoint {
            recv_cq: VecDeque::new(),
            send_cq: VecDeque::new(),
            recvs_posted: 0,
            death: None,
            faults: LoopbackFaults::none(),
            rng: SplitMix64::new(0),
            injected: Injected::default(),
        }
    }
}

fn lock(endpoint: &Mutex<Endpoint>) -> MutexGuard<'_, Endpoint> {
    // A test thread that panicked holding the lock leaves nothing half
    // done that matters here.
    endpoint
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle on one endpoint that tests keep after the queue moved into a
/// link: inject faults, kill it, read what was injected.
#[derive(Debug, Clone)]
pub struct LoopbackControl {
    endpoint: Arc<Mutex<Endpoint>>,
}

impl LoopbackControl {
    /// Faults for the writes this endpoint sends from now on.
    pub fn set_faults(&self, faults: LoopbackFaults) {
        let mut endpoint = lock(&self.endpoint);
        endpoint.rng = SplitMix64::new(faults.seed);
        endpoint.faults = faults;
    }

    /// Kills this endpoint: from now on what its peer sends to it goes
    /// nowhere (`Silent`) or fails (`RetryExceeded`), and it sends nothing.
    pub fn kill(&self, death: Death) {
        lock(&self.endpoint).death = Some(death);
    }

    /// What was injected into this endpoint's writes so far.
    pub fn injected(&self) -> Injected {
        lock(&self.endpoint).injected
    }
}

/// One endpoint of a software queue pair.
#[derive(Debug)]
pub struct LoopbackQueue {
    own: Arc<Mutex<Endpoint>>,
    peer: Arc<Mutex<Endpoint>>,
    receive: Arc<HeapWindow>,
    staging: Arc<HeapWindow>,
    peer_receive: Arc<HeapWindow>,
    sq_depth: usize,
    rq_depth: usize,
    scratch: Vec<u8>,
}

/// Two connected endpoints: `a` receives into a ring of shape `ring_a`,
/// `b` into one of shape `ring_b`; each stages for the other's ring. Send
/// queues hold `sq_depth` work requests; receive queues as many receives
/// as the own ring has slots.
pub fn pair(
    ring_a: RingShape,
    ring_b: RingShape,
    sq_depth: usize,
) -> Result<(LoopbackQueue, LoopbackQueue), QueueError> {
    pair_with_staging(
        ring_a,
        ring_b,
        ring_b.slots_len(),
        ring_a.slots_len(),
        sq_depth,
    )
}

/// [`pair`] with staging areas of the given sizes (tests of a side that
/// believes the peer's ring larger than it is).
pub fn pair_with_staging(
    ring_a: RingShape,
    ring_b: RingShape,
    staging_a: usize,
    staging_b: usize,
    sq_depth: usize,
) -> Result<(LoopbackQueue, LoopbackQueue), QueueError> {
    let receive_a = Arc::new(HeapWindow::new(ring_a.region_len())?);
    let receive_b = Arc::new(HeapWindow::new(ring_b.region_len())?);
    let staging_a = Arc::new(HeapWindow::new(staging_a)?);
    let staging_b = Arc::new(HeapWindow::new(staging_b)?);
    let endpoint_a = Arc::new(Mutex::new(Endpoint::new()));
    let endpoint_b = Arc::new(Mutex::new(Endpoint::new()));
    let a = LoopbackQueue {
        own: endpoint_a.clone(),
        peer: endpoint_b.clone(),
        receive: receive_a.clone(),
        staging: staging_a,
        peer_receive: receive_b.clone(),
        sq_depth,
        rq_depth: ring_a.slots as usize,
        scratch: Vec::new(),
    };
    let b = LoopbackQueue {
        own: endpoint_b,
        peer: endpoint_a,
        receive: receive_b,
        staging: staging_b,
        peer_receive: receive_a,
        sq_depth,
        rq_depth: ring_b.slots as usize,
        scratch: Vec::new(),
    };
    Ok((a, b))
}

impl LoopbackQueue {
    /// A handle on this endpoint (faults, death).
    pub fn control(&self) -> LoopbackControl {
        LoopbackControl {
            endpoint: self.own.clone(),
        }
    }

    /// Whether this endpoint is dead (then its posts do nothing).
    fn dead(&self) -> bool {
        lock(&self.own).death.is_some()
    }

    /// Completes a work request on this side's send queue.
    fn complete_send(&self, wr_id: u64, status: WcStatus, signaled: bool) {
        // Failed requests always complete, signaled or not.
        if signaled || status != WcStatus::Success {
            lock(&self.own).send_cq.push_back(Completion {
                wr_id,
                status,
                vendor_err: 0,
                byte_len: 0,
                imm: None,
            });
        }
    }

    /// What the peer's death (if any) does to a request: `None` to go on.
    fn peer_death(&self) -> Option<Death> {
        lock(&self.peer).death
    }

    /// Whether a write posted now reaches nobody: this side is dead (it
    /// posts nothing), or the peer is — silently (nothing completes), or
    /// with the adapter giving up ("retry exceeded" completes the request).
    fn write_goes_nowhere(&self, wr_id: u64, signaled: bool) -> bool {
        if self.dead() {
            return true;
        }
        match self.peer_death() {
            Some(Death::Silent) => true,
            Some(Death::RetryExceeded) => {
                self.complete_send(wr_id, WcStatus::RetryExcErr, signaled);
                true
            }
            None => false,
        }
    }
}

impl LoopbackQueue {
    /// A write's local half: `len` bytes of the staging area, then
    /// `in_place` (a payload read where it lies), gathered into `scratch`;
    /// then its remote half.
    fn gather(
        &mut self,
        write: PacketWrite,
        len: usize,
        in_place: &[u8],
    ) -> Result<(), QueueError> {
        let PacketWrite {
            wr_id,
            local_offset,
            remote_offset,
            imm,
            signaled,
        } = write;
        if self.write_goes_nowhere(wr_id, signaled) {
            return Ok(());
        }
        // The local read: a length beyond the staging area is a local
        // protection error, as an adapter would report it.
        self.scratch.resize(len, 0);
        if self.staging.read(local_offset, &mut self.scratch).is_err() {
            self.complete_send(wr_id, WcStatus::LocProtErr, signaled);
            return Ok(());
        }
        self.scratch.extend_from_slice(in_place);
        self.place_scratch(wr_id, remote_offset, imm, signaled)
    }

    /// The remote half of a write whose bytes were gathered into
    /// `scratch`: placed in the peer's region (faults applied), then the
    /// peer's receive and this side's send complete.
    fn place_scratch(
        &mut self,
        wr_id: u64,
        remote_offset: usize,
        imm: u32,
        signaled: bool,
    ) -> Result<(), QueueError> {
        let len = self.scratch.len();
        // The remote write: beyond the peer's region is a remote access error.
        let in_bounds = remote_offset
            .checked_add(len)
            .is_some_and(|end| end <= self.peer_receive.len());
        if !in_bounds {
            self.complete_send(wr_id, WcStatus::RemAccessErr, signaled);
            return Ok(());
        }
        let lose = {
            let mut own = lock(&self.own);
            let faults = own.faults;
            let corrupt = faults.corrupt > 0.0 && own.rng.chance(faults.corrupt);
            let lose = faults.lose > 0.0 && own.rng.chance(faults.lose);
            let bit = own.rng.below((len.max(1) * 8) as u64) as usize;
            if lose {
                own.injected.lost += 1;
            } else if corrupt && len > 0 {
                own.injected.corrupted += 1;
                self.scratch[bit / 8] ^= 1 << (bit % 8);
            }
            lose
        };
        if !lose {
            self.peer_receive.write(remote_offset, &self.scratch)?;
        }
        {
            let mut peer = lock(&self.peer);
            if peer.recvs_posted == 0 {
                drop(peer);
                self.complete_send(wr_id, WcStatus::RnrRetryExcErr, signaled);
                return Ok(());
            }
            peer.recvs_posted -= 1;
            peer.recv_cq.push_back(Completion {
                wr_id: 0,
                status: WcStatus::Success,
                vendor_err: 0,
                byte_len: len as u32,
                imm: Some(imm),
            });
        }
        self.complete_send(wr_id, WcStatus::Success, signaled);
        Ok(())
    }
}

impl PacketQueue for LoopbackQueue {
    type Region = Arc<HeapWindow>;

    fn receive_region(&self) -> &Arc<HeapWindow> {
        &self.receive
    }

    fn staging(&self) -> &Arc<HeapWindow> {
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
        let write = PacketWrite {
            wr_id,
            local_offset,
            remote_offset,
            imm,
            signaled,
        };
        self.gather(write, len, &[])
    }

    fn in_place(&self, payload: &[u8]) -> Option<InPlace> {
        let hold = send_memory::hold_without_device(payload)?;
        Some(InPlace {
            sge: None,
            hold: Some(hold),
        })
    }

    fn post_write_imm_in_place(
        &mut self,
        write: PacketWrite,
        header_len: usize,
        payload: &[u8],
        _source: InPlace,
    ) -> Result<(), QueueError> {
        self.gather(write, header_len, payload)
    }

    fn post_credit(&mut self, wr_id: u64, value: u64, signaled: bool) -> Result<(), QueueError> {
        if self.write_goes_nowhere(wr_id, signaled) {
            return Ok(());
        }
        // The credit word lies in registered memory like the slots, and a
        // flaky path corrupts or loses its write the same way.
        let landing = {
            let mut own = lock(&self.own);
            let faults = own.faults;
            let corrupt = faults.corrupt > 0.0 && own.rng.chance(faults.corrupt);
            let lose = faults.lose > 0.0 && own.rng.chance(faults.lose);
            let bit = own.rng.below(64);
            if lose {
                own.injected.credits_lost += 1;
                None
            } else if corrupt {
                own.injected.credits_corrupted += 1;
                Some(value ^ (1 << bit))
            } else {
                Some(value)
            }
        };
        if let Some(word) = landing {
            self.peer_receive
                .store_u64(CREDIT_OFFSET, word, Ordering::Release)?;
        }
        self.complete_send(wr_id, WcStatus::Success, signaled);
        Ok(())
    }

    fn post_recvs(&mut self, count: usize) -> Result<(), QueueError> {
        let mut own = lock(&self.own);
        if own.recvs_posted + count > self.rq_depth {
            return Err(QueueError::Post {
                operation: "receives",
                detail: format!(
                    "{} receives would be posted on a queue of {}",
                    own.recvs_posted + count,
                    self.rq_depth
                ),
            });
        }
        own.recvs_posted += count;
        Ok(())
    }

    fn poll_send(&mut self, out: &mut Vec<Completion>) -> Result<(), QueueError> {
        out.extend(lock(&self.own).send_cq.drain(..));
        Ok(())
    }

    fn poll_recv(&mut self, out: &mut VecDeque<Completion>) -> Result<(), QueueError> {
        out.extend(lock(&self.own).recv_cq.drain(..));
        Ok(())
    }
}
