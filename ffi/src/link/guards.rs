//! What a blocking call lends the link for its length, taken back before
//! it returns, whatever happens (a panic caught at the boundary included):
//! a blocking send's bytes, and a `barlink_recv` call's buffer.
#![forbid(unsafe_code)]

use std::sync::Weak;

use super::{LinkCell, RecvInto};
use crate::error::Result;
use crate::payload::SendLoan;
use crate::types::barlink_status::BARLINK_TIMEOUT;

/// A blocking send's loan of the caller's bytes to the link, settled
/// before the call returns: by its outcome, or by a copy in the bytes'
/// place ([`super::LinkState::settle_loan`]), also when the call unwinds.
pub(crate) struct SettleLoan<'a> {
    cell: &'a LinkCell,
    /// The lent message's id, once the call learned it.
    pub(crate) msg_id: Option<u64>,
    /// The call's handle to its lent bytes; `None` while nothing is lent.
    pub(crate) loan: Option<Weak<SendLoan>>,
    settled: bool,
}

impl<'a> SettleLoan<'a> {
    /// Nothing lent yet.
    pub(crate) fn new(cell: &'a LinkCell) -> SettleLoan<'a> {
        SettleLoan {
            cell,
            msg_id: None,
            loan: None,
            settled: false,
        }
    }

    /// Settles the loan once the wait for the acknowledgement ended: by
    /// the message's outcome, or by a copy. A wait that timed out leaves
    /// the message queued with its copy, as a copying send's; any other
    /// error of the wait is returned once the loan is settled.
    pub(crate) fn finish(&mut self, waited: Result<()>) -> Result<()> {
        self.settled = true;
        let Some(loan) = &self.loan else {
            return waited;
        };
        self.cell
            .lock_even_if_closed()
            .settle_loan(self.msg_id, loan)?;
        match waited {
            Err(error) if error.status != BARLINK_TIMEOUT => Err(error),
            _ => Ok(()),
        }
    }
}

impl Drop for SettleLoan<'_> {
    fn drop(&mut self) {
        if !self.settled
            && let Some(loan) = &self.loan
        {
            let _ = self
                .cell
                .lock_even_if_closed()
                .settle_loan(self.msg_id, loan);
        }
    }
}

/// A `barlink_recv` call's buffer, taken back from the link when dropped.
pub(crate) struct LentForCall<'a> {
    cell: &'a LinkCell,
    pub(crate) into: RecvInto,
}

impl<'a> LentForCall<'a> {
    pub(crate) fn new(cell: &'a LinkCell, into: RecvInto) -> LentForCall<'a> {
        LentForCall { cell, into }
    }
}

impl Drop for LentForCall<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.into.posted.take() {
            self.cell.reclaim(id);
        }
    }
}
