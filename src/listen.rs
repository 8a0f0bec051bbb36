//! A listener that accepts any number of links on the path [`connect`]
//! would pick: a link name on this host, a TCP or RDMA address for peers on
//! other nodes. [`connect`]'s [`Role::Accept`] takes one link through it;
//! servers keep one and accept as peers come.
//!
//! [`connect`]: crate::connect
//! [`Role::Accept`]: crate::Role::Accept
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use barlink_rdma::oob::OobListener;
use barlink_rdma::verbs_queue;
use barlink_transport::link::{self, SetupError};
use barlink_transport::tcp::TcpServer;

use crate::connect::{AnyLink, Prepared, bar_link, local_config, prepare};
use crate::{ConnectError, ConnectOptions, Connection, PathDecision, PathKind, Peer};

/// What the listener holds open between accepts.
#[derive(Debug)]
enum Bound {
    /// A link name (an abstract Unix socket).
    Local(link::Listener),
    /// Two BAR windows: nothing to listen on; the one accept pairs them
    /// (whether it happened). They carry one link: pairing them again
    /// would reset the ring of the link already on them.
    Bars(AtomicBool),
    /// The RDMA setup channel.
    Rdma(OobListener),
    /// The TCP port.
    Tcp(TcpServer),
}

/// Accepts links from peers on the path chosen at [`Listener::bind`].
#[derive(Debug)]
pub struct Listener {
    options: ConnectOptions,
    prepared: Prepared,
    bound: Bound,
}

impl Listener {
    /// Chooses the path for peers named like `peer` (`local:NAME`,
    /// `tcp://ADDR:PORT` or `rdma://ADDR:PORT` to listen on) and claims
    /// the name or address.
    pub fn bind(peer: &Peer, options: &ConnectOptions) -> Result<Listener, ConnectError> {
        let prepared = prepare(peer, options)?;
        let failed = |detail: String| ConnectError::Setup {
            decision: prepared.decision.clone(),
            detail,
        };
        let bound = match (prepared.decision.path, peer) {
            (PathKind::HostBounce, Peer::Local { name }) => Bound::Local(
                link::Listener::bind(name).map_err(|e: SetupError| failed(e.to_string()))?,
            ),
            (PathKind::BarP2p, _) => Bound::Bars(AtomicBool::new(false)),
            (PathKind::Rdma, Peer::Remote { addr } | Peer::Rdma { addr }) => {
                Bound::Rdma(OobListener::bind(addr.as_str()).map_err(|e| failed(e.to_string()))?)
            }
            (PathKind::Tcp, Peer::Remote { addr } | Peer::Tcp { addr }) => {
                Bound::Tcp(TcpServer::bind(addr.as_str()).map_err(|e| failed(e.to_string()))?)
            }
            _ => unreachable!("prepare refused a path that cannot reach the peer"),
        };
        tracing::info!(path = %prepared.decision.path, reason = %prepared.decision.reason, "listening");
        Ok(Listener {
            options: options.clone(),
            prepared,
            bound,
        })
    }

    /// The path accepted links take, and why.
    pub fn decision(&self) -> &PathDecision {
        &self.prepared.decision
    }

    /// The next peer's link, waiting at most the options' setup timeout.
    pub fn accept<B: AsRef<[u8]>>(&self) -> Result<Connection<B>, ConnectError> {
        self.accept_within(self.options.setup_timeout)
    }

    /// The next peer's link, waiting at most `timeout` for it.
    pub fn accept_within<B: AsRef<[u8]>>(
        &self,
        timeout: Duration,
    ) -> Result<Connection<B>, ConnectError> {
        let decision = &self.prepared.decision;
        let failed = |detail: String| ConnectError::Setup {
            decision: decision.clone(),
            detail,
        };
        let options = ConnectOptions {
            setup_timeout: timeout,
            ..self.options.clone()
        };
        let link = match &self.bound {
            Bound::Local(listener) => AnyLink::HostBounce(
                listener
                    .accept(&local_config(&options))
                    .map_err(|e| failed(e.to_string()))?,
            ),
            Bound::Bars(accepted) => {
                if accepted.swap(true, Ordering::AcqRel) {
                    return Err(failed(
                        "two BAR windows carry one link, and this listener accepted it already: \
                         close that link and listen again for another"
                            .into(),
                    ));
                }
                AnyLink::BarP2p(bar_link(&options, failed)?)
            }
            Bound::Rdma(listener) => AnyLink::Rdma(Box::new(
                verbs_queue::accept(listener, timeout, &self.prepared.rdma)
                    .map_err(|e| failed(e.to_string()))?,
            )),
            Bound::Tcp(server) => AnyLink::Tcp(Box::new(
                server
                    .accept(timeout, &self.prepared.tcp)
                    .map_err(|e| failed(e.to_string()))?,
            )),
        };
        Ok(Connection::new(link, decision.clone()))
    }
}
