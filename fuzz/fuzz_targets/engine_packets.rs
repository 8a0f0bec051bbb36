//! An engine fed arbitrary packet sequences by a hostile peer: it never
//! panics, its memory stays within the configured bound, its timers always
//! point forward, and it delivers only what a well-formed, correctly
//! addressed, checksummed stream spelled out.
//!
//! The input is a script of operations. Packets are built from fuzzer-chosen
//! fields and then checksummed, so that the fuzzer explores the engine's
//! stateful checks rather than bouncing off the CRC; raw and bit-flipped
//! packets are in the mix too, each handed over whole or (as ring links
//! do) header first with the payload copied straight into its message.
#![no_main]

use std::time::Duration;

use barlink_transport::sim::{ReceivePath, hand_over};
use barlink_transport::wire::{self, Packet};
use barlink_transport::{Engine, EngineConfig, Event, Time};
use libfuzzer_sys::fuzz_target;

/// Reads fuzzer bytes as little-endian integers, zeros when exhausted.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    /// Small numbers most of the time, so sequence numbers and ids line up
    /// with what the engine expects often enough to go deep.
    fn small(&mut self) -> u64 {
        match self.u8() {
            0..=200 => u64::from(self.u8() % 8),
            201..=250 => u64::from(self.u8()),
            _ => self.u64(),
        }
    }
}

/// Whole packets, or header first and the payload copied from the medium
/// straight into its message (as ring links do).
fn path(script: &mut Script) -> ReceivePath {
    if script.u8() & 1 == 0 {
        ReceivePath::Contiguous
    } else {
        ReceivePath::FromMedium
    }
}

const MY_EPOCH: u32 = 1;
const PEER_EPOCH: u32 = 2;

fuzz_target!(|data: &[u8]| {
    let config = EngineConfig {
        mtu: 512,
        max_message_len: 1 << 16,
        recv_window: 8,
        send_window: 8,
        ..EngineConfig::default()
    };
    // Receive memory: buffered packets plus one message being assembled plus
    // delivered messages not yet taken (bounded by the credit).
    let memory_bound = 2 * config.recv_window as usize * config.mtu + 2 * (1 << 16);
    let mut engine: Engine = Engine::new(config.clone(), MY_EPOCH, Time::ZERO).unwrap();
    let mut now = Time::ZERO;
    let mut out = vec![0u8; config.mtu];
    let mut script = Script(data);
    let mut steps = 0;
    while !script.0.is_empty() && steps < 4096 {
        steps += 1;
        match script.u8() % 8 {
            // A checksummed packet with chosen fields.
            0..=3 => {
                let payload_len = (script.u8() as usize * 3) % (config.mtu - wire::HEADER_LEN + 64);
                let mut bytes = vec![0u8; wire::HEADER_LEN + payload_len];
                let mut packet = Packet::new_unchecked(&mut bytes[..]);
                packet.set_magic(wire::MAGIC);
                packet.set_version(wire::VERSION);
                packet.set_kind_byte(1 + script.u8() % 6);
                packet.set_flags(u16::from(script.u8() & 0x0f));
                let epoch = match script.u8() % 4 {
                    0 => script.u32(),
                    1 => PEER_EPOCH + 1,
                    _ => PEER_EPOCH,
                };
                packet.set_epoch(epoch);
                packet.set_peer_epoch(if script.u8() % 8 == 0 { 0 } else { MY_EPOCH });
                packet.set_seq(script.small());
                packet.set_ack(script.small());
                packet.set_sack(script.u64());
                packet.set_msg_id(script.small());
                packet.set_msg_len(
                    script
                        .small()
                        .wrapping_mul(100)
                        .wrapping_add(u64::from(script.u8())),
                );
                packet.set_frag_index(script.small() as u32);
                packet.set_frag_count(script.small() as u32);
                packet.set_xmit(script.u32());
                packet.set_credit(script.small() as u32);
                packet.set_payload_len(payload_len as u32);
                for byte in packet.payload_mut() {
                    *byte = 0xC3;
                }
                packet.fill_crc();
                if script.u8() % 16 == 0 {
                    let bit = script.u32() as usize % (bytes.len() * 8);
                    bytes[bit / 8] ^= 1 << (bit % 8);
                }
                let _ = hand_over(&mut engine, now, &bytes, path(&mut script));
            }
            // Raw bytes.
            4 => {
                let len = script.u8() as usize * 4;
                let raw: Vec<u8> = (0..len).map(|_| script.u8()).collect();
                let _ = hand_over(&mut engine, now, &raw, path(&mut script));
            }
            // Time passes.
            5 => {
                now += Duration::from_micros(script.small().saturating_mul(500));
                engine.handle_timeout(now);
            }
            // This side sends something.
            6 => {
                let len = (script.small() as usize).saturating_mul(300);
                let _ = engine.send(vec![0x5A; len.min(1 << 16)]);
            }
            // The caller takes events.
            _ => {
                while let Some(event) = engine.poll_event() {
                    if let Event::Message { data, .. } = event {
                        // Only the fuzzer's payload bytes can arrive.
                        assert!(data.iter().all(|&b| b == 0xC3));
                    }
                }
            }
        }
        let mut packets = 0;
        while engine.poll_transmit(now, &mut out).is_some() {
            packets += 1;
            assert!(packets < 10_000, "the engine transmits without end");
        }
        if let Some(deadline) = engine.poll_timeout() {
            assert!(deadline.as_nanos() > 0 || now == Time::ZERO);
        }
        assert!(
            engine.buffered_bytes() <= memory_bound,
            "{} bytes buffered, bound {memory_bound}",
            engine.buffered_bytes()
        );
    }
});
