//! The rows of `bench --rdma`: barlink's and perftest's, as a table or one
//! JSON object per line, printed by the client and, sent over, by the
//! server too.

use std::io::Write;

use barlink::connect::PathDecision;
use barlink_transport::EngineConfig;
use serde::Deserialize;
use serde_json::{Value, json};

use super::setup::Device;
use crate::cli::bench::report::{common_json, print_cpu_line, round};
use crate::cli::human_size;

/// The path name of barlink's rows.
pub const PATH: &str = "barlink-rdma";

#[derive(Debug, Clone, Default)]
pub struct Row {
    pub path: &'static str,
    pub size: usize,
    pub gbps: f64,
    pub lat: Option<(f64, f64)>,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub ratio: Option<f64>,
    pub messages: u64,
    pub lost: u64,
    pub iterations: usize,
}

pub struct RdmaBenchContext {
    pub role: &'static str,
    pub decision: PathDecision,
    pub device: Device,
    pub json: bool,
}

pub fn row_json(row: &Row, ctx: &RdmaBenchContext, config: &EngineConfig) -> Value {
    let (p50, p99) = row.lat.unwrap_or((0.0, 0.0));
    let mut value = common_json(
        row.path,
        row.size,
        [row.gbps, p50, p99],
        [row.retransmits, row.crc_errors],
        config,
    );
    // Six decimals, not common_json's three: under emulation small
    // messages move so slowly that three would round them to 0.
    value.insert("gbps".into(), json!(round(row.gbps, 6)));
    if row.lat.is_none() {
        value.insert("lat_p50_us".into(), Value::Null);
        value.insert("lat_p99_us".into(), Value::Null);
    }
    value.insert("path_decision".into(), json!(ctx.decision.to_string()));
    value.insert("device".into(), json!(ctx.device.name));
    if row.path == PATH {
        value.insert("messages".into(), json!(row.messages));
        value.insert("lost".into(), json!(row.lost));
        if let Some(ratio) = row.ratio {
            value.insert("ratio_to_ib_write_bw".into(), json!(round(ratio, 3)));
        }
    } else {
        value.insert("tool".into(), json!("perftest"));
        value.insert("iterations".into(), json!(row.iterations));
        if row.lat.is_some() {
            value.insert("lat_from".into(), json!("ib_write_lat"));
        }
    }
    Value::Object(value)
}

pub fn print_header(
    ctx: &RdmaBenchContext,
    config: &EngineConfig,
    peer: &str,
    windows: usize,
    baseline: &str,
) {
    if ctx.json {
        return;
    }
    println!(
        "# barlink bench --rdma ({} of {peer}): messages as RDMA WRITE WITH IMM into the peer's registered ring",
        ctx.role
    );
    println!("# path {}", ctx.decision);
    println!(
        "# device {}{}  MTU {}  window {}  CRC {}  {windows} timed windows per size (medians); latency = round trip / 2",
        ctx.device.name,
        ctx.device
            .gid_index
            .map(|g| format!(" GID index {g}"))
            .unwrap_or_default(),
        config.mtu,
        config.send_window,
        if config.crc { "on" } else { "off" },
    );
    print_cpu_line();
    println!("# baseline in the same run: {baseline}");
    println!(
        "# {:>8}  {:<14} {:>8} {:>14} {:>11} {:>11} {:>8} {:>8}",
        "size", "path", "GB/s", "vs ib_write_bw", "lat p50 us", "lat p99 us", "retrans", "crc_err"
    );
}

/// What the table shows of a row (its JSON carries more).
#[derive(Debug, Deserialize)]
#[serde(default)]
struct TableRow {
    size_bytes: usize,
    path: String,
    gbps: Option<f64>,
    ratio_to_ib_write_bw: Option<f64>,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
    retransmits: u64,
    crc_errors: u64,
}

impl Default for TableRow {
    fn default() -> Self {
        TableRow {
            size_bytes: 0,
            path: "?".into(),
            gbps: None,
            ratio_to_ib_write_bw: None,
            lat_p50_us: None,
            lat_p99_us: None,
            retransmits: 0,
            crc_errors: 0,
        }
    }
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
        let ratio = row
            .ratio_to_ib_write_bw
            .map_or("-".to_string(), |r| format!("{r:.2}x"));
        println!(
            "  {:>8}  {:<14} {:>8} {:>14} {:>11} {:>11} {:>8} {:>8}",
            human_size(row.size_bytes),
            row.path,
            number(row.gbps, 4),
            ratio,
            number(row.lat_p50_us, 2),
            number(row.lat_p99_us, 2),
            row.retransmits,
            row.crc_errors,
        );
    }
    let _ = std::io::stdout().flush();
}

pub fn note(message: &str) {
    eprintln!("barlink bench --rdma: {message}");
}
