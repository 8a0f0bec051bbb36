//! How big a TCP link's socket buffers are.
//!
//! A connection carries at most one socket buffer per round trip, so a
//! path needs buffers of its bandwidth-delay product: 25 Gb/s at 0.1 ms
//! (one rack) is 0.3 MB, at 10 ms (across a city) 31 MB. By default
//! barlink leaves them to the kernel, whose autotuning grows each one
//! with the connection up to `net.ipv4.tcp_wmem`'s and `tcp_rmem`'s
//! maximum (often 4 and 6 MiB); setting a size turns autotuning off, as
//! iperf3's `-w` does. A path whose product is beyond those maxima needs
//! them raised on both nodes, or a size of its own
//! ([`super::TcpLinkOptions::socket_buffer`], `BARLINK_TCP_SOCKET_BUFFER`).
#![forbid(unsafe_code)]

use std::fmt;
use std::net::TcpStream;

use rustix::net::sockopt;

use crate::units::parse_size;

/// The variable that sets the size where the options do not.
pub const SOCKET_BUFFER_VARIABLE: &str = "BARLINK_TCP_SOCKET_BUFFER";

/// How big a connection's socket buffers are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SocketBuffers {
    /// The kernel's autotuning, up to `net.ipv4.tcp_wmem`/`tcp_rmem`'s
    /// maximum.
    #[default]
    Autotuned,
    /// `SO_SNDBUF` and `SO_RCVBUF` of this many bytes each.
    Fixed(usize),
}

impl SocketBuffers {
    /// `explicit` if given, else what [`SOCKET_BUFFER_VARIABLE`] says
    /// (read through `var`), else autotuning.
    pub fn resolve(
        explicit: Option<usize>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<SocketBuffers, String> {
        let (bytes, source) = match explicit {
            Some(bytes) => (bytes, "the link's options"),
            None => match var(SOCKET_BUFFER_VARIABLE).filter(|v| !v.trim().is_empty()) {
                None => return Ok(SocketBuffers::Autotuned),
                Some(text) => (
                    parse_size(&text).map_err(|e| format!("{SOCKET_BUFFER_VARIABLE}: {e}"))?,
                    SOCKET_BUFFER_VARIABLE,
                ),
            },
        };
        // The kernel's floor is a few KiB; below 64 KiB a connection could
        // not hold one packet of a link in flight.
        if !(64 << 10..=1 << 30).contains(&bytes) {
            return Err(format!(
                "{source}: a socket buffer of {bytes} bytes; give 64K to 1G (the path's bandwidth times its round trip)"
            ));
        }
        Ok(SocketBuffers::Fixed(bytes))
    }

    /// Sets the buffers of `stream` (nothing for autotuning). Beyond
    /// `net.core.wmem_max`/`rmem_max` only a privileged process gets the
    /// size asked for; others get the maximum, as `buffer_sizes` shows.
    pub fn apply(self, stream: &TcpStream) -> std::io::Result<()> {
        let SocketBuffers::Fixed(bytes) = self else {
            return Ok(());
        };
        if sockopt::set_socket_send_buffer_size_force(stream, bytes).is_err() {
            sockopt::set_socket_send_buffer_size(stream, bytes)?;
        }
        if sockopt::set_socket_recv_buffer_size_force(stream, bytes).is_err() {
            sockopt::set_socket_recv_buffer_size(stream, bytes)?;
        }
        Ok(())
    }
}

impl fmt::Display for SocketBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketBuffers::Autotuned => match autotuning_limits() {
                Some((send, recv)) => write!(
                    f,
                    "socket buffers autotuned up to {} send, {} receive (net.ipv4.tcp_wmem, tcp_rmem)",
                    mib(send),
                    mib(recv)
                ),
                None => f.write_str("socket buffers autotuned by the kernel"),
            },
            SocketBuffers::Fixed(bytes) => write!(f, "socket buffers of {} each", mib(*bytes)),
        }
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// The send and receive buffer sizes of `stream` now, as the kernel
/// reports them (twice what it lets the data use: the rest is its
/// bookkeeping).
pub fn buffer_sizes(stream: &TcpStream) -> std::io::Result<(usize, usize)> {
    Ok((
        sockopt::socket_send_buffer_size(stream)?,
        sockopt::socket_recv_buffer_size(stream)?,
    ))
}

/// The most autotuning grows a send and a receive buffer to, from procfs.
pub fn autotuning_limits() -> Option<(usize, usize)> {
    let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).ok();
    Some((
        third_field(&read("tcp_wmem")?)?,
        third_field(&read("tcp_rmem")?)?,
    ))
}

/// The maximum of a `min default max` triple.
fn third_field(text: &str) -> Option<usize> {
    text.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_comes_from_the_options_then_the_variable() {
        let none = |_: &str| None;
        let set = |value: &'static str| move |_: &str| Some(value.to_string());
        assert_eq!(
            SocketBuffers::resolve(None, none),
            Ok(SocketBuffers::Autotuned)
        );
        assert_eq!(
            SocketBuffers::resolve(None, set(" ")),
            Ok(SocketBuffers::Autotuned)
        );
        assert_eq!(
            SocketBuffers::resolve(None, set("8M")),
            Ok(SocketBuffers::Fixed(8 << 20))
        );
        assert_eq!(
            SocketBuffers::resolve(Some(1 << 20), set("8M")),
            Ok(SocketBuffers::Fixed(1 << 20))
        );
        let bad = SocketBuffers::resolve(None, set("lots")).unwrap_err();
        assert!(bad.starts_with(SOCKET_BUFFER_VARIABLE), "{bad}");
        let tiny = SocketBuffers::resolve(Some(4096), none).unwrap_err();
        assert!(tiny.contains("64K to 1G"), "{tiny}");
        let huge = SocketBuffers::resolve(None, set("4G")).unwrap_err();
        assert!(huge.starts_with(SOCKET_BUFFER_VARIABLE), "{huge}");
    }

    #[test]
    fn the_autotuning_maximum_is_the_third_field() {
        assert_eq!(third_field("4096\t131072\t6291456\n"), Some(6_291_456));
        assert_eq!(third_field("4096 16384"), None);
        assert_eq!(third_field("a b c"), None);
    }

    #[test]
    fn a_fixed_size_reaches_the_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let before = buffer_sizes(&stream).unwrap();
        SocketBuffers::Autotuned.apply(&stream).unwrap();
        assert_eq!(buffer_sizes(&stream).unwrap(), before);
        SocketBuffers::Fixed(1 << 20).apply(&stream).unwrap();
        let (send, recv) = buffer_sizes(&stream).unwrap();
        // The kernel reports twice what it grants; unprivileged, it caps
        // what it grants at net.core.wmem_max/rmem_max.
        for (what, got) in [("send", send), ("receive", recv)] {
            assert!((128 << 10..=2 << 20).contains(&got), "{what}: {got}");
        }
    }
}
