//! `barlink bench`: barlink's throughput and per-message latency, with
//! baselines measured in the same run.
//!
//! - `shm` (the default, [`shm`]): two processes over shared memory —
//!   barlink's ring link against raw rings and a Unix socket;
//! - `engine-mem` ([`engine_mem`]): two engines in one thread over an
//!   in-memory medium, against memcpy: the protocol's own cost;
//! - `--rdma` ([`rdma`]): between two machines, against perftest;
//! - `--tcp` ([`tcp`]): between two machines, against iperf3 and a plain
//!   TCP ping-pong;
//! - `--gpu` ([`gpu`]): device buffers at both ends, against cuMemcpy
//!   staging and CUDA IPC.
//!
//! Figures are medians over timed windows, as the machine is shared and
//! noisy.

mod args;
mod engine_mem;
pub mod gpu;
mod rdma;
mod remote;
mod report;
pub mod shm;
mod tcp;

pub use args::BenchArgs;
use args::BenchPath;

use super::{CommandError, Status};

pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    if args.gpu {
        return gpu::run(args);
    }
    if args.remote.rdma || args.remote.tcp {
        return remote::run(args);
    }
    let plan = args.plan()?;
    let max_size = *plan.sizes.iter().max().expect("checked non-empty");
    let config = args.engine_config(max_size);
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    match args.path {
        BenchPath::Shm => shm::run(args, &plan, &config),
        BenchPath::EngineMem => engine_mem::run(args, &plan, &config),
    }
}
