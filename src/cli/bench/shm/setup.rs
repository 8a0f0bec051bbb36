//! Setting each path up between the two processes: the parent listens,
//! the child connects.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink_transport::link::{LinkConfig, Listener, RingLink, connect, connect_windows};
use barlink_transport::window::{FaultConfig, FaultWindow, ShmWindow};

use super::pipes::{Pipe, Sending, SocketPipe, link_pipe};
use super::plan::{PeerPlan, ProcPath, STEP_TIMEOUT, link_config};
use super::raw_ring::RawRingPipe;
use super::watch::PeerWatch;

/// A link whose writes into the peer's ring flip a bit with probability
/// `rate` per packet. Each packet is two writes (payload, then header, each
/// one fault decision), so each write is faulted with `rate / 2`. Both
/// windows go through the wrapper so that both directions pay its cost.
fn faulty_link(
    own: ShmWindow,
    peer: ShmWindow,
    config: &LinkConfig,
    rate: f64,
    seed: u64,
) -> Result<RingLink<FaultWindow<ShmWindow>, Arc<[u8]>>, String> {
    let own = FaultWindow::new(own, FaultConfig::none(), seed);
    let peer = FaultWindow::new(
        peer,
        FaultConfig::none().with_bit_flip(rate / 2.0),
        seed ^ 0x5EED,
    );
    RingLink::new(own, peer, config.engine.clone(), 1).map_err(|e| e.to_string())
}

fn socket_address(name: &str) -> Result<SocketAddr, String> {
    SocketAddr::from_abstract_name(format!("barlink-bench/{name}")).map_err(|e| e.to_string())
}

/// Opens the pipe on the parent's side (it listens; the child connects).
pub(super) fn parent_pipe(
    plan: &PeerPlan,
    path: ProcPath,
    watch: &PeerWatch,
) -> Result<Box<dyn Pipe>, String> {
    let config = link_config(plan);
    let name = format!("{}-{}", plan.name, path.name());
    Ok(match path {
        ProcPath::Barlink | ProcPath::BarlinkCopied | ProcPath::BarlinkAcked => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            link_pipe(
                listener.accept(&config).map_err(|e| e.to_string())?,
                plan.progress,
                sending(path),
            )?
        }
        ProcPath::BarlinkFaults => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            let (own, peer) = listener
                .accept_windows(&config)
                .map_err(|e| e.to_string())?;
            link_pipe(
                faulty_link(own, peer, &config, plan.fault_rate, plan.seed)?,
                plan.progress,
                Sending::Shared,
            )?
        }
        ProcPath::RawRing | ProcPath::RawRingCrc => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            let (own, peer) = listener
                .accept_windows(&config)
                .map_err(|e| e.to_string())?;
            Box::new(RawRingPipe::new(own, peer, path == ProcPath::RawRingCrc)?)
        }
        ProcPath::UnixSocket => {
            let listener =
                UnixListener::bind_addr(&socket_address(&name)?).map_err(|e| e.to_string())?;
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            let deadline = Instant::now() + config.setup_timeout;
            let stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline || !watch.peer_running() {
                            return Err("unix socket: the peer never connected".into());
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e.to_string()),
                }
            };
            stream.set_nonblocking(false).map_err(|e| e.to_string())?;
            stream
                .set_read_timeout(Some(STEP_TIMEOUT))
                .map_err(|e| e.to_string())?;
            Box::new(SocketPipe(stream))
        }
    })
}

/// How a barlink path's sender (the parent) hands its messages to the
/// link.
fn sending(path: ProcPath) -> Sending {
    match path {
        ProcPath::BarlinkCopied => Sending::Copied,
        ProcPath::BarlinkAcked => Sending::Acked,
        _ => Sending::Shared,
    }
}

/// How the child hands the link its answers ("got them", the latency
/// echoes): as the parent sends, but never awaiting them, since the
/// parent's acknowledgement of an answer comes only with its next message.
fn answering(path: ProcPath) -> Sending {
    match sending(path) {
        Sending::Acked => Sending::Shared,
        other => other,
    }
}

pub(super) fn child_pipe(plan: &PeerPlan, path: ProcPath) -> Result<Box<dyn Pipe>, String> {
    let config = link_config(plan);
    let name = format!("{}-{}", plan.name, path.name());
    Ok(match path {
        ProcPath::Barlink | ProcPath::BarlinkCopied | ProcPath::BarlinkAcked => link_pipe(
            connect(&name, &config).map_err(|e| e.to_string())?,
            plan.progress,
            answering(path),
        )?,
        ProcPath::BarlinkFaults => {
            let (own, peer) = connect_windows(&name, &config).map_err(|e| e.to_string())?;
            link_pipe(
                faulty_link(own, peer, &config, plan.fault_rate, !plan.seed)?,
                plan.progress,
                Sending::Shared,
            )?
        }
        ProcPath::RawRing | ProcPath::RawRingCrc => {
            let (own, peer) = connect_windows(&name, &config).map_err(|e| e.to_string())?;
            Box::new(RawRingPipe::new(own, peer, path == ProcPath::RawRingCrc)?)
        }
        ProcPath::UnixSocket => {
            let addr = socket_address(&name)?;
            let deadline = Instant::now() + config.setup_timeout;
            let stream = loop {
                match UnixStream::connect_addr(&addr) {
                    Ok(stream) => break stream,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => return Err(e.to_string()),
                }
            };
            stream
                .set_read_timeout(Some(STEP_TIMEOUT))
                .map_err(|e| e.to_string())?;
            Box::new(SocketPipe(stream))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_barlink_path_sends_as_its_name_says_and_the_child_never_awaits() {
        let cases = [
            (ProcPath::Barlink, Sending::Shared, Sending::Shared),
            (ProcPath::BarlinkCopied, Sending::Copied, Sending::Copied),
            (ProcPath::BarlinkAcked, Sending::Acked, Sending::Shared),
            (ProcPath::BarlinkFaults, Sending::Shared, Sending::Shared),
        ];
        for (path, parent, child) in cases {
            assert_eq!(sending(path), parent, "{}", path.name());
            assert_eq!(answering(path), child, "{}", path.name());
        }
    }
}
