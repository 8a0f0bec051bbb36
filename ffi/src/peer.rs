//! Setting links up: a peer named as `barlink::connect` takes it — a local
//! link name (`NAME` or `local:NAME`), `tcp://HOST:PORT`, `rdma://HOST:PORT`
//! or `HOST:PORT` (RDMA where this host has it, else TCP) — and the
//! listeners that accept them.
//!
//! Local names go straight to the transport, whose setup errors are typed
//! (name in use, no listener, a peer not allowed); peers on other nodes,
//! and local peers whose BAR windows the config names, go through the
//! facade's path choice and its setup (authenticated with a pre-shared key
//! or pinned keys from `BARLINK_PSK_FILE`, ... for other nodes).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink::connect::AnyLink;
use barlink::rdma::verbs_queue::RdmaLinkOptions;
use barlink::{
    BarEnds, ConnectError, ConnectOptions, Connection, PathDecision, PathKind, Peer, Role,
};
use barlink_transport::link::{LinkConfig, Listener, SetupError};

use crate::config::{SendLimits, link_config};
use crate::error::{Error, Result};
use crate::link::LinkCell;
use crate::payload::Payload;
use crate::types::barlink_status::*;
use crate::types::{BARLINK_CONFIG_PROGRESS_THREAD, barlink_config};

/// Link names: what the transport accepts, checked here first so that a bad
/// name is an argument error rather than a setup failure.
const MAX_NAME_LEN: usize = 100;

/// `barlink_transport` values.
const TRANSPORT_SHM: u32 = 1;
const TRANSPORT_BAR: u32 = 2;
const TRANSPORT_RDMA: u32 = 3;

/// The string fields of a caller's config, read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConfigTexts {
    pub(crate) own_bar: Option<String>,
    pub(crate) peer_bar: Option<String>,
    pub(crate) sysfs_root: Option<String>,
}

/// A caller's config, checked: the ring and engine settings, the transport
/// it asked for, and the BAR windows it named.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    link: LinkConfig,
    limits: SendLimits,
    transport: u32,
    progress_thread: bool,
    bars: Option<BarEnds>,
    sysfs_root: PathBuf,
    /// RDMA device, GID and QP timeout from `BARLINK_RDMA_DEVICE`, ...
    rdma: RdmaLinkOptions,
}

impl Setup {
    pub(crate) fn new(config: &barlink_config, texts: ConfigTexts) -> Result<Setup> {
        let bars = BarEnds::from_texts(texts.own_bar.as_deref(), texts.peer_bar.as_deref())
            .map_err(|e| Error::invalid(format!("config: {e}")))?;
        if config.transport == TRANSPORT_BAR && bars.is_none() {
            return Err(Error::invalid(
                "BARLINK_TRANSPORT_BAR needs the two BAR windows: set config.own_bar and config.peer_bar",
            ));
        }
        let link = link_config(config)?;
        Ok(Setup {
            limits: SendLimits::new(config, &link),
            link,
            transport: config.transport,
            progress_thread: config.flags & BARLINK_CONFIG_PROGRESS_THREAD != 0,
            bars,
            sysfs_root: PathBuf::from(texts.sysfs_root.as_deref().unwrap_or("/")),
            rdma: RdmaLinkOptions::default()
                .with_environment()
                .map_err(Error::invalid)?,
        })
    }

    /// The facade's options for a peer it sets up.
    fn connect_options(&self, timeout: Duration) -> ConnectOptions {
        ConnectOptions {
            engine: self.link.engine.clone(),
            setup_timeout: timeout,
            allow: self.link.allow.clone(),
            window_len: self.link.window_len,
            shm: self.link.shm.clone(),
            force: match self.transport {
                TRANSPORT_RDMA => Some(PathKind::Rdma),
                TRANSPORT_BAR => Some(PathKind::BarP2p),
                // Shared memory asked for by name, BAR windows named or not.
                TRANSPORT_SHM if self.bars.is_some() => Some(PathKind::HostBounce),
                _ => None,
            },
            bars: self.bars.clone(),
            sysfs_root: self.sysfs_root.clone(),
            rdma: self.rdma.clone(),
            ..ConnectOptions::default()
        }
    }
}

/// Who a name points at.
enum Target {
    /// A link name on this host, over host shared memory.
    Local(String),
    /// A peer the facade sets up: on another node, or on this host over
    /// the BAR windows the config names.
    Facade(Peer),
}

fn target(name: &str, setup: &Setup) -> Result<Target> {
    let peer: Peer = name
        .parse()
        .map_err(|e: ConnectError| Error::invalid(e.to_string()))?;
    match peer {
        Peer::Local { name } => {
            if name.is_empty() || name.len() > MAX_NAME_LEN {
                return Err(Error::invalid(format!(
                    "link name {name:?} must be 1 to {MAX_NAME_LEN} bytes"
                )));
            }
            if setup.transport == TRANSPORT_RDMA {
                return Err(Error::new(
                    BARLINK_NOT_AVAILABLE,
                    format!(
                        "BARLINK_TRANSPORT_RDMA reaches peers on other nodes: give rdma://HOST:PORT, not the local name {name:?}"
                    ),
                ));
            }
            if setup.bars.is_some() {
                Ok(Target::Facade(Peer::Local { name }))
            } else {
                Ok(Target::Local(name))
            }
        }
        _ if setup.bars.is_some() => Err(Error::invalid(format!(
            "config.own_bar and peer_bar name BAR windows on this host, but {name:?} is a peer on another node"
        ))),
        remote => Ok(Target::Facade(remote)),
    }
}

fn setup_error(error: SetupError) -> Error {
    let status = match &error {
        SetupError::NameInUse { .. } => BARLINK_NAME_IN_USE,
        SetupError::NoListener { .. } => BARLINK_NO_LISTENER,
        SetupError::Timeout { .. } => BARLINK_TIMEOUT,
        SetupError::Config(_) | SetupError::AllowList { .. } => BARLINK_INVALID_ARGUMENT,
        SetupError::PeerNotAllowed { .. } | SetupError::RefusedByPeer { .. } => {
            BARLINK_PEER_NOT_ALLOWED
        }
        SetupError::Io { .. } | SetupError::Window(_) => BARLINK_IO_ERROR,
        _ => BARLINK_SETUP_FAILED,
    };
    Error::new(status, error.to_string())
}

/// The status of a failed setup with another node. The facade says what
/// failed in words; the status follows the kinds a caller acts on.
fn connect_error(error: ConnectError) -> Error {
    let status = match &error {
        ConnectError::NoPath { .. } => BARLINK_NOT_AVAILABLE,
        ConnectError::Usage { .. } => BARLINK_INVALID_ARGUMENT,
        ConnectError::Setup { detail, .. } => {
            let says = |words: &[&str]| words.iter().any(|w| detail.contains(w));
            if says(&["no authentication is configured", "is not a key"]) {
                BARLINK_INVALID_ARGUMENT
            } else if says(&["in use"]) {
                BARLINK_NAME_IN_USE
            } else if says(&["refused", "not listed", "authenticat", "wrong key"]) {
                BARLINK_PEER_NOT_ALLOWED
            } else if says(&["timed out", "did not answer", "within"]) {
                BARLINK_TIMEOUT
            } else if says(&["libibverbs", "no RDMA", "needs"]) {
                BARLINK_NOT_AVAILABLE
            } else {
                BARLINK_SETUP_FAILED
            }
        }
        _ => BARLINK_SETUP_FAILED,
    };
    Error::new(status, error.to_string())
}

/// A link over host memory, as the facade's connection.
fn local_connection(
    link: barlink_transport::link::RingLink<barlink_transport::window::ShmWindow, Payload>,
) -> Connection<Payload> {
    Connection {
        link: AnyLink::HostBounce(link),
        decision: PathDecision {
            path: PathKind::HostBounce,
            reason: "a link name on this host: rings in host shared memory".to_string(),
        },
    }
}

/// The accepting side of a name or an address, with the config its links
/// get.
#[derive(Debug)]
pub(crate) enum ListenerCell {
    Local {
        listener: Listener,
        setup: Setup,
    },
    Facade {
        /// Boxed: it holds the setup options of every medium.
        listener: Box<barlink::Listener>,
        setup: Setup,
    },
}

impl ListenerCell {
    pub(crate) fn bind(name: &str, setup: Setup) -> Result<ListenerCell> {
        Ok(match target(name, &setup)? {
            Target::Local(name) => ListenerCell::Local {
                listener: Listener::bind(&name).map_err(setup_error)?,
                setup,
            },
            Target::Facade(peer) => {
                let options = setup.connect_options(setup.link.setup_timeout);
                ListenerCell::Facade {
                    listener: Box::new(
                        barlink::Listener::bind(&peer, &options).map_err(connect_error)?,
                    ),
                    setup,
                }
            }
        })
    }

    pub(crate) fn accept(&self, timeout: Duration) -> Result<Arc<LinkCell>> {
        let start = Instant::now();
        let (link, setup) = match self {
            ListenerCell::Local { listener, setup } => {
                let config = LinkConfig {
                    setup_timeout: timeout,
                    ..setup.link.clone()
                };
                let link = listener.accept(&config).map_err(setup_error)?;
                (local_connection(link), setup)
            }
            ListenerCell::Facade { listener, setup } => {
                let link = listener.accept_within(timeout).map_err(connect_error)?;
                (link, setup)
            }
        };
        LinkCell::established(link, setup.limits, start + timeout)?.start(setup.progress_thread)
    }

    /// The path accepted links take, and why.
    pub(crate) fn decision(&self) -> String {
        match self {
            ListenerCell::Local { .. } => {
                "host-bounce: a link name on this host: rings in host shared memory".to_string()
            }
            ListenerCell::Facade { listener, .. } => listener.decision().to_string(),
        }
    }
}

/// Connects to the peer `name` names, waiting at most `timeout`.
pub(crate) fn connect_link(name: &str, setup: Setup, timeout: Duration) -> Result<Arc<LinkCell>> {
    let start = Instant::now();
    let link = match target(name, &setup)? {
        Target::Local(name) => {
            let config = LinkConfig {
                setup_timeout: timeout,
                ..setup.link.clone()
            };
            local_connection(barlink_transport::link::connect(&name, &config).map_err(setup_error)?)
        }
        Target::Facade(peer) => {
            barlink::connect(&peer, Role::Connect, &setup.connect_options(timeout))
                .map_err(connect_error)?
        }
    };
    LinkCell::established(link, setup.limits, start + timeout)?.start(setup.progress_thread)
}
