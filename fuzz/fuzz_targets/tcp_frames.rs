//! The byte stream a hostile peer sends on a TCP link: frames are cut out
//! of it only where a length and its check agree and the length is within
//! the largest packet, and every frame goes to an engine, which never
//! panics on it. A stream whose header fails stops the cutting, as the
//! medium ends the link there.
#![no_main]

use barlink_transport::tcp::{FRAME_HEADER_LEN, hand_frame, next_frame};
use barlink_transport::{Engine, EngineConfig, Time};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the largest packet (small ones make the length
    // bound bite).
    let Some((&selector, mut stream)) = data.split_first() else {
        return;
    };
    let max_packet = 256 + usize::from(selector) * 257;
    let config = EngineConfig {
        mtu: max_packet.max(4096),
        ..EngineConfig::default()
    };
    let mut engine: Engine<Vec<u8>> = Engine::new(config, 1, Time::ZERO).expect("valid config");
    let mut now = Time::ZERO;
    while let Ok(Some(len)) = next_frame(stream, max_packet) {
        assert!((1..=max_packet).contains(&len));
        let packet = &stream[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
        // As the medium hands it over: payload into its message with its
        // CRC, in one pass.
        let _ = hand_frame(&mut engine, now, packet);
        stream = &stream[FRAME_HEADER_LEN + len..];
        now += std::time::Duration::from_micros(10);
    }
    while engine.poll_transmit_with(now, |t| t.len()).is_some() {}
});
