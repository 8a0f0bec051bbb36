//! What the C ABI's test files share: the last error, status checks,
//! link names no other test uses, connected pairs, a thread that drives a
//! link, and the calls the tests make most.
#![allow(dead_code)]

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

pub mod dmabuf;

/// The library's defaults, as `barlink_config_init` fills them, for a test
/// to change a field of.
pub fn default_config() -> barlink_config {
    let mut config = barlink_config::default();
    // SAFETY: a whole, writable config of the size given.
    let status =
        unsafe { barlink_config_init_size(&mut config, std::mem::size_of::<barlink_config>()) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    config
}

pub fn last_error() -> String {
    // SAFETY: barlink_last_error never returns NULL; the string is valid
    // until this thread's next barlink call, and copied at once.
    unsafe { CStr::from_ptr(barlink_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts a status and that the message mentions `needle`.
#[track_caller]
pub fn expect(status: barlink_status, want: barlink_status, needle: &str) {
    let message = last_error();
    assert_eq!(status, want, "message: {message}");
    assert!(
        message.contains(needle),
        "message {message:?} should mention {needle:?}"
    );
}

pub fn unique_name(tag: &str) -> std::ffi::CString {
    static N: AtomicU32 = AtomicU32::new(0);
    std::ffi::CString::new(format!(
        "ffi-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap()
}

/// A config handed to the connecting thread.
pub struct SendConfig(barlink_config);

// SAFETY: the strings a config points at outlive the thread it goes to:
// `pair` joins it before returning.
unsafe impl Send for SendConfig {}

/// A connected pair: (accepted, connected).
pub fn pair(config: Option<&barlink_config>) -> (*mut barlink_link, *mut barlink_link) {
    pair_at(unique_name("pair"), config, 5000)
}

/// A pair connected at `name` (a local name or a node's address), each
/// side's setup given `timeout_ms`: (accepted, connected).
pub fn pair_at(
    name: std::ffi::CString,
    config: Option<&barlink_config>,
    timeout_ms: u32,
) -> (*mut barlink_link, *mut barlink_link) {
    let config_ptr = config.map_or(ptr::null(), |c| c as *const _);
    let mut listener = ptr::null_mut();
    // SAFETY: valid name, config and out-pointer.
    let status = unsafe { barlink_listen(name.as_ptr(), config_ptr, &mut listener) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    let config_copy = config.copied().map(SendConfig);
    let connector = std::thread::spawn(move || {
        let mut link = ptr::null_mut();
        let config_ptr = config_copy
            .as_ref()
            .map_or(ptr::null(), |c| &c.0 as *const _);
        // SAFETY: valid name, config and out-pointer.
        let status = unsafe { barlink_connect(name.as_ptr(), config_ptr, timeout_ms, &mut link) };
        assert_eq!(status, BARLINK_OK, "{}", last_error());
        link as usize
    });
    let mut accepted = ptr::null_mut();
    // SAFETY: valid out-pointer.
    let status = unsafe { barlink_accept(listener, timeout_ms, &mut accepted) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    let connected = connector.join().unwrap() as *mut barlink_link;
    assert_eq!(barlink_listener_close(listener), BARLINK_OK);
    (accepted, connected)
}

/// Drives a link from a thread of its own (as the peer process would),
/// until dropped.
pub struct Driver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn drive(link: *mut barlink_link) -> Driver {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let link = link as usize;
    let thread = std::thread::spawn({
        let stop = stop.clone();
        move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = barlink_progress(link as *mut barlink_link);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    });
    Driver {
        stop,
        thread: Some(thread),
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub fn send(link: *mut barlink_link, data: &[u8]) -> barlink_status {
    // SAFETY: data is a live slice.
    unsafe { barlink_send(link, data.as_ptr().cast(), data.len(), 5000) }
}

pub fn recv(link: *mut barlink_link, buf: &mut [u8], timeout_ms: u32) -> (barlink_status, usize) {
    let mut len = usize::MAX;
    // SAFETY: buf is a live mutable slice; len is writable.
    let status = unsafe {
        barlink_recv(
            link,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut len,
            timeout_ms,
        )
    };
    (status, len)
}

pub fn post_recv(link: *mut barlink_link, buf: &mut [u8], user_tag: u64) -> u64 {
    let mut request = 0;
    // SAFETY: buf outlives the request (each test waits for its
    // completion or closes the link first); request is writable.
    let status = unsafe {
        barlink_post_recv(
            link,
            buf.as_mut_ptr().cast(),
            buf.len(),
            user_tag,
            &mut request,
        )
    };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_ne!(request, 0);
    request
}

/// Polls `link` until `count` completions came, for at most 10 s.
pub fn completions(link: *mut barlink_link, count: usize) -> Vec<barlink_completion> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {count} completions",
            got.len()
        );
        got.extend(poll(link));
    }
    got
}

/// `count` completion slots for barlink to fill; one it has not written
/// reads as `BARLINK_INTERNAL`.
pub fn unwritten_completions(count: usize) -> Vec<barlink_completion> {
    let unwritten = barlink_completion {
        request: 0,
        user_tag: 0,
        bytes: 0,
        status: BARLINK_INTERNAL,
        reserved: 0,
    };
    vec![unwritten; count]
}

/// One `barlink_poll` of `link`: the completions it took (up to 8).
pub fn poll(link: *mut barlink_link) -> Vec<barlink_completion> {
    let mut batch = unwritten_completions(8);
    let mut n = 0;
    // SAFETY: batch holds 8 writable completions; n is writable.
    let status = unsafe { barlink_poll(link, batch.as_mut_ptr(), batch.len(), &mut n) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    batch[..n].to_vec()
}
