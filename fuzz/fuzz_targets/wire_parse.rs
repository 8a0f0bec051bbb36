//! Header parsing on arbitrary bytes: never panics, and whatever parses
//! re-emits to the same bytes (header fields, payload and CRC).
#![no_main]

use barlink_transport::wire::{HEADER_LEN, Packet, ParseLimits, Repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the limits, so both CRC modes and tight and
    // loose maxima are explored.
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let limits = ParseLimits {
        max_payload_len: if selector & 1 == 0 { 4096 } else { u32::MAX },
        max_message_len: if selector & 2 == 0 { 1 << 20 } else { u64::MAX },
        verify_crc: selector & 4 == 0,
    };
    let packet = Packet::new_unchecked(bytes);
    let Ok(repr) = Repr::parse(&packet, &limits) else {
        return;
    };
    // Parsed: the claimed payload lies inside the buffer.
    let payload = packet.payload();
    assert_eq!(payload.len(), repr.payload_len as usize);
    let mut again = vec![0u8; repr.buffer_len()];
    repr.emit(&mut again, payload);
    if limits.verify_crc {
        assert_eq!(
            &again[..],
            &bytes[..repr.buffer_len()],
            "emit(parse(x)) != x"
        );
    } else {
        assert_eq!(&again[..HEADER_LEN - 4], &bytes[..HEADER_LEN - 4]);
    }
    assert_eq!(
        Repr::parse(&Packet::new_unchecked(&again[..]), &limits),
        Ok(repr)
    );
});
