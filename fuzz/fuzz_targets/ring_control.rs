//! A ring link whose control blocks a hostile peer writes: arbitrary bytes
//! over the identity line and the index words, and index words that pass
//! their check but lie (ahead, behind, a lap away). Neither side panics,
//! reads outside its window or fails the link over it, and the receiver
//! delivers only the sender's messages, in order, each once and intact:
//! a lying index can cost time, never a wrong message.
//!
//! The input is a script of operations: the sender sends and makes
//! progress, the receiver makes progress and takes what it delivered, and
//! the hostile peer writes into either window's control block (never the
//! slots: a peer that writes slots can send what it likes, and the engine
//! fuzz target covers packets).
#![no_main]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use barlink_transport::EngineConfig;
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::{CONTROL_LEN, Geometry, IndexKind, encode_index, offset};
use barlink_transport::window::{HeapWindow, Window};
use libfuzzer_sys::fuzz_target;

/// Reads fuzzer bytes, zeros when exhausted.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        let (&first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        first
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.u8()))
    }
    fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

const MTU: usize = 512;
const SLOTS: usize = 4;
const WINDOW_LEN: usize = CONTROL_LEN + SLOTS * Geometry::slot_size_for(MTU);

/// Message `index`: its length and bytes follow from the index.
fn message(index: u64) -> Vec<u8> {
    let len = (index as usize * 37) % (3 * MTU);
    (0..len).map(|i| (i as u64 ^ index) as u8).collect()
}

type HeapLink = RingLink<Arc<HeapWindow>>;

fn links() -> (HeapLink, HeapLink, [Arc<HeapWindow>; 2]) {
    let config = EngineConfig {
        mtu: MTU,
        ..EngineConfig::default()
    };
    let sender_own = Arc::new(HeapWindow::new(WINDOW_LEN).expect("window"));
    let receiver_own = Arc::new(HeapWindow::new(WINDOW_LEN).expect("window"));
    let geometry = Geometry::for_window(WINDOW_LEN, MTU).expect("geometry");
    init_ring(&*sender_own, geometry, 1).expect("ring");
    init_ring(&*receiver_own, geometry, 1).expect("ring");
    let sender = RingLink::new(sender_own.clone(), receiver_own.clone(), config.clone(), 1)
        .expect("sender link");
    let receiver =
        RingLink::new(receiver_own.clone(), sender_own.clone(), config, 1).expect("receiver link");
    (sender, receiver, [sender_own, receiver_own])
}

/// An index word near `base` (what the side that owns it has done): a
/// few ahead or behind, a lap of 2^32 away, or anything, with its check.
fn lying_word(kind: IndexKind, base: u64, script: &mut Script) -> u64 {
    let delta = u64::from(script.u8() % 16);
    let count = match script.u8() % 4 {
        0 => base.wrapping_add(delta),
        1 => base.wrapping_sub(delta),
        2 => base.wrapping_add(1 << 32),
        _ => script.u64(),
    };
    encode_index(kind, count)
}

fuzz_target!(|data: &[u8]| {
    let mut script = Script(data);
    let (mut sender, mut receiver, windows) = links();
    let (mut sent, mut delivered) = (0u64, 0u64);
    let mut steps = 0;
    while !script.is_done() && steps < 256 {
        steps += 1;
        match script.u8() % 6 {
            0 => {
                if sender.send(message(sent)).is_ok() {
                    sent += 1;
                }
            }
            1 => {
                sender.progress().expect("the sender's link never fails");
            }
            2 => {
                receiver
                    .progress()
                    .expect("the receiver's link never fails");
                while let Some(data) = receiver.try_recv().expect("the receiver never fails") {
                    assert!(
                        delivered < sent && data == message(delivered),
                        "message {delivered} delivered wrong ({} bytes, {sent} sent)",
                        data.len()
                    );
                    delivered += 1;
                }
            }
            3 => {
                // Bytes anywhere in either control block.
                let window = &windows[usize::from(script.u8() & 1)];
                let at = usize::from(script.u8()) % CONTROL_LEN;
                let len = (usize::from(script.u8() % 16) + 1).min(CONTROL_LEN - at);
                let bytes: Vec<u8> = (0..len).map(|_| script.u8()).collect();
                window.write(at, &bytes).expect("in bounds");
            }
            4 => {
                // A head that passes its check, near what was written.
                let base = sender.engine().stats().packets_sent;
                let word = lying_word(IndexKind::Head, base, &mut script);
                windows[1]
                    .store_u64(offset::HEAD, word, Ordering::Release)
                    .expect("in bounds");
            }
            _ => {
                // A consumed count that passes its check, near what was read.
                let base = receiver.engine().stats().packets_received;
                let word = lying_word(IndexKind::Consumed, base, &mut script);
                windows[0]
                    .store_u64(offset::CONSUMED, word, Ordering::Release)
                    .expect("in bounds");
            }
        }
    }
});
