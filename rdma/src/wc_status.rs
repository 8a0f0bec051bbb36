//! A work completion's status (`enum ibv_wc_status`): the vocabulary that
//! the verbs wrappers, the link and the errors share.
//!
//! It lives apart from the verbs so that [`crate::error`] can name it
//! without depending on the code that returns those errors.
#![forbid(unsafe_code)]

/// A completion's status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success,
    /// Local length error (a receive buffer too short for the message).
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local EE context operation error.
    LocEecOpErr,
    /// Local protection error (an SGE outside its region, wrong lkey).
    LocProtErr,
    /// Flushed: the QP was already in the error state.
    WrFlushErr,
    /// Memory window bind error.
    MwBindErr,
    /// Bad response from the peer.
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// The peer found the request invalid.
    RemInvReqErr,
    /// The peer refused the memory access (rkey, range, rights).
    RemAccessErr,
    /// The peer could not complete the operation.
    RemOpErr,
    /// Transport retries exhausted: no acknowledgement from the peer.
    RetryExcErr,
    /// Receiver-not-ready retries exhausted.
    RnrRetryExcErr,
    /// Local RDD violation.
    LocRddViolErr,
    /// Remote invalid RD request.
    RemInvRdReqErr,
    /// The peer aborted.
    RemAbortErr,
    /// Invalid EE context number.
    InvEecnErr,
    /// Invalid EE context state.
    InvEecStateErr,
    /// Fatal device error.
    FatalErr,
    /// Response timeout.
    RespTimeoutErr,
    /// Other error.
    GeneralErr,
    /// Tag matching error.
    TmErr,
    /// Tag matching rendezvous incomplete.
    TmRndvIncomplete,
    /// A value this crate does not know.
    Other(u32),
}

const WC_STATUS: [(WcStatus, &str); 24] = [
    (WcStatus::Success, "IBV_WC_SUCCESS"),
    (WcStatus::LocLenErr, "IBV_WC_LOC_LEN_ERR"),
    (WcStatus::LocQpOpErr, "IBV_WC_LOC_QP_OP_ERR"),
    (WcStatus::LocEecOpErr, "IBV_WC_LOC_EEC_OP_ERR"),
    (WcStatus::LocProtErr, "IBV_WC_LOC_PROT_ERR"),
    (WcStatus::WrFlushErr, "IBV_WC_WR_FLUSH_ERR"),
    (WcStatus::MwBindErr, "IBV_WC_MW_BIND_ERR"),
    (WcStatus::BadRespErr, "IBV_WC_BAD_RESP_ERR"),
    (WcStatus::LocAccessErr, "IBV_WC_LOC_ACCESS_ERR"),
    (WcStatus::RemInvReqErr, "IBV_WC_REM_INV_REQ_ERR"),
    (WcStatus::RemAccessErr, "IBV_WC_REM_ACCESS_ERR"),
    (WcStatus::RemOpErr, "IBV_WC_REM_OP_ERR"),
    (WcStatus::RetryExcErr, "IBV_WC_RETRY_EXC_ERR"),
    (WcStatus::RnrRetryExcErr, "IBV_WC_RNR_RETRY_EXC_ERR"),
    (WcStatus::LocRddViolErr, "IBV_WC_LOC_RDD_VIOL_ERR"),
    (WcStatus::RemInvRdReqErr, "IBV_WC_REM_INV_RD_REQ_ERR"),
    (WcStatus::RemAbortErr, "IBV_WC_REM_ABORT_ERR"),
    (WcStatus::InvEecnErr, "IBV_WC_INV_EECN_ERR"),
    (WcStatus::InvEecStateErr, "IBV_WC_INV_EEC_STATE_ERR"),
    (WcStatus::FatalErr, "IBV_WC_FATAL_ERR"),
    (WcStatus::RespTimeoutErr, "IBV_WC_RESP_TIMEOUT_ERR"),
    (WcStatus::GeneralErr, "IBV_WC_GENERAL_ERR"),
    (WcStatus::TmErr, "IBV_WC_TM_ERR"),
    (WcStatus::TmRndvIncomplete, "IBV_WC_TM_RNDV_INCOMPLETE"),
];

impl WcStatus {
    /// The status of a verbs enum value.
    pub fn from_code(code: u32) -> WcStatus {
        WC_STATUS
            .get(code as usize)
            .map_or(WcStatus::Other(code), |&(s, _)| s)
    }

    /// The verbs enum value.
    pub fn code(self) -> u32 {
        match self {
            WcStatus::Other(c) => c,
            known => WC_STATUS
                .iter()
                .position(|&(s, _)| s == known)
                .map_or(u32::MAX, |i| i as u32),
        }
    }

    /// The verbs name, e.g. `IBV_WC_RETRY_EXC_ERR`.
    pub fn name(self) -> &'static str {
        WC_STATUS
            .iter()
            .find(|&&(s, _)| s == self)
            .map_or("an unknown status", |&(_, n)| n)
    }

    /// What this status usually means, and what to check.
    pub fn what_to_check(self) -> &'static str {
        match self {
            WcStatus::Success => "no error",
            WcStatus::RetryExcErr => {
                "the peer never acknowledged (timeout x retry_cnt): the peer is gone or its QP \
                 is not in RTR/RTS, or the path is wrong (GID index, remote GID/QP number, MTU, \
                 network)"
            }
            WcStatus::RnrRetryExcErr => {
                "the peer had no receive posted (receiver not ready): post receives before \
                 SENDs and writes with immediate arrive, or raise rnr_retry (7 = forever)"
            }
            WcStatus::RemAccessErr => {
                "the peer refused the access: wrong rkey, address outside the peer's region, \
                 or the region lacks REMOTE_WRITE/REMOTE_READ"
            }
            WcStatus::RemInvReqErr => {
                "the peer found the request invalid: a message longer than its receive buffer, \
                 or an opcode its QP's access flags do not allow"
            }
            WcStatus::RemOpErr => "the peer could not carry out the operation (its QP failed)",
            WcStatus::LocLenErr => {
                "a receive buffer was shorter than the incoming message, or a message exceeds \
                 the port's limit"
            }
            WcStatus::LocProtErr => {
                "a local SGE lies outside its registered region or names a stale lkey (region \
                 deregistered while in flight?)"
            }
            WcStatus::LocQpOpErr => {
                "the local QP rejected the request (e.g. inline data beyond max_inline_data)"
            }
            WcStatus::WrFlushErr => {
                "flushed because the QP had failed earlier: look at the first failed completion"
            }
            WcStatus::FatalErr => "the device reported a fatal error: check dmesg",
            _ => "see the device driver's log (dmesg) and ibv_wc_status_str",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_status_codes_names_and_hints() {
        for code in 0..24 {
            let s = WcStatus::from_code(code);
            assert_eq!(s.code(), code);
            assert!(s.name().starts_with("IBV_WC_"));
        }
        assert_eq!(WcStatus::from_code(99), WcStatus::Other(99));
        assert_eq!(WcStatus::from_code(12), WcStatus::RetryExcErr);
        assert_eq!(WcStatus::from_code(10), WcStatus::RemAccessErr);
        assert!(WcStatus::RetryExcErr.what_to_check().contains("peer"));
    }
}
