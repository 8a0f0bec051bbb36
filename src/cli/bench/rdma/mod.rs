//! `barlink bench --rdma`: barlink over RDMA between two machines, with
//! perftest's `ib_write_bw` (and `ib_write_lat`) on the same device, with
//! the same sizes, between the same two machines, as the baseline in the
//! same run.
//!
//! Roles as in `ib_write_bw`: `barlink bench --rdma --server` waits (on
//! `--listen`, default `0.0.0.0:18515`); `barlink bench --rdma HOST[:PORT]`
//! connects and drives. Both set up through [`barlink::connect`]
//! (`Peer::Remote`, `Role::Accept`/`Role::Connect`), which says which path
//! it took and why; that decision heads the table and is a field of every
//! JSON row.
//!
//! The schedule, over the link itself:
//! 1. The client sends its plan (sizes, messages per window, windows,
//!    latency round trips, whether it has perftest); the server answers
//!    with its device, GID index, whether it has perftest, and the TCP port
//!    its perftest servers will use (its own port + 1).
//! 2. Per size: a warm-up and `--windows` timed windows of messages from the
//!    client, each closed by the server's "got them all" (with its
//!    counters and how many messages it received, every one checked for
//!    length, the first of each window and all of the warm-up byte for byte);
//!    then round trips for latency (the server echoes each message).
//! 3. Per size, the baseline: the client asks for `ib_write_bw`; the server
//!    starts `ib_write_bw` as a server, waits until it listens, says so; the
//!    client runs `ib_write_bw HOST` with the same size, device and GID, and
//!    says when it is done; the server collects its process. The same for
//!    `ib_write_lat`. Then the client sends the size's rows, which the
//!    server prints too.
//!
//! Every step has a deadline, and a perftest process that overruns its own
//! is killed. Without libibverbs or an RDMA device the command exits 3 with
//! what is missing; without perftest it says so and prints no ratio.

mod client;
pub(super) mod perftest;
mod report;
mod server;
mod setup;

use setup::{DEFAULT_PORT, local_device};

use super::remote::client_target;

use crate::cli::bench::args::BenchArgs;
use crate::cli::{CommandError, Status};

/// `barlink bench --rdma ...`.
pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    let rdma = &args.remote;
    if args.fault_rate != 0.0 {
        return Err(CommandError::usage(
            "--fault-rate is not supported with --rdma (the link's own tests inject faults)",
        ));
    }
    let plan = args.plan()?;
    if plan.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        return Err(CommandError::usage(
            "--sizes: with --rdma each size must be 1 byte .. 1 GiB",
        ));
    }
    args.engine_config(1)
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let target = match (&rdma.host, rdma.server) {
        (Some(host), false) => Some(
            client_target(host, DEFAULT_PORT)
                .map_err(|e| CommandError::usage(format!("bench --rdma: {e}")))?,
        ),
        (None, true) => None,
        _ => {
            return Err(CommandError::usage(
                "bench --rdma needs a role: --server (waits), or HOST[:PORT] of the server (connects)",
            ));
        }
    };
    // Key files named on the command line are checked now; what the
    // environment configures is resolved when the link is set up.
    rdma.auth.peer_auth()?;
    // No RDMA here: say what is missing before anything listens or connects.
    let device = local_device(rdma).map_err(|e| {
        CommandError::environment(format!("bench --rdma: no RDMA path from this host: {e}"))
    })?;
    match target {
        Some((host, addr)) => client::run(args, &plan, device, &host, &addr),
        None => server::run(args, device),
    }
}
