//! What a queue pair is created and connected with: its sizes
//! ([`QpConfig`]), the endpoint each side tells the other
//! ([`QpEndpoint`]), the connection parameters ([`QpConnectOptions`]), and
//! its states ([`QpState`]).
#![forbid(unsafe_code)]

use super::values::{Access, Gid, Mtu};
use crate::sys;

/// Sizes of a new QP (`ibv_qp_cap`) and its signaling mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receives.
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline (copied at post time, no lkey needed);
    /// the device may grant more, see [`QueuePair::max_inline_data`](crate::verbs::QueuePair::max_inline_data).
    pub max_inline_data: u32,
    /// Every send generates a completion, whatever its `signaled` flag.
    pub sq_sig_all: bool,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
            sq_sig_all: false,
        }
    }
}

/// What a side of an RC connection tells its peer out of band: its QP
/// number, first packet sequence number and address (GID for RoCE and
/// global routing, LID for InfiniBand).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// QP number.
    pub qp_num: u32,
    /// The first PSN this side sends with (the peer's `rq_psn`).
    pub psn: u32,
    /// The port's GID at the chosen index (zero: LID-routed InfiniBand).
    pub gid: Gid,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
}

/// Connection parameters for [`QueuePair::connect`](crate::verbs::QueuePair::connect). Both sides should
/// agree on MTU; the defaults suit a real fabric, and under slow software
/// RoCE (rxe under emulation) a longer `timeout` (18–20) helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConnectOptions {
    /// Local port (from 1).
    pub port: u8,
    /// Local GID index to send from (RoCE v2: the entry of type "RoCE v2"
    /// for the interface's address; see [`crate::device`]).
    pub sgid_index: u8,
    /// IP TTL / GRH hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP << 2 for RoCE v2).
    pub traffic_class: u8,
    /// Path MTU; `None` uses the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries before [`WcStatus::RetryExcErr`](crate::verbs::WcStatus::RetryExcErr) (0–7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0–7; 7 = retry forever).
    pub rnr_retry: u8,
    /// RNR NAK timer this side asks peers to wait (an IB table index; 12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs/atomics this side issues.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READs/atomics this side accepts.
    pub max_dest_rd_atomic: u8,
    /// What the peer may do to this side's memory through this QP.
    pub access: Access,
}

impl Default for QpConnectOptions {
    fn default() -> Self {
        QpConnectOptions {
            port: 1,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            path_mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: Access::RDMA,
        }
    }
}

/// A QP's state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Fresh or reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    ReadyToReceive,
    /// Ready to send: connected.
    ReadyToSend,
    /// Send queue drain.
    SendQueueDrain,
    /// Send queue error.
    SendQueueError,
    /// Error: every outstanding request is flushed.
    Error,
    /// Another value.
    Other(u32),
}

impl QpState {
    pub(super) fn from_code(code: u32) -> QpState {
        match code {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::ReadyToReceive,
            sys::IBV_QPS_RTS => QpState::ReadyToSend,
            sys::IBV_QPS_SQD => QpState::SendQueueDrain,
            sys::IBV_QPS_SQE => QpState::SendQueueError,
            sys::IBV_QPS_ERR => QpState::Error,
            other => QpState::Other(other),
        }
    }
}
