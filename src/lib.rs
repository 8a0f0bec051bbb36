//! barlink: trustworthy GPU peer-to-peer transfers where the vendor disabled
//! them — messages cut into CRC-checked packets over BAR windows, host
//! memory or RDMA, retransmitted when they fail, delivered once, intact and
//! in order, or an error that says why.
//!
//! This crate is the facade: it re-exports the parts a framework embeds and
//! hosts the `barlink` command. The parts:
//! - [`transport`]: wire format, the sans-IO reliability [`Engine`], the
//!   simulated medium (and, later, links over memory windows);
//! - [`topology`]: PCI discovery, P2P path choice and the platform doctor;
//! - [`vfio`]: VFIO devices and BAR windows (VFIO regions, sysfs
//!   `resourceN`), the windows BAR links run over;
//! - [`rdma`]: ibverbs loaded at run time, RC queue pairs and RDMA links;
//! - [`gpu`]: device memory (the CUDA driver loaded at run time) as a
//!   link's message source and destination;
//! - [`connect()`]: one call that picks BAR P2P, a host-memory bounce or
//!   RDMA for a peer and says why;
//! - [`loan`]: when a face's blocking send stops reading the caller's
//!   bytes in place and copies them;
//! - [`logging`]: stderr logging as `BARLINK_LOG` says, for every face.
//!
//! See `docs/ARCHITECTURE.md` for how they fit together.
#![forbid(unsafe_code)]

pub use barlink_cuda as cuda;
pub use barlink_rdma as rdma;
pub use barlink_topology as topology;
pub use barlink_transport as transport;
pub use barlink_transport::{
    Engine, EngineConfig, Event, LinkError, MessageId, PacketError, SendError, Stats, Time,
};
pub use barlink_vfio as vfio;

pub mod bars;
pub mod connect;
pub mod doctor;
pub mod gpu;
pub mod listen;
pub mod loan;
pub mod logging;
pub use connect::{
    BarEnds, BarRef, ConnectError, ConnectOptions, Connection, PathDecision, PathKind, Peer, Role,
    choose_path, connect,
};
pub use listen::Listener;
