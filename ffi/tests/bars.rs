//! BAR windows named in `barlink_config` (`own_bar`, `peer_bar`,
//! `sysfs_root`): over a fixture tree whose `resource2` files are ordinary
//! files, a link name is reached over the two windows, the path says so,
//! and messages cross intact; bad windows are refused with a reason; a
//! device that cannot be found sends the automatic choice through host
//! memory and fails the forced one.

use std::ffi::CString;
use std::ptr;

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

#[path = "../../tests/support/bar_fixture.rs"]
mod bar_fixture;

use bar_fixture::BarFixture;
use support::{expect, last_error, unique_name};

const WINDOW: u64 = 8 << 20;

/// The strings a config points at, kept alive beside it.
struct BarConfig {
    own: Option<CString>,
    peer: Option<CString>,
    root: CString,
    transport: u32,
}

impl BarConfig {
    fn new(fixture: &BarFixture, own: Option<String>, peer: Option<String>) -> BarConfig {
        BarConfig {
            own: own.map(|text| CString::new(text).unwrap()),
            peer: peer.map(|text| CString::new(text).unwrap()),
            root: CString::new(fixture.root.to_str().unwrap()).unwrap(),
            transport: 0,
        }
    }

    /// Side `slot`'s config: its own window first, the other's second.
    fn side(fixture: &BarFixture, slot: usize) -> BarConfig {
        BarConfig::new(
            fixture,
            Some(fixture.window(slot, 0, WINDOW)),
            Some(fixture.window(1 - slot, 0, WINDOW)),
        )
    }

    /// The C struct; valid while `self` lives.
    fn raw(&self) -> barlink_config {
        let mut config = barlink_config::default();
        let size = std::mem::size_of::<barlink_config>();
        // SAFETY: a whole, writable config.
        let status = unsafe { barlink_config_init_size(&mut config, size) };
        assert_eq!(status, BARLINK_OK);
        config.transport = self.transport;
        config.own_bar = self.own.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        config.peer_bar = self.peer.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        config.sysfs_root = self.root.as_ptr();
        config
    }
}

fn path_of_listener(listener: *mut barlink_listener) -> String {
    let mut buf = vec![0u8; 512];
    let mut len = 0;
    // SAFETY: buf is writable for its length; len is writable.
    let status =
        unsafe { barlink_listener_path(listener, buf.as_mut_ptr().cast(), buf.len(), &mut len) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn path_of_link(link: *mut barlink_link) -> String {
    let mut buf = vec![0u8; 512];
    let mut len = 0;
    // SAFETY: as above.
    let status = unsafe { barlink_link_path(link, buf.as_mut_ptr().cast(), buf.len(), &mut len) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn message(index: usize) -> Vec<u8> {
    (0..index * 1013).map(|i| (i ^ index) as u8).collect()
}

/// Listens with side 0's config and connects with side 1's from a thread
/// that sends `count` messages; returns the accepted link and the
/// listener's path.
fn bar_pair(configs: [BarConfig; 2], count: usize) -> (String, String) {
    let name = unique_name("bars");
    let [accepting, connecting] = configs;
    let mut listener = ptr::null_mut();
    // SAFETY: valid name, config (its strings live in `accepting`) and
    // out-pointer.
    let status = unsafe { barlink_listen(name.as_ptr(), &accepting.raw(), &mut listener) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    let listener_path = path_of_listener(listener);
    let sender = std::thread::spawn(move || {
        let mut link = ptr::null_mut();
        // SAFETY: valid name, config (its strings live in `connecting`,
        // owned by this thread) and out-pointer.
        let status =
            unsafe { barlink_connect(name.as_ptr(), &connecting.raw(), 10_000, &mut link) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        for index in 0..count {
            let data = message(index);
            // SAFETY: data is a live slice.
            let status = unsafe { barlink_send(link, data.as_ptr().cast(), data.len(), 10_000) };
            assert_eq!(status, BARLINK_OK, "message {index}: {}", last_error());
        }
        assert_eq!(barlink_close(link, 10_000), BARLINK_OK, "{}", last_error());
    });
    let mut link = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let status = unsafe { barlink_accept(listener, 10_000, &mut link) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    let link_path = path_of_link(link);
    let mut buf = vec![0u8; count * 1013 + 1];
    for index in 0..count {
        let mut len = 0;
        // SAFETY: buf is writable for its length; len is writable.
        let status =
            unsafe { barlink_recv(link, buf.as_mut_ptr().cast(), buf.len(), &mut len, 10_000) };
        assert_eq!(status, BARLINK_OK, "message {index}: {}", last_error());
        assert!(buf[..len] == message(index), "message {index} differs");
    }
    // The last receive may have left its acknowledgement for this link's
    // next round, which the sender's close waits for; the sender may also
    // have closed already.
    let status = barlink_progress(link);
    assert!(
        status == BARLINK_OK || status == BARLINK_CLOSED,
        "{status:?}: {}",
        last_error()
    );
    sender.join().unwrap();
    let mut stats = barlink_stats {
        struct_size: std::mem::size_of::<barlink_stats>() as u32,
        ..barlink_stats::default()
    };
    // SAFETY: a valid stats struct.
    assert_eq!(unsafe { barlink_get_stats(link, &mut stats) }, BARLINK_OK);
    assert_eq!(stats.messages_received, count as u64);
    assert_eq!(stats.crc_failures, 0);
    if listener_path.starts_with("bar-p2p") {
        // The two windows carry this link: a second accept would reset it.
        let mut second = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let status = unsafe { barlink_accept(listener, 0, &mut second) };
        expect(status, BARLINK_SETUP_FAILED, "carry one link");
        assert!(second.is_null());
    }
    assert_eq!(barlink_close(link, 1000), BARLINK_OK);
    assert_eq!(barlink_listener_close(listener), BARLINK_OK);
    (listener_path, link_path)
}

#[test]
fn a_link_name_with_bar_windows_goes_over_them() {
    let fixture = BarFixture::new("ffi");
    let configs = [BarConfig::side(&fixture, 0), BarConfig::side(&fixture, 1)];
    let (listener_path, link_path) = bar_pair(configs, 120);
    for path in [&listener_path, &link_path] {
        assert!(path.starts_with("bar-p2p:"), "{path}");
        assert!(path.contains("not GPUs"), "{path}");
    }
}

#[test]
fn bar_p2p_forced_by_the_transport_says_so() {
    let fixture = BarFixture::new("ffi-forced");
    let mut configs = [BarConfig::side(&fixture, 0), BarConfig::side(&fixture, 1)];
    for config in &mut configs {
        config.transport = barlink_transport::BARLINK_TRANSPORT_BAR as u32;
    }
    let (_, link_path) = bar_pair(configs, 10);
    assert!(link_path.starts_with("bar-p2p:"), "{link_path}");
}

#[test]
fn shared_memory_asked_for_by_name_wins_over_bar_windows() {
    let fixture = BarFixture::new("ffi-shm");
    let mut configs = [BarConfig::side(&fixture, 0), BarConfig::side(&fixture, 1)];
    for config in &mut configs {
        config.transport = barlink_transport::BARLINK_TRANSPORT_SHM as u32;
    }
    let (_, link_path) = bar_pair(configs, 10);
    assert!(link_path.starts_with("host-bounce:"), "{link_path}");
    assert!(link_path.contains("forced"), "{link_path}");
}

/// Windows on a device the tree does not have: the automatic choice does
/// not risk peer-to-peer blind and links through host memory, saying why;
/// the forced one fails at accept, naming the device.
#[test]
fn a_device_that_cannot_be_found_bounces_or_fails_with_its_name() {
    let fixture = BarFixture::new("ffi-missing");
    let missing = || Some("0000:00:1f.0/2+8M".to_string());
    let other = || Some(fixture.window(0, 0, WINDOW));
    let configs = [
        BarConfig::new(&fixture, missing(), other()),
        BarConfig::new(&fixture, other(), missing()),
    ];
    let (listener_path, link_path) = bar_pair(configs, 10);
    for path in [&listener_path, &link_path] {
        assert!(path.starts_with("host-bounce:"), "{path}");
        assert!(path.contains("cannot be found"), "{path}");
    }

    let mut forced = BarConfig::new(&fixture, missing(), other());
    forced.transport = barlink_transport::BARLINK_TRANSPORT_BAR as u32;
    let name = unique_name("bars-missing");
    let mut listener = ptr::null_mut();
    // SAFETY: valid name, config and out-pointer.
    let status = unsafe { barlink_listen(name.as_ptr(), &forced.raw(), &mut listener) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert!(path_of_listener(listener).contains("forced"));
    let mut link = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let status = unsafe { barlink_accept(listener, 2000, &mut link) };
    let error = last_error();
    assert_eq!(status, BARLINK_SETUP_FAILED, "{error}");
    assert!(error.contains("no PCI device 0000:00:1f.0"), "{error}");
    assert!(link.is_null());
    assert_eq!(barlink_listener_close(listener), BARLINK_OK);
}

#[test]
fn bad_bar_windows_are_refused_with_the_reason() {
    let fixture = BarFixture::new("ffi-bad");
    let window = || Some(fixture.window(0, 0, WINDOW));
    let name = unique_name("bars-bad");
    let not_utf8 = CString::new(vec![0xffu8, 0xfe]).unwrap();
    let cases: Vec<(BarConfig, &str, &str)> = vec![
        (
            BarConfig::new(&fixture, window(), None),
            "local",
            "peer_bar is not",
        ),
        (
            BarConfig::new(&fixture, None, window()),
            "local",
            "own_bar is not",
        ),
        (
            BarConfig::new(&fixture, Some("0000:00:10.0".into()), window()),
            "local",
            "DEVICE/BAR@OFFSET+LEN",
        ),
        (
            BarConfig::new(&fixture, Some("0000:00:10.0/9+4K".into()), window()),
            "local",
            "not an index 0 to 5",
        ),
        (
            BarConfig::side(&fixture, 0),
            "rdma://192.0.2.1:18515",
            "another node",
        ),
    ];
    for (config, peer, needle) in cases {
        let peer = if peer == "local" {
            name.clone()
        } else {
            CString::new(peer).unwrap()
        };
        let mut listener = ptr::null_mut();
        let mut link = ptr::null_mut();
        // SAFETY: valid names, configs and out-pointers.
        unsafe {
            expect(
                barlink_listen(peer.as_ptr(), &config.raw(), &mut listener),
                BARLINK_INVALID_ARGUMENT,
                needle,
            );
            expect(
                barlink_connect(peer.as_ptr(), &config.raw(), 100, &mut link),
                BARLINK_INVALID_ARGUMENT,
                needle,
            );
        }
        assert!(listener.is_null() && link.is_null());
    }
    let config = BarConfig::side(&fixture, 0);
    let mut raw = config.raw();
    raw.own_bar = not_utf8.as_ptr();
    let mut listener = ptr::null_mut();
    // SAFETY: valid name, config and out-pointer.
    let status = unsafe { barlink_listen(name.as_ptr(), &raw, &mut listener) };
    expect(status, BARLINK_INVALID_ARGUMENT, "own_bar is not UTF-8");
}
