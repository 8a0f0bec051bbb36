//! Sealed records on an encrypting TCP link, as an attacker on the path
//! shapes them: the input is a script of records sealed by the real peer
//! (arbitrary plaintext, or frames of packets), bits flipped, records
//! replayed or dropped, and bytes of the attacker's own. The receiving
//! side opens records where they lie and hands their frames to an engine,
//! as the medium does. It never panics, and the records that open are
//! exactly the first ones the peer sealed, in order, unaltered: anything
//! else stops the stream. Every record before the first change opens,
//! and an untouched script opens in full.
#![no_main]

use barlink_transport::auth::{Handshake, PeerAuth, SecretKey, Session, preamble};
use barlink_transport::tcp::{
    FRAME_HEADER_LEN, MAX_RECORD_PLAINTEXT, MAX_SEALED_PACKET, RECORD_HEADER_LEN, frame_header,
    hand_record, open_record,
};
use barlink_transport::{Engine, EngineConfig, Time};
use libfuzzer_sys::fuzz_target;

/// Both ends of a finished pre-shared-key handshake (sender, receiver).
fn sessions() -> (Session, Session) {
    let auth = PeerAuth::PreSharedKey {
        key: SecretKey::from_hex(&"5a".repeat(32)).expect("64 hex digits"),
        source: "fuzz".to_string(),
    };
    let ours = preamble(auth.mode());
    let mut initiator = Handshake::new(&auth, true, &ours, &ours).expect("handshake");
    let mut responder = Handshake::new(&auth, false, &ours, &ours).expect("handshake");
    while !(initiator.is_finished() && responder.is_finished()) {
        let (from, to) = if initiator.is_my_turn() {
            (&mut initiator, &mut responder)
        } else {
            (&mut responder, &mut initiator)
        };
        let message = from.write_message().expect("handshake message");
        to.read_message(&message).expect("handshake message");
    }
    (
        initiator.finish().expect("session"),
        responder.finish().expect("session"),
    )
}

/// Takes `n` bytes of the script (fewer at its end).
fn take<'a>(script: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = script.split_at(n.min(script.len()));
    *script = rest;
    head
}

/// A number from the next two bytes of the script.
fn number(script: &mut &[u8]) -> usize {
    take(script, 2)
        .iter()
        .rev()
        .fold(0, |n, &b| (n << 8) | usize::from(b))
}

fuzz_target!(|data: &[u8]| {
    let (mut sender, mut receiver) = sessions();
    let mut script = data;
    let mut wire: Vec<u8> = Vec::new();
    // Where each sealed record lies on the wire, and its plaintext.
    let mut records: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::new();
    // Where the first change to what the peer sealed lies on the wire.
    let mut intact_until = usize::MAX;
    while let Some((&op, rest)) = script.split_first() {
        script = rest;
        match op % 6 {
            // A record the peer seals: its plaintext as the script says,
            // or packets (each with its two-byte length first) as frames.
            0 | 1 => {
                let mut plain = Vec::new();
                if op % 6 == 0 {
                    let len = number(&mut script) % (MAX_RECORD_PLAINTEXT + 1);
                    plain.extend_from_slice(take(&mut script, len));
                } else {
                    let count = take(&mut script, 1).first().copied().unwrap_or(0);
                    for _ in 0..count {
                        let len = number(&mut script) % 4096;
                        let packet = take(&mut script, len);
                        if plain.len() + FRAME_HEADER_LEN + packet.len() > MAX_RECORD_PLAINTEXT {
                            break;
                        }
                        plain.extend_from_slice(&frame_header(packet.len()));
                        plain.extend_from_slice(packet);
                    }
                }
                let mut sealed = plain.clone();
                let tag = sender.seal_in_place(&mut sealed).expect("a record fits");
                sealed.extend_from_slice(&tag);
                let start = wire.len();
                let len = u16::try_from(sealed.len()).expect("a record fits 64 KiB");
                wire.extend_from_slice(&len.to_le_bytes());
                wire.extend_from_slice(&sealed);
                records.push((start..wire.len(), plain));
            }
            // A bit flipped somewhere on the wire.
            2 if !wire.is_empty() => {
                let at = number(&mut script) % wire.len();
                wire[at] ^= 1 << (op >> 5);
                intact_until = intact_until.min(at);
            }
            // A record sent again.
            3 if !records.is_empty() => {
                let which = number(&mut script) % records.len();
                let copy = wire[records[which].0.clone()].to_vec();
                intact_until = intact_until.min(wire.len());
                wire.extend_from_slice(&copy);
            }
            // The last record dropped, and what followed it.
            4 if !records.is_empty() => {
                let (place, _) = records.pop().expect("not empty");
                wire.truncate(place.start);
                // It was sealed: the sender's nonce moved on, so what the
                // peer seals next does not open after what came before.
                intact_until = intact_until.min(place.start);
            }
            // Bytes of the attacker's own.
            5 => {
                let len = number(&mut script) % 4096;
                intact_until = intact_until.min(wire.len());
                wire.extend_from_slice(take(&mut script, len));
            }
            _ => {}
        }
    }

    // Receive memory stays small whatever lengths the packets claim.
    let config = EngineConfig {
        mtu: MAX_SEALED_PACKET,
        max_message_len: 1 << 20,
        recv_window: 8,
        send_window: 8,
        ..EngineConfig::default()
    };
    let mut engine: Engine<Vec<u8>> = Engine::new(config, 1, Time::ZERO).expect("valid config");
    let mut now = Time::ZERO;
    let mut at = 0;
    let mut opened = 0;
    let mut frames_ok = true;
    while let Ok(Some((taken, plain))) = open_record(&mut wire[at..], &mut receiver) {
        let plaintext = &wire[at + RECORD_HEADER_LEN..][..plain];
        let Some((_, sealed)) = records.get(opened) else {
            panic!(
                "record {opened} opened, but the peer sealed only {}",
                records.len()
            );
        };
        assert_eq!(plaintext, &sealed[..], "record {opened} opened altered");
        if frames_ok {
            frames_ok =
                hand_record(&mut engine, now, plaintext, MAX_SEALED_PACKET, &"the peer").is_ok();
        }
        while engine.poll_transmit_with(now, |t| t.len()).is_some() {}
        now += std::time::Duration::from_micros(10);
        at += taken;
        opened += 1;
    }
    // Every record that lies wholly before the first change opens.
    let intact = records
        .iter()
        .take_while(|(place, _)| place.end <= intact_until)
        .count();
    assert!(
        opened >= intact,
        "{opened} opened of {intact} intact records"
    );
    if intact_until == usize::MAX {
        assert_eq!(opened, records.len(), "an untouched stream opens in full");
        assert_eq!(at, wire.len());
    }
});
