//! The client's side of `bench --tcp` (the side `iperf3 -c` is on): it
//! sends the plan, drives every size — barlink's windows and round trips,
//! then iperf3 and the ping-pong against the server's — and prints the
//! rows, which it sends over for the server to print too.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use barlink::connect::Role;
use barlink_transport::tcp::TcpLink;
use serde_json::Value;

use super::baseline::{iperf3_client, ping_pong};
use super::link_up;
use super::report::{
    IPERF3, PATH, PING_PONG, Row, TcpBenchContext, note, print_header, print_row_value, row_json,
};
use super::server::TcpServerInfo;
use crate::cli::bench::args::{BenchArgs, Plan};
use crate::cli::bench::rdma::perftest::find_tool;
use crate::cli::bench::remote::control::{
    Answer, Bye, Request, Schedule, recv_control, send_control,
};
use crate::cli::bench::remote::exchange::{round_trips, send_windows};
use crate::cli::bench::remote::{STEP_TIMEOUT, count_for, counters, lat_iters_for, message_of};
use crate::cli::bench::report::{median, percentile};
use crate::cli::{CommandError, Status};

/// Seconds iperf3 runs per size (after one it omits).
const IPERF3_SECONDS: u32 = 3;

struct Client {
    /// Messages go out as shared buffers: the link reads the one buffer,
    /// as iperf3 does.
    link: TcpLink<Arc<[u8]>>,
    schedule: Schedule,
    iperf3: Option<(PathBuf, u16)>,
    ping_pong: Option<SocketAddr>,
    host: String,
    failed: bool,
}

pub fn run(args: &BenchArgs, plan: &Plan, host: &str, addr: &str) -> Result<Status, CommandError> {
    let remote = &args.remote;
    let iperf3 = if remote.no_baseline {
        None
    } else {
        find_tool("iperf3")
    };
    let schedule = Schedule {
        sizes: plan.sizes.clone(),
        counts: plan.sizes.iter().map(|&s| count_for(plan, s)).collect(),
        windows: plan.windows,
        lat_iters: plan.lat_iters.min(100_000),
        bw: iperf3.is_some(),
        lat: !remote.no_baseline,
    };
    let (mut link, decision) = link_up(args, addr, Role::Connect)?;
    send_control(&mut link, &schedule.to_json())?;
    let answer: Answer<TcpServerInfo> =
        recv_control(&mut link, STEP_TIMEOUT, "the server's answer to the plan")?;
    let server = answer.into_result().map_err(|error| {
        CommandError::environment(format!(
            "bench --tcp: the server refused the plan: {}",
            error.as_deref().unwrap_or("(no reason)")
        ))
    })?;
    let ping_pong = server.ping_pong_port.and_then(|port| {
        (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
    });
    let baseline = baseline_text(remote.no_baseline, iperf3.is_some(), &server);
    let ctx = TcpBenchContext {
        role: "client",
        decision,
        encrypted: link.medium().is_encrypted(),
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(&ctx, &config, addr, plan.windows, &baseline);
    let mut client = Client {
        link,
        schedule,
        iperf3: iperf3.zip(server.iperf3_port),
        ping_pong,
        host: host.to_string(),
        failed: false,
    };
    let sizes = client.schedule.sizes.clone();
    let counts = client.schedule.counts.clone();
    for (index, (&size, &count)) in sizes.iter().zip(&counts).enumerate() {
        let rows = client.measure_size(size, count)?;
        let values: Vec<Value> = rows.iter().map(|r| row_json(r, &ctx, &config)).collect();
        for value in &values {
            print_row_value(value, ctx.json);
        }
        let last = index + 1 == sizes.len();
        send_control(&mut client.link, &Request::Rows { rows: values, last })?;
    }
    let _: Bye = recv_control(&mut client.link, STEP_TIMEOUT, "the server's goodbye")?;
    let _ = client.link.close(Duration::from_secs(5));
    Ok(if client.failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

fn baseline_text(no_baseline: bool, iperf3_here: bool, server: &TcpServerInfo) -> String {
    if no_baseline {
        return "none (--no-baseline): no ratio".to_string();
    }
    let bandwidth = match (iperf3_here, server.iperf3_port) {
        (true, Some(port)) => format!(
            "iperf3 -c (one stream, the same write size, {IPERF3_SECONDS} s) against the server's iperf3 -s on port {port}"
        ),
        (false, _) => {
            let text =
                "no iperf3 here (Debian: apt install iperf3): no bandwidth ratio".to_string();
            note(&text);
            text
        }
        (true, None) => "no iperf3 on the server: no bandwidth ratio".to_string(),
    };
    let latency = match server.ping_pong_port {
        Some(port) => format!(
            "a plain TCP ping-pong (TCP_NODELAY, blocking reads) against the server's echo on port {port}"
        ),
        None => "no ping-pong echo on the server: no latency ratio".to_string(),
    };
    format!("{bandwidth}; {latency}")
}

impl Client {
    /// One size: barlink's windows and round trips, then the baselines.
    fn measure_size(&mut self, size: usize, count: usize) -> Result<Vec<Row>, CommandError> {
        let message: Arc<[u8]> = message_of(size).into();
        let mut windows = send_windows(&mut self.link, &message, count, self.schedule.windows)?;
        let iters = lat_iters_for(self.schedule.lat_iters, size);
        let mut latencies = round_trips(&mut self.link, &message, iters, &mut self.failed, &note)?;
        self.link.flush(STEP_TIMEOUT).map_err(|e| {
            CommandError::environment(format!("bench --tcp: size {size}: flush: {e}"))
        })?;
        let after = counters(&self.link);
        // Both sides' counts leave the warm-up out.
        let before = windows.client_before;
        let (sent, received) = (windows.sent, windows.received);
        let lost = sent.saturating_sub(received);
        if lost > 0 {
            self.failed = true;
            note(&format!(
                "size {size}: the server received {received} of {sent} messages"
            ));
        }
        let barlink_gbps = median(&mut windows.gbps);
        let lat = (
            percentile(&mut latencies, 0.5),
            percentile(&mut latencies, 0.99),
        );
        let mut barlink = Row {
            path: PATH,
            size,
            gbps: Some(barlink_gbps),
            lat: Some(lat),
            retransmits: after.0 - before.0
                + windows.server_now.0.saturating_sub(windows.server_before.0),
            crc_errors: after.1 - before.1
                + windows.server_now.1.saturating_sub(windows.server_before.1),
            messages: sent,
            lost,
            ..Row::default()
        };
        let mut rows = Vec::new();
        if let Some((program, port)) = self.iperf3.clone() {
            // The link waits unpolled meanwhile: its peer timeout is a step.
            match iperf3_client(&program, &self.host, port, size, IPERF3_SECONDS) {
                Ok(gbps) => {
                    barlink.ratio = Some(barlink_gbps / gbps);
                    rows.push(Row {
                        path: IPERF3,
                        size,
                        gbps: Some(gbps),
                        ..Row::default()
                    });
                }
                Err(error) => note(&format!("size {size}: {error}")),
            }
        }
        if let Some(addr) = self.ping_pong {
            match ping_pong(addr, size, iters) {
                Ok(mut plain) => {
                    let plain_lat = (percentile(&mut plain, 0.5), percentile(&mut plain, 0.99));
                    barlink.lat_ratio = Some(lat.0 / plain_lat.0);
                    rows.push(Row {
                        path: PING_PONG,
                        size,
                        lat: Some(plain_lat),
                        ..Row::default()
                    });
                }
                Err(error) => note(&format!("size {size}: {error}")),
            }
        }
        // Keep the link answered after the baselines ran.
        let _ = self.link.progress();
        rows.insert(0, barlink);
        Ok(rows)
    }
}
