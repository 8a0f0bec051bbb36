//! RDMA between nodes over ibverbs: device discovery, protection domains,
//! completion queues, RC queue pairs, memory registration (host memory and
//! dma-buf), connection setup, and links whose packets travel as RDMA WRITE
//! with immediate into a peer's registered ring.
//!
//! Nothing is implemented here yet: the RDMA issue fills this crate. See
//! `docs/ARCHITECTURE.md`.
#![forbid(unsafe_code)]
