//! Registered memory on a link: a registered range as a payload, and a
//! registration with the link's device asked for up front
//! (`barlink_link_register_buffer`, design change 90).
#![forbid(unsafe_code)]

use std::sync::Arc;

use barlink::connect::AnyLink;

use super::LinkState;
use crate::error::{Error, Result};
use crate::payload::{CpuRead, Payload, PayloadSource, Region};
use crate::types::barlink_status::{BARLINK_CLOSED, BARLINK_NOT_AVAILABLE};

impl LinkState {
    /// A registered range as a payload (for `post`), holding its CPU read
    /// if it is a dma-buf's.
    pub(crate) fn registered_payload(
        &mut self,
        region: &Arc<Region>,
        offset: usize,
        len: usize,
        read: Option<CpuRead>,
    ) -> Result<(Payload, PayloadSource)> {
        self.check_len(len)?;
        let payload = region.payload(offset, len, read)?;
        Ok((payload, PayloadSource::Registered))
    }

    /// Registers `region` with the link's RDMA device now rather than at
    /// the first send from it: `BARLINK_NOT_AVAILABLE` with the device's
    /// reason where it refuses (sends from it then copy through the staging
    /// area). Other links read registered memory with the CPU and need no
    /// registration.
    pub(crate) fn register_region(&self, region: &Region) -> Result<()> {
        if let Some(error) = self.end_error() {
            return Err(error);
        }
        let Some(link) = &self.link else {
            return Err(Error::new(BARLINK_CLOSED, "the link is closed"));
        };
        let AnyLink::Rdma(rdma) = &link.link else {
            return Ok(());
        };
        region.with_send_memory(|memory| {
            rdma.medium()
                .queue()
                .register_send_memory(memory)
                .map_err(|error| {
                    Error::new(
                        BARLINK_NOT_AVAILABLE,
                        format!(
                            "the RDMA device refused this buffer ({error}): sends from it over this link copy it through the staging area"
                        ),
                    )
                })
        })
    }
}
