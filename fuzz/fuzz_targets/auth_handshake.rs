//! A hostile peer of remote setup: arbitrary bytes as its preamble, its
//! handshake frames and its sealed messages. Authentication and what
//! follows never panic and never take more than a frame's 2-byte length
//! says; the seeds include a real first handshake message, so the fuzzer
//! also works past the handshake.
#![no_main]

use barlink_transport::auth::{AuthError, FrameStream, PeerAuth, SecretKey, authenticate};
use libfuzzer_sys::fuzz_target;

/// The fuzz input as the peer's side of the socket; what this side sends
/// is dropped.
struct Hostile<'a> {
    input: &'a [u8],
}

enum Failure {
    Auth,
    Exhausted,
}

impl From<AuthError> for Failure {
    fn from(_: AuthError) -> Self {
        Failure::Auth
    }
}

impl FrameStream for Hostile<'_> {
    type Error = Failure;
    fn send_bytes(&mut self, _bytes: &[u8]) -> Result<(), Failure> {
        Ok(())
    }
    fn recv_bytes(&mut self, buf: &mut [u8]) -> Result<(), Failure> {
        if self.input.len() < buf.len() {
            return Err(Failure::Exhausted);
        }
        let (head, rest) = self.input.split_at(buf.len());
        buf.copy_from_slice(head);
        self.input = rest;
        Ok(())
    }
}

fn key(byte: u8) -> SecretKey {
    SecretKey::from_hex(&format!("{byte:02x}").repeat(32)).expect("64 hex digits")
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks this side's role and mode.
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let auth = match selector % 3 {
        0 => PeerAuth::PreSharedKey {
            key: key(1),
            source: "fuzz".to_string(),
        },
        1 => PeerAuth::PinnedKeys {
            private: key(2),
            peers: vec![key(3).public_key()],
            source: "fuzz".to_string(),
        },
        _ => PeerAuth::Insecure,
    };
    let initiator = selector & 0x80 != 0;
    let mut stream = Hostile { input };
    let Ok(mut session) = authenticate(&mut stream, &auth, initiator) else {
        return;
    };
    // Through (a recorded handshake, or insecure): sealed messages next.
    while let Ok(message) = session.recv(&mut stream) {
        assert!(message.len() <= barlink_transport::auth::MAX_FRAME);
    }
});
