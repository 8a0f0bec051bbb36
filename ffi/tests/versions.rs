//! The config across ABI versions: a program built against the 0.4 header
//! (a 112-byte `barlink_config`) calls `barlink_config_init`, which writes
//! no byte past those 112; the current header's `barlink_config_init`
//! (a macro for `barlink_config_init_size(config, sizeof *config)`) fills
//! every field it declares; a `struct_size` that ends inside a field (a
//! pointer, or the 0.7 `send_queue_bytes`) is refused rather than read
//! as a value nobody meant.

use std::mem::size_of;
use std::ptr;

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

use support::{default_config, expect, last_error, unique_name};

const V0_4_SIZE: usize = 112;

/// A config-sized buffer (and more) of canary bytes, 8-aligned.
fn canaries() -> [u64; 32] {
    [0xAAAA_AAAA_AAAA_AAAA; 32]
}

fn bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn listen_with(config: *const barlink_config) -> barlink_status {
    let name = unique_name("versions");
    let mut listener = ptr::null_mut();
    // SAFETY: a valid name, a config the test made, a writable out-pointer.
    let status = unsafe { barlink_listen(name.as_ptr(), config, &mut listener) };
    if status == BARLINK_OK {
        assert_eq!(barlink_listener_close(listener), BARLINK_OK);
    }
    status
}

#[test]
fn the_old_symbol_fills_the_old_struct_and_nothing_past_it() {
    let mut buf = canaries();
    // SAFETY: buf holds 256 writable, aligned bytes.
    let status = unsafe { barlink_config_init(buf.as_mut_ptr().cast()) };
    assert_eq!(status, BARLINK_OK);
    let after = bytes(&buf);
    assert!(
        after[V0_4_SIZE..].iter().all(|&b| b == 0xAA),
        "barlink_config_init wrote past the 0.4 struct's 112 bytes"
    );
    assert_eq!(u32::from_ne_bytes(after[..4].try_into().unwrap()), 112);
    // A 0.4 program's config works, the new fields taking their defaults.
    assert_eq!(
        listen_with(buf.as_ptr().cast()),
        BARLINK_OK,
        "{}",
        last_error()
    );
}

#[test]
fn the_sized_init_fills_every_field_the_caller_has() {
    let ours = size_of::<barlink_config>();
    let mut config = barlink_config::default();
    // SAFETY: a whole, writable config.
    let status = unsafe { barlink_config_init_size(&mut config, ours) };
    assert_eq!(status, BARLINK_OK);
    assert_eq!(config.struct_size as usize, ours);
    assert!(config.mtu > 0 && config.own_bar.is_null() && config.sysfs_root.is_null());
    // A newer header's larger struct: zero past what this library knows.
    let mut newer = canaries();
    // SAFETY: newer holds 256 writable bytes.
    let status = unsafe { barlink_config_init_size(newer.as_mut_ptr().cast(), 200) };
    assert_eq!(status, BARLINK_OK);
    let after = bytes(&newer);
    assert!(after[ours..200].iter().all(|&b| b == 0));
    assert!(after[200..].iter().all(|&b| b == 0xAA));
    assert_eq!(
        listen_with(newer.as_ptr().cast()),
        BARLINK_OK,
        "{}",
        last_error()
    );
    // Smaller than any header's struct: refused, nothing written.
    let mut small = canaries();
    // SAFETY: small holds 256 writable bytes.
    let status = unsafe { barlink_config_init_size(small.as_mut_ptr().cast(), 100) };
    expect(status, BARLINK_INVALID_ARGUMENT, "sizeof(barlink_config)");
    assert!(bytes(&small).iter().all(|&b| b == 0xAA));
}

#[test]
fn a_struct_size_that_splits_a_field_is_refused() {
    let config = default_config();
    for size in [
        V0_4_SIZE + 4,
        V0_4_SIZE + 12,
        V0_4_SIZE + 28,
        size_of::<barlink_config>() - 1,
    ] {
        let mut bad = config;
        bad.struct_size = size as u32;
        expect(
            listen_with(&bad),
            BARLINK_INVALID_ARGUMENT,
            "ends inside a field",
        );
    }
    // Whole fields are fine: 0.4 plus own_bar, which is NULL here; 0.6
    // (the three pointers), send_queue_bytes taking its default.
    for size in [V0_4_SIZE + 8, V0_4_SIZE + 24] {
        let mut whole = config;
        whole.struct_size = size as u32;
        assert_eq!(listen_with(&whole), BARLINK_OK, "{}", last_error());
    }
}
