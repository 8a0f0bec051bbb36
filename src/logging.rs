//! Logging to stderr as `BARLINK_LOG` says, for every face: a level
//! (`debug`), or targets with levels
//! (`barlink_transport=debug,barlink_rdma=trace`). The command logs
//! warnings when it is unset; a library (the C ABI, the Python package)
//! stays silent then, as a library inside someone else's process should.
//! A value that does not parse is reported and ignored, never fatal.

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// The variable that turns logging on and says what to log.
pub const LOG_VAR: &str = "BARLINK_LOG";

/// Logs to stderr as `BARLINK_LOG` says, or at `unset` when it is not set
/// (`None`: not at all). Does nothing where the process has a logger of
/// its own already (a Rust program that embeds a face). Whether it
/// installed one.
pub fn to_stderr(unset: Option<LevelFilter>) -> bool {
    let fallback = |level: Option<LevelFilter>| level.map(|l| Targets::new().with_default(l));
    let filter = match std::env::var(LOG_VAR) {
        Ok(spec) if !spec.trim().is_empty() => match spec.parse::<Targets>() {
            Ok(targets) => Some(targets),
            Err(error) => {
                eprintln!(
                    "barlink: {LOG_VAR}={spec:?} is not a log filter ({error}); use e.g. debug or barlink_transport=debug"
                );
                fallback(Some(unset.unwrap_or(LevelFilter::WARN)))
            }
        },
        _ => fallback(unset),
    };
    let Some(filter) = filter else {
        return false;
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init()
        .is_ok()
}
