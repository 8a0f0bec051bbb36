//! The control messages between client and server, over the link itself,
//! as serde types (JSON on the wire), and the server's binary "got them
//! all", which closes each timed window and so stays a few bytes.
//!
//! The order: the client's plan ([`Schedule`], with the protocol version
//! beside it) and the server's [`Answer`] with what it has
//! ([`ServerInfo`]); per size, after barlink's windows, the client's
//! [`Request`]s — with `--rdma`, a perftest run (the server answers [`Ready`] when its
//! side listens, and after the client's `Finished` an [`Answer`] on how
//! its side ended) — until the size's rows; at the end the server's
//! [`Bye`].

use std::time::{Duration, Instant};

use barlink_transport::link::{Link, Medium};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{STEP_TIMEOUT, link_error};
use crate::cli::CommandError;
use crate::cli::bench::rdma::perftest::Baseline;

/// Version of the control messages.
const PROTOCOL: u64 = 2;

/// What the client asks of the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub sizes: Vec<usize>,
    pub counts: Vec<usize>,
    pub windows: usize,
    pub lat_iters: usize,
    /// The client would run ib_write_bw / ib_write_lat.
    #[serde(rename = "ib_write_bw", default)]
    pub bw: bool,
    #[serde(rename = "ib_write_lat", default)]
    pub lat: bool,
}

/// The plan as it travels: the schedule with the protocol's version.
#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    barlink_bench_rdma: u64,
    #[serde(flatten)]
    schedule: Schedule,
}

/// The version a plan says it speaks, read before the rest, so that a
/// client of another version is told so rather than misread.
#[derive(Debug, Deserialize)]
struct Version {
    #[serde(default)]
    barlink_bench_rdma: Value,
}

impl Schedule {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(Plan {
            barlink_bench_rdma: PROTOCOL,
            schedule: self.clone(),
        })
        .expect("a plan always serializes")
    }

    pub fn from_json(value: &Value) -> Result<Schedule, String> {
        let version = Version::deserialize(value).map_err(|e| format!("plan: {e}"))?;
        if version.barlink_bench_rdma.as_u64() != Some(PROTOCOL) {
            return Err(format!(
                "the client speaks another version of bench --rdma/--tcp ({}); run the same barlink on both sides",
                version.barlink_bench_rdma
            ));
        }
        let schedule = Plan::deserialize(value)
            .map_err(|e| format!("plan: {e}"))?
            .schedule;
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

/// A yes, with what comes with it, or a no with the reason:
/// `{"ok": true, ...}` or `{"ok": false, "error": "..."}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Answer<T> {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten)]
    detail: Option<T>,
}

impl<T> Answer<T> {
    pub fn yes(detail: T) -> Answer<T> {
        Answer {
            ok: true,
            error: None,
            detail: Some(detail),
        }
    }

    pub fn no(error: impl Into<String>) -> Answer<T> {
        Answer {
            ok: false,
            error: Some(error.into()),
            detail: None,
        }
    }

    /// What came with a yes, or the reason of a no (`None` if it gave none).
    pub fn into_result(self) -> Result<T, Option<String>> {
        match (self.ok, self.detail) {
            (true, Some(detail)) => Ok(detail),
            _ => Err(self.error),
        }
    }
}

/// Nothing more than the yes.
#[derive(Debug, Serialize, Deserialize)]
pub struct Done {}

/// What the server has, in its answer to the plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerInfo {
    pub device: String,
    pub gid_index: Option<u32>,
    /// The TCP port its perftest listens on.
    pub perftest_port: u16,
    pub ib_write_bw: bool,
    pub ib_write_lat: bool,
}

/// The client's steps after its windows and round trips of a size.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Request {
    /// Start your side of this perftest run.
    Run {
        run: Baseline,
        size: usize,
        iters: usize,
    },
    /// My side of the run is over: collect yours.
    Finished { finished: Baseline },
    /// The size's rows, as printed with `--json`; the last size says so.
    Rows { rows: Vec<Value>, last: bool },
}

/// The server's side of a perftest run listens (or could not start).
#[derive(Debug, Serialize, Deserialize)]
pub struct Ready {
    ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Ready {
    pub fn result(result: Result<(), String>) -> Ready {
        match result {
            Ok(()) => Ready {
                ready: true,
                error: None,
            },
            Err(error) => Ready {
                ready: false,
                error: Some(error),
            },
        }
    }

    pub fn into_result(self) -> Result<(), Option<String>> {
        if self.ready { Ok(()) } else { Err(self.error) }
    }
}

/// The server is through; the client closes.
#[derive(Debug, Serialize, Deserialize)]
pub struct Bye {
    pub bye: bool,
}

pub fn send_control<M: Medium, B: AsRef<[u8]> + From<Vec<u8>>>(
    link: &mut Link<M, B>,
    message: &impl Serialize,
) -> Result<(), CommandError> {
    let bytes = serde_json::to_vec(message).expect("control messages always serialize");
    link.send_blocking(B::from(bytes), STEP_TIMEOUT)
        .map(|_| ())
        .map_err(link_error("sending a control message"))
}

pub fn recv_control<T: DeserializeOwned, M: Medium, B: AsRef<[u8]>>(
    link: &mut Link<M, B>,
    timeout: Duration,
    what: &str,
) -> Result<T, CommandError> {
    let data = link
        .recv(timeout)
        .map_err(|e| CommandError::environment(format!("bench: waiting for {what}: {e}")))?;
    serde_json::from_slice(&data).map_err(|e| {
        CommandError::environment(format!(
            "bench: waiting for {what}, a message of {} bytes that is no control message ({e}): \
             the two sides are out of step (same barlink and options on both?)",
            data.len()
        ))
    })
}

/// As [`recv_control`], but sleeping between polls: for waits while
/// perftest runs, which must not compete with a spinning receiver.
pub fn recv_control_gently<T: DeserializeOwned, M: Medium, B: AsRef<[u8]>>(
    link: &mut Link<M, B>,
    timeout: Duration,
    what: &str,
) -> Result<T, CommandError> {
    let deadline = Instant::now() + timeout;
    loop {
        let waiting = |e| CommandError::environment(format!("bench: waiting for {what}: {e}"));
        if let Some(data) = link.try_recv().map_err(waiting)? {
            return serde_json::from_slice(&data).map_err(|e| {
                CommandError::environment(format!(
                    "bench: waiting for {what}, a message of {} bytes that is no control message ({e})",
                    data.len()
                ))
            });
        }
        if Instant::now() >= deadline {
            return Err(CommandError::environment(format!(
                "bench: waiting for {what}: nothing after {timeout:?}"
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
    use serde_json::json;

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

    /// The messages read back as sent, with the same JSON fields as before
    /// they were types (`ok`/`error`, `ready`, `run`/`size`/`iters`,
    /// `finished`, `rows`/`last`, `bye`).
    #[test]
    fn control_messages_keep_their_json() {
        let info = ServerInfo {
            device: "rxe0".into(),
            gid_index: Some(1),
            perftest_port: 18516,
            ib_write_bw: true,
            ib_write_lat: false,
        };
        let yes = serde_json::to_value(Answer::yes(info)).unwrap();
        assert_eq!(yes["ok"], true);
        assert_eq!(yes["perftest_port"], 18516);
        assert!(yes.get("error").is_none());
        let back: Answer<ServerInfo> = serde_json::from_value(yes).unwrap();
        assert_eq!(back.into_result().unwrap().device, "rxe0");
        let no = serde_json::to_value(Answer::<ServerInfo>::no("bad plan")).unwrap();
        assert_eq!(no, json!({ "ok": false, "error": "bad plan" }));
        let back: Answer<ServerInfo> = serde_json::from_value(no).unwrap();
        assert_eq!(back.into_result().unwrap_err().as_deref(), Some("bad plan"));
        let done: Answer<Done> = serde_json::from_value(json!({ "ok": true })).unwrap();
        assert!(done.into_result().is_ok());
        assert_eq!(
            serde_json::to_value(Ready::result(Ok(()))).unwrap(),
            json!({ "ready": true })
        );
        let run = Request::Run {
            run: Baseline::Lat,
            size: 64,
            iters: 5,
        };
        assert_eq!(
            serde_json::to_value(&run).unwrap(),
            json!({ "run": "ib_write_lat", "size": 64, "iters": 5 })
        );
        let finished: Request =
            serde_json::from_value(json!({ "finished": "ib_write_bw" })).unwrap();
        assert!(matches!(
            finished,
            Request::Finished {
                finished: Baseline::Bw
            }
        ));
        let rows: Request = serde_json::from_value(json!({ "rows": [], "last": true })).unwrap();
        assert!(matches!(rows, Request::Rows { last: true, .. }));
        assert!(serde_json::from_value::<Request>(json!({ "what": 1 })).is_err());
    }

    #[test]
    fn done_messages_round_trip() {
        assert_eq!(parse_done(&done_message(3, 4, 5)), Some((3, 4, 5)));
        assert_eq!(parse_done(b"{\"rows\":[]}"), None);
    }
}
