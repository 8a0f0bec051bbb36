//! A link's progress thread and the registry's per-thread cache: the only
//! test in this binary, as it counts the process's progress threads and
//! other tests start their own.

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

use support::{expect, pair, recv, send};

/// Progress threads alive in this process, by their name.
fn progress_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        // The kernel keeps 15 bytes of a thread's name.
        .filter(|name| name.trim() == "barlink-progres")
        .count()
}

/// Waits up to two seconds for the count of progress threads to reach
/// `expected`: a new thread names itself once it runs, and an ended one
/// leaves `/proc` a moment after its link closed.
fn progress_threads_settle_at(expected: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut count = progress_threads();
    while count != expected && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        count = progress_threads();
    }
    count
}

/// A thread's calls on a link remember it (the registry's per-thread
/// cache); closed, the handle is still refused as closed, and the link's
/// progress thread still ends.
#[test]
fn a_link_this_thread_used_is_refused_once_closed_and_its_thread_ends() {
    let before = progress_threads();
    let config = barlink_config {
        struct_size: std::mem::size_of::<barlink_config>() as u32,
        flags: BARLINK_CONFIG_PROGRESS_THREAD,
        ..barlink_config::default()
    };
    let (a, b) = pair(Some(&config));
    assert_eq!(
        progress_threads_settle_at(before + 2),
        before + 2,
        "each link starts its progress thread"
    );
    for _ in 0..3 {
        assert_eq!(send(a, b"cached"), BARLINK_OK);
        let mut buf = [0u8; 16];
        assert_eq!(recv(b, &mut buf, 5000), (BARLINK_OK, 6));
    }
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
    // This thread looked both links up, `b` last: its cache holds both.
    expect(send(b, b"late"), BARLINK_INVALID_HANDLE, "already closed");
    expect(send(a, b"late"), BARLINK_INVALID_HANDLE, "already closed");
    assert_eq!(
        progress_threads_settle_at(before),
        before,
        "a closed link's thread lives on"
    );
}
