//! One listening socket shared by a TCP server and every link it accepted.
//!
//! A connection on it is either a new link (for the server's accept) or a
//! link taking its peer back after a dropped connection (for that link).
//! Only its sealed hello, after authentication, says which. So whoever
//! takes a connection off the socket authenticates it and reads its hello;
//! one meant for another party is filed where that party looks first.
//! Without this, a link resuming could take a new peer's connection and
//! drop it, and a server could take a resuming link's connection and
//! refuse it: with several peers on one port, both happen.
//!
//! Each connection taken off the socket is admitted (authenticated, its
//! hello read) on a thread of its own, so that a client that connects and
//! says nothing — no key needed for that — holds back nobody else: the
//! one that proves itself first is linked first. At most
//! [`MAX_ADMITTING`] admissions run at once; past that the one that has
//! waited longest is cut off (a client that holds the key takes
//! milliseconds).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::TcpHello;
use super::channel::{ADMISSION_FLOOR, Channel, ChannelError, ChannelListener, ChannelOptions};
use crate::auth::PeerAuth;

/// How long a filed connection waits for its taker before it is dropped
/// (its peer's setup or resume then fails and says so).
const FILED_FOR: Duration = Duration::from_secs(10);

/// Connections filed at most: a peer that holds the key could otherwise
/// file connection after connection, each a descriptor for [`FILED_FOR`],
/// until accepting fails for every link on the port. Past it the oldest
/// goes (its peer's setup or resume fails and tries again).
pub(super) const MAX_FILED: usize = 64;

/// Admissions running at once at most (each a thread and a descriptor).
pub(super) const MAX_ADMITTING: usize = 16;

/// Longest a taker waits before it looks at the socket again.
const LOOK: Duration = Duration::from_millis(5);

/// What a taker wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// A peer setting up a new link.
    New,
    /// The peer of the link with this id, resuming it.
    Resume(u64),
}

/// An authenticated connection and the hello it sent.
#[derive(Debug)]
pub(super) struct Arrival {
    pub(super) channel: Channel,
    pub(super) hello: TcpHello,
    since: Instant,
}

impl Arrival {
    fn is_for(&self, want: Want) -> bool {
        match want {
            Want::New => !self.hello.resume,
            Want::Resume(id) => self.hello.resume && self.hello.link_id == id,
        }
    }
}

/// A connection being admitted.
#[derive(Debug)]
struct Admitting {
    id: u64,
    since: Instant,
    /// The same socket, to cut the admission off.
    socket: TcpStream,
}

/// What the takers and the admissions share.
#[derive(Debug, Default)]
struct Lobby {
    /// Admitted connections waiting for their taker, oldest first.
    filed: VecDeque<Arrival>,
    admitting: Vec<Admitting>,
    next_admission: u64,
    /// Clients refused so far, and the last refusal.
    refusals: u64,
    last_refusal: Option<ChannelError>,
}

/// The shared socket and the connections filed for others.
#[derive(Debug)]
pub(super) struct Acceptor {
    listener: ChannelListener,
    lobby: Arc<(Mutex<Lobby>, Condvar)>,
}

impl Acceptor {
    pub(super) fn new(listener: ChannelListener) -> Acceptor {
        Acceptor {
            listener,
            lobby: Arc::default(),
        }
    }

    pub(super) fn listener(&self) -> &ChannelListener {
        &self.listener
    }

    fn lock(&self) -> MutexGuard<'_, Lobby> {
        lock(&self.lobby.0)
    }

    /// The next connection for `want`: a filed one, else one taken off the
    /// socket and admitted within `timeout` (zero: one look). Connections
    /// for others are filed; clients that fail authentication are logged
    /// and dropped, and the wait goes on (for a new link, a refusal is the
    /// error if nothing else came). A client this call took off the socket
    /// keeps at least [`ADMISSION_FLOOR`] to prove itself, whatever the
    /// timeout, so that a poll does not take a waiting client only to
    /// leave it unanswered.
    pub(super) fn next(
        &self,
        want: Want,
        timeout: Duration,
        options: &ChannelOptions,
        auth: &PeerAuth,
    ) -> Result<Option<Arrival>, ChannelError> {
        let deadline = Instant::now() + timeout;
        let refusals_before = self.lock().refusals;
        let mut started = Vec::new();
        loop {
            let mut lobby = self.lock();
            if let Some(mut arrival) = take_filed(&mut lobby, want) {
                drop(lobby);
                arrival.channel.adopt(options);
                return Ok(Some(arrival));
            }
            drop(lobby);
            while let Some(channel) = self.listener.try_accept(options)? {
                if let Some(id) = self.admit_apart(channel, options, auth) {
                    started.push(id);
                }
            }
            let now = Instant::now();
            let mut lobby = self.lock();
            // Admissions this call began and that may still finish.
            let admitted_by = lobby
                .admitting
                .iter()
                .filter(|admitting| started.contains(&admitting.id))
                .map(|admitting| admitting.since + ADMISSION_FLOOR)
                .max();
            let end = admitted_by.map_or(deadline, |floor| deadline.max(floor));
            if now >= end {
                let refused = lobby.refusals > refusals_before;
                return match lobby.last_refusal.take() {
                    Some(refusal) if refused && want == Want::New => Err(refusal),
                    refusal => {
                        lobby.last_refusal = refusal;
                        Ok(None)
                    }
                };
            }
            if take_filed_ready(&lobby, want) {
                continue;
            }
            let wait = (end - now).min(LOOK);
            drop(
                self.lobby
                    .1
                    .wait_timeout(lobby, wait)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }

    /// Connections waiting for their taker.
    #[cfg(test)]
    pub(super) fn filed_count(&self) -> usize {
        self.lock().filed.len()
    }

    /// Admissions under way.
    #[cfg(test)]
    pub(super) fn admitting_count(&self) -> usize {
        self.lock().admitting.len()
    }

    /// Admits `channel` on a thread of its own, within the options'
    /// authentication limit; its id, or `None` when it could not start
    /// (the connection is dropped and the client told nothing).
    fn admit_apart(
        &self,
        mut channel: Channel,
        options: &ChannelOptions,
        auth: &PeerAuth,
    ) -> Option<u64> {
        // The whole admission, hello included, within the authentication
        // limit, and none of it within the taker's deadline: the taker
        // may be gone by then, and another takes what it admitted.
        channel.set_deadline(Some(Instant::now() + options.auth_timeout));
        let socket = match channel.try_clone_socket() {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(%error, "dropped a client: no second handle on its socket");
                return None;
            }
        };
        let id = {
            let mut lobby = self.lock();
            while lobby.admitting.len() >= MAX_ADMITTING {
                let oldest = lobby.admitting.remove(0);
                tracing::warn!(
                    waited = ?oldest.since.elapsed(),
                    "cut off the admission that waited longest: too many clients at once"
                );
                let _ = oldest.socket.shutdown(std::net::Shutdown::Both);
            }
            let id = lobby.next_admission;
            lobby.next_admission += 1;
            lobby.admitting.push(Admitting {
                id,
                since: Instant::now(),
                socket,
            });
            id
        };
        let lobby = Arc::clone(&self.lobby);
        let auth = auth.clone();
        let spawned = std::thread::Builder::new()
            .name("barlink-tcp-admit".to_string())
            .spawn(move || {
                let outcome = admit(channel, &auth);
                let (lock_of, arrived) = &*lobby;
                let mut lobby = lock(lock_of);
                lobby.admitting.retain(|admitting| admitting.id != id);
                match outcome {
                    Ok(arrival) => file(&mut lobby, arrival),
                    Err(refusal) => {
                        lobby.refusals += 1;
                        lobby.last_refusal = Some(refusal);
                    }
                }
                drop(lobby);
                arrived.notify_all();
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "dropped a client: no thread to admit it");
            self.lock().admitting.retain(|admitting| admitting.id != id);
            return None;
        }
        Some(id)
    }

}

fn lock(mutex: &Mutex<Lobby>) -> MutexGuard<'_, Lobby> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A filed connection for `want`, dropping those filed too long ago.
fn take_filed(lobby: &mut Lobby, want: Want) -> Option<Arrival> {
    lobby.filed.retain(|arrival| {
        let fresh = arrival.since.elapsed() < FILED_FOR;
        if !fresh {
            tracing::warn!(hello = ?arrival.hello, "dropped a connection nobody took");
        }
        fresh
    });
    let index = lobby
        .filed
        .iter()
        .position(|arrival| arrival.is_for(want))?;
    lobby.filed.remove(index)
}

/// Whether a connection for `want` is filed.
fn take_filed_ready(lobby: &Lobby, want: Want) -> bool {
    lobby.filed.iter().any(|arrival| arrival.is_for(want))
}

/// Keeps `arrival` for the party it is for, within [`MAX_FILED`].
fn file(lobby: &mut Lobby, arrival: Arrival) {
    while lobby.filed.len() >= MAX_FILED {
        if let Some(oldest) = lobby.filed.pop_front() {
            tracing::warn!(hello = ?oldest.hello, "dropped a filed connection: too many wait");
        }
    }
    lobby.filed.push_back(arrival);
}

/// Authenticates a new connection and reads its hello.
fn admit(mut channel: Channel, auth: &PeerAuth) -> Result<Arrival, ChannelError> {
    let peer = channel
        .peer_addr()
        .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
    let refused = |error: ChannelError| {
        tracing::warn!(%peer, %error, "refused a client that failed authentication");
        ChannelError::Refusal {
            peer: peer.clone(),
            error: Box::new(error),
        }
    };
    channel.authenticate(auth, false).map_err(refused)?;
    let bytes = channel.recv_sealed("waiting for the peer's TCP link hello")?;
    let hello = TcpHello::decode(&bytes).map_err(|detail| {
        tracing::warn!(%peer, detail, "dropped a client whose hello does not decode");
        ChannelError::Refusal {
            peer: peer.clone(),
            error: Box::new(ChannelError::Protocol { detail }),
        }
    })?;
    Ok(Arrival {
        channel,
        hello,
        since: Instant::now(),
    })
}
