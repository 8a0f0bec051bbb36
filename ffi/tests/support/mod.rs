//! What the C ABI's test files share: the last error, status checks, and
//! link names no other test uses.
#![allow(dead_code)]

use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, Ordering};

use barlink_c::*;

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
