//! Links between processes that share a directory (`/dev/shm`) but no
//! socket — containers with a common IPC mount and separate network
//! namespaces, where the abstract Unix socket of [`super::connect`] is not
//! shared.
//!
//! Each side creates its receive ring as a named file (mode 0600,
//! `O_EXCL`), `<name>.first` or `<name>.second` by its [`Side`], and opens
//! the other's once it appears. A ring file outlives a process that crashed
//! before removing it: creating over it is refused, and the error says
//! which case it is — a live owner ([`SetupError::NameInUse`]), an owner
//! that no longer runs ([`SetupError::StaleRing`], removed and recreated
//! only when [`NamedOptions::reclaim_stale`] says so), or a file that is no
//! barlink ring at all ([`SetupError::NotARing`]).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{RingLink, SetupError, init_ring, read_identity, ring_info};
use crate::engine::EngineConfig;
use crate::ring::Geometry;
use crate::window::{ShmOptions, ShmWindow, Window, WindowError};

/// Which of the two sides this process is (each must pick the other one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Creates `<name>.first`, writes into `<name>.second`.
    First,
    /// Creates `<name>.second`, writes into `<name>.first`.
    Second,
}

impl Side {
    fn suffix(self) -> &'static str {
        match self {
            Side::First => "first",
            Side::Second => "second",
        }
    }

    fn other(self) -> Side {
        match self {
            Side::First => Side::Second,
            Side::Second => Side::First,
        }
    }
}

/// How named rings are created and found.
#[derive(Debug, Clone)]
pub struct NamedOptions {
    /// The engine (both sides should agree on the MTU).
    pub engine: EngineConfig,
    /// Bytes of each side's receive ring file.
    pub window_len: usize,
    /// Directory and pages of the ring files (default `/dev/shm`).
    pub shm: ShmOptions,
    /// Longest wait for the other side's ring to appear.
    pub setup_timeout: Duration,
    /// Remove a ring file whose owner no longer runs and create it anew,
    /// instead of refusing with [`SetupError::StaleRing`].
    pub reclaim_stale: bool,
}

impl Default for NamedOptions {
    fn default() -> Self {
        NamedOptions {
            engine: EngineConfig::default(),
            window_len: crate::ring::Geometry::window_len_for(4 << 20),
            shm: ShmOptions::default(),
            setup_timeout: Duration::from_secs(10),
            reclaim_stale: false,
        }
    }
}

/// Whether process `pid` exists (a process of another user counts).
fn process_runs(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(errno) => errno != rustix::io::Errno::SRCH,
    }
}

/// Whether nobody has written packets into a ring yet: both index words
/// still hold the zero its owner laid out.
fn ring_is_fresh<W: Window>(window: &W) -> Result<bool, SetupError> {
    use crate::ring::{IndexKind, encode_index, offset};
    let head = window.load_u64(offset::HEAD, Ordering::Acquire)?;
    let consumed = window.load_u64(offset::CONSUMED, Ordering::Acquire)?;
    Ok(
        head == encode_index(IndexKind::Head, 0)
            && consumed == encode_index(IndexKind::Consumed, 0),
    )
}

/// Why an existing ring file cannot be created over, or `Ok` if it is
/// stale and may be reclaimed.
fn diagnose_existing(
    name: &str,
    path: &Path,
    options: &ShmOptions,
) -> Result<StaleRing, SetupError> {
    let opened = ShmWindow::open_named(name, &options.clone().with_unlink_on_drop(false));
    let window = match opened {
        Ok(window) => window,
        // Another user's file, a link, an empty file: the window layer's
        // error says which.
        Err(error) => return Err(SetupError::Window(error)),
    };
    // Of any layout version, and judged by its owner alone (not by its
    // geometry): a file of ours with a ring's magic whose owner is gone is
    // stale, whatever else it holds.
    let identity = read_identity(&window)?;
    if process_runs(identity.owner_pid) {
        let version = if identity.version == crate::ring::RING_VERSION {
            String::new()
        } else {
            format!(" of layout version {},", identity.version)
        };
        return Err(SetupError::NameInUse {
            name: format!(
                "{} (ring{version} owned by running process {})",
                path.display(),
                identity.owner_pid
            ),
        });
    }
    Ok(StaleRing {
        path: path.to_path_buf(),
        owner_pid: identity.owner_pid,
    })
}

struct StaleRing {
    path: PathBuf,
    owner_pid: u32,
}

/// Creates this process's receive ring as the named file `file_name`,
/// with a ring laid out for `mtu`. An existing file is diagnosed (see the
/// module documentation) and reclaimed only if `reclaim_stale`.
pub fn create_named_ring(
    file_name: &str,
    window_len: usize,
    mtu: usize,
    options: &ShmOptions,
    reclaim_stale: bool,
) -> Result<ShmWindow, SetupError> {
    let window = match ShmWindow::create_named(file_name, window_len, options) {
        Ok(window) => window,
        Err(WindowError::NameInUse { path }) => {
            let stale = diagnose_existing(file_name, &path, options)?;
            if !reclaim_stale {
                return Err(SetupError::StaleRing {
                    path: stale.path,
                    owner_pid: stale.owner_pid,
                });
            }
            tracing::warn!(
                path = %stale.path.display(),
                owner_pid = stale.owner_pid,
                "reclaiming a ring file left by a process that no longer runs"
            );
            std::fs::remove_file(&stale.path).map_err(|error| SetupError::Io {
                operation: "removing a stale ring file",
                error,
            })?;
            ShmWindow::create_named(file_name, window_len, options)?
        }
        Err(error) => return Err(error.into()),
    };
    let geometry = Geometry::for_window(window.len(), mtu)?;
    init_ring(&window, geometry, 1)?;
    Ok(window)
}

/// Sets up this process's side of the link `name` over named ring files:
/// creates its own ring, waits (at most `options.setup_timeout`) for the
/// other side's, and binds the engine. Each side removes its own file when
/// the link is dropped.
pub fn connect_named<B: AsRef<[u8]>>(
    name: &str,
    side: Side,
    options: &NamedOptions,
) -> Result<RingLink<ShmWindow, B>, SetupError> {
    let own_name = format!("{name}.{}", side.suffix());
    let peer_name = format!("{name}.{}", side.other().suffix());
    let own = create_named_ring(
        &own_name,
        options.window_len,
        options.engine.mtu,
        &options.shm,
        options.reclaim_stale,
    )?;
    let opener = options.shm.clone().with_unlink_on_drop(false);
    let peer_path = options.shm.path_of(&peer_name)?;
    let deadline = Instant::now() + options.setup_timeout;
    let mut refusal = None;
    let peer = loop {
        match ShmWindow::open_named(&peer_name, &opener) {
            Ok(window) => match peer_ring_state(&window, &peer_path)? {
                PeerRing::Usable => break window,
                PeerRing::NotYet(why) => refusal = why.or(refusal),
            },
            // Not there yet, or there but not sized yet.
            Err(WindowError::NotFound { .. } | WindowError::TooSmall { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        waited(deadline, options.setup_timeout, &mut refusal)?;
    };
    tracing::info!(name, ?side, "ring files paired");
    RingLink::new(own, peer, options.engine.clone(), 1)
}

/// What the other side's ring looks like right now.
enum PeerRing {
    /// Laid out, its owner runs, and nobody has written packets into it.
    Usable,
    /// Not laid out yet, or refused for now with this error: its owner no
    /// longer runs, or it holds packets of a session that is over (its
    /// owner lays out a new one when it notices; writing into it would go
    /// unread).
    NotYet(Option<SetupError>),
}

fn peer_ring_state<W: Window>(window: &W, place: &Path) -> Result<PeerRing, SetupError> {
    let identity = match read_identity(window) {
        Ok(identity) => identity,
        // Not laid out yet.
        Err(SetupError::NotARing { found: 0 }) => return Ok(PeerRing::NotYet(None)),
        Err(error) => return Err(error),
    };
    // Of any layout version: its owner lays it out anew when it comes back.
    if !process_runs(identity.owner_pid) {
        return Ok(PeerRing::NotYet(Some(SetupError::StaleRing {
            path: place.to_path_buf(),
            owner_pid: identity.owner_pid,
        })));
    }
    // A running owner's ring of another version is refused by it.
    let info = ring_info(identity, window.len())?;
    if ring_is_fresh(window)? {
        return Ok(PeerRing::Usable);
    }
    Ok(PeerRing::NotYet(Some(SetupError::Handshake {
        detail: format!(
            "the other side's ring in {} (process {}) holds packets of an earlier session: \
             restart that side too",
            place.display(),
            info.owner_pid
        ),
    })))
}

/// Sleeps a little before the next look, or ends the wait at the deadline
/// with the last refusal seen (else a timeout).
fn waited(
    deadline: Instant,
    timeout: Duration,
    refusal: &mut Option<SetupError>,
) -> Result<(), SetupError> {
    if Instant::now() >= deadline {
        return Err(refusal.take().unwrap_or(SetupError::Timeout {
            operation: "waiting for the other side's ring",
            after: timeout,
        }));
    }
    std::thread::sleep(Duration::from_millis(2));
    Ok(())
}

/// Sets up a link over two windows both processes can already reach — a
/// pair of device BARs, say, each side mapping its own and the other's —
/// with no rendezvous: lays out this side's ring in `own`, waits (at most
/// `timeout`) for the other side's in `peer` (refusing a stale one or one
/// of an earlier session, as named rings do), and binds the engine.
/// `place` names the peer window in errors (e.g. the device's sysfs
/// resource file).
pub fn pair_windows<W: Window, B: AsRef<[u8]>>(
    own: W,
    peer: W,
    engine: EngineConfig,
    timeout: Duration,
    place: &Path,
) -> Result<RingLink<W, B>, SetupError> {
    let geometry = Geometry::for_window(own.len(), engine.mtu)?;
    init_ring(&own, geometry, 1)?;
    let deadline = Instant::now() + timeout;
    let mut refusal = None;
    loop {
        match peer_ring_state(&peer, place)? {
            PeerRing::Usable => break,
            PeerRing::NotYet(why) => refusal = why.or(refusal),
        }
        waited(deadline, timeout, &mut refusal)?;
    }
    tracing::info!(peer = %place.display(), "windows paired");
    RingLink::new(own, peer, engine, 1)
}
