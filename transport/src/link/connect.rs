//! Setting up a link between processes by name.
//!
//! The accepting side listens on a Unix socket in the abstract namespace
//! (`@barlink/<name>`: it vanishes with the process, so a crashed listener
//! leaves nothing stale behind, and a live one makes the name "in use").
//! Each side creates a memfd window, lays out its receive ring in it, and
//! hands the descriptor to the other over the socket (`SCM_RIGHTS`); each
//! then maps the other's window as the one it writes into. Every step has a
//! timeout.
//!
//! Any local user can reach an abstract socket, so each side first reads
//! who the other is (`SO_PEERCRED`, see [`super::credentials`]):
//!
//! 1. The listener accepts a connection and answers at once with a verdict,
//!    [`WELCOME`] or [`REFUSED`]. A refused client is logged and counted,
//!    and the listener goes on listening.
//! 2. The client checks the listener's user before reading the verdict; a
//!    listener it does not admit (a squatter on the name) gets nothing.
//! 3. A welcomed client sends its window's descriptor, the listener sends
//!    its own back.
//!
//! The listener holds many handshakes at once and gives each
//! [`LinkConfig::handshake_timeout`], so idle or slow connections cost the
//! real peer nothing ([`ListenerStats`] counts what was dropped).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::credentials::{AllowedPeers, PeerCredentials, own_uid};
use super::{RingLink, SetupError, init_ring};
use crate::engine::EngineConfig;
use crate::ring::Geometry;
use crate::window::{ShmOptions, ShmWindow, Window, recv_fd, send_fd, try_recv_fd};

/// The listener's answer to a client it admits.
pub const WELCOME: [u8; 4] = *b"BLA+";
/// The listener's answer to a client of a user it does not admit.
pub const REFUSED: [u8; 4] = *b"BLA-";

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
    /// Which other local users may be the peer (by default: the same user,
    /// plus what `BARLINK_ALLOW_UIDS`/`BARLINK_ALLOW_GIDS` name).
    pub allow: AllowedPeers,
    /// Longest a listener waits for one connection's descriptor before it
    /// drops that connection and serves the others.
    pub handshake_timeout: Duration,
    /// Most connections a listener holds in handshake at once; the oldest
    /// is dropped to make room for a new one.
    pub max_pending_handshakes: usize,
}

impl Default for LinkConfig {
    /// 4 MiB rings (the size that moves data fastest on the development
    /// machine) with the default engine.
    fn default() -> Self {
        LinkConfig {
            engine: EngineConfig::default(),
            window_len: crate::ring::Geometry::window_len_for(4 << 20),
            shm: ShmOptions::default(),
            setup_timeout: Duration::from_secs(10),
            allow: AllowedPeers::default(),
            handshake_timeout: Duration::from_secs(2),
            max_pending_handshakes: 64,
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

/// What a listener turned away, over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Clients of a user the listener does not admit.
    pub refused: u64,
    /// Connections that sent no descriptor within the handshake timeout.
    pub timed_out: u64,
    /// Connections that closed, or sent something other than a window.
    pub malformed: u64,
    /// Connections dropped because too many were in handshake.
    pub evicted: u64,
    /// Links set up.
    pub accepted: u64,
}

/// The accepting side of links under one name.
#[derive(Debug)]
pub struct Listener {
    name: String,
    socket: UnixListener,
    stats: Mutex<ListenerStats>,
    /// Connections welcomed and waiting for their descriptor, kept from one
    /// accept to the next: peers that connect together are all served, one
    /// per accept, rather than dropped when the first is taken.
    pending: Mutex<VecDeque<Pending>>,
}

/// A connection the listener welcomed and waits on for a descriptor.
#[derive(Debug)]
struct Pending {
    stream: UnixStream,
    peer: PeerCredentials,
    since: Instant,
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
            stats: Mutex::new(ListenerStats::default()),
            pending: Mutex::new(VecDeque::new()),
        })
    }

    /// What this listener turned away and accepted so far.
    pub fn stats(&self) -> ListenerStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, what: impl FnOnce(&mut ListenerStats)) {
        what(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Waits (at most `config.setup_timeout`) for an admitted peer to
    /// connect and sets up the link. Connections that are refused, idle or
    /// malformed are dropped and counted; the wait goes on.
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
        config.engine.validate()?;
        let allow = config.allow.resolve()?;
        let own_uid = own_uid();
        let deadline = Instant::now() + config.setup_timeout;
        // Accepts on other threads wait here: one serves the queue at a time.
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut last_failure: Option<String> = None;
        loop {
            let mut busy = false;
            while let Some(stream) = self.next_connection()? {
                busy = true;
                if let Some(admitted) = self.admit(stream, &allow, own_uid) {
                    if pending.len() >= config.max_pending_handshakes.max(1) {
                        pending.pop_front();
                        self.count(|s| s.evicted += 1);
                    }
                    pending.push_back(admitted);
                }
            }
            let now = Instant::now();
            let mut index = 0;
            while index < pending.len() {
                let connection = &pending[index];
                match try_recv_fd(&connection.stream) {
                    Ok(Some(peer_fd)) => {
                        busy = true;
                        let connection = pending.remove(index).expect("index is in range");
                        match self.finish(connection, peer_fd, config) {
                            Ok(windows) => {
                                self.count(|s| s.accepted += 1);
                                return Ok(windows);
                            }
                            Err(failure) => last_failure = Some(failure),
                        }
                    }
                    Ok(None) if now.duration_since(connection.since) < config.handshake_timeout => {
                        index += 1;
                    }
                    Ok(None) => {
                        tracing::warn!(
                            name = self.name,
                            peer = %connection.peer,
                            after = ?config.handshake_timeout,
                            "dropped a connection that sent no window descriptor in time"
                        );
                        pending.remove(index);
                        self.count(|s| s.timed_out += 1);
                    }
                    Err(error) => {
                        tracing::warn!(name = self.name, peer = %connection.peer, %error, "dropped a connection");
                        last_failure = Some(format!("a client ({}): {error}", connection.peer));
                        pending.remove(index);
                        self.count(|s| s.malformed += 1);
                    }
                }
            }
            if Instant::now() >= deadline {
                let mut operation = "waiting for a peer to connect";
                if let Some(failure) = last_failure {
                    tracing::warn!(name = self.name, failure, "no peer completed the setup");
                    operation = "waiting for a peer to complete the setup (see the log for the last failure)";
                }
                return Err(SetupError::Timeout {
                    operation,
                    after: config.setup_timeout,
                });
            }
            if !busy {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    fn next_connection(&self) -> Result<Option<UnixStream>, SetupError> {
        match self.socket.accept() {
            Ok((stream, _)) => Ok(Some(stream)),
            Err(error) if error.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(error) if error.kind() == ErrorKind::ConnectionAborted => Ok(None),
            // Out of descriptors (a flood can cause it): the held
            // handshakes time out and free some; keep waiting.
            Err(error)
                if [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE]
                    .iter()
                    .any(|e| error.raw_os_error() == Some(e.raw_os_error())) =>
            {
                tracing::debug!(name = self.name, %error, "accept deferred");
                Ok(None)
            }
            Err(error) => Err(SetupError::Io {
                operation: "accepting a connection",
                error,
            }),
        }
    }

    /// Reads who connected and answers with the verdict; `None` when the
    /// connection is refused or already gone.
    fn admit(&self, stream: UnixStream, allow: &AllowedPeers, own_uid: u32) -> Option<Pending> {
        let peer = match PeerCredentials::of_socket(&stream) {
            Ok(peer) => peer,
            Err(error) => {
                tracing::warn!(name = self.name, %error, "dropped a connection");
                self.count(|s| s.malformed += 1);
                return None;
            }
        };
        // A fresh socket has room for four bytes; a client that already
        // left makes the write fail, and it is dropped.
        let _ = stream.set_nonblocking(true);
        if !allow.admits(&peer, own_uid) {
            let _ = send_small(&stream, &REFUSED);
            tracing::warn!(
                name = self.name,
                %peer,
                allowed = allow.describe(),
                "refused a client of a user this listener does not admit"
            );
            self.count(|s| s.refused += 1);
            return None;
        }
        if let Err(error) =
            send_small(&stream, &WELCOME).and_then(|()| stream.set_nonblocking(false))
        {
            tracing::warn!(name = self.name, %peer, %error, "dropped a connection");
            self.count(|s| s.malformed += 1);
            return None;
        }
        Some(Pending {
            stream,
            peer,
            since: Instant::now(),
        })
    }

    /// Maps the client's window and sends it ours; a failure is that
    /// client's alone and comes back as words for the log.
    fn finish(
        &self,
        connection: Pending,
        peer_fd: std::os::fd::OwnedFd,
        config: &LinkConfig,
    ) -> Result<(ShmWindow, ShmWindow), String> {
        let result = (|| {
            let peer = ShmWindow::from_fd(peer_fd)?;
            let own = own_window(config, &self.name)?;
            send_fd(&connection.stream, own.fd(), config.handshake_timeout)?;
            Ok::<_, SetupError>((own, peer))
        })();
        match result {
            Ok((own, peer)) => {
                tracing::info!(
                    name = self.name,
                    peer = %connection.peer,
                    own_len = own.len(),
                    peer_len = peer.len(),
                    mtu = config.engine.mtu,
                    "memfd rings exchanged"
                );
                Ok((own, peer))
            }
            Err(error) => {
                tracing::warn!(name = self.name, peer = %connection.peer, %error, "a client's setup failed");
                self.count(|s| s.malformed += 1);
                Err(format!("a client ({}): {error}", connection.peer))
            }
        }
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
    config.engine.validate()?;
    let allow = config.allow.resolve()?;
    let deadline = Instant::now() + config.setup_timeout;
    let addr = address(name)?;
    // Made before connecting, so that the listener's handshake timeout
    // covers only the socket round trips.
    let own = own_window(config, name)?;
    let mut stream = loop {
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
    let listener = PeerCredentials::of_socket(&stream)?;
    let own_uid = own_uid();
    if !allow.admits(&listener, own_uid) {
        return Err(SetupError::PeerNotAllowed {
            peer_is: "listener",
            peer: listener,
            own_uid,
            allowed: allow.describe(),
        });
    }
    let remaining = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    match read_verdict(&mut stream, remaining())? {
        WELCOME => {}
        REFUSED => return Err(SetupError::RefusedByPeer { listener, own_uid }),
        other => {
            return Err(SetupError::Handshake {
                detail: format!(
                    "the listener ({listener}) answered {other:?}, not a barlink verdict: run the same barlink version on both sides"
                ),
            });
        }
    }
    send_fd(&stream, own.fd(), remaining())?;
    let peer = ShmWindow::from_fd(recv_fd(&stream, remaining())?)?;
    tracing::info!(
        name,
        %listener,
        own_len = own.len(),
        peer_len = peer.len(),
        mtu = config.engine.mtu,
        "memfd rings exchanged"
    );
    Ok((own, peer))
}

/// The listener's four-byte verdict, waited for at most `timeout`.
fn read_verdict(stream: &mut UnixStream, timeout: Duration) -> Result<[u8; 4], SetupError> {
    const OPERATION: &str = "waiting for the listener's verdict";
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|error| SetupError::Io {
            operation: OPERATION,
            error,
        })?;
    let mut verdict = [0u8; 4];
    let result = stream.read_exact(&mut verdict);
    let _ = stream.set_read_timeout(None);
    match result {
        Ok(()) => Ok(verdict),
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err(SetupError::Timeout {
                operation: OPERATION,
                after: timeout,
            })
        }
        Err(error) if error.kind() == ErrorKind::UnexpectedEof => Err(SetupError::Handshake {
            detail: "the listener closed the connection before its verdict (it may have been too busy: too many connections in handshake)".to_string(),
        }),
        Err(error) => Err(SetupError::Io {
            operation: OPERATION,
            error,
        }),
    }
}

/// The generation of a ring in a fresh memfd window: every connection gets
/// new windows, so nothing of an earlier session can be in them.
const GENERATION: u64 = 1;

/// This side's receive window with its ring laid out.
fn own_window(config: &LinkConfig, name: &str) -> Result<ShmWindow, SetupError> {
    let label = format!("barlink-{name}-{}", std::process::id());
    let own = ShmWindow::create_memfd(&label, config.window_len, &config.shm)?;
    let geometry = Geometry::for_window(own.len(), config.engine.mtu)?;
    init_ring(&own, geometry, GENERATION)?;
    Ok(own)
}

/// Writes a few bytes that a fresh socket has room for, as one `send`
/// that never raises `SIGPIPE` (a client that already left is an error,
/// not a signal to a program that left it at its default).
fn send_small(stream: &UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    let sent = rustix::net::send(stream, bytes, rustix::net::SendFlags::NOSIGNAL)?;
    if sent == bytes.len() {
        Ok(())
    } else {
        Err(std::io::Error::from(ErrorKind::WriteZero))
    }
}
