//! barlink: trustworthy GPU peer-to-peer transfers where the vendor disabled
//! them — messages cut into CRC-checked packets over BAR windows, host
//! memory or RDMA, retransmitted when they fail, delivered once, intact and
//! in order, or an error that says why.
//!
//! This crate is the facade: it re-exports the parts a framework embeds and
//! hosts the `barlink` command. The parts:
//! - [`transport`]: wire format, the sans-IO reliability [`Engine`], the
//!   simulated medium (and, later, links over memory windows);
//! - [`topology`]: PCI discovery, P2P path choice and the platform doctor.
//!
//! See `docs/ARCHITECTURE.md` for how they fit together.
#![forbid(unsafe_code)]

pub use barlink_transport as transport;
pub use barlink_transport::{
    Engine, EngineConfig, Event, LinkError, MessageId, PacketError, SendError, Stats, Time,
};
pub use barlink_vfio as topology;
