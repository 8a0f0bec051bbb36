//! Setup between nodes over TCP.
#![forbid(unsafe_code)]

pub mod channel;

pub use channel::{Channel, ChannelError, ChannelListener, ChannelOptions};
