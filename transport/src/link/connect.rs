//! Setting up a link between processes by name.
//!
//! The accepting side listens on a Unix socket in the abstract namespace
//! (`@barlink/<name>`: it vanishes with the process, so a crashed listener
//! leaves nothing stale behind, and a live one makes the name "in use").
//! Each side creates a memfd window, lays out its receive ring in it, and
//! hands the descriptor to the other over the socket (`SCM_RIGHTS`); each
//! then maps the other's window as the one it writes into. Every step has a
//! timeout.

use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::{RingLink, SetupError, init_ring};
use crate::engine::EngineConfig;
use crate::ring::Geometry;
use crate::window::{ShmOptions, ShmWindow, Window, recv_fd, send_fd};

/// How to set up a link between processes.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The engine on each side (both sides should agree on the MTU).
    pub engine: EngineConfig,
    /// Bytes of each side's receive window (control block plus slots).
    pub window_len: usize,
    /// Where and how the windows are backed (huge pages, ...).
    pub shm: ShmOptions,
    /// Longest wait for the peer during setup.
    pub setup_timeout: Duration,
}

impl Default for LinkConfig {
    /// 4 MiB rings (the size that moves data fastest on the development
    /// machine) with the default engine.
    fn default() -> Self {
        LinkConfig {
            engine: EngineConfig::default(),
            window_len: (4 << 20) + crate::ring::CONTROL_LEN,
            shm: ShmOptions::default(),
            setup_timeout: Duration::from_secs(10),
        }
    }
}

fn address(name: &str) -> Result<SocketAddr, SetupError> {
    if name.is_empty() || name.len() > 100 || name.contains('\0') {
        return Err(SetupError::Handshake {
            detail: format!("link name {name:?} must be 1 to 100 bytes without NUL"),
        });
    }
    SocketAddr::from_abstract_name(format!("barlink/{name}")).map_err(|error| SetupError::Io {
        operation: "making the socket address",
        error,
    })
}

/// The accepting side of links under one name.
#[derive(Debug)]
pub struct Listener {
    name: String,
    socket: UnixListener,
}

impl Listener {
    /// Claims `name`; fails with [`SetupError::NameInUse`] if a live process
    /// holds it.
    pub fn bind(name: &str) -> Result<Listener, SetupError> {
        let socket = UnixListener::bind_addr(&address(name)?).map_err(|error| {
            if error.kind() == ErrorKind::AddrInUse {
                SetupError::NameInUse {
                    name: name.to_string(),
                }
            } else {
                SetupError::Io {
                    operation: "binding the link name",
                    error,
                }
            }
        })?;
        socket
            .set_nonblocking(true)
            .map_err(|error| SetupError::Io {
                operation: "making the listener non-blocking",
                error,
            })?;
        Ok(Listener {
            name: name.to_string(),
            socket,
        })
    }

    /// Waits (at most `config.setup_timeout`) for a peer to connect and sets
    /// up the link.
    pub fn accept<B: AsRef<[u8]>>(
        &self,
        config: &LinkConfig,
    ) -> Result<RingLink<ShmWindow, B>, SetupError> {
        let (own, peer) = self.accept_windows(config)?;
        RingLink::new(own, peer, config.engine.clone(), GENERATION as u32)
    }

    /// Like [`Listener::accept`], but returns the two windows (own ring
    /// laid out, peer's received) without an engine: for baselines that
    /// move raw bytes through the same rings.
    pub fn accept_windows(
        &self,
        config: &LinkConfig,
    ) -> Result<(ShmWindow, ShmWindow), SetupError> {
        let deadline = Instant::now() + config.setup_timeout;
        let stream = loop {
            match self.socket.accept() {
                Ok((stream, _)) => break stream,
                Err(error) if error.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(SetupError::Timeout {
                            operation: "waiting for a peer to connect",
                            after: config.setup_timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(error) => {
                    return Err(SetupError::Io {
                        operation: "accepting a connection",
                        error,
                    });
                }
            }
        };
        stream
            .set_nonblocking(false)
            .map_err(|error| SetupError::Io {
                operation: "making the connection blocking",
                error,
            })?;
        exchange(&stream, config, &self.name, Role::Acceptor)
    }
}

/// Connects to the listener under `name` and sets up the link.
pub fn connect<B: AsRef<[u8]>>(
    name: &str,
    config: &LinkConfig,
) -> Result<RingLink<ShmWindow, B>, SetupError> {
    let (own, peer) = connect_windows(name, config)?;
    RingLink::new(own, peer, config.engine.clone(), GENERATION as u32)
}

/// Like [`connect`], but returns the two windows without an engine.
pub fn connect_windows(
    name: &str,
    config: &LinkConfig,
) -> Result<(ShmWindow, ShmWindow), SetupError> {
    let deadline = Instant::now() + config.setup_timeout;
    let addr = address(name)?;
    let stream = loop {
        match UnixStream::connect_addr(&addr) {
            Ok(stream) => break stream,
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => {
                if Instant::now() >= deadline {
                    return Err(SetupError::NoListener {
                        name: name.to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => {
                return Err(SetupError::Io {
                    operation: "connecting to the link name",
                    error,
                });
            }
        }
    };
    exchange(&stream, config, name, Role::Connector)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Acceptor,
    Connector,
}

/// The generation of a ring in a fresh memfd window: every connection gets
/// new windows, so nothing of an earlier session can be in them.
const GENERATION: u64 = 1;

/// Creates this side's window and swaps descriptors with the peer.
fn exchange(
    stream: &UnixStream,
    config: &LinkConfig,
    name: &str,
    role: Role,
) -> Result<(ShmWindow, ShmWindow), SetupError> {
    config.engine.validate()?;
    let label = format!("barlink-{name}-{}", std::process::id());
    let own = ShmWindow::create_memfd(&label, config.window_len, &config.shm)?;
    let geometry = Geometry::for_window(own.len(), config.engine.mtu)?;
    init_ring(&own, geometry, GENERATION)?;
    let timeout = config.setup_timeout;
    let peer_fd = match role {
        Role::Connector => {
            send_fd(stream, own.fd(), timeout)?;
            recv_fd(stream, timeout)?
        }
        Role::Acceptor => {
            let fd = recv_fd(stream, timeout)?;
            send_fd(stream, own.fd(), timeout)?;
            fd
        }
    };
    let peer = ShmWindow::from_fd(peer_fd)?;
    tracing::info!(
        name,
        ?role,
        own_len = own.len(),
        peer_len = peer.len(),
        mtu = config.engine.mtu,
        "memfd rings exchanged"
    );
    Ok((own, peer))
}
