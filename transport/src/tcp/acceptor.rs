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
//! Each connection is admitted (authenticated, its hello read) on a thread
//! of its own ([`super::lobby`]), so a client that says nothing holds back
//! no one.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use super::TcpHello;
use super::channel::{Channel, ChannelError, ChannelListener, ChannelOptions};
use super::lobby::{Lobby, Take};
use crate::auth::PeerAuth;

/// How long a filed connection waits for its taker before it is dropped
/// (its peer's setup or resume then fails and says so).
const FILED_FOR: Duration = Duration::from_secs(10);

/// Connections filed at most: a peer that holds the key could otherwise
/// file connection after connection, each a descriptor for [`FILED_FOR`],
/// until accepting fails for every link on the port. Past it the oldest
/// goes (its peer's setup or resume fails and tries again).
pub(super) const MAX_FILED: usize = 64;

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
    /// What it was authenticated against: only a taker with the same
    /// takes it.
    auth: PeerAuth,
}

impl Arrival {
    fn is_for(&self, want: Want) -> bool {
        match want {
            Want::New => !self.hello.resume,
            Want::Resume(id) => self.hello.resume && self.hello.link_id == id,
        }
    }
}

/// The shared socket and the connections filed for their takers.
#[derive(Debug)]
pub(super) struct Acceptor {
    listener: ChannelListener,
    filed: Lobby<Arrival>,
}

impl Acceptor {
    pub(super) fn new(listener: ChannelListener) -> Acceptor {
        Acceptor {
            listener,
            filed: Lobby::new(FILED_FOR, MAX_FILED),
        }
    }

    pub(super) fn listener(&self) -> &ChannelListener {
        &self.listener
    }

    /// The next connection for `want`: a filed one, else one taken off the
    /// socket and admitted within `timeout` (zero: one look). Connections
    /// for others are filed; clients that fail authentication are logged
    /// and dropped, and the wait goes on (for a new link, a refusal is the
    /// error if nothing else came).
    pub(super) fn next(
        &self,
        want: Want,
        timeout: Duration,
        options: &ChannelOptions,
        auth: &PeerAuth,
    ) -> Result<Option<Arrival>, ChannelError> {
        let admit_auth = auth.clone();
        let take = Take {
            listener: &self.listener,
            timeout,
            options,
            pick: &|arrival: &Arrival| {
                arrival.is_for(want) && auth.would_accept(&arrival.auth, arrival.channel.peer_key())
            },
            admit: Arc::new(move |channel| admit(channel, &admit_auth)),
            refusal_is_error: want == Want::New,
        };
        let mut arrival = self.filed.next(&take)?;
        if let Some(arrival) = &mut arrival {
            arrival.channel.adopt(options);
        }
        Ok(arrival)
    }

    /// Connections waiting for their taker.
    #[cfg(test)]
    pub(super) fn filed_count(&self) -> usize {
        self.filed.ready_count()
    }
}

/// Authenticates a new connection and reads its hello.
fn admit(mut channel: Channel, auth: &PeerAuth) -> Result<Arrival, ChannelError> {
    channel.authenticate_client(auth)?;
    let bytes = channel.recv_sealed("waiting for the peer's TCP link hello")?;
    let hello = TcpHello::decode(&bytes).map_err(|detail| {
        let peer = channel.peer_name();
        tracing::warn!(%peer, detail, "dropped a client whose hello does not decode");
        ChannelError::Refusal {
            peer,
            error: Box::new(ChannelError::Protocol { detail }),
        }
    })?;
    Ok(Arrival {
        channel,
        hello,
        auth: auth.clone(),
    })
}
