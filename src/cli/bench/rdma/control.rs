//! The control messages between client and server, over the link itself,
//! and the server's binary "got them all".

use std::time::{Duration, Instant};

use barlink_rdma::RdmaLink;
use barlink_rdma::verbs_queue::VerbsQueue;
use serde_json::{Value, json};

use super::setup::{STEP_TIMEOUT, link_error};
use crate::cli::CommandError;

/// Version of the control messages.
const PROTOCOL: u64 = 1;

/// What the client asks of the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub sizes: Vec<usize>,
    pub counts: Vec<usize>,
    pub windows: usize,
    pub lat_iters: usize,
    /// The client would run ib_write_bw / ib_write_lat.
    pub bw: bool,
    pub lat: bool,
}

impl Schedule {
    pub fn to_json(&self) -> Value {
        json!({
            "barlink_bench_rdma": PROTOCOL,
            "sizes": self.sizes,
            "counts": self.counts,
            "windows": self.windows,
            "lat_iters": self.lat_iters,
            "ib_write_bw": self.bw,
            "ib_write_lat": self.lat,
        })
    }

    pub fn from_json(value: &Value) -> Result<Schedule, String> {
        if value["barlink_bench_rdma"].as_u64() != Some(PROTOCOL) {
            return Err(format!(
                "the client speaks another version of bench --rdma ({}); run the same barlink on both sides",
                value["barlink_bench_rdma"]
            ));
        }
        let list = |key: &str| -> Result<Vec<usize>, String> {
            value[key]
                .as_array()
                .ok_or(format!("plan: no {key}"))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or(format!("plan: {key}: {v}"))
                })
                .collect()
        };
        let number = |key: &str| -> Result<usize, String> {
            value[key]
                .as_u64()
                .map(|n| n as usize)
                .ok_or(format!("plan: no {key}"))
        };
        let schedule = Schedule {
            sizes: list("sizes")?,
            counts: list("counts")?,
            windows: number("windows")?,
            lat_iters: number("lat_iters")?,
            bw: value["ib_write_bw"].as_bool().unwrap_or(false),
            lat: value["ib_write_lat"].as_bool().unwrap_or(false),
        };
        if schedule.sizes.len() != schedule.counts.len()
            || schedule.sizes.is_empty()
            || schedule.counts.contains(&0)
            || schedule.sizes.iter().any(|&s| s > 1 << 30)
        {
            return Err("plan: sizes and counts do not match".into());
        }
        Ok(schedule)
    }
}

pub fn send_control(link: &mut RdmaLink<VerbsQueue>, value: &Value) -> Result<(), CommandError> {
    link.send_blocking(value.to_string().into_bytes(), STEP_TIMEOUT)
        .map(|_| ())
        .map_err(link_error("sending a control message"))
}

pub fn recv_control(
    link: &mut RdmaLink<VerbsQueue>,
    timeout: Duration,
    what: &str,
) -> Result<Value, CommandError> {
    let data = link
        .recv(timeout)
        .map_err(|e| CommandError::environment(format!("bench --rdma: waiting for {what}: {e}")))?;
    serde_json::from_slice(&data).map_err(|e| {
        CommandError::environment(format!(
            "bench --rdma: waiting for {what}, a message of {} bytes that is no control message ({e}): \
             the two sides are out of step (same barlink and options on both?)",
            data.len()
        ))
    })
}

/// As [`recv_control`], but sleeping between polls: for waits while
/// perftest runs, which must not compete with a spinning receiver.
pub fn recv_control_gently(
    link: &mut RdmaLink<VerbsQueue>,
    timeout: Duration,
    what: &str,
) -> Result<Value, CommandError> {
    let deadline = Instant::now() + timeout;
    loop {
        let waiting =
            |e| CommandError::environment(format!("bench --rdma: waiting for {what}: {e}"));
        if let Some(data) = link.try_recv().map_err(waiting)? {
            return serde_json::from_slice(&data).map_err(|e| {
                CommandError::environment(format!(
                    "bench --rdma: waiting for {what}, a message of {} bytes that is no control message ({e})",
                    data.len()
                ))
            });
        }
        if Instant::now() >= deadline {
            return Err(CommandError::environment(format!(
                "bench --rdma: waiting for {what}: nothing after {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The server's "got them all": tag, its retransmits, CRC errors, and how
/// many messages of this size it has received so far.
const DONE_TAG: u8 = 0xD0;

pub fn done_message(retransmits: u64, crc_errors: u64, received: u64) -> Vec<u8> {
    let mut done = vec![DONE_TAG];
    for value in [retransmits, crc_errors, received] {
        done.extend_from_slice(&value.to_le_bytes());
    }
    done
}

pub fn parse_done(data: &[u8]) -> Option<(u64, u64, u64)> {
    if data.len() != 25 || data[0] != DONE_TAG {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(data[1 + 8 * i..9 + 8 * i].try_into().expect("8"));
    Some((word(0), word(1), word(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_round_trip_and_bad_ones_are_refused() {
        let schedule = Schedule {
            sizes: vec![64, 4096],
            counts: vec![100, 16],
            windows: 3,
            lat_iters: 20,
            bw: true,
            lat: false,
        };
        assert_eq!(
            Schedule::from_json(&schedule.to_json()),
            Ok(schedule.clone())
        );
        let mut value = schedule.to_json();
        value["counts"] = json!([1]);
        assert!(Schedule::from_json(&value).is_err());
        value["barlink_bench_rdma"] = json!(99);
        assert!(Schedule::from_json(&value).unwrap_err().contains("version"));
    }

    #[test]
    fn done_messages_round_trip() {
        assert_eq!(parse_done(&done_message(3, 4, 5)), Some((3, 4, 5)));
        assert_eq!(parse_done(b"{\"rows\":[]}"), None);
    }
}
