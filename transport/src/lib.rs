//! barlink's transport: everything that moves messages and needs no
//! hardware.
//!
//! - [`wire`]: the packet format (an 80-byte header and a CRC-32C over
//!   header and payload), parsed with every peer-written field checked;
//! - [`engine`]: the sans-IO reliability protocol — fragmentation, sliding
//!   window, cumulative and selective acknowledgement, NAK on corruption,
//!   retransmission with backoff, credit-based flow control, in-order
//!   exactly-once delivery, heartbeats, peer loss and restart detection;
//! - [`sim`]: a simulated medium with seeded loss, corruption, duplication,
//!   reordering and delay, to drive two engines in tests and benchmarks;
//! - [`ring`]: the packet ring inside a receive window — layout and the
//!   head/consumed index protocol, with every peer-written index checked;
//! - [`window`]: byte regions read and written only through bounds-checked
//!   copies and atomic accessors, never through references (shared memory,
//!   heap, fault injection);
//! - [`link`]: an engine bound to a medium (rings in a pair of windows, or
//!   another crate's), the blocking and polling message API, connect and
//!   accept by name (with the peer's user checked), a background progress
//!   thread;
//! - [`auth`]: mutual authentication of remote setup (a pre-shared key or
//!   pinned public keys, Noise) and the sealed session after it;
//! - [`crc`], [`time`]: the checksum and the engine's notion of time;
//! - [`rng`]: the seeded generator behind fault injection, the simulator
//!   and test data;
//! - [`cpu`]: the CPU and the copy and CRC kernels chosen on it, for
//!   reports;
//! - [`units`]: sizes as people write them (`4K`, `1M`).
//!
//! Protocol code here contains no unsafe code: `unsafe` is denied crate-wide
//! and allowed only where the system is touched: `window::mapping` (raw
//! pointers into mapped memory), `crc::x86` (the vector CRC kernel) and
//! `clock` (the CPU's time-stamp counter).
#![deny(unsafe_code)]

pub mod auth;
mod clock;
pub mod cpu;
pub mod crc;
pub mod engine;
pub mod link;
pub mod ring;
pub mod rng;
pub mod sim;
pub mod sync;
pub mod tcp;
pub mod time;
pub mod units;
pub mod window;
pub mod wire;

pub use engine::{
    ConfigError, Delivery, Engine, EngineConfig, Event, LinkError, MessageId, PacketError, PostId,
    PostedRecv, RecvTarget, SendError, Stats, Transmit,
};
pub use time::Time;
