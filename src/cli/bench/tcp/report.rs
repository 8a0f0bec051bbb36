//! The rows of `bench --tcp`: barlink's, iperf3's and the ping-pong's, as
//! a table or one JSON object per line, printed by the client and, sent
//! over, by the server too.

use std::io::Write;

use barlink::connect::PathDecision;
use barlink_transport::EngineConfig;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cli::bench::report::{common_json, print_cpu_line, round};
use crate::cli::human_size;

/// The path name of barlink's rows.
pub const PATH: &str = "barlink-tcp";
/// The bandwidth baseline's rows.
pub const IPERF3: &str = "iperf3";
/// The latency baseline's rows.
pub const PING_PONG: &str = "tcp-ping-pong";

#[derive(Debug, Clone, Default)]
pub struct Row {
    pub path: &'static str,
    pub size: usize,
    pub gbps: Option<f64>,
    pub lat: Option<(f64, f64)>,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub ratio: Option<f64>,
    pub lat_ratio: Option<f64>,
    pub messages: u64,
    pub lost: u64,
}

pub struct TcpBenchContext {
    pub role: &'static str,
    pub decision: PathDecision,
    pub encrypted: bool,
    pub json: bool,
}

pub fn row_json(row: &Row, ctx: &TcpBenchContext, config: &EngineConfig) -> Value {
    let (p50, p99) = row.lat.unwrap_or((0.0, 0.0));
    let mut value = common_json(
        row.path,
        row.size,
        [row.gbps.unwrap_or(0.0), p50, p99],
        [row.retransmits, row.crc_errors],
        config,
    );
    if row.gbps.is_none() {
        value.insert("gbps".into(), Value::Null);
    }
    if row.lat.is_none() {
        value.insert("lat_p50_us".into(), Value::Null);
        value.insert("lat_p99_us".into(), Value::Null);
    }
    value.insert("path_decision".into(), json!(ctx.decision.to_string()));
    value.insert("encrypted".into(), json!(ctx.encrypted && row.path == PATH));
    if row.path == PATH {
        value.insert("messages".into(), json!(row.messages));
        value.insert("lost".into(), json!(row.lost));
        if let Some(ratio) = row.ratio {
            value.insert("ratio_to_iperf3".into(), json!(round(ratio, 3)));
        }
        if let Some(ratio) = row.lat_ratio {
            value.insert("lat_ratio_to_tcp_ping_pong".into(), json!(round(ratio, 3)));
        }
    } else {
        value.insert("tool".into(), json!(row.path));
    }
    Value::Object(value)
}

pub fn print_header(
    ctx: &TcpBenchContext,
    config: &EngineConfig,
    peer: &str,
    windows: usize,
    baseline: &str,
) {
    if ctx.json {
        return;
    }
    println!(
        "# barlink bench --tcp ({} of {peer}): packets framed over one TCP connection{}",
        ctx.role,
        if ctx.encrypted {
            ", each sealed (AES-256-GCM)"
        } else {
            ""
        }
    );
    println!("# path {}", ctx.decision);
    println!(
        "# MTU {}  window {}  CRC {}  {windows} timed windows per size (medians); latency = round trip / 2",
        config.mtu,
        config.send_window,
        if config.crc { "on" } else { "off" },
    );
    print_cpu_line();
    println!("# baselines in the same run: {baseline}");
    println!(
        "# {:>8}  {:<14} {:>8} {:>10} {:>11} {:>11} {:>13} {:>8} {:>8}",
        "size",
        "path",
        "GB/s",
        "vs iperf3",
        "lat p50 us",
        "lat p99 us",
        "vs ping-pong",
        "retrans",
        "crc_err"
    );
}

/// What the table shows of a row (its JSON carries more).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TableRow {
    size_bytes: usize,
    path: String,
    gbps: Option<f64>,
    ratio_to_iperf3: Option<f64>,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
    lat_ratio_to_tcp_ping_pong: Option<f64>,
    retransmits: u64,
    crc_errors: u64,
}

/// Prints a row as `row_json` made it: the JSON itself, or a table line.
pub fn print_row_value(value: &Value, json_mode: bool) {
    if json_mode {
        println!("{value}");
    } else {
        let row = TableRow::deserialize(value).unwrap_or_default();
        let number = |value: Option<f64>, digits: usize| {
            value.map_or("-".to_string(), |v| format!("{v:.digits$}"))
        };
        let ratio = |value: Option<f64>| value.map_or("-".to_string(), |r| format!("{r:.2}x"));
        println!(
            "  {:>8}  {:<14} {:>8} {:>10} {:>11} {:>11} {:>13} {:>8} {:>8}",
            human_size(row.size_bytes),
            row.path,
            number(row.gbps, 3),
            ratio(row.ratio_to_iperf3),
            number(row.lat_p50_us, 2),
            number(row.lat_p99_us, 2),
            ratio(row.lat_ratio_to_tcp_ping_pong),
            row.retransmits,
            row.crc_errors,
        );
    }
    let _ = std::io::stdout().flush();
}

pub fn note(message: &str) {
    eprintln!("barlink bench --tcp: {message}");
}
