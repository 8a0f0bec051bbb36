//! A caller's `barlink_config`, checked and turned into the transport's
//! link config, and the limits a link's sends are held to.
#![forbid(unsafe_code)]

use std::time::Duration;

use barlink_transport::engine::EngineConfig;
use barlink_transport::link::LinkConfig;
use barlink_transport::ring::{CONTROL_LEN, Geometry};
use barlink_transport::window::{HugePages, ShmOptions};

use crate::error::{Error, Result};
use crate::types::{
    BARLINK_CONFIG_ALLOW_ANY_USER, BARLINK_CONFIG_HUGE_PAGES, BARLINK_CONFIG_PROGRESS_THREAD,
    BARLINK_MAX_ALLOWED_IDS, barlink_config,
};

/// The default largest packet: as `barlink bench` and the Python package
/// use, so the C face moves data at their speed out of the box (a 64 KiB
/// message is one packet).
pub(crate) const DEFAULT_MTU: usize = 128 << 10;

/// The largest ring window a config may ask for: beyond it the request is
/// a mistake (the window is memory each side maps), not a tuning.
const MAX_WINDOW_BYTES: u64 = 4 << 30;

/// The least the default send-queue limit allows, and how many ring
/// windows it covers otherwise: enough copies that the ring never runs dry
/// between a blocking sender's calls, even of messages of several windows.
const MIN_SEND_QUEUE_BYTES: u64 = 64 << 20;
const SEND_QUEUE_WINDOWS: u64 = 4;
/// What a link's sends are held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendLimits {
    /// Longest message (`max_message_bytes`).
    pub(crate) max_message_len: u64,
    /// Most bytes of copies held for unacknowledged sends
    /// (`send_queue_bytes`).
    pub(crate) queue_bytes: u64,
    /// Shortest message a blocking send reads in place.
    pub(crate) loan_from: u64,
    /// Payload bytes of a full packet.
    pub(crate) max_payload: u64,
}

impl SendLimits {
    /// The limits a checked config sets for a link of `link`'s windows.
    pub(crate) fn new(config: &barlink_config, link: &LinkConfig) -> SendLimits {
        let queue_bytes = match config.send_queue_bytes {
            0 => (link.window_len as u64)
                .saturating_mul(SEND_QUEUE_WINDOWS)
                .max(MIN_SEND_QUEUE_BYTES),
            bytes => bytes,
        };
        SendLimits {
            max_message_len: link.engine.max_message_len,
            queue_bytes,
            loan_from: barlink::loan::lend_from(link.engine.max_payload_len() as usize) as u64,
            max_payload: u64::from(link.engine.max_payload_len()),
        }
    }
}

/// Checks a caller's config (already widened to this library's layout) and
/// turns it into the transport's.
pub(crate) fn link_config(config: &barlink_config) -> Result<LinkConfig> {
    match config.transport {
        0 | 1 => {}
        // Forced paths: BAR P2P for a local peer over the windows the
        // config names, RDMA for rdma:// and HOST:PORT peers (peer.rs).
        2 | 3 => {}
        other => {
            return Err(Error::invalid(format!(
                "transport {other} is not a barlink_transport value"
            )));
        }
    }
    if config.flags
        & !(BARLINK_CONFIG_HUGE_PAGES
            | BARLINK_CONFIG_ALLOW_ANY_USER
            | BARLINK_CONFIG_PROGRESS_THREAD)
        != 0
    {
        return Err(Error::invalid(format!(
            "flags {:#x} has bits this library does not know",
            config.flags
        )));
    }
    if config.reserved != 0 {
        return Err(Error::invalid("the reserved field must be zero"));
    }
    let mut link = LinkConfig::default();
    let mut engine = EngineConfig {
        mtu: match config.mtu {
            0 => DEFAULT_MTU,
            mtu => mtu as usize,
        },
        ..EngineConfig::default()
    };
    if config.max_message_bytes != 0 {
        engine.max_message_len = config.max_message_bytes;
    }
    if config.peer_timeout_ms != 0 {
        engine.peer_timeout = Duration::from_millis(u64::from(config.peer_timeout_ms));
    }
    engine
        .validate()
        .map_err(|error| Error::invalid(format!("config: {error}")))?;
    if config.window_bytes != 0 {
        link.window_len = usize::try_from(config.window_bytes)
            .ok()
            .filter(|_| config.window_bytes <= MAX_WINDOW_BYTES)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "window_bytes {} is larger than {MAX_WINDOW_BYTES} (4 GiB), the most a ring window may map",
                    config.window_bytes
                ))
            })?;
    }
    let geometry = Geometry::for_window(link.window_len, engine.mtu).map_err(|error| {
        Error::invalid(format!(
            "window_bytes {} with mtu {} (the control block takes {CONTROL_LEN} bytes): {error}",
            link.window_len, engine.mtu
        ))
    })?;
    // Packets in flight: as many as the peer's ring holds, as the bench
    // and the Python package choose.
    let window = geometry.slot_count.clamp(4, 256);
    engine.send_window = window;
    engine.recv_window = window;
    engine
        .validate()
        .map_err(|error| Error::invalid(format!("config: {error}")))?;
    if config.flags & BARLINK_CONFIG_HUGE_PAGES != 0 {
        link.shm = ShmOptions::default().with_huge_pages(HugePages::ReservedOrTransparent);
    }
    link.allow.uids = allowed_ids(
        "allow_uid_count",
        &config.allow_uids,
        config.allow_uid_count,
    )?;
    link.allow.gids = allowed_ids(
        "allow_gid_count",
        &config.allow_gids,
        config.allow_gid_count,
    )?;
    link.allow.anyone = config.flags & BARLINK_CONFIG_ALLOW_ANY_USER != 0;
    link.allow
        .resolve()
        .map_err(|error| Error::invalid(error.to_string()))?;
    link.engine = engine;
    Ok(link)
}

fn allowed_ids(field: &str, ids: &[u32; BARLINK_MAX_ALLOWED_IDS], count: u32) -> Result<Vec<u32>> {
    let count = usize::try_from(count)
        .ok()
        .filter(|&n| n <= BARLINK_MAX_ALLOWED_IDS)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{field} is {count}: at most {BARLINK_MAX_ALLOWED_IDS} ids fit"
            ))
        })?;
    Ok(ids[..count].to_vec())
}
