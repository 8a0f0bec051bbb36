//! `barlink bench` between two machines: `--rdma` ([`super::rdma`],
//! against perftest) or `--tcp` ([`super::tcp`], against iperf3 and a
//! plain TCP ping-pong). Roles as in `ib_write_bw` and `iperf3`: one side
//! `--server`, the other `HOST[:PORT]`. What both share: the options, the
//! control messages over the link itself, and the timed windows and round
//! trips.

pub mod args;
pub mod control;
pub mod exchange;

use std::net::SocketAddr;
use std::time::Duration;

use barlink_transport::link::{IoError, Link, Medium};
use barlink_transport::rng::SplitMix64;

use crate::cli::CommandError;
use crate::cli::Status;
use crate::cli::bench::args::{BenchArgs, Plan};

/// Longest wait for any one step of the schedule (a window, a round trip,
/// a control message).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// `barlink bench --rdma|--tcp ...`.
pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    if args.remote.rdma {
        super::rdma::run(args)
    } else {
        super::tcp::run(args)
    }
}

/// Round trips for latency at `size` (large messages take long; fewer
/// samples still give stable medians, as in the shared-memory bench).
pub fn lat_iters_for(lat_iters: usize, size: usize) -> usize {
    if size >= 1 << 20 {
        lat_iters.min(50)
    } else {
        lat_iters
    }
}

/// Messages of one timed window, capped as the shared-memory bench caps them.
pub fn count_for(plan: &Plan, size: usize) -> usize {
    plan.messages_per_window(size).min(100_000)
}

/// The message of `size` both sides expect.
pub fn message_of(size: usize) -> Vec<u8> {
    let mut data = vec![0u8; size];
    SplitMix64::new(size as u64 ^ 0xB4E1_0DA7).fill(&mut data);
    data
}

pub fn link_error(what: &str) -> impl Fn(IoError) -> CommandError + '_ {
    move |error| CommandError::environment(format!("bench: {what}: {error}"))
}

/// The link's retransmissions and CRC errors (malformed packets included).
pub fn counters<M: Medium, B: AsRef<[u8]>>(link: &Link<M, B>) -> (u64, u64) {
    let stats = link.engine().stats();
    (stats.retransmits(), stats.crc_failures + stats.malformed)
}

/// `HOST`, `HOST:PORT`, `[V6]:PORT` -> (the host for a baseline tool,
/// host:port).
pub fn client_target(text: &str, default_port: u16) -> Result<(String, String), String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.to_string()));
    }
    if text.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((text.to_string(), format!("[{text}]:{default_port}")));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            port.parse::<u16>()
                .map_err(|_| format!("{text:?}: the port {port:?} is not a number"))?;
            Ok((host.to_string(), text.to_string()))
        }
        Some(_) => Err(format!("{text:?} is not HOST or HOST:PORT")),
        None if text.is_empty() => Err("an empty HOST".into()),
        None => Ok((text.to_string(), format!("{text}:{default_port}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_targets() {
        assert_eq!(
            client_target("10.0.2.15", 18515).unwrap(),
            ("10.0.2.15".into(), "10.0.2.15:18515".into())
        );
        assert_eq!(
            client_target("node2:9000", 18515).unwrap(),
            ("node2".into(), "node2:9000".into())
        );
        assert_eq!(
            client_target("[fe80::1]:7000", 18515).unwrap(),
            ("fe80::1".into(), "[fe80::1]:7000".into())
        );
        assert!(client_target("host:port", 18515).is_err());
        assert!(client_target("", 18515).is_err());
    }
}
