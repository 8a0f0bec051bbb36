//! perftest (`ib_write_bw`, `ib_write_lat`) as the baseline: finding it,
//! its arguments, running it with a deadline, and reading its output.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::setup::Device;

/// An executable named `name` in `PATH`.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A perftest process with its output collected by two threads.
pub struct Tool {
    name: &'static str,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

fn reader(stream: Option<impl std::io::Read + Send + 'static>) -> Option<JoinHandle<String>> {
    let mut stream = stream?;
    Some(std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }))
}

impl Tool {
    pub fn spawn(name: &'static str, program: &Path, args: &[String]) -> Result<Tool, String> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        Ok(Tool {
            name,
            stdout: reader(child.stdout.take()),
            stderr: reader(child.stderr.take()),
            child,
        })
    }

    pub fn output(&mut self) -> String {
        let mut text = String::new();
        for handle in [self.stdout.take(), self.stderr.take()]
            .into_iter()
            .flatten()
        {
            text.push_str(&handle.join().unwrap_or_default());
        }
        text
    }

    /// Waits at most `limit`, calling `tick` meanwhile; kills it past that.
    pub fn wait(
        mut self,
        limit: Duration,
        mut tick: impl FnMut(),
    ) -> Result<(ExitStatus, String), String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let text = self.output();
                    return Ok((status, text));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("{}: {e}", self.name)),
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let text = self.output();
                return Err(format!(
                    "{} ran past {limit:?} and was killed; its output ended: {}",
                    self.name,
                    last_lines(&text, 3)
                ));
            }
            tick();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..]
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// perftest's common arguments: device, GID, size, iterations, port, QP timeout.
pub fn perftest_args(
    device: &Device,
    size: usize,
    iters: usize,
    port: u16,
    qp_timeout: u8,
) -> Vec<String> {
    let mut args = vec!["-d".into(), device.name.clone(), "-i".into(), "1".into()];
    if let Some(gid) = device.gid_index {
        args.extend(["-x".into(), gid.to_string()]);
    }
    args.extend([
        "-s".into(),
        size.to_string(),
        "-n".into(),
        iters.max(5).to_string(),
        "-p".into(),
        port.to_string(),
        "-u".into(),
        qp_timeout.to_string(),
        "-F".into(),
    ]);
    args
}

/// Which perftest tool, and its extra arguments (named by the tool in
/// control messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Baseline {
    #[serde(rename = "ib_write_bw")]
    Bw,
    #[serde(rename = "ib_write_lat")]
    Lat,
}

impl Baseline {
    pub fn tool(self) -> &'static str {
        match self {
            Baseline::Bw => "ib_write_bw",
            Baseline::Lat => "ib_write_lat",
        }
    }

    /// Arguments of this tool only. `ib_write_bw` reports in MB/sec (MiB)
    /// with two decimals: 8x the resolution of `--report_gbits`, which
    /// rounds soft-RoCE's small-message figures to 0.00.
    pub fn extra(self) -> &'static [&'static str] {
        &[]
    }
}

/// `ib_write_bw`'s average bandwidth in GB/s (10^9 bytes per second, as
/// barlink's `gbps`): the row after the `#bytes #iterations BW peak BW
/// average` header whose first number is `size`. Gb/sec (`--report_gbits`)
/// and MB/sec (perftest's MB are MiB) are both understood.
pub fn parse_write_bw(output: &str, size: usize) -> Option<f64> {
    let mut scale = None;
    for line in output.lines() {
        if line.contains("#bytes") && line.contains("BW average") {
            scale = Some(if line.contains("BW average[Gb/sec]") {
                1.0 / 8.0
            } else if line.contains("BW average[MB/sec]") || line.contains("BW average[MiB/sec]") {
                1_048_576.0 / 1e9
            } else {
                return None;
            });
            continue;
        }
        let Some(scale) = scale else { continue };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 4 && fields[0].parse::<usize>() == Ok(size) {
            let average: f64 = fields[3].parse().ok().filter(|v: &f64| v.is_finite())?;
            return Some(average * scale);
        }
    }
    None
}

/// `ib_write_lat`'s one-way latency (it halves the round trip itself):
/// (typical = median, 99th percentile) in microseconds; where it printed
/// only an average, that twice.
pub fn parse_write_lat(output: &str, size: usize) -> Option<(f64, f64)> {
    let mut typical = None;
    for line in output.lines() {
        if line.contains("#bytes") && line.contains("usec") {
            typical = Some(line.contains("t_typical"));
            continue;
        }
        let Some(typical) = typical else { continue };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 3 && fields[0].parse::<usize>() == Ok(size) {
            // perftest prints "nan" where its cycle counter failed it
            let number = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .filter(|v| v.is_finite())
            };
            return if typical {
                Some((number(4)?, number(7).or(number(3))?))
            } else {
                let avg = number(2)?;
                Some((avg, avg))
            };
        }
    }
    None
}

/// Whether a perftest client failed only because its server was not
/// listening yet (worth another try).
pub fn not_listening_yet(output: &str) -> bool {
    output.contains("Unable to open file descriptor for socket connection")
        || output.contains("Unable to init the socket connection")
        || output.contains("Couldn't connect")
}

/// Whether something listens on TCP `port` here (perftest's server).
pub fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && format!("{} ", fields[1]).ends_with(&hex) && fields[3] == "0A"
            })
        })
    })
}

/// Longest a perftest run of `bytes` may take: generous enough for
/// soft-RoCE under emulation, but bounded.
pub fn tool_limit(bytes: usize) -> Duration {
    Duration::from_secs(30 + (bytes / 2_000_000) as u64).min(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE_BW: &str = "
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rxe0
 Number of qps   : 1\t\tTransport type : IB
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      100              0.18               0.16   \t\t   0.000305
---------------------------------------------------------------------------------------
";

    const WRITE_LAT: &str = "
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 4096       20          310.25         2011.40      402.12     \t     455.32     \t  150.10  \t\t1900.00 \t\t2011.40 
---------------------------------------------------------------------------------------
";

    #[test]
    fn ib_write_bw_average_in_gigabytes_per_second() {
        let gbps = parse_write_bw(WRITE_BW, 65536).unwrap();
        assert!((gbps - 0.02).abs() < 1e-9, "{gbps}");
        assert_eq!(parse_write_bw(WRITE_BW, 4096), None, "another size");
        let mib = WRITE_BW
            .replace("Gb/sec", "MB/sec")
            .replace("0.16", "100.00");
        let gbps = parse_write_bw(&mib, 65536).unwrap();
        assert!((gbps - 0.104_857_6).abs() < 1e-9, "{gbps}");
        assert_eq!(
            parse_write_bw("Couldn't connect to 10.0.2.15:18516", 64),
            None
        );
    }

    #[test]
    fn ib_write_lat_typical_and_99th_percentile() {
        assert_eq!(parse_write_lat(WRITE_LAT, 4096), Some((402.12, 1900.0)));
        assert_eq!(parse_write_lat(WRITE_LAT, 64), None);
        let average =
            " #bytes        #iterations       t_avg[usec]    tps average\n 64  100  12.5  80000\n";
        assert_eq!(parse_write_lat(average, 64), Some((12.5, 12.5)));
        let nan = WRITE_LAT
            .replace("402.12", "nan")
            .replace("1900.00", "-nan");
        assert_eq!(parse_write_lat(&nan, 4096), None);
    }

    #[test]
    fn perftest_arguments() {
        let device = Device {
            name: "rxe0".into(),
            gid_index: Some(1),
        };
        assert_eq!(
            perftest_args(&device, 4096, 3, 18516, 18).join(" "),
            "-d rxe0 -i 1 -x 1 -s 4096 -n 5 -p 18516 -u 18 -F"
        );
        let ib = Device {
            name: "mlx5_0".into(),
            gid_index: None,
        };
        assert!(!perftest_args(&ib, 64, 100, 1, 14).contains(&"-x".to_string()));
    }

    #[test]
    fn a_perftest_that_overruns_is_killed() {
        let started = Instant::now();
        let tool = Tool::spawn("sleep", Path::new("/bin/sleep"), &["30".into()]).unwrap();
        let error = tool.wait(Duration::from_millis(200), || {}).unwrap_err();
        assert!(error.contains("killed"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
