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
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::TcpHello;
use super::channel::{Channel, ChannelError, ChannelListener, ChannelOptions};
use crate::auth::PeerAuth;

/// How long a filed connection waits for its taker before it is dropped
/// (its peer's setup or resume then fails and says so).
const FILED_FOR: Duration = Duration::from_secs(10);

/// Connections filed at most: a peer that holds the key could otherwise
/// file connection after connection, each a descriptor for [`FILED_FOR`],
/// until accepting fails for every link on the port. Past it the oldest
/// goes (its peer's setup or resume fails and tries again).
pub(super) const MAX_FILED: usize = 64;

/// Longest one look at the socket blocks while filed connections wait.
const LOOK: Duration = Duration::from_millis(20);

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

/// The shared socket and the connections filed for others.
#[derive(Debug)]
pub(super) struct Acceptor {
    listener: ChannelListener,
    filed: Mutex<VecDeque<Arrival>>,
}

impl Acceptor {
    pub(super) fn new(listener: ChannelListener) -> Acceptor {
        Acceptor {
            listener,
            filed: Mutex::new(VecDeque::new()),
        }
    }

    pub(super) fn listener(&self) -> &ChannelListener {
        &self.listener
    }

    /// A filed connection for `want`, dropping those filed too long ago.
    fn take_filed(&self, want: Want) -> Option<Arrival> {
        let mut filed = self.filed.lock().unwrap_or_else(|e| e.into_inner());
        filed.retain(|arrival| {
            let fresh = arrival.since.elapsed() < FILED_FOR;
            if !fresh {
                tracing::warn!(hello = ?arrival.hello, "dropped a connection nobody took");
            }
            fresh
        });
        let index = filed.iter().position(|arrival| arrival.is_for(want))?;
        filed.remove(index)
    }

    /// The next connection for `want`: a filed one, else one taken off the
    /// socket within `timeout` (zero: one look), authenticated, its hello
    /// read. Connections for others are filed; clients that fail
    /// authentication are logged and dropped, and the wait goes on (the
    /// last refusal is the error if nothing else came).
    pub(super) fn next(
        &self,
        want: Want,
        timeout: Duration,
        options: &ChannelOptions,
        auth: &PeerAuth,
    ) -> Result<Option<Arrival>, ChannelError> {
        let deadline = Instant::now() + timeout;
        let mut last_refusal = None;
        loop {
            if let Some(mut arrival) = self.take_filed(want) {
                arrival.channel.adopt(options);
                return Ok(Some(arrival));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.listener.accept(left.min(LOOK), options) {
                Ok(channel) => match Self::admit(channel, auth) {
                    Ok(mut arrival) if arrival.is_for(want) => {
                        arrival.channel.adopt(options);
                        return Ok(Some(arrival));
                    }
                    Ok(arrival) => self.file(arrival),
                    Err(refusal) => last_refusal = Some(refusal),
                },
                Err(ChannelError::Timeout { .. }) => {}
                Err(error) => return Err(error),
            }
            if Instant::now() >= deadline {
                return match last_refusal {
                    Some(refusal) if want == Want::New => Err(refusal),
                    _ => Ok(None),
                };
            }
        }
    }

    /// Connections waiting for their taker.
    #[cfg(test)]
    pub(super) fn filed_count(&self) -> usize {
        self.filed.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keeps `arrival` for the party it is for, within [`MAX_FILED`].
    fn file(&self, arrival: Arrival) {
        let mut filed = self.filed.lock().unwrap_or_else(|e| e.into_inner());
        while filed.len() >= MAX_FILED {
            if let Some(oldest) = filed.pop_front() {
                tracing::warn!(hello = ?oldest.hello, "dropped a filed connection: too many wait");
            }
        }
        filed.push_back(arrival);
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
}
