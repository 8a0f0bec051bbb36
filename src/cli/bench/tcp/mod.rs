//! `barlink bench --tcp`: barlink over TCP between two machines, with
//! iperf3 (bandwidth) and a plain TCP ping-pong (latency) between the same
//! two machines, at the same sizes, in the same run, as the baselines.
//!
//! Roles as in `iperf3`: `barlink bench --tcp --server` waits (on
//! `--listen`, default `0.0.0.0:18616`); `barlink bench --tcp HOST[:PORT]`
//! connects and drives. Both set up through [`barlink::connect`]
//! (`Peer::Tcp`), authenticated as `--psk-file`, `--key-file` or the
//! environment say (or `--insecure`), sealed with `--encrypt` on both.
//!
//! The schedule, over the link itself: the client's plan; the server's
//! answer with the ports of its baselines (its own port + 1 for `iperf3
//! -s`, + 2 for the ping-pong echo), which run for the whole session; per
//! size, barlink's timed windows and round trips, then the client's
//! `iperf3 -c` and ping-pong against those ports, then the size's rows,
//! which the server prints too.

mod baseline;
mod client;
mod report;
mod server;

use std::time::Duration;

use barlink::connect::{AnyLink, ConnectError, ConnectOptions, PathDecision, Peer, Role};
use barlink_transport::EngineConfig;
use barlink_transport::tcp::{ChannelOptions, DEFAULT_PORT, TcpLink, TcpLinkOptions};

use super::remote::{STEP_TIMEOUT, client_target};
use crate::cli::bench::args::BenchArgs;
use crate::cli::{CommandError, Status};

/// `barlink bench --tcp ...`.
pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    let remote = &args.remote;
    if args.fault_rate != 0.0 {
        return Err(CommandError::usage(
            "--fault-rate is not supported with --tcp (the link's own tests inject faults)",
        ));
    }
    let plan = args.plan()?;
    if plan.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        return Err(CommandError::usage(
            "--sizes: with --tcp each size must be 1 byte .. 1 GiB",
        ));
    }
    args.engine_config(1)
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    // Key files named on the command line are checked before anything
    // listens or connects.
    remote.auth.peer_auth()?;
    match (&remote.host, remote.server) {
        (Some(host), false) => {
            let (host, addr) = client_target(host, DEFAULT_PORT)
                .map_err(|e| CommandError::usage(format!("bench --tcp: {e}")))?;
            client::run(args, &plan, &host, &addr)
        }
        (None, true) => server::run(args),
        _ => Err(CommandError::usage(
            "bench --tcp needs a role: --server (waits), or HOST[:PORT] of the server (connects)",
        )),
    }
}

/// How both roles set up: the shared engine settings, a peer timeout as
/// long as a step (the link waits unpolled while iperf3 runs), and the
/// authentication and encryption the options name.
fn connect_options(args: &BenchArgs) -> Result<ConnectOptions, CommandError> {
    let mut engine: EngineConfig = args.engine_config(1);
    engine.max_message_len = EngineConfig::default().max_message_len;
    engine.peer_timeout = STEP_TIMEOUT;
    Ok(ConnectOptions {
        setup_timeout: Duration::from_secs(args.remote.accept_timeout),
        tcp: TcpLinkOptions {
            channel: ChannelOptions {
                connect_timeout: Duration::from_secs(5),
                connect_retries: 20,
                retry_interval: Duration::from_millis(500),
                io_timeout: STEP_TIMEOUT,
                auth_timeout: Duration::from_secs(10),
                auth: None,
                deadline: None,
            },
            ..TcpLinkOptions::default()
        },
        encrypt: args.remote.encrypt,
        auth: args.remote.auth.peer_auth()?,
        engine,
        ..ConnectOptions::default()
    })
}

/// Sets up the link and takes the TCP link out of the connection.
fn link_up<B: AsRef<[u8]>>(
    args: &BenchArgs,
    addr: &str,
    role: Role,
) -> Result<(TcpLink<B>, PathDecision), CommandError> {
    let options = connect_options(args)?;
    let connection = barlink::connect::<B>(
        &Peer::Tcp {
            addr: addr.to_string(),
        },
        role,
        &options,
    )
    .map_err(|error| match error {
        ConnectError::Usage { .. } => CommandError::usage(format!("bench --tcp: {error}")),
        other => CommandError::environment(format!("bench --tcp: {other}")),
    })?;
    let decision = connection.decision;
    match connection.link {
        AnyLink::Tcp(link) => Ok((*link, decision)),
        _ => Err(CommandError::environment(format!(
            "bench --tcp: the link is not TCP ({decision})"
        ))),
    }
}
