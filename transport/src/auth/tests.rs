use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use super::*;

/// One end of a socket pair, with the errors setup code would have.
struct End(UnixStream);

#[derive(Debug, PartialEq)]
enum TestError {
    Auth(AuthError),
    Io(String),
}

impl From<AuthError> for TestError {
    fn from(error: AuthError) -> Self {
        TestError::Auth(error)
    }
}

impl FrameStream for End {
    type Error = TestError;
    fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), TestError> {
        self.0
            .write_all(bytes)
            .map_err(|e| TestError::Io(e.to_string()))
    }
    fn recv_bytes(&mut self, buf: &mut [u8]) -> Result<(), TestError> {
        self.0
            .read_exact(buf)
            .map_err(|e| TestError::Io(e.to_string()))
    }
}

fn ends() -> (End, End) {
    let (a, b) = UnixStream::pair().unwrap();
    for end in [&a, &b] {
        end.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    (End(a), End(b))
}

fn psk(byte: u8) -> PeerAuth {
    PeerAuth::PreSharedKey {
        key: SecretKey([byte; 32]),
        source: "test".to_string(),
    }
}

fn pinned(own: u8, peers: &[u8]) -> PeerAuth {
    PeerAuth::PinnedKeys {
        private: SecretKey([own; 32]),
        peers: peers
            .iter()
            .map(|&p| SecretKey([p; 32]).public_key())
            .collect(),
        source: "test".to_string(),
    }
}

/// Runs both sides; each then sends one sealed message and reads the
/// other's, as the RDMA setup sends its hello.
fn run(
    client: PeerAuth,
    server: PeerAuth,
) -> (Result<Vec<u8>, TestError>, Result<Vec<u8>, TestError>) {
    let (mut a, mut b) = ends();
    let server = thread::spawn(move || {
        let mut session = authenticate(&mut b, &server, false)?;
        let got = session.recv(&mut b)?;
        session.send(&mut b, b"server hello")?;
        Ok(got)
    });
    let client = (|| {
        let mut session = authenticate(&mut a, &client, true)?;
        session.send(&mut a, b"client hello")?;
        session.recv(&mut a)
    })();
    drop(a);
    (client, server.join().unwrap())
}

#[test]
fn the_same_pre_shared_key_authenticates_and_seals() {
    let (client, server) = run(psk(7), psk(7));
    assert_eq!(client.unwrap(), b"server hello");
    assert_eq!(server.unwrap(), b"client hello");
}

#[test]
fn another_pre_shared_key_gets_nothing_both_ways() {
    let (client, server) = run(psk(7), psk(8));
    assert_eq!(server, Err(TestError::Auth(AuthError::WrongKey)));
    assert_eq!(
        client,
        Err(TestError::Auth(AuthError::RefusedByPeer {
            mode: AuthMode::PreSharedKey
        }))
    );
}

#[test]
fn pinned_keys_authenticate_both_ways() {
    let (client, server) = run(pinned(1, &[2]), pinned(2, &[1, 3]));
    assert_eq!(client.unwrap(), b"server hello");
    assert_eq!(server.unwrap(), b"client hello");
}

#[test]
fn an_unpinned_client_is_refused_before_the_server_says_anything() {
    let (client, server) = run(pinned(1, &[2]), pinned(2, &[3]));
    assert_eq!(
        server,
        Err(TestError::Auth(AuthError::UnknownPeerKey {
            key: SecretKey([1; 32]).public_key()
        }))
    );
    assert_eq!(
        client,
        Err(TestError::Auth(AuthError::RefusedByPeer {
            mode: AuthMode::PinnedKeys
        }))
    );
}

/// The refusal reaches the initiator inside `authenticate`, even when the
/// responder has already closed: it never gets a session to send into a
/// dead connection (where it would see a broken pipe, not the reason).
#[test]
fn a_refused_initiator_learns_it_before_it_has_a_session() {
    let (mut a, mut b) = ends();
    let server = thread::spawn(move || {
        let refused = authenticate(&mut b, &pinned(2, &[3]), false).map(|_| ());
        drop(b);
        refused
    });
    let client = authenticate(&mut a, &pinned(1, &[2]), true).map(|_| ());
    assert!(matches!(
        server.join().unwrap(),
        Err(TestError::Auth(AuthError::UnknownPeerKey { .. }))
    ));
    assert_eq!(
        client,
        Err(TestError::Auth(AuthError::RefusedByPeer {
            mode: AuthMode::PinnedKeys
        }))
    );
}

#[test]
fn an_unpinned_server_gets_nothing_from_the_client() {
    let (client, server) = run(pinned(1, &[3]), pinned(2, &[1]));
    assert_eq!(
        client,
        Err(TestError::Auth(AuthError::UnknownPeerKey {
            key: SecretKey([2; 32]).public_key()
        }))
    );
    assert_eq!(
        server,
        Err(TestError::Auth(AuthError::RefusedByPeer {
            mode: AuthMode::PinnedKeys
        }))
    );
}

#[test]
fn different_modes_are_named_on_both_sides() {
    let (client, server) = run(PeerAuth::Insecure, psk(7));
    assert_eq!(
        client,
        Err(TestError::Auth(AuthError::ModeMismatch {
            ours: AuthMode::Insecure,
            theirs: AuthMode::PreSharedKey
        }))
    );
    assert_eq!(
        server,
        Err(TestError::Auth(AuthError::ModeMismatch {
            ours: AuthMode::PreSharedKey,
            theirs: AuthMode::Insecure
        }))
    );
    let (client, server) = run(PeerAuth::Insecure, PeerAuth::Insecure);
    assert_eq!(client.unwrap(), b"server hello");
    assert_eq!(server.unwrap(), b"client hello");
}

#[test]
fn preambles_are_checked_field_by_field() {
    let good = preamble(AuthMode::PinnedKeys);
    assert_eq!(read_preamble(&good), Ok(AuthMode::PinnedKeys));
    let mut bad = good;
    bad[0] = b'X';
    assert!(matches!(
        read_preamble(&bad),
        Err(AuthError::NotBarlink { .. })
    ));
    for version in [AUTH_VERSION - 1, AUTH_VERSION + 1] {
        let mut bad = good;
        bad[4] = version;
        assert!(matches!(
            read_preamble(&bad),
            Err(AuthError::NotBarlink { .. })
        ));
    }
    let mut bad = good;
    bad[5] = 9;
    assert!(matches!(
        read_preamble(&bad),
        Err(AuthError::Malformed { .. })
    ));
    let mut bad = good;
    bad[7] = 1;
    assert!(matches!(
        read_preamble(&bad),
        Err(AuthError::Malformed { .. })
    ));
}

/// Both sides' messages, handed over by hand, with `tamper` applied to
/// each message before the other side reads it.
fn handshake_pair(
    auth: &PeerAuth,
    responder_sees: [u8; PREAMBLE_LEN],
    tamper: impl FnMut(usize, &mut Vec<u8>),
) -> Result<(Session, Session), AuthError> {
    let (initiator, responder) = run_handshakes(auth, responder_sees, tamper)?;
    Ok((initiator.finish()?, responder.finish()?))
}

#[test]
fn an_altered_message_or_preamble_fails_the_handshake() {
    for auth in [psk(5), pinned(1, &[1])] {
        let own = preamble(auth.mode());
        assert!(handshake_pair(&auth, own, |_, _| {}).is_ok());
        for target in 0..3 {
            let result = handshake_pair(&auth, own, |index, message| {
                if index == target {
                    let last = message.len() - 1;
                    message[last] ^= 1;
                }
            });
            if target < 2 || auth.mode() == AuthMode::PinnedKeys {
                assert!(
                    result.is_err(),
                    "{:?}: message {target} altered",
                    auth.mode()
                );
            }
        }
        // The responder saw another initiator preamble (a downgrade on the
        // way): the prologues differ and the handshake fails.
        let mut altered = own;
        altered[6] = 1;
        assert!(handshake_pair(&auth, altered, |_, _| {}).is_err());
    }
}

#[test]
fn sealed_messages_refuse_alteration_and_replay() {
    let (mut initiator, mut responder) =
        handshake_pair(&psk(9), preamble(AuthMode::PreSharedKey), |_, _| {}).unwrap();
    let sealed = initiator.seal(b"the hello").unwrap();
    assert_eq!(sealed.len(), 9 + SEAL_OVERHEAD);
    assert_ne!(&sealed[..9], b"the hello");
    let mut altered = sealed.clone();
    altered[0] ^= 0x80;
    assert!(responder.open(&altered).is_err());
    let (mut initiator, mut responder) =
        handshake_pair(&psk(9), preamble(AuthMode::PreSharedKey), |_, _| {}).unwrap();
    let sealed = initiator.seal(b"the hello").unwrap();
    assert_eq!(responder.open(&sealed).unwrap(), b"the hello");
    assert!(responder.open(&sealed).is_err(), "a replay must not open");
    assert!(responder.open(&[0u8; 3]).is_err());
}

/// Sealed in place with ring, each message is still a Noise transport
/// message: snow's own transport state, holding the other end of the same
/// handshake, opens what this side seals and seals what it opens, in
/// order.
#[test]
fn sealed_messages_are_noise_transport_messages() {
    for auth in [psk(3), pinned(2, &[2])] {
        let (initiator, responder) =
            run_handshakes(&auth, preamble(auth.mode()), |_, _| {}).unwrap();
        let mut session = initiator.finish().unwrap();
        let mut noise = responder.state.into_transport_mode().unwrap();
        let mut buf = vec![0u8; MAX_FRAME];
        for round in 0..3u8 {
            let plaintext = vec![round; 100 + usize::from(round)];
            let sealed = session.seal(&plaintext).unwrap();
            let len = noise.read_message(&sealed, &mut buf).unwrap();
            assert_eq!(
                &buf[..len],
                &plaintext[..],
                "{:?} round {round}",
                auth.mode()
            );
            let len = noise.write_message(&plaintext, &mut buf).unwrap();
            assert_eq!(session.open(&buf[..len]).unwrap(), plaintext);
        }
        let mut in_place = *b"in place, then opened by snow";
        let tag = session.seal_in_place(&mut in_place).unwrap();
        let mut sealed = in_place.to_vec();
        sealed.extend_from_slice(&tag);
        let len = noise.read_message(&sealed, &mut buf).unwrap();
        assert_eq!(&buf[..len], b"in place, then opened by snow");
    }
}

#[test]
fn a_message_that_fails_to_open_takes_no_number() {
    let (mut initiator, mut responder) =
        handshake_pair(&psk(4), preamble(AuthMode::PreSharedKey), |_, _| {}).unwrap();
    let first = initiator.seal(b"first").unwrap();
    let second = initiator.seal(b"second").unwrap();
    let mut altered = first.clone();
    altered[2] ^= 4;
    assert!(responder.open(&altered).is_err());
    assert!(responder.open(&second).is_err(), "out of order");
    assert_eq!(responder.open(&first).unwrap(), b"first");
    assert_eq!(responder.open(&second).unwrap(), b"second");
}

#[test]
fn an_insecure_session_seals_nothing_in_place() {
    let mut session = Session::insecure();
    assert!(session.seal_in_place(&mut [1u8; 8]).is_err());
    assert!(session.open_in_place(&mut [1u8; 24]).is_err());
    assert_eq!(session.seal(b"plain").unwrap(), b"plain");
}

#[test]
fn a_peer_is_accepted_by_the_same_keys_whatever_their_source() {
    let key = |byte: u8| Some(SecretKey([byte; 32]).public_key());
    let elsewhere = PeerAuth::PreSharedKey {
        key: SecretKey([1; 32]),
        source: "another file".to_string(),
    };
    assert!(psk(1).would_accept(&elsewhere, None));
    assert!(!psk(1).would_accept(&psk(2), None));
    assert!(!psk(1).would_accept(&PeerAuth::Insecure, None));
    assert!(PeerAuth::Insecure.would_accept(&PeerAuth::Insecure, None));
    // Pinned: the same own key, and the peer's proven key listed here,
    // in whatever order.
    assert!(pinned(9, &[3, 4]).would_accept(&pinned(9, &[4, 3]), key(3)));
    assert!(!pinned(9, &[3]).would_accept(&pinned(9, &[3, 4]), key(4)));
    assert!(!pinned(9, &[3]).would_accept(&pinned(8, &[3]), key(3)));
    assert!(!pinned(9, &[3]).would_accept(&pinned(9, &[3]), None));
}
