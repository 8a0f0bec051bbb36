//! The server's side of `bench --rdma` (the side `ib_write_bw` without a
//! host is on): it waits for a client, follows its plan — receiving and
//! checking barlink's windows, echoing the round trips, starting its side
//! of each perftest run when asked — and prints the rows the client sends.

use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use barlink::connect::Role;
use barlink_rdma::RdmaLink;
use barlink_rdma::verbs_queue::VerbsQueue;

use super::perftest::{
    Baseline, Tool, find_tool, last_lines, listening, perftest_args, tool_limit,
};
use super::report::{RdmaBenchContext, note, print_header, print_row_value};
use super::setup::{DEFAULT_PORT, Device, link_up};
use crate::cli::bench::args::BenchArgs;
use crate::cli::bench::remote::control::{
    Answer, Bye, Done, Ready, Request, Schedule, ServerInfo, recv_control, recv_control_gently,
    send_control,
};
use crate::cli::bench::remote::exchange::{echo, receive_windows};
use crate::cli::bench::remote::{STEP_TIMEOUT, lat_iters_for};
use crate::cli::{CommandError, Status};

/// A run in progress, server side.
struct Server {
    link: RdmaLink<VerbsQueue>,
    ctx: RdmaBenchContext,
    /// `ib_write_bw` and `ib_write_lat`, where installed (and wanted).
    tools: [Option<PathBuf>; 2],
    /// The TCP port our perftest listens on.
    perf_port: u16,
    qp_timeout: u8,
    /// A message arrived wrong.
    failed: bool,
}

pub fn run(args: &BenchArgs, device: Device) -> Result<Status, CommandError> {
    let rdma = &args.remote;
    let listen = rdma
        .listen
        .clone()
        .unwrap_or_else(|| format!("0.0.0.0:{DEFAULT_PORT}"));
    let port = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.port())
        .ok_or_else(|| {
            CommandError::usage(format!("--listen {listen:?}: not an address (ADDR:PORT)"))
        })?;
    let perf_port = port.checked_add(1).unwrap_or(port - 1);
    if !args.output.json {
        eprintln!(
            "barlink bench --rdma: server on {listen} (device {}), waiting up to {} s for a client",
            device.name, rdma.accept_timeout
        );
    }
    let (mut link, decision) = link_up(args, &device, &listen, Role::Accept)?;
    let plan: serde_json::Value = recv_control(&mut link, STEP_TIMEOUT, "the client's plan")?;
    let schedule = match Schedule::from_json(&plan) {
        Ok(schedule) => schedule,
        Err(error) => {
            send_control(&mut link, &Answer::<ServerInfo>::no(error.clone()))?;
            let _ = link.close(Duration::from_secs(5));
            return Err(CommandError::usage(format!("bench --rdma: {error}")));
        }
    };
    let tools = if rdma.no_baseline {
        [None, None]
    } else {
        [find_tool("ib_write_bw"), find_tool("ib_write_lat")]
    };
    if schedule.bw && tools[0].is_none() && !rdma.no_baseline {
        note(
            "perftest's ib_write_bw is not installed here (Debian: apt install perftest): no baseline, no ratio",
        );
    }
    let info = ServerInfo {
        device: device.name.clone(),
        gid_index: device.gid_index,
        perftest_port: perf_port,
        ib_write_bw: tools[0].is_some(),
        ib_write_lat: tools[1].is_some(),
    };
    send_control(&mut link, &Answer::yes(info))?;
    let ctx = RdmaBenchContext {
        role: "server",
        decision,
        device,
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(
        &ctx,
        &config,
        &format!("a client, listening on {listen}"),
        schedule.windows,
        "perftest ib_write_bw/ib_write_lat, run by the client (rows as it measured them)",
    );
    let mut server = Server {
        link,
        ctx,
        tools,
        perf_port,
        qp_timeout: rdma.qp_timeout,
        failed: false,
    };
    for (&size, &count) in schedule.sizes.iter().zip(&schedule.counts) {
        receive_windows(
            &mut server.link,
            size,
            count,
            schedule.windows,
            &mut server.failed,
            &note,
        )?;
        echo(
            &mut server.link,
            size,
            lat_iters_for(schedule.lat_iters, size),
        )?;
        server.serve_requests()?;
    }
    send_control(&mut server.link, &Bye { bye: true })?;
    // The client closes after the goodbye; wait for that, briefly.
    let _ = server.link.close(Duration::from_secs(5));
    Ok(if server.failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

impl Server {
    /// The client's requests (perftest runs), until it sends the size's rows.
    fn serve_requests(&mut self) -> Result<(), CommandError> {
        loop {
            let request = recv_control(&mut self.link, STEP_TIMEOUT, "the client's next step")?;
            match request {
                Request::Rows { rows, .. } => {
                    for row in &rows {
                        print_row_value(row, self.ctx.json);
                    }
                    return Ok(());
                }
                Request::Run { run, size, iters } => self.perftest(run, size, iters)?,
                Request::Finished { .. } => {
                    return Err(CommandError::environment(format!(
                        "bench --rdma: an unknown request from the client: {}",
                        json_text(&request)
                    )));
                }
            }
        }
    }

    /// One perftest run, server side: start ours, say when it listens, wait
    /// for the client's "finished", collect ours (killed if it overruns).
    fn perftest(&mut self, which: Baseline, size: usize, iters: usize) -> Result<(), CommandError> {
        let program = self.tools[usize::from(which == Baseline::Lat)].clone();
        let Some(tool) = self.start_perftest(program.as_deref(), which, size, iters)? else {
            return Ok(());
        };
        let link = &mut self.link;
        let limit = tool_limit(size * iters);
        let finished: Request =
            recv_control_gently(link, limit + STEP_TIMEOUT, "the client's perftest")?;
        if !matches!(finished, Request::Finished { finished } if finished == which) {
            return Err(CommandError::environment(format!(
                "bench --rdma: expected the end of {}, got {}",
                which.tool(),
                json_text(&finished)
            )));
        }
        let verdict = match tool.wait(Duration::from_secs(20), || {
            let _ = link.progress();
        }) {
            Ok((status, _)) if status.success() => Answer::yes(Done {}),
            Ok((status, output)) => {
                Answer::no(format!("exited with {status}: {}", last_lines(&output, 3)))
            }
            Err(error) => Answer::no(error),
        };
        send_control(link, &verdict)
    }

    /// Starts our perftest and waits until it listens, then tells the
    /// client (or tells it why not): the running tool, if it runs.
    fn start_perftest(
        &mut self,
        program: Option<&Path>,
        which: Baseline,
        size: usize,
        iters: usize,
    ) -> Result<Option<Tool>, CommandError> {
        let port = self.perf_port;
        let started = match program {
            None => Err(format!("{} is not installed on the server", which.tool())),
            Some(program) => {
                let mut args = perftest_args(&self.ctx.device, size, iters, port, self.qp_timeout);
                args.extend(which.extra().iter().map(|s| s.to_string()));
                Tool::spawn(which.tool(), program, &args)
            }
        };
        let answer: Result<(), String>;
        let tool = match started {
            Ok(mut tool) => {
                // Until it listens (or dies): then tell the client.
                let deadline = Instant::now() + Duration::from_secs(20);
                while !listening(port) && tool.running() && Instant::now() < deadline {
                    let _ = self.link.progress();
                    std::thread::sleep(Duration::from_millis(10));
                }
                if tool.running() {
                    answer = Ok(());
                    Some(tool)
                } else {
                    let output = tool.output();
                    answer = Err(format!(
                        "{} exited at once: {}",
                        which.tool(),
                        last_lines(&output, 3)
                    ));
                    None
                }
            }
            Err(error) => {
                answer = Err(error);
                None
            }
        };
        send_control(&mut self.link, &Ready::result(answer))?;
        Ok(tool)
    }
}

/// A request as it came over the wire, for an error message.
fn json_text(request: &Request) -> String {
    serde_json::to_string(request).unwrap_or_default()
}
