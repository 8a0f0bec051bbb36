//! The setup channel between two nodes: TCP with a deadline on every
//! connect, accept, read and write, connection retries while the server is
//! not up yet, and mutual authentication ([`crate::auth`]) before anything
//! else, after which messages travel sealed. RDMA links exchange their
//! hello over it (`barlink_rdma::oob`); TCP links set up over it and then
//! carry their packets on the same connection.
#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lobby::{Lobby, Take};
use crate::auth::{self, AuthError, FrameStream, PeerAuth, Session};

/// Why setting up over TCP failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ChannelError {
    /// A socket operation failed.
    Io {
        operation: &'static str,
        error: io::Error,
    },
    /// Nobody accepted the connection, after every attempt.
    Refused {
        addr: SocketAddr,
        attempts: u32,
        last: io::Error,
    },
    /// A step did not finish in time.
    Timeout {
        operation: &'static str,
        after: Duration,
    },
    /// The setup's deadline ([`ChannelOptions::deadline`]) passed during
    /// this step.
    OutOfTime { operation: &'static str },
    /// The peer closed the connection in the middle of the setup.
    PeerClosed { operation: &'static str },
    /// The peer sent something other than the ready byte.
    Protocol { detail: String },
    /// The two sides did not authenticate each other.
    Auth(AuthError),
    /// A server's wait ended with no client authenticated; the last one
    /// that tried failed this way.
    Refusal {
        peer: String,
        error: Box<ChannelError>,
    },
}

impl From<AuthError> for ChannelError {
    fn from(error: AuthError) -> Self {
        ChannelError::Auth(error)
    }
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Io { operation, error } => write!(f, "{operation}: {error}"),
            ChannelError::Refused {
                addr,
                attempts,
                last,
            } => write!(
                f,
                "could not connect to {addr} in {attempts} attempts ({last}): is the server side started, on this address and port, and not firewalled?"
            ),
            ChannelError::Timeout { operation, after } => write!(
                f,
                "{operation}: no answer within {after:?} (is the peer running, and reachable?)"
            ),
            ChannelError::OutOfTime { operation } => write!(
                f,
                "{operation}: the setup's time ran out (the setup timeout, or the 500 ms of an \
                 attempt to take a peer back; is the peer running, and reachable?)"
            ),
            ChannelError::PeerClosed { operation } => write!(
                f,
                "{operation}: the peer closed the connection (see its error)"
            ),
            ChannelError::Protocol { detail } => write!(f, "connection setup: {detail}"),
            ChannelError::Auth(error) => write!(f, "connection setup: {error}"),
            ChannelError::Refusal { peer, error } => write!(
                f,
                "no client authenticated in time; the last, from {peer}, was refused: {error}"
            ),
        }
    }
}

impl std::error::Error for ChannelError {}

/// Timeouts, retries and authentication of setup over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelOptions {
    /// Limit of one connection attempt.
    pub connect_timeout: Duration,
    /// Attempts after the first when the server is not there yet.
    pub connect_retries: u32,
    /// Pause between attempts.
    pub retry_interval: Duration,
    /// Limit of each exchange step (hello, ready byte).
    pub io_timeout: Duration,
    /// Limit of authentication, kept short so that a client that never
    /// completes it holds a server only briefly.
    pub auth_timeout: Duration,
    /// How the two sides prove who they are; `None`: as the environment
    /// says (`PeerAuth::from_environment`), which is an error when it says
    /// nothing.
    pub auth: Option<PeerAuth>,
    /// When the whole setup must be over, if it must (a caller's setup
    /// timeout, one attempt to take a peer back): every connection
    /// attempt, pause, read and write is cut short to end by then. `None`:
    /// each step is bounded by its own limit above only.
    pub deadline: Option<Instant>,
}

impl ChannelOptions {
    /// These options with the setup ending within `within` from now (or
    /// at the deadline they already had, if that comes first).
    pub fn ending_within(mut self, within: Duration) -> ChannelOptions {
        let end = Instant::now() + within;
        self.deadline = Some(self.deadline.map_or(end, |old| old.min(end)));
        self
    }

    /// `limit` from now, cut to end at the deadline: zero once it passed.
    fn cut(&self, limit: Duration) -> Duration {
        cut_to(self.deadline, limit)
    }

    /// The authentication to use: the options', else the environment's.
    pub fn resolve_auth(&self) -> Result<PeerAuth, ChannelError> {
        match &self.auth {
            Some(auth) => Ok(auth.clone()),
            None => Ok(PeerAuth::from_environment()?),
        }
    }
}

impl Default for ChannelOptions {
    /// 2 s per attempt, 10 retries 500 ms apart (a server that starts a
    /// few seconds after its client is still found), 30 s per step (queue
    /// pair setup under emulation is slow).
    fn default() -> Self {
        ChannelOptions {
            connect_timeout: Duration::from_secs(2),
            connect_retries: 10,
            retry_interval: Duration::from_millis(500),
            io_timeout: Duration::from_secs(30),
            auth_timeout: Duration::from_secs(5),
            auth: None,
            deadline: None,
        }
    }
}

/// What a connection taken off the listening socket has at least to set
/// up, even past the caller's deadline: an accept whose time is up (or a
/// poll with no time at all) must not take a client off the queue only to
/// drop it mid-handshake. A handshake on a live host takes milliseconds.
pub(super) const ADMISSION_FLOOR: Duration = Duration::from_millis(250);

/// `deadline`, but not sooner than [`ADMISSION_FLOOR`] from now.
pub(super) fn with_floor(deadline: Option<Instant>) -> Option<Instant> {
    deadline.map(|end| end.max(Instant::now() + ADMISSION_FLOOR))
}

/// `limit` from now, cut to end at `deadline`.
fn cut_to(deadline: Option<Instant>, limit: Duration) -> Duration {
    deadline.map_or(limit, |end| {
        limit.min(end.saturating_duration_since(Instant::now()))
    })
}

/// How long a client that authenticated waits for an accept to take it.
const AUTHENTICATED_KEPT_FOR: Duration = Duration::from_secs(10);

/// Clients that authenticated and wait for an accept, at most.
const AUTHENTICATED_KEPT: usize = 64;

/// The server side: a listening socket.
#[derive(Debug)]
pub struct ChannelListener {
    listener: TcpListener,
    /// Clients authenticated apart, waiting for
    /// [`ChannelListener::accept_authenticated`] (with what they were
    /// authenticated against). Each handle on the socket has its own.
    authenticated: Lobby<(PeerAuth, Channel)>,
}

impl ChannelListener {
    /// A second handle on the same listening socket (a TCP link keeps one
    /// to take its peer back after a dropped connection).
    pub fn try_clone(&self) -> Result<ChannelListener, ChannelError> {
        Ok(ChannelListener {
            listener: self
                .listener
                .try_clone()
                .map_err(|error| ChannelError::Io {
                    operation: "keeping the listener",
                    error,
                })?,
            authenticated: Lobby::new(AUTHENTICATED_KEPT_FOR, AUTHENTICATED_KEPT),
        })
    }

    /// Listens on `addr` (e.g. `0.0.0.0:18515`; port 0 picks one).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<ChannelListener, ChannelError> {
        let listener = TcpListener::bind(addr).map_err(|error| ChannelError::Io {
            operation: "listening for the peer",
            error,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|error| ChannelError::Io {
                operation: "listening for the peer",
                error,
            })?;
        Ok(ChannelListener {
            listener,
            authenticated: Lobby::new(AUTHENTICATED_KEPT_FOR, AUTHENTICATED_KEPT),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, ChannelError> {
        self.listener
            .local_addr()
            .map_err(|error| ChannelError::Io {
                operation: "listening for the peer",
                error,
            })
    }

    /// Whether a client waits to be taken off the socket (no wait; an
    /// error reads as no).
    pub(super) fn has_waiting_client(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&now)).is_ok_and(|ready| ready > 0)
    }

    /// A client waiting to be taken off the socket, if one is (no wait).
    pub(super) fn try_accept(
        &self,
        options: &ChannelOptions,
    ) -> Result<Option<Channel>, ChannelError> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => return Channel::new(stream, options).map(Some),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(ChannelError::Io {
                        operation: "accepting the peer",
                        error,
                    });
                }
            }
        }
    }

    /// Waits at most `timeout` (and not past the options' deadline) for a
    /// client.
    pub fn accept(
        &self,
        timeout: Duration,
        options: &ChannelOptions,
    ) -> Result<Channel, ChannelError> {
        let deadline = Instant::now() + options.cut(timeout);
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let mut channel = Channel::new(stream, options)?;
                    channel.deadline = with_floor(options.deadline);
                    return Ok(channel);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(ChannelError::Io {
                        operation: "accepting the peer",
                        error,
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(ChannelError::Timeout {
                    operation: "waiting for the peer to connect",
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl ChannelListener {
    /// Waits at most `timeout` for a client that authenticates as `auth`
    /// requires. Each client taken off the socket authenticates on a
    /// thread of its own (`lobby`), so one that says nothing holds back
    /// no other; one that fails (another key, another mode, garbage,
    /// silence past `options.auth_timeout`) is logged and dropped, having
    /// received nothing but the refusal, and the wait goes on. A client
    /// that authenticates after this call gave up waits, for 10 s, for the
    /// next call on this handle with the same `auth`.
    pub fn accept_authenticated(
        &self,
        timeout: Duration,
        options: &ChannelOptions,
        auth: &PeerAuth,
    ) -> Result<Channel, ChannelError> {
        let options = &options.clone().ending_within(timeout);
        let admit_auth = auth.clone();
        let take = Take {
            listener: self,
            timeout: options.cut(timeout),
            options,
            pick: &|(admitted_by, channel): &(PeerAuth, Channel)| {
                auth.would_accept(admitted_by, channel.peer_key())
            },
            admit: Arc::new(move |mut channel: Channel| {
                channel.authenticate_client(&admit_auth)?;
                Ok((admit_auth.clone(), channel))
            }),
            refusal_is_error: true,
        };
        let (_, mut channel) = self
            .authenticated
            .next(&take)?
            .ok_or(ChannelError::Timeout {
                operation: "waiting for the peer to connect",
                after: timeout,
            })?;
        channel.adopt(options);
        Ok(channel)
    }
}

/// The client side: connects to `addr`, retrying while nobody listens
/// yet, each attempt bounded by `options.connect_timeout`, all of it by
/// the options' deadline.
pub fn connect(
    addr: impl ToSocketAddrs,
    options: &ChannelOptions,
) -> Result<Channel, ChannelError> {
    let addr = addr
        .to_socket_addrs()
        .map_err(|error| ChannelError::Io {
            operation: "resolving the peer's address",
            error,
        })?
        .next()
        .ok_or_else(|| ChannelError::Io {
            operation: "resolving the peer's address",
            error: io::Error::new(io::ErrorKind::NotFound, "no address"),
        })?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let limit = options.cut(options.connect_timeout);
        if limit.is_zero() {
            return Err(ChannelError::OutOfTime {
                operation: "connecting to the peer",
            });
        }
        let last = match TcpStream::connect_timeout(&addr, limit) {
            Ok(stream) => return Channel::new(stream, options),
            Err(error) => error,
        };
        let retryable = matches!(
            last.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::TimedOut
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::Interrupted
                | io::ErrorKind::ConnectionReset
        );
        if !retryable {
            return Err(ChannelError::Io {
                operation: "connecting to the peer",
                error: last,
            });
        }
        if attempts > options.connect_retries {
            if last.kind() == io::ErrorKind::TimedOut {
                return Err(ChannelError::Timeout {
                    operation: "connecting to the peer",
                    after: options.connect_timeout,
                });
            }
            return Err(ChannelError::Refused {
                addr,
                attempts,
                last,
            });
        }
        std::thread::sleep(options.cut(options.retry_interval));
    }
}

/// A connected setup channel.
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
    io_timeout: Duration,
    auth_timeout: Duration,
    /// When every step must be over ([`ChannelOptions::deadline`]).
    deadline: Option<Instant>,
    /// Set by [`Channel::authenticate`]; the hello needs it.
    session: Option<Session>,
    /// What the stream is doing, for errors.
    step: &'static str,
}

impl FrameStream for Channel {
    type Error = ChannelError;

    fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), ChannelError> {
        self.write_all(bytes, self.step)
    }

    fn recv_bytes(&mut self, buf: &mut [u8]) -> Result<(), ChannelError> {
        self.read_exact(buf, self.step)
    }
}

impl Channel {
    fn new(stream: TcpStream, options: &ChannelOptions) -> Result<Channel, ChannelError> {
        let setup = |error| ChannelError::Io {
            operation: "setting up the connection to the peer",
            error,
        };
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        stream
            .set_write_timeout(Some(options.io_timeout.max(Duration::from_millis(1))))
            .map_err(setup)?;
        Ok(Channel {
            stream,
            io_timeout: options.io_timeout,
            auth_timeout: options.auth_timeout,
            deadline: options.deadline,
            session: None,
            step: "talking to the peer",
        })
    }

    /// Proves to the peer, and checks, who each side is (`initiator`: the
    /// side that connected). Nothing about this host's rings is sent before
    /// it succeeds; on failure the peer is told it was refused.
    pub fn authenticate(&mut self, auth: &PeerAuth, initiator: bool) -> Result<(), ChannelError> {
        let io_timeout = self.io_timeout;
        self.io_timeout = self.auth_timeout;
        self.step = "authenticating with the peer";
        let result = auth::authenticate(self, auth, initiator);
        self.io_timeout = io_timeout;
        self.session = Some(result?);
        Ok(())
    }

    /// When every step must be over from now on (`None`: each step's own
    /// limit only).
    pub(super) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// A second handle on the connection's socket (to shut it down from
    /// elsewhere).
    pub(super) fn try_clone_socket(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    /// The peer's address as text, for logs and errors.
    pub(super) fn peer_name(&self) -> String {
        self.peer_addr()
            .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string())
    }

    /// The server's side of [`Channel::authenticate`] for a client taken
    /// off a listening socket: a client that fails is logged, and its
    /// error comes back as a [`ChannelError::Refusal`] naming it.
    pub(super) fn authenticate_client(&mut self, auth: &PeerAuth) -> Result<(), ChannelError> {
        self.authenticate(auth, false).map_err(|error| {
            let peer = self.peer_name();
            tracing::warn!(%peer, %error, "refused a client that failed authentication");
            ChannelError::Refusal {
                peer,
                error: Box::new(error),
            }
        })
    }

    /// Takes on `options`' limits and deadline (floored as for a new
    /// connection): a connection one party took off a shared socket and
    /// filed for another goes on under the taker's, not the filer's.
    pub(super) fn adopt(&mut self, options: &ChannelOptions) {
        self.io_timeout = options.io_timeout;
        self.auth_timeout = options.auth_timeout;
        self.deadline = with_floor(options.deadline);
    }

    /// The connection and the session, for a medium that carries packets
    /// on the same connection after setup.
    pub fn into_parts(self) -> (TcpStream, Option<Session>) {
        (self.stream, self.session)
    }

    /// The public key the peer proved it holds (pinned keys), if it did.
    pub fn peer_key(&self) -> Option<crate::auth::PublicKey> {
        self.session.as_ref().and_then(Session::peer_key)
    }

    /// Whether the session is authenticated (false: `--insecure`).
    pub fn is_authenticated(&self) -> bool {
        self.session.as_ref().is_some_and(Session::is_authenticated)
    }

    /// Sends one message through the session (sealed, unless the
    /// setup runs without authentication).
    pub fn send_sealed(&mut self, bytes: &[u8], step: &'static str) -> Result<(), ChannelError> {
        self.step = step;
        let mut session = self.session.take().ok_or_else(not_authenticated)?;
        let result = session.send(self, bytes);
        self.session = Some(session);
        result
    }

    /// Receives one message through the session.
    pub fn recv_sealed(&mut self, step: &'static str) -> Result<Vec<u8>, ChannelError> {
        self.step = step;
        let mut session = self.session.take().ok_or_else(not_authenticated)?;
        let result = session.recv(self);
        self.session = Some(session);
        result
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr, ChannelError> {
        self.stream.peer_addr().map_err(|error| ChannelError::Io {
            operation: "reading the peer's address",
            error,
        })
    }

    /// A step that ran out of its `limit`: the step's own limit, or the
    /// setup's deadline when that cut it shorter.
    fn timed_out(&self, operation: &'static str, limit: Duration) -> ChannelError {
        if limit < self.io_timeout {
            ChannelError::OutOfTime { operation }
        } else {
            ChannelError::Timeout {
                operation,
                after: limit,
            }
        }
    }

    /// Raw bytes to the peer (tests of hostile hellos), each write within
    /// the I/O timeout, cut to the deadline.
    pub fn write_all(&mut self, bytes: &[u8], operation: &'static str) -> Result<(), ChannelError> {
        let limit = cut_to(self.deadline, self.io_timeout);
        let timed_out = self.timed_out(operation, limit);
        if limit.is_zero() {
            return Err(timed_out);
        }
        self.stream
            .set_write_timeout(Some(limit))
            .map_err(|error| ChannelError::Io { operation, error })?;
        self.stream
            .write_all(bytes)
            .map_err(|error| match error.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out,
                _ => ChannelError::Io { operation, error },
            })
    }

    /// Reads exactly `buf.len()` bytes within the I/O timeout, cut to the
    /// deadline (one limit for the whole read, however the bytes trickle
    /// in).
    pub fn read_exact(
        &mut self,
        buf: &mut [u8],
        operation: &'static str,
    ) -> Result<(), ChannelError> {
        let limit = cut_to(self.deadline, self.io_timeout);
        let deadline = Instant::now() + limit;
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out(operation, limit));
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|error| ChannelError::Io { operation, error })?;
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(ChannelError::PeerClosed { operation }),
                Ok(n) => filled += n,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(error) => return Err(ChannelError::Io { operation, error }),
            }
        }
        Ok(())
    }
}

fn not_authenticated() -> ChannelError {
    ChannelError::Protocol {
        detail: "the setup channel must be authenticated (Channel::authenticate) before the hello"
            .to_string(),
    }
}
