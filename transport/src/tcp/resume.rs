//! Taking the peer back after a dropped connection: the side that
//! connected dials again, the side that accepted takes a new connection on
//! the listener it kept, and the two authenticate as at setup and prove,
//! with the link's id in a sealed hello, that they are the same link. The
//! engine then retransmits what the old connection lost; its sequence
//! numbers drop anything delivered twice.
#![forbid(unsafe_code)]

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use std::sync::Arc;

use super::acceptor::{Acceptor, Want};
use super::channel::{self, Channel, ChannelOptions};
use super::{HELLO_LEN, TcpHello};
use crate::auth::{PeerAuth, PublicKey, Session};

/// Longest one attempt may block a round: a connect, the handshake and
/// the hello together.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// How this side takes the peer back.
#[derive(Debug)]
pub(super) enum Rejoin {
    /// This side connected: it dials `addr` again.
    Redial { addr: SocketAddr },
    /// This side accepted: it takes its peer's new connection on the
    /// server's socket.
    Reaccept { acceptor: Arc<Acceptor> },
}

/// What an attempt needs.
#[derive(Debug)]
pub(super) struct Resume {
    pub(super) rejoin: Rejoin,
    pub(super) options: ChannelOptions,
    pub(super) auth: PeerAuth,
    /// This side's hello, with the link's id.
    pub(super) hello: TcpHello,
    /// The key the peer proved at setup (pinned keys): only the same key
    /// may take the link back. Another listed peer that learned the
    /// link's id must not.
    pub(super) peer_key: Option<PublicKey>,
}

impl Resume {
    /// One attempt: the new connection and its session, `Ok(None)` when
    /// the peer is not there (yet), or the reason an attempt was refused.
    pub(super) fn attempt(&self) -> Result<Option<(TcpStream, Option<Session>)>, String> {
        let options = ChannelOptions {
            connect_timeout: ATTEMPT_TIMEOUT,
            connect_retries: 0,
            io_timeout: ATTEMPT_TIMEOUT,
            auth_timeout: ATTEMPT_TIMEOUT,
            ..self.options.clone()
        }
        .ending_within(ATTEMPT_TIMEOUT);
        let ours = TcpHello {
            resume: true,
            ..self.hello
        };
        match &self.rejoin {
            Rejoin::Redial { addr } => {
                let Ok(mut channel) = channel::connect(addr, &options) else {
                    return Ok(None);
                };
                channel
                    .authenticate(&self.auth, true)
                    .map_err(|e| e.to_string())?;
                self.check_key(channel.peer_key())?;
                channel
                    .send_sealed(&ours.encode(), "sending the resume hello")
                    .map_err(|e| e.to_string())?;
                let peer = Self::peer_hello(&mut channel)?;
                self.check(&peer)?;
                Ok(Some(channel.into_parts()))
            }
            Rejoin::Reaccept { acceptor } => {
                let want = Want::Resume(self.hello.link_id);
                // Clients this attempt takes off the socket are admitted
                // under the link's own limits: they may be new links for
                // the server, and the attempt's 500 ms are not theirs.
                let options = self.options.clone().ending_within(ATTEMPT_TIMEOUT);
                let Some(mut arrival) = acceptor
                    .next(want, Duration::ZERO, &options, &self.auth)
                    .map_err(|e| e.to_string())?
                else {
                    return Ok(None);
                };
                self.check_key(arrival.channel.peer_key())?;
                self.check(&arrival.hello)?;
                arrival
                    .channel
                    .send_sealed(&ours.encode(), "answering the resume hello")
                    .map_err(|e| e.to_string())?;
                Ok(Some(arrival.channel.into_parts()))
            }
        }
    }

    fn peer_hello(channel: &mut Channel) -> Result<TcpHello, String> {
        let bytes = channel
            .recv_sealed("waiting for the resume hello")
            .map_err(|e| e.to_string())?;
        if bytes.len() != HELLO_LEN {
            return Err(format!("a resume hello of {} bytes", bytes.len()));
        }
        TcpHello::decode(&bytes)
    }

    /// The side taking the link back proved the key the peer proved at
    /// setup.
    fn check_key(&self, key: Option<PublicKey>) -> Result<(), String> {
        if key == self.peer_key {
            return Ok(());
        }
        Err(format!(
            "a peer with key {} offered to resume a link set up with {}: only the peer that set it \
             up may take it back",
            describe_key(key),
            describe_key(self.peer_key)
        ))
    }

    /// The peer's resume hello names this link.
    fn check(&self, peer: &TcpHello) -> Result<(), String> {
        if !peer.resume {
            return Err("a new link, not this one resuming".to_string());
        }
        if peer.link_id != self.hello.link_id {
            return Err(format!(
                "link {:#018x} resuming, this is link {:#018x}",
                peer.link_id, self.hello.link_id
            ));
        }
        self.hello.check_agreement(peer)
    }
}

fn describe_key(key: Option<PublicKey>) -> String {
    key.map_or_else(
        || "none (a pre-shared key)".to_string(),
        |key| format!("{key}"),
    )
}
