//! Safe RAII wrappers over libibverbs: [`Context`] (an open device),
//! [`ProtectionDomain`], [`CompletionQueue`], RC [`QueuePair`]s,
//! [`MemoryRegion`]s (host memory or dma-buf) and [`RegisteredMemory`]
//! (page-aligned memory of our own, registered, and a
//! [`Window`](barlink_transport::window::Window)).
//!
//! Ownership mirrors the verbs object tree: each object holds its parent
//! (by `Arc`) so a context outlives its PDs, a PD its QPs and regions, a
//! CQ the QPs that use it; dropping the last handle destroys the object.
//! All objects are `Send + Sync`: libibverbs and its providers are
//! thread-safe per verb.
//!
//! Nothing here blocks: posts and polls return at once, and
//! [`CompletionQueue::wait`] takes a timeout.
//!
//! Memory the device writes (a receive buffer, the target of a peer's
//! RDMA WRITE) changes outside the program's control, so it is never lent
//! out as `&[u8]`: [`RegisteredMemory`] is read and written by copies and
//! atomics only, through the
//! [`Window`](barlink_transport::window::Window) trait.
//!
//! One file per object: `context` (an open device, its queries), `pd`,
//! `mr` (regions, SGEs, peers' regions), `registered_memory`,
//! `send_memory` (a program's memory that links send from in place), `cq`,
//! `work_completion`, `qp` and `qp_params`; `values` holds what they take
//! and report, and `device_list` the walk over the devices.
//! Each object's constructor lives with the object (`Context::alloc_pd` in
//! `pd`, `ProtectionDomain::create_rc_qp` in `qp`), so that a child names
//! its parent and never the other way round.
//
// No `forbid(unsafe_code)` here: it would reach the files that call the
// verbs. Those allow `unsafe` one by one; the others forbid it.

mod context;
mod cq;
mod device_list;
mod mr;
mod pd;
mod qp;
mod qp_params;
mod registered_memory;
pub(crate) mod send_memory;
mod values;
mod work_completion;

pub use crate::wc_status::WcStatus;
pub use context::Context;
pub use cq::CompletionQueue;
pub use device_list::device_names;
pub use mr::{MemoryRegion, RemoteAddr, RemoteRegion, Sge};
pub use pd::ProtectionDomain;
pub use qp::{MAX_SGE, QueuePair};
pub use qp_params::{QpConfig, QpConnectOptions, QpEndpoint, QpState};
pub use registered_memory::{HugePolicy, MemoryOptions, RegisteredMemory};
pub use send_memory::SendMemory;
pub use values::{Access, DeviceAttr, Gid, LinkLayer, Mtu, PortAttr, PortState};
pub use work_completion::{WcOpcode, WorkCompletion};
