//! The client's side of `bench --rdma` (the side `ib_write_bw HOST` is on):
//! it sends the plan, drives every size — barlink's windows and round
//! trips, then perftest's — and prints the rows, which it sends over for
//! the server to print too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use barlink::connect::Role;
use barlink_rdma::RdmaLink;
use barlink_rdma::verbs_queue::VerbsQueue;
use barlink_transport::EngineConfig;
use serde_json::Value;

use super::perftest::{
    Baseline, Tool, find_tool, last_lines, not_listening_yet, parse_write_bw, parse_write_lat,
    perftest_args, tool_limit,
};
use super::report::{PATH, RdmaBenchContext, Row, note, print_header, print_row_value, row_json};
use super::setup::{Device, link_up};
use crate::cli::bench::args::{BenchArgs, Plan};
use crate::cli::bench::remote::control::{
    Answer, Bye, Done, Ready, Request, Schedule, ServerInfo, recv_control, recv_control_gently,
    send_control,
};
use crate::cli::bench::remote::exchange::{round_trips, send_windows};
use crate::cli::bench::remote::{
    STEP_TIMEOUT, count_for, counters, lat_iters_for, link_error, message_of,
};
use crate::cli::bench::report::{median, percentile};
use crate::cli::{CommandError, Status};

/// A run in progress, client side.
struct Client<'a> {
    /// Messages go out as shared buffers: the link reads the one buffer,
    /// as perftest does.
    link: RdmaLink<VerbsQueue, Arc<[u8]>>,
    ctx: RdmaBenchContext,
    config: EngineConfig,
    schedule: Schedule,
    /// The server's host, for perftest.
    host: &'a str,
    qp_timeout: u8,
    /// The TCP port the server's perftest listens on.
    perf_port: u16,
    /// `ib_write_bw` and `ib_write_lat`, where both sides have them.
    bw: Option<PathBuf>,
    lat: Option<PathBuf>,
    /// A message was lost or came back wrong.
    failed: bool,
}

pub fn run(
    args: &BenchArgs,
    plan: &Plan,
    device: Device,
    host: &str,
    addr: &str,
) -> Result<Status, CommandError> {
    let rdma = &args.remote;
    let tools = if rdma.no_baseline {
        [None, None]
    } else {
        [find_tool("ib_write_bw"), find_tool("ib_write_lat")]
    };
    let schedule = Schedule {
        sizes: plan.sizes.clone(),
        counts: plan.sizes.iter().map(|&s| count_for(plan, s)).collect(),
        windows: plan.windows,
        lat_iters: plan.lat_iters.min(100_000),
        bw: tools[0].is_some(),
        lat: tools[1].is_some(),
    };
    let (mut link, decision) = link_up(args, &device, addr, Role::Connect)?;
    send_control(&mut link, &schedule.to_json())?;
    let answer: Answer<ServerInfo> =
        recv_control(&mut link, STEP_TIMEOUT, "the server's answer to the plan")?;
    let server = answer.into_result().map_err(|error| {
        CommandError::environment(format!(
            "bench --rdma: the server refused the plan: {}",
            error.as_deref().unwrap_or("(no reason)")
        ))
    })?;
    let perf_port = server.perftest_port;
    let run_bw = schedule.bw && server.ib_write_bw;
    let run_lat = schedule.lat && server.ib_write_lat;
    let baseline = if rdma.no_baseline {
        "none (--no-baseline): no ratio".to_string()
    } else if !run_bw {
        let missing = if tools[0].is_none() {
            "here"
        } else {
            "on the server"
        };
        let text = format!(
            "none: perftest's ib_write_bw is not installed {missing} (Debian: apt install perftest): no ratio"
        );
        note(&text);
        text
    } else {
        // As the server's JSON has it: a number, or null on InfiniBand.
        let server_gid = server
            .gid_index
            .map_or_else(|| "null".to_string(), |g| g.to_string());
        baseline_text(&device, &server_gid, perf_port, run_lat)
    };
    let ctx = RdmaBenchContext {
        role: "client",
        decision,
        device,
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(&ctx, &config, addr, plan.windows, &baseline);
    let [bw, lat] = tools;
    let mut client = Client {
        link,
        ctx,
        config,
        schedule,
        host,
        qp_timeout: rdma.qp_timeout,
        perf_port,
        bw: bw.filter(|_| run_bw),
        lat: lat.filter(|_| run_lat),
        failed: false,
    };
    let sizes = client.schedule.sizes.clone();
    let counts = client.schedule.counts.clone();
    for (index, (&size, &count)) in sizes.iter().zip(&counts).enumerate() {
        let rows = client.measure_size(size, count)?;
        let values: Vec<Value> = rows
            .iter()
            .map(|r| row_json(r, &client.ctx, &client.config))
            .collect();
        for value in &values {
            print_row_value(value, client.ctx.json);
        }
        let last = index + 1 == sizes.len();
        let rows = Request::Rows { rows: values, last };
        send_control(&mut client.link, &rows)?;
    }
    let _: Bye = recv_control(&mut client.link, STEP_TIMEOUT, "the server's goodbye")?;
    let _ = client.link.close(Duration::from_secs(5));
    Ok(if client.failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

/// The header's baseline line when perftest runs.
fn baseline_text(device: &Device, server_gid: &str, perf_port: u16, run_lat: bool) -> String {
    format!(
        "perftest ib_write_bw{} on {} (server GID index {server_gid}), same sizes, between the same two machines (TCP port {perf_port}){}",
        if run_lat {
            " (bandwidth) and ib_write_lat (latency)"
        } else {
            ""
        },
        device.name,
        if run_lat {
            ""
        } else {
            "; ib_write_lat not installed on both sides: no baseline latency"
        }
    )
}

impl Client<'_> {
    /// One size: barlink's windows and round trips, then perftest's; the rows.
    fn measure_size(&mut self, size: usize, count: usize) -> Result<Vec<Row>, CommandError> {
        let message: Arc<[u8]> = message_of(size).into();
        let mut windows = send_windows(&mut self.link, &message, count, self.schedule.windows)?;
        let iters = lat_iters_for(self.schedule.lat_iters, size);
        let mut latencies = round_trips(&mut self.link, &message, iters, &mut self.failed, &note)?;
        self.link
            .flush(STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: flush")))?;
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
        let (server_before, server_now) = (windows.server_before, windows.server_now);
        let barlink_gbps = median(&mut windows.gbps);
        let mut rows = vec![Row {
            path: PATH,
            size,
            gbps: barlink_gbps,
            lat: Some((
                percentile(&mut latencies, 0.5),
                percentile(&mut latencies, 0.99),
            )),
            retransmits: after.0 - before.0 + server_now.0.saturating_sub(server_before.0),
            crc_errors: after.1 - before.1 + server_now.1.saturating_sub(server_before.1),
            messages: sent,
            lost,
            ..Row::default()
        }];
        let bw = self.bandwidth_baseline(size, count);
        let lat = match bw {
            Some(_) => self.latency_baseline(size),
            None => None,
        };
        if let Some((perf_gbps, iterations)) = bw {
            if perf_gbps > 0.0 {
                rows[0].ratio = Some(barlink_gbps / perf_gbps);
            } else {
                note(&format!(
                    "size {size}: ib_write_bw's bandwidth printed as 0 (below its resolution): no ratio"
                ));
            }
            rows.push(Row {
                path: "ib_write_bw",
                size,
                gbps: perf_gbps,
                lat,
                iterations,
                ..Row::default()
            });
        }
        Ok(rows)
    }

    /// `ib_write_bw` at `size`: its GB/s and iterations, or `None` (said why).
    fn bandwidth_baseline(&mut self, size: usize, count: usize) -> Option<(f64, usize)> {
        let program = self.bw.clone()?;
        let iters = count.clamp(5, 100_000);
        match self.perftest(&program, Baseline::Bw, size, iters) {
            Ok(output) => {
                let gbps = parse_write_bw(&output, size);
                if gbps.is_none() {
                    note(&format!(
                        "size {size}: no bandwidth in ib_write_bw's output: {}",
                        last_lines(&output, 4)
                    ));
                }
                gbps.map(|g| (g, iters))
            }
            Err(e) => {
                note(&format!("size {size}: ib_write_bw: {e}"));
                None
            }
        }
    }

    /// `ib_write_lat` at `size`: its (typical, 99th percentile) one-way
    /// latency, or `None` (said why).
    fn latency_baseline(&mut self, size: usize) -> Option<(f64, f64)> {
        let program = self.lat.clone()?;
        let iters = lat_iters_for(self.schedule.lat_iters, size).clamp(5, 100_000);
        match self.perftest(&program, Baseline::Lat, size, iters) {
            Ok(output) => {
                let lat = parse_write_lat(&output, size);
                if lat.is_none() {
                    note(&format!(
                        "size {size}: no latency in ib_write_lat's output: {}",
                        last_lines(&output, 4)
                    ));
                }
                lat
            }
            Err(e) => {
                note(&format!("size {size}: ib_write_lat: {e}"));
                None
            }
        }
    }

    /// One perftest run: ask the server to start its side, run ours (a few
    /// tries while the server's is not listening yet), tell the server,
    /// collect its verdict. The output of ours, or why there is none.
    fn perftest(
        &mut self,
        program: &Path,
        which: Baseline,
        size: usize,
        iters: usize,
    ) -> Result<String, String> {
        let link = &mut self.link;
        let control_error = |e: CommandError| e.to_string();
        let run = Request::Run {
            run: which,
            size,
            iters,
        };
        send_control(link, &run).map_err(control_error)?;
        let ready: Ready = recv_control_gently(link, STEP_TIMEOUT, "the server's perftest")
            .map_err(control_error)?;
        ready.into_result().map_err(|error| {
            format!(
                "the server could not start its side: {}",
                error.as_deref().unwrap_or("(no reason)")
            )
        })?;
        let mut args = perftest_args(
            &self.ctx.device,
            size,
            iters,
            self.perf_port,
            self.qp_timeout,
        );
        args.extend(which.extra().iter().map(|s| s.to_string()));
        args.push(self.host.to_string());
        let limit = tool_limit(size * iters);
        let outcome = run_with_retries(link, program, which, &args, limit);
        // Whatever happened here, the server collects its side before the
        // schedule goes on.
        send_control(link, &Request::Finished { finished: which }).map_err(control_error)?;
        let verdict: Answer<Done> =
            recv_control_gently(link, limit + STEP_TIMEOUT, "the server's perftest result")
                .map_err(control_error)?;
        if outcome.is_ok()
            && let Err(error) = verdict.into_result()
        {
            note(&format!(
                "{}: the server's side: {}",
                which.tool(),
                error.as_deref().unwrap_or("failed")
            ));
        }
        outcome
    }
}

/// Runs our perftest, again (up to four times) while it fails only because
/// the server's side is not listening yet; keeps the link moving meanwhile.
fn run_with_retries(
    link: &mut RdmaLink<VerbsQueue, Arc<[u8]>>,
    program: &Path,
    which: Baseline,
    args: &[String],
    limit: Duration,
) -> Result<String, String> {
    let mut outcome = Err(String::from("not run"));
    for attempt in 0..4 {
        let result = Tool::spawn(which.tool(), program, args).and_then(|tool| {
            tool.wait(limit, || {
                let _ = link.progress();
            })
        });
        match result {
            Ok((status, output)) if status.success() => {
                outcome = Ok(output);
                break;
            }
            Ok((status, output)) => {
                outcome = Err(format!("exited with {status}: {}", last_lines(&output, 3)));
                if !not_listening_yet(&output) || attempt == 3 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    outcome
}
