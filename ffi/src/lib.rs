//! The C ABI of barlink, as a Rust library: `ffi/lib/` builds the C library
//! from it (`libbarlink_c.so` / `libbarlink_c.a`, pkg-config name
//! `barlink`; docs/ARCHITECTURE.md, design change 86), and the header
//! `ffi/include/barlink.h` is generated from it by cbindgen with
//! `scripts/gen-header.sh`.
//!
//! This crate owns the boundary and nothing else: the transport does the
//! work. What it adds:
//!
//! - **Handles** (`registry`): opaque values that are keys into a
//!   process-wide registry, never pointers, so NULL, closed, double-closed
//!   and forged handles are errors, never a dereference of freed memory.
//! - **Status codes and the last error** (`types`, `error`): every function
//!   returns a `barlink_status` with stable numbers and leaves a message in
//!   a thread-local for `barlink_last_error`. Every body runs inside
//!   `catch_unwind`: no panic crosses into C.
//! - **Peers** (`peer`): a link name on this host or a node's address,
//!   set up by the transport (local names) or the facade's `connect`.
//! - **Links** (`link`): the facade's `Connection` behind a mutex, with the
//!   messages delivered but not yet taken (a too-small buffer loses
//!   nothing), the non-blocking requests and their completions, and why the
//!   link ended. Calls drive progress; blocking calls unlock between steps
//!   (a waiting receive in place keeps the lock across idle rounds until
//!   another call waits for it: `link::direct`).
//! - **Zero copy** (`payload`): a registered buffer's range is the engine's
//!   message buffer itself, read from the caller's memory until the engine
//!   lets go of it, which is when the completion becomes due.
//!
//! `unsafe` lives only in `api` (pointer arguments), `payload` (reading
//! registered memory) and `dmabuf` (mapping a dma-buf for the CPU); every
//! other module forbids it. docs/FFI.md has the
//! ownership, threading and versioning rules.

mod api;
mod completions;
mod config;
mod dmabuf;
mod error;
mod held;
mod ids;
mod link;
mod payload;
mod peer;
mod recv;
mod registry;
mod types;

pub use api::*;
pub use types::*;
