//! [`QueuePair`]: a reliable-connected queue pair, its way from RESET to
//! RTS, and its posts (RDMA WRITE, with immediate or inline, SEND,
//! receive).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::context::{Context, ContextInner};
use super::cq::{CompletionQueue, CqInner};
use super::mr::{RemoteAddr, Sge};
use super::pd::{PdInner, ProtectionDomain};
use super::qp_params::{QpConfig, QpConnectOptions, QpEndpoint, QpState};
use super::values::{Access, Mtu};
use crate::error::RdmaError;
use crate::sys;

/// Most SGEs one work request may list here.
pub const MAX_SGE: usize = 16;

/// A reliable-connected queue pair. Create it with
/// [`ProtectionDomain::create_rc_qp`], exchange [`QpEndpoint`]s with the
/// peer out of band, [`connect`](QueuePair::connect), then post. Posting
/// never blocks: a full queue is an `ibv_post_send` ENOMEM error (poll
/// completions first).
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    qp_num: u32,
    cap: sys::ibv_qp_cap,
    ctx: Arc<ContextInner>,
    _pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
}

// SAFETY: a QP may be used from any thread (posting is serialised by the
// provider); destroyed once, in `drop`.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("device", &self.ctx.name)
            .finish_non_exhaustive()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created in `create_rc_qp`, destroyed once; its PD and CQs
        // are still alive (held by this value until after this).
        unsafe { (self.ctx.v.destroy_qp)(self.raw.as_ptr()) };
    }
}

impl ProtectionDomain {
    /// Creates a reliable-connected QP whose completions go to `send_cq`
    /// and `recv_cq` (which may be the same CQ). It starts in RESET: bring
    /// it up with [`QueuePair::connect`] once the peer's [`QpEndpoint`] is
    /// known.
    pub fn create_rc_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        config: &QpConfig,
    ) -> Result<QueuePair, RdmaError> {
        if !Arc::ptr_eq(&send_cq.inner.ctx, &self.inner.ctx)
            || !Arc::ptr_eq(&recv_cq.inner.ctx, &self.inner.ctx)
        {
            return Err(RdmaError::InvalidArgument {
                what: "the CQs and the PD of a QP must come from the same Context".into(),
            });
        }
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.inner.raw.as_ptr(),
            recv_cq: recv_cq.inner.raw.as_ptr(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: config.max_send_wr,
                max_recv_wr: config.max_recv_wr,
                max_send_sge: config.max_send_sge,
                max_recv_sge: config.max_recv_sge,
                max_inline_data: config.max_inline_data,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: c_int::from(config.sq_sig_all),
        };
        // SAFETY: the PD and both CQs are live (held below for the QP's
        // lifetime); `init` is a valid attribute struct; the library writes
        // the capabilities it granted back into `init.cap`.
        let raw = unsafe { (self.inner.ctx.v.create_qp)(self.inner.raw.as_ptr(), &mut init) };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_create_qp", sys::errno()))?;
        // SAFETY: the QP was just created and is live.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        Ok(QueuePair {
            raw,
            qp_num,
            cap: init.cap,
            _pd: self.inner.clone(),
            _send_cq: send_cq.inner.clone(),
            _recv_cq: recv_cq.inner.clone(),
            ctx: self.inner.ctx.clone(),
        })
    }
}

impl QueuePair {
    /// The QP number (what the peer connects to).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Bytes a send may carry inline, as granted by the device.
    pub fn max_inline_data(&self) -> u32 {
        self.cap.max_inline_data
    }

    /// Send-queue depth granted.
    pub fn max_send_wr(&self) -> u32 {
        self.cap.max_send_wr
    }

    /// Receive-queue depth granted.
    pub fn max_recv_wr(&self) -> u32 {
        self.cap.max_recv_wr
    }

    /// This side's [`QpEndpoint`] for `options` (its GID at
    /// `options.sgid_index` and LID on `options.port`), with first PSN
    /// `psn` (random in production, so that a stale peer's packets miss).
    pub fn local_endpoint(
        &self,
        options: &QpConnectOptions,
        psn: u32,
    ) -> Result<QpEndpoint, RdmaError> {
        let ctx = Context {
            inner: self.ctx.clone(),
        };
        let port = ctx.query_port(options.port)?;
        let gid = ctx.query_gid(options.port, u32::from(options.sgid_index))?;
        Ok(QpEndpoint {
            qp_num: self.qp_num,
            psn: psn & 0xff_ffff,
            gid,
            lid: port.lid,
        })
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: c_int) -> Result<(), RdmaError> {
        // SAFETY: the QP is live; `attr` is a valid attribute struct whose
        // fields named by `mask` are set.
        let rc = unsafe { (self.ctx.v.modify_qp)(self.raw.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_modify_qp", sys::rc_errno(rc)));
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: the struct is plain integers and a union of integers, for
        // which all-zero is valid.
        unsafe { MaybeUninit::<sys::ibv_qp_attr>::zeroed().assume_init() }
    }

    /// RESET → INIT on `port`, granting peers `access`. Receives may be
    /// posted from here on (post them before the peer starts sending).
    pub fn to_init(&self, port: u8, access: Access) -> Result<(), RdmaError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access.bits();
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR (ready to receive) towards `remote`.
    pub fn to_rtr(&self, remote: &QpEndpoint, options: &QpConnectOptions) -> Result<(), RdmaError> {
        let mtu = match options.path_mtu {
            Some(m) => m,
            None => {
                let ctx = Context {
                    inner: self.ctx.clone(),
                };
                ctx.query_port(options.port)?
                    .active_mtu
                    .unwrap_or(Mtu::Mtu1024)
            }
        };
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTR;
        a.path_mtu = mtu.code();
        a.dest_qp_num = remote.qp_num;
        a.rq_psn = remote.psn & 0xff_ffff;
        a.max_dest_rd_atomic = options.max_dest_rd_atomic;
        a.min_rnr_timer = options.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = options.port;
        if !remote.gid.is_zero() {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: remote.gid.0 };
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = options.sgid_index;
            a.ah_attr.grh.hop_limit = options.hop_limit;
            a.ah_attr.grh.traffic_class = options.traffic_class;
        }
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS (ready to send), sending from PSN `psn` (the one this side
    /// advertised in its [`QpEndpoint`]).
    pub fn to_rts(&self, psn: u32, options: &QpConnectOptions) -> Result<(), RdmaError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTS;
        a.timeout = options.timeout;
        a.retry_cnt = options.retry_cnt;
        a.rnr_retry = options.rnr_retry;
        a.sq_psn = psn & 0xff_ffff;
        a.max_rd_atomic = options.max_rd_atomic;
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// RESET → INIT → RTR → RTS in one call: `local` is what this side sent
    /// the peer (from [`QueuePair::local_endpoint`]), `remote` what the
    /// peer sent. Post receives between INIT and the peer's first send if
    /// the peer may send at once (or use [`QueuePair::to_init`] first and
    /// then this, which skips INIT when already there).
    pub fn connect(
        &self,
        local: &QpEndpoint,
        remote: &QpEndpoint,
        options: &QpConnectOptions,
    ) -> Result<(), RdmaError> {
        if self.state()? == QpState::Reset {
            self.to_init(options.port, options.access)?;
        }
        self.to_rtr(remote, options)?;
        self.to_rts(local.psn, options)
    }

    /// The QP's current state (`ibv_query_qp`). An error completion moves
    /// it to [`QpState::Error`].
    pub fn state(&self) -> Result<QpState, RdmaError> {
        let mut a = Self::zeroed_attr();
        // SAFETY: as in `zeroed_attr`.
        let mut init = unsafe { MaybeUninit::<sys::ibv_qp_init_attr>::zeroed().assume_init() };
        // SAFETY: the QP is live; both out-structs are writable.
        let rc = unsafe {
            (self.ctx.v.query_qp)(self.raw.as_ptr(), &mut a, sys::IBV_QP_STATE, &mut init)
        };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_query_qp", sys::rc_errno(rc)));
        }
        Ok(QpState::from_code(a.qp_state))
    }

    fn post(
        &self,
        wr_id: u64,
        opcode: u32,
        sges: &mut [sys::ibv_sge],
        remote: Option<RemoteAddr>,
        imm: Option<u32>,
        flags: u32,
    ) -> Result<(), RdmaError> {
        // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, integers).
        let mut wr = unsafe { MaybeUninit::<sys::ibv_send_wr>::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.next = ptr::null_mut();
        wr.sg_list = if sges.is_empty() {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data = imm.unwrap_or(0).to_be();
        if let Some(r) = remote {
            wr.wr.rdma = sys::ibv_send_wr_rdma {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP and its context are live.
        let post_send =
            unsafe { (*self.ctx.raw.as_ptr()).ops.post_send }.ok_or(RdmaError::Unsupported {
                what: "the provider has no post_send".into(),
            })?;
        // SAFETY: the QP is live; `wr` and its SGE list are valid for the
        // call (the provider copies them into the send queue, and copies
        // inline data out of the caller's memory before returning); every
        // non-inline SGE was made by `MemoryRegion::sge` and names memory
        // registered for the device, which never holds Rust references (if
        // it has been deregistered since, the device fails the request with
        // a protection error instead of touching it).
        let rc = unsafe { post_send(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_post_send", sys::rc_errno(rc)));
        }
        Ok(())
    }

    fn sge_list(&self, local: &[Sge]) -> Result<[sys::ibv_sge; MAX_SGE], RdmaError> {
        if local.len() > MAX_SGE || local.len() > self.cap.max_send_sge as usize {
            return Err(RdmaError::InvalidArgument {
                what: format!(
                    "{} SGEs in one work request; this QP takes {}",
                    local.len(),
                    self.cap.max_send_sge.min(MAX_SGE as u32)
                ),
            });
        }
        let mut list = [sys::ibv_sge::default(); MAX_SGE];
        for (d, s) in list.iter_mut().zip(local) {
            *d = s.raw();
        }
        Ok(list)
    }

    fn flags(signaled: bool) -> u32 {
        if signaled { sys::IBV_SEND_SIGNALED } else { 0 }
    }

    /// Posts an RDMA WRITE of `local` (gathered in order) to `remote`. The
    /// peer sees no completion. Unsignaled writes (`signaled: false`)
    /// complete silently unless they fail; signal one every so often so
    /// that the send queue's slots are freed.
    pub fn post_write(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_WRITE,
            &mut list[..local.len()],
            Some(remote),
            None,
            Self::flags(signaled),
        )
    }

    /// Posts an RDMA WRITE WITH IMMEDIATE: the data lands at `remote`, then
    /// the peer's next posted receive completes with `imm` (host order)
    /// and the byte count. The peer must have a receive posted (a
    /// zero-length one suffices), else the write waits (RNR) and finally
    /// fails with [`WcStatus::RnrRetryExcErr`](crate::verbs::WcStatus::RnrRetryExcErr). `local` may be empty: a
    /// pure notification.
    pub fn post_write_imm(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        imm: u32,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_WRITE_WITH_IMM,
            &mut list[..local.len()],
            Some(remote),
            Some(imm),
            Self::flags(signaled),
        )
    }

    /// Posts an RDMA WRITE (with immediate when `imm` is given) whose data
    /// is copied out of `data` during this call (`IBV_SEND_INLINE`): no
    /// registration needed, lowest latency for small writes. `data` may be
    /// at most [`QueuePair::max_inline_data`] bytes.
    pub fn post_write_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        remote: RemoteAddr,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        if data.len() > self.cap.max_inline_data as usize {
            return Err(RdmaError::InvalidArgument {
                what: format!(
                    "{} bytes inline; this QP's max_inline_data is {}",
                    data.len(),
                    self.cap.max_inline_data
                ),
            });
        }
        let mut sge = [sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        }];
        let sges: &mut [sys::ibv_sge] = if data.is_empty() { &mut [] } else { &mut sge };
        let opcode = if imm.is_some() {
            sys::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::IBV_WR_RDMA_WRITE
        };
        self.post(
            wr_id,
            opcode,
            sges,
            Some(remote),
            imm,
            Self::flags(signaled) | sys::IBV_SEND_INLINE,
        )
    }

    /// Posts a SEND of `local` (with immediate when `imm` is given): it
    /// consumes the peer's next posted receive, whose buffer must hold it.
    pub fn post_send(
        &self,
        wr_id: u64,
        local: &[Sge],
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        let opcode = if imm.is_some() {
            sys::IBV_WR_SEND_WITH_IMM
        } else {
            sys::IBV_WR_SEND
        };
        self.post(
            wr_id,
            opcode,
            &mut list[..local.len()],
            None,
            imm,
            Self::flags(signaled),
        )
    }

    /// Posts a receive: `Some(sge)` to take a SEND's payload into, `None`
    /// for a zero-length receive (enough for RDMA WRITE WITH IMM, whose
    /// data goes to the address the writer names). Every receive completes
    /// with a completion on the receive CQ.
    pub fn post_recv(&self, wr_id: u64, local: Option<&Sge>) -> Result<(), RdmaError> {
        let mut sge = local.map(Sge::raw).unwrap_or_default();
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: if local.is_some() {
                &mut sge
            } else {
                ptr::null_mut()
            },
            num_sge: c_int::from(local.is_some()),
        };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP and its context are live.
        let post_recv =
            unsafe { (*self.ctx.raw.as_ptr()).ops.post_recv }.ok_or(RdmaError::Unsupported {
                what: "the provider has no post_recv".into(),
            })?;
        // SAFETY: the QP is live; `wr` and `sge` are valid for the call (the
        // provider copies them); the SGE was made by `MemoryRegion::sge` and
        // names registered memory that never holds Rust references.
        let rc = unsafe { post_recv(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_post_recv", sys::rc_errno(rc)));
        }
        Ok(())
    }
}
