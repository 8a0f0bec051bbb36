//! RDMA between nodes over ibverbs: device discovery, protection domains,
//! completion queues, RC queue pairs, memory registration (host memory and
//! dma-buf), connection setup, and links whose packets travel as RDMA WRITE
//! with immediate into a peer's registered ring.
//!
//! libibverbs is loaded at run time: on a machine without it every entry
//! point reports [`RdmaError::NotAvailable`] and nothing else in barlink is
//! affected. `unsafe` lives only in `sys` (the C ABI and the loader) and
//! `verbs` (the safe wrappers over it); the link and connection setup
//! forbid it.
#![deny(unsafe_code)]

pub mod device;
pub mod error;
pub mod mr_cache;
mod sys;
pub mod verbs;
mod wc_status;
pub use device::{DiscoveryOptions, GidEntry, GidType, PortInfo, RdmaDeviceInfo};
pub use error::RdmaError;
pub use mr_cache::{CacheStats, CachedRegion, MrCache};
pub use verbs::{
    Access, CompletionQueue, Context, Gid, HugePolicy, LinkLayer, MemoryOptions, MemoryRegion, Mtu,
    PortState, ProtectionDomain, QpConfig, QpConnectOptions, QpEndpoint, QpState, QueuePair,
    RegisteredMemory, RemoteAddr, RemoteRegion, SendMemory, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

pub mod link;
pub mod loopback;
pub mod oob;
pub mod verbs_queue;
pub use link::{PacketQueue, RdmaLink, RdmaMedium, RingShape, rdma_link};
