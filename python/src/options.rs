//! `barlink.connect` and the platform documents: keyword arguments made
//! into `barlink::ConnectOptions`, checked before anything is set up.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use barlink::rdma::verbs_queue::RdmaLinkOptions;
use barlink::{BarEnds, ConnectOptions, PathKind, Peer, Role};
use barlink_topology::{PathPolicy, Topology, render};
use barlink_transport::EngineConfig;
use barlink_transport::auth::PeerAuth;
use barlink_transport::link::AllowedPeers;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::errors;
use crate::link::Link;

/// The default packet size: the one `barlink bench` uses (a 64 KiB
/// message in one packet; half the packets of larger ones).
pub const DEFAULT_MTU: usize = 128 << 10;

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    if value.is_finite() && value > 0.0 {
        Ok(Duration::from_secs_f64(value.min(1e9)))
    } else {
        Err(PyValueError::new_err(format!(
            "{name} must be a number of seconds > 0, not {value}"
        )))
    }
}

fn path_kind(name: &str) -> PyResult<PathKind> {
    Ok(match name {
        "host-bounce" => PathKind::HostBounce,
        "bar-p2p" => PathKind::BarP2p,
        "rdma" => PathKind::Rdma,
        "tcp" => PathKind::Tcp,
        other => {
            return Err(PyValueError::new_err(format!(
                "path {other:?} is not one of host-bounce, bar-p2p, rdma, tcp"
            )));
        }
    })
}

/// How setup with another node is authenticated: at most one way, else
/// the environment's (`BARLINK_PSK_FILE`, ...).
fn auth(
    psk_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    peer_keys: Option<PathBuf>,
    insecure: bool,
) -> PyResult<Option<PeerAuth>> {
    let bad = |e: barlink_transport::auth::AuthError| PyValueError::new_err(e.to_string());
    match (psk_file, key_file, peer_keys, insecure) {
        (None, None, None, false) => Ok(None),
        (None, None, None, true) => Ok(Some(PeerAuth::Insecure)),
        (Some(psk), None, None, false) => PeerAuth::psk_file(&psk).map(Some).map_err(bad),
        (None, Some(key), Some(peers), false) => PeerAuth::pinned_key_files(&key, &peers)
            .map(Some)
            .map_err(bad),
        (None, Some(_), None, false) | (None, None, Some(_), false) => Err(PyValueError::new_err(
            "pinned keys need both key_file (this side's private key) and peer_keys (the \
             public keys it accepts)",
        )),
        _ => Err(PyValueError::new_err(
            "give one way to authenticate: psk_file, or key_file with peer_keys, or insecure=True",
        )),
    }
}

/// Links to `peer` over the path barlink picks for it and returns the
/// Link; `link.path` says which path and why.
///
/// `peer`: `local:NAME` (a process on this host), `rdma://HOST:PORT`,
/// `tcp://HOST:PORT`, or `HOST:PORT` (RDMA where this host has it, else
/// TCP). `role`: "connect" goes to the peer, "accept" waits for it (for a
/// remote peer, HOST:PORT is where to listen). `timeout`: seconds setup may
/// take. Both sides must use the same `mtu` and `max_message_bytes`.
/// `own_bar`/`peer_bar`: the BAR windows of a local peer reached over PCIe
/// BARs (`DEVICE/BAR@OFFSET+LEN`), this side's ring and the peer's; the
/// peer names the two swapped.
#[pyfunction]
#[pyo3(signature = (
    peer, role="connect", timeout=10.0, *, mtu=DEFAULT_MTU, window=None,
    max_message_bytes=1 << 30, peer_timeout=2.0, encrypt=false, psk_file=None,
    key_file=None, peer_keys=None, insecure=false, allow_uids=Vec::new(),
    allow_gids=Vec::new(), allow_any_user=false, path=None, sysfs_root=PathBuf::from("/"),
    own_bar=None, peer_bar=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn connect(
    py: Python<'_>,
    peer: &str,
    role: &str,
    timeout: f64,
    mtu: usize,
    window: Option<u32>,
    max_message_bytes: u64,
    peer_timeout: f64,
    encrypt: bool,
    psk_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    peer_keys: Option<PathBuf>,
    insecure: bool,
    allow_uids: Vec<u32>,
    allow_gids: Vec<u32>,
    allow_any_user: bool,
    path: Option<&str>,
    sysfs_root: PathBuf,
    own_bar: Option<&str>,
    peer_bar: Option<&str>,
) -> PyResult<Link> {
    let peer: Peer = peer.parse().map_err(errors::connect_error)?;
    let bars = BarEnds::from_texts(own_bar, peer_bar).map_err(PyValueError::new_err)?;
    if bars.is_some() && !matches!(peer, Peer::Local { .. }) {
        return Err(PyValueError::new_err(
            "own_bar and peer_bar name BAR windows on this host, but the peer is on another node",
        ));
    }
    let role = match role {
        "connect" => Role::Connect,
        "accept" => Role::Accept,
        other => {
            return Err(PyValueError::new_err(format!(
                "role {other:?} is not \"connect\" or \"accept\""
            )));
        }
    };
    // As bench: as many packets in flight as fill the 4 MiB rings.
    let window = window.unwrap_or(((4 << 20) / mtu.max(1)).clamp(4, 256) as u32);
    let engine = EngineConfig {
        mtu,
        send_window: window,
        recv_window: window,
        max_message_len: max_message_bytes,
        peer_timeout: seconds("peer_timeout", peer_timeout)?,
        ..EngineConfig::default()
    };
    engine
        .validate()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let options = ConnectOptions {
        engine,
        setup_timeout: seconds("timeout", timeout)?,
        sysfs_root,
        bars,
        force: path.map(path_kind).transpose()?,
        allow: AllowedPeers {
            uids: allow_uids,
            gids: allow_gids,
            anyone: allow_any_user,
            from_environment: true,
        },
        encrypt,
        auth: auth(psk_file, key_file, peer_keys, insecure)?,
        rdma: RdmaLinkOptions::default()
            .with_environment()
            .map_err(PyValueError::new_err)?,
        ..ConnectOptions::default()
    };
    let conn = crate::exit::detached(py, || barlink::connect(&peer, role, &options))
        .map_err(errors::connect_error)?;
    Ok(Link::new(conn, options.engine.max_payload_len() as usize))
}

fn discover(sysfs_root: &Path) -> PyResult<Topology> {
    Topology::discover(sysfs_root, PathPolicy::default())
        .map_err(|e| PyOSError::new_err(format!("reading the PCI topology: {e}")))
}

/// `barlink topo --json` as a JSON string (`barlink.topology()` parses it).
#[pyfunction]
#[pyo3(signature = (sysfs_root=PathBuf::from("/")))]
pub fn topology_json(py: Python<'_>, sysfs_root: PathBuf) -> PyResult<String> {
    let topology = crate::exit::detached(py, || discover(&sysfs_root))?;
    Ok(render::topo_json(&topology).to_string())
}

/// `barlink doctor --json` as a JSON string (`barlink.doctor()` parses it).
#[pyfunction]
#[pyo3(signature = (sysfs_root=PathBuf::from("/")))]
pub fn doctor_json(py: Python<'_>, sysfs_root: PathBuf) -> PyResult<String> {
    let topology = crate::exit::detached(py, || discover(&sysfs_root))?;
    Ok(barlink::doctor::report(&topology).to_json().to_string())
}

/// The CPU and the copy and CRC kernels chosen on it, and how this
/// extension was built (`release`, or `debug`: the test command's dev
/// profile, whose figures are not barlink's speed), as JSON (benchmark
/// reports name them).
#[pyfunction]
pub fn cpu_json() -> String {
    let cpu = barlink_transport::cpu::CpuReport::current();
    serde_json::json!({
        "model": cpu.model,
        "features": cpu.features,
        "crc_kernel": cpu.crc_kernel,
        "copy_crc_kernel": cpu.copy_crc_kernel,
        "copy_kernel": cpu.copy_kernel,
        "isa_limit": cpu.isa_limit,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
    .to_string()
}
