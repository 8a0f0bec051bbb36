//! The baselines of `bench --tcp`: iperf3 for bandwidth, and a plain TCP
//! ping-pong (what an application writing to a socket gets) for latency.
//! The server runs both for the whole session; the client measures.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cli::bench::rdma::perftest::{Tool, last_lines, listening};

/// `iperf3 -s` on `port` until dropped, once it listens.
pub fn start_iperf3_server(program: &Path, port: u16) -> Result<Tool, String> {
    let args = ["-s".to_string(), "-p".to_string(), port.to_string()];
    let mut tool = Tool::spawn("iperf3", program, &args)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(port) && tool.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if tool.running() && listening(port) {
        Ok(tool)
    } else {
        Err(format!(
            "iperf3 -s did not listen on port {port}: {}",
            last_lines(&tool.output(), 3)
        ))
    }
}

/// `iperf3 -c` against `host:port` with writes of `size` bytes for
/// `seconds` (the first one omitted, as TCP ramps up): its GB/s.
pub fn iperf3_client(
    program: &Path,
    host: &str,
    port: u16,
    size: usize,
    seconds: u32,
) -> Result<f64, String> {
    let args: Vec<String> = [
        "-c",
        host,
        "-p",
        &port.to_string(),
        "-l",
        &size.to_string(),
        "-t",
        &seconds.to_string(),
        "-O",
        "1",
        "-J",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tool = Tool::spawn("iperf3", program, &args)?;
    let (status, output) = tool.wait(Duration::from_secs(u64::from(seconds) + 30), || {})?;
    if !status.success() {
        return Err(format!(
            "iperf3 -c exited with {status}: {}",
            last_lines(&output, 3)
        ));
    }
    parse_iperf3(&output).ok_or_else(|| {
        format!(
            "no bandwidth in iperf3's output: {}",
            last_lines(&output, 3)
        )
    })
}

/// The received bandwidth of an `iperf3 -J` report, in GB/s.
pub fn parse_iperf3(json: &str) -> Option<f64> {
    let start = json.find('{')?;
    let value: serde_json::Value = serde_json::from_str(&json[start..]).ok()?;
    let bits = value["end"]["sum_received"]["bits_per_second"].as_f64()?;
    (bits > 0.0).then_some(bits / 8e9)
}

/// The ping-pong echo: a thread that takes connections on a port and
/// sends back every message (a 4-byte length first, then messages of that
/// length) until the connection ends; stopped when dropped. The port is
/// open to anyone, so a connection announcing more than `max_len` bytes is
/// dropped, and at most [`MAX_ECHO_CONNECTIONS`] are served at once.
pub struct EchoServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

/// Connections the echo serves at once (the client uses one at a time).
const MAX_ECHO_CONNECTIONS: usize = 4;

impl EchoServer {
    pub fn start(addr: impl ToSocketAddrs, max_len: usize) -> Result<EchoServer, String> {
        let listener = TcpListener::bind(addr).map_err(|e| format!("the ping-pong echo: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let serving = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) if serving.load(Ordering::Relaxed) < MAX_ECHO_CONNECTIONS => {
                        serving.fetch_add(1, Ordering::Relaxed);
                        let serving = serving.clone();
                        std::thread::spawn(move || {
                            let _ = echo_connection(stream, max_len);
                            serving.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    // Too many at once: this one is dropped.
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(EchoServer { port, stop })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn echo_connection(mut stream: TcpStream, max_len: usize) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max_len {
        // Not the client's: it announces only sizes of its plan.
        return Ok(());
    }
    let mut buf = vec![0u8; len];
    loop {
        stream.read_exact(&mut buf)?;
        stream.write_all(&buf)?;
    }
}

/// `iters` round trips of `size` bytes to the echo at `addr`: one-way
/// times in microseconds.
pub fn ping_pong(addr: SocketAddr, size: usize, iters: usize) -> Result<Vec<f64>, String> {
    let failed = |e: std::io::Error| format!("the TCP ping-pong to {addr}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(failed)?;
    stream
        .write_all(&u32::try_from(size).unwrap_or(u32::MAX).to_le_bytes())
        .map_err(failed)?;
    let message = vec![0x5Au8; size];
    let mut back = vec![0u8; size];
    let mut latencies = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        stream.write_all(&message).map_err(failed)?;
        stream.read_exact(&mut back).map_err(failed)?;
        latencies.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_reports_parse() {
        let json = r#"{"end": {"sum_received": {"bits_per_second": 16000000000.0}}}"#;
        assert_eq!(parse_iperf3(json), Some(2.0));
        assert_eq!(parse_iperf3("iperf3: error - unable to connect"), None);
    }

    #[test]
    fn the_ping_pong_echoes() {
        let echo = EchoServer::start("127.0.0.1:0", 4096).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", echo.port).parse().unwrap();
        let latencies = ping_pong(addr, 64, 10).unwrap();
        assert_eq!(latencies.len(), 10);
        // More than the plan's largest message: dropped, nothing allocated.
        assert!(ping_pong(addr, 1 << 20, 1).is_err());
        assert!(latencies.iter().all(|&l| l > 0.0));
    }
}
