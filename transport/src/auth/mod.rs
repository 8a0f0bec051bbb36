//! Mutual authentication of remote setup, before any address or key of a
//! ring leaves the host.
//!
//! Both sides first send an 8-byte [`preamble`] in the clear: `BLAU`, a
//! version and the [`AuthMode`] each uses, so that a mismatch ("the server
//! wants a pre-shared key, this side runs --insecure") is named at once on
//! both ends. Then a Noise handshake (X25519, AES-256-GCM, BLAKE2s; the
//! AEAD from `ring`, whose AES-NI/VAES code seals several times faster than
//! a portable ChaCha20-Poly1305 on the CPUs barlink runs on):
//!
//! - with a pre-shared key, `NNpsk0`: the key is mixed in from the first
//!   message, so a side without it cannot produce or read one;
//! - with pinned keys, `XX`: each side proves it holds the private half of
//!   a static key, and each checks the other's public key against its list.
//!
//! Both preambles are the handshake's prologue, so neither can be altered
//! on the way. Everything after the handshake (the RDMA hello, the ready
//! byte) travels sealed by the [`Session`]. Messages are framed as a
//! 2-byte little-endian length and the bytes; an empty frame means "I
//! refuse you" and carries nothing else.
//!
//! [`Handshake`] is sans-IO (it takes and gives messages); [`authenticate`]
//! drives it over any [`FrameStream`].
#![forbid(unsafe_code)]

mod keys;
mod record;

use std::fmt;

use record::RecordKeys;

pub use keys::{
    AuthMode, KEY_FILE_VAR, PEER_KEYS_VAR, PSK_FILE_VAR, PSK_VAR, PeerAuth, PublicKey, SecretKey,
    parse_public_keys, public_key_path,
};

const PSK_PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_BLAKE2s";
const PINNED_PATTERN: &str = "Noise_XX_25519_AESGCM_BLAKE2s";
/// `b"BLAU"`.
pub const PREAMBLE_MAGIC: [u8; 4] = *b"BLAU";
/// The authentication protocol this build speaks. Version 2 added the
/// confirmation that ends every handshake.
pub const AUTH_VERSION: u8 = 2;
/// Bytes of a preamble.
pub const PREAMBLE_LEN: usize = 8;
/// Largest frame: a Noise message is at most 65,535 bytes.
pub const MAX_FRAME: usize = 65_535;
/// A sealed message carries this many bytes more than its plaintext.
pub const SEAL_OVERHEAD: usize = 16;

/// Why authentication failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthError {
    /// Nothing configures authentication and `--insecure` was not given.
    NotConfigured,
    /// More than one way is configured.
    Ambiguous { set: String },
    /// A key or key file is unusable.
    BadKey { source: String, why: String },
    /// The peer is not speaking this protocol.
    NotBarlink { detail: String },
    /// The two sides use different modes.
    ModeMismatch { ours: AuthMode, theirs: AuthMode },
    /// The peer's message does not decrypt: it holds another pre-shared
    /// key, or the bytes were altered on the way.
    WrongKey,
    /// The peer proved a key this side does not pin.
    UnknownPeerKey { key: PublicKey },
    /// The peer refused this side (an empty frame).
    RefusedByPeer { mode: AuthMode },
    /// A frame or message breaks the protocol.
    Malformed { detail: String },
    /// The cryptography library failed where it should not.
    Noise { detail: String },
}

impl AuthError {
    fn noise(error: impl fmt::Display) -> AuthError {
        AuthError::Noise {
            detail: error.to_string(),
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::NotConfigured => write!(
                f,
                "no authentication is configured for remote setup: set {PSK_FILE_VAR} to a file holding a \
                 pre-shared key (`barlink keygen --psk --out FILE`, the same file on both nodes), or \
                 {KEY_FILE_VAR} and {PEER_KEYS_VAR} for pinned keys, or run without authentication \
                 by asking for it (--insecure; see docs/SECURITY.md)"
            ),
            AuthError::Ambiguous { set } => write!(
                f,
                "authentication is configured more than one way ({set}): set a pre-shared key or pinned keys, not both"
            ),
            AuthError::BadKey { source, why } => write!(f, "key {source}: {why}"),
            AuthError::NotBarlink { detail } => write!(
                f,
                "the peer does not speak barlink's authenticated setup ({detail}): is something else on that port, or an older barlink?"
            ),
            AuthError::ModeMismatch { ours, theirs } => write!(
                f,
                "this side uses {}, the peer {}: configure both sides alike",
                ours.describe(),
                theirs.describe()
            ),
            AuthError::WrongKey => write!(
                f,
                "the peer's handshake does not decrypt: it holds another pre-shared key (or the bytes were altered on the way); nothing was sent to it"
            ),
            AuthError::UnknownPeerKey { key } => write!(
                f,
                "the peer proved public key {key}, which is not in this side's list of peer keys; nothing was sent to it"
            ),
            AuthError::RefusedByPeer { mode } => match mode {
                AuthMode::PinnedKeys => write!(
                    f,
                    "the peer refused this side: it does not list this node's public key (see its log)"
                ),
                _ => write!(
                    f,
                    "the peer refused this side: the pre-shared keys differ (see its log)"
                ),
            },
            AuthError::Malformed { detail } => write!(f, "authentication: {detail}"),
            AuthError::Noise { detail } => write!(f, "authentication: {detail}"),
        }
    }
}

impl std::error::Error for AuthError {}

/// This side's preamble.
pub fn preamble(mode: AuthMode) -> [u8; PREAMBLE_LEN] {
    let mut bytes = [0u8; PREAMBLE_LEN];
    bytes[..4].copy_from_slice(&PREAMBLE_MAGIC);
    bytes[4] = AUTH_VERSION;
    bytes[5] = mode as u8;
    bytes
}

/// The mode a peer's preamble announces, checked.
pub fn read_preamble(bytes: &[u8; PREAMBLE_LEN]) -> Result<AuthMode, AuthError> {
    if bytes[..4] != PREAMBLE_MAGIC {
        return Err(AuthError::NotBarlink {
            detail: format!("it began with {:02x?}", &bytes[..4]),
        });
    }
    if bytes[4] != AUTH_VERSION {
        return Err(AuthError::NotBarlink {
            detail: format!(
                "authentication version {}, this build's is {AUTH_VERSION}",
                bytes[4]
            ),
        });
    }
    if bytes[6..] != [0, 0] {
        return Err(AuthError::Malformed {
            detail: "the preamble's reserved bytes are not zero".to_string(),
        });
    }
    AuthMode::from_byte(bytes[5]).ok_or_else(|| AuthError::Malformed {
        detail: format!("the preamble names mode {}, which does not exist", bytes[5]),
    })
}

/// The Noise handshake between the two preambles and the [`Session`].
pub struct Handshake {
    state: snow::HandshakeState,
    mode: AuthMode,
    pinned: Vec<PublicKey>,
    /// Whether the peer's static key has been checked against `pinned`.
    peer_checked: bool,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake")
            .field("mode", &self.mode)
            .field("finished", &self.state.is_handshake_finished())
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts the handshake for `auth` (not [`PeerAuth::Insecure`]): the
    /// initiator is the side that connected. The two preambles, the
    /// initiator's first, become the prologue.
    pub fn new(
        auth: &PeerAuth,
        initiator: bool,
        initiator_preamble: &[u8; PREAMBLE_LEN],
        responder_preamble: &[u8; PREAMBLE_LEN],
    ) -> Result<Handshake, AuthError> {
        let mut prologue = Vec::with_capacity(2 * PREAMBLE_LEN);
        prologue.extend_from_slice(initiator_preamble);
        prologue.extend_from_slice(responder_preamble);
        let (pattern, pinned) = match auth {
            PeerAuth::Insecure => {
                return Err(AuthError::Noise {
                    detail: "an insecure setup has no handshake".to_string(),
                });
            }
            PeerAuth::PreSharedKey { .. } => (PSK_PATTERN, Vec::new()),
            PeerAuth::PinnedKeys { peers, .. } => (PINNED_PATTERN, peers.clone()),
        };
        let params: snow::params::NoiseParams = pattern.parse().map_err(AuthError::noise)?;
        let mut builder = snow::Builder::new(params)
            .prologue(&prologue)
            .map_err(AuthError::noise)?;
        builder = match auth {
            PeerAuth::PreSharedKey { key, .. } => builder.psk(0, &key.0),
            PeerAuth::PinnedKeys { private, .. } => builder.local_private_key(&private.0),
            PeerAuth::Insecure => unreachable!("returned above"),
        }
        .map_err(AuthError::noise)?;
        let state = if initiator {
            builder.build_initiator()
        } else {
            builder.build_responder()
        }
        .map_err(AuthError::noise)?;
        Ok(Handshake {
            state,
            mode: auth.mode(),
            pinned,
            peer_checked: false,
        })
    }

    pub fn is_finished(&self) -> bool {
        self.state.is_handshake_finished()
    }

    /// Whether the next message is this side's to write.
    pub fn is_my_turn(&self) -> bool {
        self.state.is_my_turn()
    }

    /// The next message to send.
    pub fn write_message(&mut self) -> Result<Vec<u8>, AuthError> {
        let mut message = vec![0u8; MAX_FRAME];
        let len = self
            .state
            .write_message(&[], &mut message)
            .map_err(AuthError::noise)?;
        message.truncate(len);
        Ok(message)
    }

    /// Takes the peer's next message. A peer without the pre-shared key
    /// fails here ([`AuthError::WrongKey`]), and so does one whose proven
    /// static key is not pinned ([`AuthError::UnknownPeerKey`]).
    pub fn read_message(&mut self, message: &[u8]) -> Result<(), AuthError> {
        if message.is_empty() {
            return Err(AuthError::RefusedByPeer { mode: self.mode });
        }
        let mut payload = vec![0u8; MAX_FRAME];
        let len = self
            .state
            .read_message(message, &mut payload)
            .map_err(|error| match error {
                snow::Error::Decrypt => AuthError::WrongKey,
                other => AuthError::Malformed {
                    detail: format!("the peer's handshake message: {other}"),
                },
            })?;
        if len != 0 {
            return Err(AuthError::Malformed {
                detail: format!(
                    "a handshake message carried {len} bytes of payload, none expected"
                ),
            });
        }
        self.check_peer_key()
    }

    fn check_peer_key(&mut self) -> Result<(), AuthError> {
        if self.mode != AuthMode::PinnedKeys || self.peer_checked {
            return Ok(());
        }
        let Some(remote) = self.state.get_remote_static() else {
            return Ok(());
        };
        let mut key = [0u8; 32];
        key.copy_from_slice(remote);
        let key = PublicKey(key);
        if !self.pinned.contains(&key) {
            return Err(AuthError::UnknownPeerKey { key });
        }
        self.peer_checked = true;
        Ok(())
    }

    /// The session, once the handshake is finished.
    pub fn finish(self) -> Result<Session, AuthError> {
        if self.mode == AuthMode::PinnedKeys && !self.peer_checked {
            return Err(AuthError::Malformed {
                detail: "the handshake ended without the peer's key".to_string(),
            });
        }
        let peer_key = self.state.get_remote_static().map(|remote| {
            let mut key = [0u8; 32];
            key.copy_from_slice(remote);
            PublicKey(key)
        });
        let mut state = self.state;
        if !state.is_handshake_finished() {
            return Err(AuthError::Malformed {
                detail: "the handshake is not finished".to_string(),
            });
        }
        let (initiator_sends, responder_sends) = state.dangerously_get_raw_split();
        let keys = if state.is_initiator() {
            RecordKeys::new(&initiator_sends, &responder_sends)
        } else {
            RecordKeys::new(&responder_sends, &initiator_sends)
        }?;
        Ok(Session {
            keys: Some(keys),
            peer_key,
            mode: self.mode,
        })
    }
}

/// Both sides' handshakes run to their end in memory, each message passed
/// through `tamper` (its index, its bytes) on the way, the responder
/// seeing `responder_sees` as the initiator's preamble: for tests.
#[cfg(test)]
pub(crate) fn run_handshakes(
    auth: &PeerAuth,
    responder_sees: [u8; PREAMBLE_LEN],
    mut tamper: impl FnMut(usize, &mut Vec<u8>),
) -> Result<(Handshake, Handshake), AuthError> {
    let initiator_preamble = preamble(auth.mode());
    let responder_preamble = preamble(auth.mode());
    let mut initiator = Handshake::new(auth, true, &initiator_preamble, &responder_preamble)?;
    let mut responder = Handshake::new(auth, false, &responder_sees, &responder_preamble)?;
    let mut index = 0;
    while !(initiator.is_finished() && responder.is_finished()) {
        let (from, to) = if initiator.is_my_turn() {
            (&mut initiator, &mut responder)
        } else {
            (&mut responder, &mut initiator)
        };
        let mut message = from.write_message()?;
        tamper(index, &mut message);
        to.read_message(&message)?;
        index += 1;
    }
    Ok((initiator, responder))
}

/// What follows authentication: messages sealed (encrypted and
/// authenticated, in order) for the peer, or passed through unchanged when
/// the setup runs without authentication.
pub struct Session {
    keys: Option<RecordKeys>,
    peer_key: Option<PublicKey>,
    mode: AuthMode,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("sealed", &self.keys.is_some())
            .field("peer_key", &self.peer_key)
            .finish()
    }
}

impl Session {
    /// A session that seals nothing (`--insecure`).
    pub fn insecure() -> Session {
        Session {
            keys: None,
            peer_key: None,
            mode: AuthMode::Insecure,
        }
    }

    pub fn is_authenticated(&self) -> bool {
        self.keys.is_some()
    }

    /// The peer's proven public key (pinned keys only).
    pub fn peer_key(&self) -> Option<PublicKey> {
        self.peer_key
    }

    /// Seals `plaintext` and sends it as one frame.
    pub fn send<S: FrameStream>(
        &mut self,
        stream: &mut S,
        plaintext: &[u8],
    ) -> Result<(), S::Error> {
        let sealed = self.seal(plaintext)?;
        stream.send_frame(&sealed)
    }

    /// Receives one frame and opens it. An empty frame is the peer's
    /// refusal, as during the handshake.
    pub fn recv<S: FrameStream>(&mut self, stream: &mut S) -> Result<Vec<u8>, S::Error> {
        let frame = stream.recv_frame()?;
        if frame.is_empty() {
            return Err(AuthError::RefusedByPeer { mode: self.mode }.into());
        }
        Ok(self.open(&frame)?)
    }

    /// Encrypts `in_out` where it lies and returns the tag that follows
    /// it on the wire (at most `MAX_FRAME - 16` bytes at once): for a
    /// medium that seals records in its own buffers, with no copy.
    pub fn seal_in_place(&mut self, in_out: &mut [u8]) -> Result<[u8; SEAL_OVERHEAD], AuthError> {
        if in_out.len() + SEAL_OVERHEAD > MAX_FRAME {
            return Err(AuthError::Malformed {
                detail: format!("a message of {} bytes is too long to seal", in_out.len()),
            });
        }
        self.keys_mut()?.seal_in_place(in_out)
    }

    /// Opens `in_out` (ciphertext, then its tag) where it lies and returns
    /// the plaintext's length, at its front; an altered, replayed or
    /// reordered message is refused.
    pub fn open_in_place(&mut self, in_out: &mut [u8]) -> Result<usize, AuthError> {
        self.keys_mut()?.open_in_place(in_out)
    }

    fn keys_mut(&mut self) -> Result<&mut RecordKeys, AuthError> {
        self.keys.as_mut().ok_or_else(|| AuthError::Noise {
            detail: "a session without authentication seals nothing".to_string(),
        })
    }

    /// `plaintext` sealed for the peer (at most `MAX_FRAME - 16` bytes).
    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, AuthError> {
        if self.keys.is_none() {
            return Ok(plaintext.to_vec());
        }
        let mut sealed = Vec::with_capacity(plaintext.len() + SEAL_OVERHEAD);
        sealed.extend_from_slice(plaintext);
        let tag = self.seal_in_place(&mut sealed)?;
        sealed.extend_from_slice(&tag);
        Ok(sealed)
    }

    /// The plaintext of a message the peer sealed; an altered, replayed or
    /// reordered one is refused.
    pub fn open(&mut self, sealed: &[u8]) -> Result<Vec<u8>, AuthError> {
        if self.keys.is_none() {
            return Ok(sealed.to_vec());
        }
        let mut plaintext = sealed.to_vec();
        let len = self.open_in_place(&mut plaintext)?;
        plaintext.truncate(len);
        Ok(plaintext)
    }
}

/// A byte stream that setup runs over, with its own deadlines and errors.
pub trait FrameStream {
    type Error: From<AuthError>;
    fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), Self::Error>;
    fn recv_bytes(&mut self, buf: &mut [u8]) -> Result<(), Self::Error>;

    /// Sends one frame (`bytes.len()` ≤ [`MAX_FRAME`]).
    fn send_frame(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        let len = u16::try_from(bytes.len()).map_err(|_| AuthError::Malformed {
            detail: format!("a frame of {} bytes is too long", bytes.len()),
        })?;
        let mut framed = Vec::with_capacity(2 + bytes.len());
        framed.extend_from_slice(&len.to_le_bytes());
        framed.extend_from_slice(bytes);
        self.send_bytes(&framed)
    }

    /// Receives one frame (the length is at most [`MAX_FRAME`] by its
    /// encoding, so nothing larger is ever allocated).
    fn recv_frame(&mut self) -> Result<Vec<u8>, Self::Error> {
        let mut len = [0u8; 2];
        self.recv_bytes(&mut len)?;
        let mut frame = vec![0u8; usize::from(u16::from_le_bytes(len))];
        self.recv_bytes(&mut frame)?;
        Ok(frame)
    }
}

/// Runs the preambles and the handshake over `stream`: the [`Session`] if
/// both sides authenticated each other. On a failure this side sends an
/// empty frame (so the peer learns it was refused) and returns the error;
/// nothing else has been sent.
pub fn authenticate<S: FrameStream>(
    stream: &mut S,
    auth: &PeerAuth,
    initiator: bool,
) -> Result<Session, S::Error> {
    let ours = preamble(auth.mode());
    stream.send_bytes(&ours)?;
    let mut theirs = [0u8; PREAMBLE_LEN];
    stream.recv_bytes(&mut theirs)?;
    let their_mode = read_preamble(&theirs)?;
    if their_mode != auth.mode() {
        return Err(AuthError::ModeMismatch {
            ours: auth.mode(),
            theirs: their_mode,
        }
        .into());
    }
    if auth.mode() == AuthMode::Insecure {
        return Ok(Session::insecure());
    }
    let (first, second) = if initiator {
        (&ours, &theirs)
    } else {
        (&theirs, &ours)
    };
    let mut handshake = Handshake::new(auth, initiator, first, second)?;
    let mut wrote_last = false;
    while !handshake.is_finished() {
        wrote_last = handshake.is_my_turn();
        if wrote_last {
            let message = handshake.write_message()?;
            stream.send_frame(&message)?;
        } else {
            let message = stream.recv_frame()?;
            if let Err(error) = handshake.read_message(&message) {
                if !matches!(error, AuthError::RefusedByPeer { .. }) {
                    // Best effort: the error below is what counts.
                    let _ = stream.send_frame(&[]);
                }
                return Err(error.into());
            }
        }
    }
    let mut session = handshake.finish()?;
    confirm(stream, &mut session, wrote_last)?;
    Ok(session)
}

/// The side that wrote the handshake's last message cannot tell whether
/// the peer accepted it (with pinned keys the responder checks the
/// initiator's key only then): it waits for a sealed, empty confirmation
/// or the empty refusal frame, so it never sends into a connection the
/// peer is closing and reports a refusal rather than a broken pipe.
fn confirm<S: FrameStream>(
    stream: &mut S,
    session: &mut Session,
    wrote_last: bool,
) -> Result<(), S::Error> {
    if !wrote_last {
        let confirmation = session.seal(&[])?;
        return stream.send_frame(&confirmation);
    }
    let frame = stream.recv_frame()?;
    if frame.is_empty() {
        return Err(AuthError::RefusedByPeer { mode: session.mode }.into());
    }
    if !session.open(&frame)?.is_empty() {
        return Err(AuthError::Malformed {
            detail: "the handshake's confirmation carries data".to_string(),
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
