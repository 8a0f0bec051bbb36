//! The synchronization primitives that concurrent code in this crate is
//! written against: `loom`'s model-checked ones when built with
//! `RUSTFLAGS="--cfg loom"`, the standard library's otherwise (as tokio's
//! `src/loom` facade does).
//!
//! Code that goes through this module can be model-checked by loom, which
//! runs it under every interleaving and every value a weakly ordered load may
//! return (`scripts/loom.sh`, `transport/tests/loom_ring.rs`). The module is
//! public only so that those models, which are integration tests, build on
//! the same facade; it is not part of the crate's API.
#![doc(hidden)]

#[cfg(loom)]
pub use loom::{sync::Arc, thread};
#[cfg(not(loom))]
pub use std::{sync::Arc, thread};

/// Atomics and fences: `loom::sync::atomic` or `std::sync::atomic`.
///
/// `Ordering` is the standard library's under both (loom re-exports it), so
/// orderings pass unchanged to APIs that take `std::sync::atomic::Ordering`,
/// such as [`Window`](crate::window::Window).
pub mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::{AtomicU64, Ordering, fence};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{AtomicU64, Ordering, fence};
}

/// Busy-wait hints: under loom, `spin_loop` yields to the model's scheduler,
/// which is what lets a model of a polling loop terminate.
pub mod hint {
    #[cfg(loom)]
    pub use loom::hint::spin_loop;
    #[cfg(not(loom))]
    pub use std::hint::spin_loop;
}
