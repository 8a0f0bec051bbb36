//! The server's side of `bench --tcp`: it waits for a client, starts the
//! baselines' servers (iperf3 -s and the ping-pong echo) for the session,
//! follows the client's plan — receiving and checking barlink's windows,
//! echoing the round trips — and prints the rows the client sends.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use barlink::connect::Role;
use barlink_transport::tcp::DEFAULT_PORT;
use serde::{Deserialize, Serialize};

use super::baseline::{EchoServer, start_iperf3_server};
use super::link_up;
use super::report::{TcpBenchContext, note, print_header, print_row_value};
use crate::cli::bench::args::BenchArgs;
use crate::cli::bench::rdma::perftest::find_tool;
use crate::cli::bench::remote::control::{
    Answer, Bye, Request, Schedule, recv_control, recv_control_gently, send_control,
};
use crate::cli::bench::remote::exchange::{echo, receive_windows};
use crate::cli::bench::remote::{STEP_TIMEOUT, lat_iters_for};
use crate::cli::{CommandError, Status};

/// What the server offers: where its baselines listen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpServerInfo {
    /// `iperf3 -s`, where installed (and wanted).
    pub iperf3_port: Option<u16>,
    /// The ping-pong echo (absent with --no-baseline).
    pub ping_pong_port: Option<u16>,
}

pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    let remote = &args.remote;
    let listen = remote
        .listen
        .clone()
        .unwrap_or_else(|| format!("0.0.0.0:{DEFAULT_PORT}"));
    let addr: SocketAddr = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            CommandError::usage(format!("--listen {listen:?}: not an address (ADDR:PORT)"))
        })?;
    if !args.output.json {
        eprintln!(
            "barlink bench --tcp: server on {listen}, waiting up to {} s for a client",
            remote.accept_timeout
        );
    }
    let (mut link, decision) = link_up(args, &listen, Role::Accept)?;
    let plan: serde_json::Value = recv_control(&mut link, STEP_TIMEOUT, "the client's plan")?;
    let schedule = match Schedule::from_json(&plan) {
        Ok(schedule) => schedule,
        Err(error) => {
            send_control(&mut link, &Answer::<TcpServerInfo>::no(error.clone()))?;
            let _ = link.close(Duration::from_secs(5));
            return Err(CommandError::usage(format!("bench --tcp: {error}")));
        }
    };
    // The baselines listen beside barlink, on the next two ports.
    let mut iperf3 = None;
    let mut echo_server = None;
    if !remote.no_baseline {
        let port = addr.port().wrapping_add(1);
        match find_tool("iperf3") {
            None if schedule.bw => note(
                "iperf3 is not installed here (Debian: apt install iperf3): no bandwidth baseline",
            ),
            None => {}
            Some(program) => match start_iperf3_server(&program, port) {
                Ok(tool) => iperf3 = Some((tool, port)),
                Err(error) => note(&error),
            },
        }
        let echo_addr = SocketAddr::new(addr.ip(), addr.port().wrapping_add(2));
        let largest = schedule.sizes.iter().copied().max().unwrap_or(0);
        match EchoServer::start(echo_addr, largest) {
            Ok(server) => echo_server = Some(server),
            Err(error) => note(&error),
        }
    }
    let info = TcpServerInfo {
        iperf3_port: iperf3.as_ref().map(|(_, port)| *port),
        ping_pong_port: echo_server.as_ref().map(|e| e.port),
    };
    send_control(&mut link, &Answer::yes(info))?;
    let ctx = TcpBenchContext {
        role: "server",
        decision,
        encrypted: link.medium().is_encrypted(),
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(
        &ctx,
        &config,
        &format!("a client, listening on {listen}"),
        schedule.windows,
        "iperf3 and a TCP ping-pong, run by the client against this side (rows as it measured them)",
    );
    let mut failed = false;
    for (&size, &count) in schedule.sizes.iter().zip(&schedule.counts) {
        receive_windows(&mut link, size, count, schedule.windows, &mut failed, &note)?;
        echo(&mut link, size, lat_iters_for(schedule.lat_iters, size))?;
        // The client runs its baselines, then sends the size's rows.
        let rows: Request = recv_control_gently(
            &mut link,
            2 * STEP_TIMEOUT,
            "the client's baselines and rows",
        )?;
        match rows {
            Request::Rows { rows, .. } => {
                for row in &rows {
                    print_row_value(row, ctx.json);
                }
            }
            other => {
                return Err(CommandError::environment(format!(
                    "bench --tcp: expected the size's rows, got {}",
                    serde_json::to_string(&other).unwrap_or_default()
                )));
            }
        }
    }
    send_control(&mut link, &Bye { bye: true })?;
    let _ = link.close(Duration::from_secs(5));
    drop(iperf3);
    drop(echo_server);
    Ok(if failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}
