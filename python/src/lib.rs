//! barlink for Python: the extension module `barlink._barlink`. Its
//! Python side (`python/barlink/`) re-exports it and adds asyncio and the
//! benchmark.
//!
//! Every face takes the same peer strings (`local:NAME`, `rdma://HOST:PORT`,
//! `tcp://HOST:PORT`) and reaches the path `barlink::connect` picks.
//!
//! `unsafe` is denied here but in `buffer`, the module that calls the
//! CPython buffer API and makes slices of memory Python owns, and one
//! block of `lend`, which lends such memory to a link for a `send` call.
#![deny(unsafe_code)]

mod buffer;
mod collective;
mod errors;
mod exit;
mod lend;
mod link;
mod options;
mod reduce;
mod targets;

use pyo3::prelude::*;

#[pymodule]
fn _barlink(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Stderr logging as BARLINK_LOG says; silent while it is unset.
    barlink::logging::to_stderr(None);
    exit::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SetupError", py.get_type::<errors::SetupError>())?;
    m.add("LinkFailed", py.get_type::<errors::LinkFailed>())?;
    m.add("PeerLost", py.get_type::<errors::PeerLost>())?;
    m.add("LinkClosed", py.get_type::<errors::LinkClosed>())?;
    m.add("Mismatch", py.get_type::<errors::Mismatch>())?;
    m.add_class::<link::Link>()?;
    m.add_class::<link::Request>()?;
    m.add_class::<buffer::Message>()?;
    m.add_class::<collective::Exchange>()?;
    m.add_function(wrap_pyfunction!(options::connect, m)?)?;
    m.add_function(wrap_pyfunction!(options::topology_json, m)?)?;
    m.add_function(wrap_pyfunction!(options::doctor_json, m)?)?;
    m.add_function(wrap_pyfunction!(options::cpu_json, m)?)?;
    m.add_function(wrap_pyfunction!(collective::combine, m)?)?;
    Ok(())
}
