//! [`WorkCompletion`]: one finished work request, as a completion queue
//! reports it, with its opcode ([`WcOpcode`]) and status ([`WcStatus`]).
#![forbid(unsafe_code)]

use crate::error::RdmaError;
use crate::sys;
use crate::wc_status::WcStatus;

/// The operation a completion reports (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A SEND finished (sender side).
    #[default]
    Send,
    /// An RDMA WRITE (with or without immediate) finished (sender side).
    RdmaWrite,
    /// An RDMA READ finished.
    RdmaRead,
    /// A receive consumed by a SEND (receiver side).
    Recv,
    /// A receive consumed by an RDMA WRITE WITH IMM (receiver side).
    RecvRdmaWithImm,
    /// Another opcode.
    Other(u32),
}

impl WcOpcode {
    fn from_code(code: u32) -> WcOpcode {
        match code {
            sys::IBV_WC_SEND => WcOpcode::Send,
            sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            sys::IBV_WC_RECV => WcOpcode::Recv,
            sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }

    /// Whether this completes a posted receive.
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// One finished work request (from `ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The id given when posting.
    pub wr_id: u64,
    /// Success or what failed.
    pub status: WcStatus,
    /// The operation. Valid only on success (error completions may carry
    /// any value here).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// The immediate value (host byte order) when the peer sent one.
    pub imm_data: Option<u32>,
    /// The provider-specific error code.
    pub vendor_err: u32,
    /// The local QP's number.
    pub qp_num: u32,
}

impl WorkCompletion {
    pub(super) fn from_raw(wc: &sys::ibv_wc) -> WorkCompletion {
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_code(wc.status),
            opcode: WcOpcode::from_code(wc.opcode),
            byte_len: wc.byte_len,
            imm_data: (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
            vendor_err: wc.vendor_err,
            qp_num: wc.qp_num,
        }
    }

    /// `Ok` on success, else [`RdmaError::Completion`] saying what to check.
    pub fn result(&self) -> Result<(), RdmaError> {
        if self.status == WcStatus::Success {
            Ok(())
        } else {
            Err(RdmaError::Completion {
                status: self.status,
                vendor_err: self.vendor_err,
                wr_id: self.wr_id,
            })
        }
    }
}
