//! Windows from the outside: every accessor's checks on every kind of
//! window, shared memory between two real processes (a memfd passed over a
//! Unix socket, a named /dev/shm file), threads publishing through a ring
//! of slots, the fault wrapper's rates and effects, and huge pages.
//!
//! Two-process tests spawn this test binary again with
//! `BARLINK_WINDOW_TEST_CHILD` naming the child's role; the child runs only
//! the `child_process_role` test, ignored in a normal run.

use std::io::Write as _;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::crc::{Crc32c, crc32c};
use barlink_transport::rng::SplitMix64;
use barlink_transport::window::{
    FaultConfig, FaultWindow, HeapWindow, HugePageReserve, HugePages, InjectedFaults, PageBacking,
    ShmOptions, ShmWindow, Window, WindowError, recv_fd, send_fd,
};

const WINDOW_LEN: usize = 1 << 20;
/// Where the parent writes a pattern before the child starts.
const PARENT_AT: usize = 8192;
const PARENT_LEN: usize = 4096;
/// Where the child writes its pattern, and how much.
const CHILD_AT: usize = 65536;
const CHILD_LEN: usize = 200_000;
/// Control words: the child's published length (Release) and its CRC.
const PUBLISHED_AT: usize = 0;
const CRC_AT: usize = 64;
const PARENT_SEED: u64 = 0x5eed_0001;
const CHILD_SEED: u64 = 0x5eed_0002;
const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

const CHILD_ROLE_ENV: &str = "BARLINK_WINDOW_TEST_CHILD";
const CHILD_SOCKET_ENV: &str = "BARLINK_WINDOW_TEST_SOCKET";
const CHILD_NAME_ENV: &str = "BARLINK_WINDOW_TEST_NAME";

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    SplitMix64::new(seed).fill(&mut bytes);
    bytes
}

/// A name no other test or run uses.
fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("barlink-test-{}-{tag}-{n}-{nanos}", std::process::id())
}

/// Says on the real stderr — past the test harness's capture — why a test
/// checked less than it could, so a skip is never a silent pass.
fn skipped(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}

/// Every kind of window, zeroed, of `len` bytes, with a label.
fn every_kind(len: usize) -> Vec<(&'static str, Box<dyn Window>)> {
    let named_options = ShmOptions::default();
    vec![
        ("heap", Box::new(HeapWindow::new(len).unwrap())),
        (
            "memfd",
            Box::new(ShmWindow::create_memfd("bounds", len, &ShmOptions::default()).unwrap()),
        ),
        (
            "named",
            Box::new(ShmWindow::create_named(&unique_name("bounds"), len, &named_options).unwrap()),
        ),
        (
            "fault(none)",
            Box::new(FaultWindow::new(
                HeapWindow::new(len).unwrap(),
                FaultConfig::none(),
                1,
            )),
        ),
        (
            "fault(all, indices too)",
            Box::new(FaultWindow::new(
                HeapWindow::new(len).unwrap(),
                FaultConfig::none()
                    .with_bit_flip(0.5)
                    .with_tear(0.5)
                    .with_stall(0.5, 1)
                    .with_fault_index_stores(true),
                2,
            )),
        ),
        (
            "arc",
            Box::new(Arc::new(HeapWindow::new(len).unwrap()) as Arc<dyn Window>),
        ),
    ]
}

fn is_out_of_bounds(result: Result<impl std::fmt::Debug, WindowError>, offset: usize) -> bool {
    matches!(result, Err(WindowError::OutOfBounds { offset: o, .. }) if o == offset)
}

#[test]
fn every_accessor_checks_bounds_on_every_kind_of_window() {
    const LEN: usize = 4096;
    for (kind, window) in every_kind(LEN) {
        assert_eq!(window.len(), LEN, "{kind}");
        let mut buf = [0u8; 16];
        // (offset, length): past the end, straddling it, and offsets whose
        // end overflows usize.
        let bad_ranges = [
            (LEN, 1),
            (LEN - 15, 16),
            (LEN + 1, 0),
            (usize::MAX, 1),
            (usize::MAX, 0),
            (usize::MAX - 7, 16),
            (usize::MAX - 3, 8),
        ];
        for (offset, len) in bad_ranges {
            let src = &[0xa5u8; 16][..len];
            assert!(
                is_out_of_bounds(window.write(offset, src), offset),
                "{kind} write {offset}"
            );
            assert!(
                is_out_of_bounds(window.read(offset, &mut buf[..src.len()]), offset),
                "{kind} read {offset}"
            );
            let mut calls = 0;
            assert!(
                is_out_of_bounds(
                    window.write_with(offset, src, 4, &mut |_| calls += 1),
                    offset
                ),
                "{kind} write_with {offset}"
            );
            assert_eq!(calls, 0, "{kind}: closure called for a rejected write");
        }
        let error = window.write(LEN - 2, &[1, 2, 3]).unwrap_err();
        assert_eq!(
            error,
            WindowError::OutOfBounds {
                offset: LEN - 2,
                len: 3,
                window_len: LEN
            }
        );

        // Exact fits, including empty accesses at the very end.
        window.write(LEN - 16, &[7; 16]).unwrap();
        window.read(LEN - 16, &mut buf).unwrap();
        window.write(LEN, &[]).unwrap();
        window.read(LEN, &mut []).unwrap();

        // Atomics: range first, then alignment.
        for offset in [LEN, LEN - 4, usize::MAX - 7, usize::MAX, usize::MAX - 3] {
            assert!(
                is_out_of_bounds(window.load_u64(offset, Ordering::Acquire), offset),
                "{kind}"
            );
            assert!(
                is_out_of_bounds(window.store_u64(offset, 1, Ordering::Release), offset),
                "{kind}"
            );
            assert!(
                is_out_of_bounds(window.fetch_add_u64(offset, 1, Ordering::AcqRel), offset),
                "{kind}"
            );
        }
        for offset in (1..8).chain([LEN - 12, 2052]) {
            let misaligned = |r: Result<(), WindowError>| matches!(r, Err(WindowError::Misaligned { offset: o, align: 8 }) if o == offset);
            assert!(
                misaligned(window.load_u64(offset, Ordering::Acquire).map(drop)),
                "{kind} {offset}"
            );
            assert!(
                misaligned(window.store_u64(offset, 1, Ordering::Release)),
                "{kind} {offset}"
            );
            assert!(
                misaligned(window.fetch_add_u64(offset, 1, Ordering::Relaxed).map(drop)),
                "{kind}"
            );
        }
        assert!(
            window.load_u64(LEN - 8, Ordering::Acquire).is_ok(),
            "{kind}"
        );
    }
}

#[test]
fn orderings_that_would_panic_in_std_are_errors() {
    for (kind, window) in every_kind(4096) {
        for order in [Ordering::Release, Ordering::AcqRel] {
            assert!(
                matches!(
                    window.load_u64(0, order),
                    Err(WindowError::InvalidOrdering { .. })
                ),
                "{kind}"
            );
        }
        for order in [Ordering::Acquire, Ordering::AcqRel] {
            assert!(
                matches!(
                    window.store_u64(0, 1, order),
                    Err(WindowError::InvalidOrdering { .. })
                ),
                "{kind}"
            );
        }
    }
}

#[test]
fn data_and_indices_round_trip() {
    for (kind, window) in every_kind(WINDOW_LEN) {
        if kind.starts_with("fault(all") {
            continue; // corrupts on purpose
        }
        let data = pattern(3, 100_000);
        window.write(12_345, &data).unwrap();
        let mut back = vec![0; data.len()];
        window.read(12_345, &mut back).unwrap();
        assert_eq!(back, data, "{kind}");
        window
            .store_u64(WINDOW_LEN - 8, u64::MAX - 1, Ordering::SeqCst)
            .unwrap();
        assert_eq!(
            window.fetch_add_u64(WINDOW_LEN - 8, 1, Ordering::SeqCst),
            Ok(u64::MAX - 1)
        );
        assert_eq!(
            window.load_u64(WINDOW_LEN - 8, Ordering::Relaxed),
            Ok(u64::MAX),
            "{kind}"
        );
        window.store_fence();
    }
}

#[test]
fn write_with_lends_each_source_chunk_for_the_crc() {
    let faulty = FaultConfig::none()
        .with_bit_flip(1.0)
        .with_tear(0.5)
        .with_drop(0.2);
    let windows: Vec<(&str, Box<dyn Window>)> = vec![
        ("heap", Box::new(HeapWindow::new(WINDOW_LEN).unwrap())),
        (
            "faulty",
            Box::new(FaultWindow::new(
                HeapWindow::new(WINDOW_LEN).unwrap(),
                faulty,
                9,
            )),
        ),
    ];
    let data = pattern(4, 70_001);
    for (kind, window) in &windows {
        for chunk in [0, 1, 4096, 65_536, 70_001, 1 << 20] {
            let mut crc = Crc32c::new();
            let mut lens = Vec::new();
            window
                .write_with(100, &data, chunk, &mut |piece| {
                    crc.update(piece);
                    lens.push(piece.len());
                })
                .unwrap();
            assert_eq!(crc.finish(), crc32c(&data), "{kind} chunk {chunk}");
            assert_eq!(lens.iter().sum::<usize>(), data.len());
            let expected_pieces = if chunk == 0 {
                1
            } else {
                data.len().div_ceil(chunk)
            };
            assert_eq!(lens.len(), expected_pieces, "{kind} chunk {chunk}");
            if *kind == "heap" {
                let mut back = vec![0; data.len()];
                window.read(100, &mut back).unwrap();
                assert_eq!(back, data);
            }
        }
    }
}

// ---- two processes ----------------------------------------------------

/// The child's side of the two-process tests (ignored unless they start it).
#[test]
#[ignore = "the child side of the two-process tests, which start it with --ignored"]
fn child_process_role() {
    let Ok(role) = std::env::var(CHILD_ROLE_ENV) else {
        return;
    };
    let window = match role.as_str() {
        "memfd" => {
            let socket = std::env::var(CHILD_SOCKET_ENV).unwrap();
            let stream = UnixStream::connect(&socket).unwrap();
            let fd = recv_fd(&stream, PROCESS_TIMEOUT).unwrap();
            let window = ShmWindow::from_fd(fd).unwrap();
            assert!(
                window.path().to_string_lossy().contains("memfd:"),
                "{:?}",
                window.path()
            );
            window
        }
        "named" => {
            let name = std::env::var(CHILD_NAME_ENV).unwrap();
            let window = ShmWindow::open_named(&name, &ShmOptions::default()).unwrap();
            assert!(
                !window.unlinks_on_drop(),
                "an opener must not remove the name"
            );
            window
        }
        other => panic!("unknown child role {other:?}"),
    };
    assert_eq!(window.len(), WINDOW_LEN);
    // What the parent wrote before we started is there.
    let mut from_parent = vec![0; PARENT_LEN];
    window.read(PARENT_AT, &mut from_parent).unwrap();
    assert_eq!(from_parent, pattern(PARENT_SEED, PARENT_LEN));
    // Publish a payload the way a link does: copy with the CRC taken on the
    // way, fence, then the index with Release.
    let data = pattern(CHILD_SEED, CHILD_LEN);
    let mut crc = Crc32c::new();
    window
        .write_with(CHILD_AT, &data, 16_384, &mut |piece| crc.update(piece))
        .unwrap();
    window
        .store_u64(CRC_AT, u64::from(crc.finish()), Ordering::Relaxed)
        .unwrap();
    window.store_fence();
    window
        .store_u64(PUBLISHED_AT, CHILD_LEN as u64, Ordering::Release)
        .unwrap();
}

fn spawn_child(role: &str, envs: &[(&str, &str)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "child_process_role",
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE_ENV, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.spawn().unwrap()
}

/// Waits for the child to succeed, killing it past the timeout; panics with
/// its output if it failed.
fn reap(mut child: Child) {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child process did not finish within {PROCESS_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    };
    let output = child.wait_with_output().unwrap();
    assert!(
        status.success(),
        "child failed ({status}):\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Polls the child's published index with Acquire until it is complete
/// (true) or the child has exited without publishing (false).
fn wait_for_child_payload(window: &ShmWindow, child: &mut Child) -> bool {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        let published = window.load_u64(PUBLISHED_AT, Ordering::Acquire).unwrap();
        if published == CHILD_LEN as u64 {
            return true;
        }
        assert_eq!(published, 0, "the index is either unpublished or complete");
        if child.try_wait().unwrap().is_some() {
            return window.load_u64(PUBLISHED_AT, Ordering::Acquire).unwrap() != 0;
        }
        assert!(
            Instant::now() < deadline,
            "child published nothing within {PROCESS_TIMEOUT:?}"
        );
        thread::sleep(Duration::from_micros(200));
    }
}

/// Waits for the child's payload, reaps the child (reporting its output if
/// it failed), then checks the payload and its CRC.
fn expect_child_payload(window: &ShmWindow, mut child: Child) {
    let published = wait_for_child_payload(window, &mut child);
    reap(child);
    assert!(
        published,
        "the child exited successfully without publishing"
    );
    let mut data = vec![0; CHILD_LEN];
    window.read(CHILD_AT, &mut data).unwrap();
    assert_eq!(data, pattern(CHILD_SEED, CHILD_LEN));
    assert_eq!(
        window.load_u64(CRC_AT, Ordering::Relaxed),
        Ok(u64::from(crc32c(&data)))
    );
}

#[test]
fn a_memfd_window_crosses_processes_over_a_unix_socket() {
    let window = ShmWindow::create_memfd("xproc", WINDOW_LEN, &ShmOptions::default()).unwrap();
    window
        .write(PARENT_AT, &pattern(PARENT_SEED, PARENT_LEN))
        .unwrap();

    let socket = std::env::temp_dir().join(format!("{}.sock", unique_name("memfd")));
    let listener = UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = spawn_child("memfd", &[(CHILD_SOCKET_ENV, socket.to_str().unwrap())]);

    // accept() has no timeout of its own: poll it.
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    reap(child);
                    panic!("child exited ({status}) before connecting");
                }
                assert!(Instant::now() < deadline, "child never connected");
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = std::fs::remove_file(&socket);
    stream.set_nonblocking(false).unwrap();
    send_fd(&stream, window.fd(), PROCESS_TIMEOUT).unwrap();

    expect_child_payload(&window, child);
}

#[test]
fn a_named_window_crosses_processes() {
    let name = unique_name("named");
    let window = ShmWindow::create_named(&name, WINDOW_LEN, &ShmOptions::default()).unwrap();
    window
        .write(PARENT_AT, &pattern(PARENT_SEED, PARENT_LEN))
        .unwrap();
    let child = spawn_child("named", &[(CHILD_NAME_ENV, &name)]);
    expect_child_payload(&window, child);
    let path = window.path().to_owned();
    assert!(
        path.exists(),
        "the child's drop must not remove the creator's name"
    );
    drop(window);
    assert!(
        !path.exists(),
        "the creator removes the name when it drops the window"
    );
}

// ---- names, modes and descriptors -------------------------------------

#[test]
fn named_windows_are_private_and_exclusive() {
    let options = ShmOptions::default();
    let name = unique_name("private");
    let window = ShmWindow::create_named(&name, 10_000, &options).unwrap();
    let path = options.path_of(&name).unwrap();
    assert_eq!(window.path(), path);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 10_000);

    let error = ShmWindow::create_named(&name, 10_000, &options).unwrap_err();
    assert_eq!(error, WindowError::NameInUse { path: path.clone() });
    let message = error.to_string();
    assert!(
        message.contains(&format!("rm {}", path.display())),
        "{message}"
    );
    assert!(
        path.exists(),
        "a failed create must not remove the existing name"
    );

    window.store_u64(8, 99, Ordering::Release).unwrap();
    let opened = ShmWindow::open_named(&name, &options).unwrap();
    assert_eq!(opened.len(), 10_000);
    assert_eq!(opened.load_u64(8, Ordering::Acquire), Ok(99));
    drop(opened);
    assert!(path.exists());

    // Kept on drop when asked.
    let mut window = window;
    window.set_unlink_on_drop(false);
    drop(window);
    assert!(path.exists());
    std::fs::remove_file(&path).unwrap();

    assert_eq!(
        ShmWindow::open_named(&name, &options).unwrap_err(),
        WindowError::NotFound { path }
    );
    let kept = ShmOptions::default().with_unlink_on_drop(false);
    let window = ShmWindow::create_named(&name, 4096, &kept).unwrap();
    assert!(!window.unlinks_on_drop());
    let path = window.path().to_owned();
    drop(window);
    assert!(path.exists());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn opening_refuses_files_that_are_not_private_windows() {
    let dir = std::env::temp_dir().join(unique_name("dir"));
    std::fs::create_dir(&dir).unwrap();
    let options = ShmOptions::default().with_dir(&dir);

    let shared = dir.join("shared");
    std::fs::write(&shared, [0u8; 4096]).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = ShmWindow::open_named("shared", &options).unwrap_err();
    assert!(
        matches!(error, WindowError::NotPrivate { mode: 0o644, .. }),
        "{error}"
    );

    let empty = dir.join("empty");
    std::fs::write(&empty, []).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(
        ShmWindow::open_named("empty", &options),
        Err(WindowError::TooSmall { len: 0, .. })
    ));

    std::os::unix::fs::symlink(&empty, dir.join("link")).unwrap();
    assert!(matches!(
        ShmWindow::open_named("link", &options),
        Err(WindowError::NotAWindow { .. })
    ));
    assert!(matches!(
        ShmWindow::create_named("../escape", 4096, &options),
        Err(WindowError::InvalidName { .. })
    ));
    assert!(matches!(
        ShmWindow::create_named("x", 0, &options),
        Err(WindowError::InvalidLength { len: 0, .. })
    ));
    assert!(
        !dir.join("x").exists(),
        "a refused create leaves nothing behind"
    );
    assert!(matches!(
        ShmWindow::create_named("x", 4096, &options.clone().with_dir(dir.join("missing"))),
        Err(WindowError::NotFound { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn descriptors_that_are_not_windows_are_refused() {
    let (a, _b) = UnixStream::pair().unwrap();
    let error = ShmWindow::from_fd(a.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
    assert!(matches!(error, WindowError::NotAWindow { .. }), "{error}");
    let (read_end, _write_end) = std::io::pipe().unwrap();
    assert!(matches!(
        ShmWindow::from_fd(read_end.into()),
        Err(WindowError::NotAWindow { .. })
    ));
    assert!(matches!(
        ShmWindow::create_memfd("bad\0name", 4096, &ShmOptions::default()),
        Err(WindowError::InvalidName { .. })
    ));
}

#[test]
fn receiving_a_descriptor_never_waits_forever() {
    let (_a, b) = UnixStream::pair().unwrap();
    let started = Instant::now();
    let error = recv_fd(&b, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(error, WindowError::Timeout { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

// ---- threads ------------------------------------------------------------

/// A producer publishes variable-length messages through a ring of slots
/// (write, fence, Release head) and a consumer takes them (Acquire head,
/// read, Release tail), while other threads count with fetch_add.
fn ring_of_slots_between_threads(window: Arc<dyn Window>) {
    const HEAD: usize = 0;
    const TAIL: usize = 64;
    const COUNTER: usize = 128;
    const SLOTS: u64 = 8;
    const SLOT: usize = 4096;
    const FIRST_SLOT: usize = 4096;
    const MESSAGES: u64 = 5_000;
    const COUNTERS: u64 = 4;
    const ADDS: u64 = 10_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Bodies of 1 to SLOT - 9 bytes, after an 8-byte length: never past the slot.
    let message = |seq: u64| pattern(seq, 1 + (seq as usize * 37) % (SLOT - 9));

    let producer = {
        let window = Arc::clone(&window);
        thread::spawn(move || {
            for seq in 0..MESSAGES {
                while seq - window.load_u64(TAIL, Ordering::Acquire).unwrap() >= SLOTS {
                    assert!(Instant::now() < deadline, "producer starved");
                    thread::yield_now();
                }
                let slot = FIRST_SLOT + (seq % SLOTS) as usize * SLOT;
                let body = message(seq);
                window
                    .write(slot, &(body.len() as u64).to_le_bytes())
                    .unwrap();
                window.write(slot + 8, &body).unwrap();
                window.store_fence();
                window.store_u64(HEAD, seq + 1, Ordering::Release).unwrap();
            }
        })
    };
    let counters: Vec<_> = (0..COUNTERS)
        .map(|_| {
            let window = Arc::clone(&window);
            thread::spawn(move || {
                for _ in 0..ADDS {
                    window.fetch_add_u64(COUNTER, 1, Ordering::Relaxed).unwrap();
                }
            })
        })
        .collect();
    for seq in 0..MESSAGES {
        while window.load_u64(HEAD, Ordering::Acquire).unwrap() <= seq {
            assert!(Instant::now() < deadline, "consumer starved at {seq}");
            thread::yield_now();
        }
        let slot = FIRST_SLOT + (seq % SLOTS) as usize * SLOT;
        let mut len = [0u8; 8];
        window.read(slot, &mut len).unwrap();
        let len = u64::from_le_bytes(len) as usize;
        let mut body = vec![0; len];
        window.read(slot + 8, &mut body).unwrap();
        assert_eq!(body, message(seq), "message {seq}");
        window.store_u64(TAIL, seq + 1, Ordering::Release).unwrap();
    }
    producer.join().unwrap();
    for counter in counters {
        counter.join().unwrap();
    }
    assert_eq!(
        window.load_u64(COUNTER, Ordering::SeqCst),
        Ok(COUNTERS * ADDS)
    );
}

#[test]
fn threads_publish_through_a_heap_window() {
    ring_of_slots_between_threads(Arc::new(HeapWindow::new(64 << 10).unwrap()));
}

#[test]
fn threads_publish_through_a_memfd_window_mapped_twice() {
    // Producer and consumer use two separate mappings of one memfd, as two
    // processes would.
    let window = ShmWindow::create_memfd("threads", 64 << 10, &ShmOptions::default()).unwrap();
    let second = ShmWindow::from_fd(window.fd().try_clone_to_owned().unwrap()).unwrap();
    struct Split(ShmWindow, ShmWindow);
    // Writes go through one mapping, reads and loads through the other.
    impl Window for Split {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
            self.0.write(offset, src)
        }
        fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
            self.1.read(offset, dst)
        }
        fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
            self.1.load_u64(offset, order)
        }
        fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
            self.0.store_u64(offset, value, order)
        }
        fn fetch_add_u64(
            &self,
            offset: usize,
            value: u64,
            order: Ordering,
        ) -> Result<u64, WindowError> {
            self.0.fetch_add_u64(offset, value, order)
        }
    }
    ring_of_slots_between_threads(Arc::new(Split(window, second)));
}

// ---- fault injection --------------------------------------------------

#[test]
fn with_no_faults_the_wrapper_is_transparent() {
    const LEN: usize = 1 << 16;
    let window = FaultWindow::new(HeapWindow::new(LEN).unwrap(), FaultConfig::none(), 42);
    let mut mirror = vec![0u8; LEN];
    let mut rng = SplitMix64::new(5);
    let mut writes = 0;
    let mut stores = 0;
    for _ in 0..5_000 {
        let offset = rng.below(LEN as u64) as usize;
        let len = rng.below((LEN - offset).min(3000) as u64 + 1) as usize;
        match rng.below(4) {
            0 => {
                let data = pattern(rng.next_u64(), len);
                window.write(offset, &data).unwrap();
                mirror[offset..offset + len].copy_from_slice(&data);
                writes += 1;
            }
            1 => {
                let data = pattern(rng.next_u64(), len);
                window.write_with(offset, &data, 512, &mut |_| {}).unwrap();
                mirror[offset..offset + len].copy_from_slice(&data);
                writes += 1;
            }
            2 => {
                let at = offset & !7;
                if at + 8 <= LEN {
                    let value = rng.next_u64();
                    window.store_u64(at, value, Ordering::Release).unwrap();
                    mirror[at..at + 8].copy_from_slice(&value.to_le_bytes());
                    stores += 1;
                }
            }
            _ => {
                let mut back = vec![0; len];
                window.read(offset, &mut back).unwrap();
                assert_eq!(back, mirror[offset..offset + len]);
            }
        }
    }
    let mut all = vec![0; LEN];
    window.read(0, &mut all).unwrap();
    assert_eq!(all, mirror);
    assert_eq!(
        window.injected(),
        InjectedFaults {
            bulk_writes: writes,
            index_stores: stores,
            ..InjectedFaults::default()
        }
    );
}

/// `expected ± 6 standard deviations` of a binomial count.
fn assert_near(what: &str, count: u64, trials: u64, p: f64) {
    let mean = trials as f64 * p;
    let spread = 6.0 * (trials as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (count as f64 - mean).abs() <= spread,
        "{what}: {count} injected, expected {mean:.0} ± {spread:.0}"
    );
}

#[test]
fn fault_rates_follow_their_probabilities_and_replay_from_the_seed() {
    const WRITES: u64 = 20_000;
    // Bulk writes only, so that each count has one kind of trial.
    let config = FaultConfig::none()
        .with_drop(0.05)
        .with_bit_flip(0.1)
        .with_tear(0.08)
        .with_stall(0.03, 3)
        .with_fault_index_stores(false);
    let run = |seed: u64| {
        let window = FaultWindow::new(HeapWindow::new(1 << 16).unwrap(), config.clone(), seed);
        for i in 0..WRITES {
            window
                .write((i as usize % 1000) * 64, &[0xffu8; 64])
                .unwrap();
            window.store_u64(65_528, i, Ordering::Release).unwrap();
        }
        window.land_stalled();
        window.injected()
    };
    let counts = run(1234);
    assert_eq!(counts.bulk_writes, WRITES);
    assert_eq!(counts.index_stores, WRITES);
    assert_near("dropped", counts.dropped, WRITES, 0.05);
    // The others apply only to writes that were not dropped.
    let kept = WRITES - counts.dropped;
    assert_near("bit flips", counts.bit_flips, kept, 0.1);
    assert_near("torn", counts.torn, kept, 0.08);
    assert_near("stalled", counts.stalled, kept, 0.03);
    assert_eq!(counts.stalls_landed, counts.stalled);
    assert_eq!(run(1234), counts, "the same seed replays the same faults");
    assert_ne!(run(4321), counts, "another seed gives other faults");
}

#[test]
fn each_fault_does_what_it_says() {
    // A bit flip changes exactly one bit of what lands.
    let window = FaultWindow::new(
        HeapWindow::new(4096).unwrap(),
        FaultConfig::none().with_bit_flip(1.0),
        3,
    );
    for round in 0..200u64 {
        let data = pattern(round, 1000);
        window.write(0, &data).unwrap();
        let mut back = vec![0; 1000];
        window.inner().read(0, &mut back).unwrap();
        let flipped: u32 = back
            .iter()
            .zip(&data)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(flipped, 1, "round {round}");
    }

    // A dropped write leaves the window as it was.
    window.set_config(FaultConfig::none().with_drop(1.0));
    window.inner().write(0, &[0; 1000]).unwrap();
    window.write(0, &[9; 1000]).unwrap();
    window.write_with(0, &[9; 1000], 100, &mut |_| {}).unwrap();
    let mut back = vec![1; 1000];
    window.inner().read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));

    // A stalled data write lands after the index that was meant to publish
    // it — the reordering a ring must survive.
    window.set_config(FaultConfig::none().with_stall(1.0, 1));
    window.write(0, &[5; 64]).unwrap();
    assert_eq!(window.pending_stalls(), 1);
    window.set_config(FaultConfig::none());
    let mut seen = [0u8; 64];
    window.inner().read(0, &mut seen).unwrap();
    assert_eq!(seen, [0; 64], "not landed yet");
    window.read(0, &mut seen).unwrap(); // the next call lands it first
    assert_eq!(seen, [5; 64]);
    assert_eq!(window.pending_stalls(), 0);
}

#[test]
fn index_stores_are_faulted_unless_turned_off() {
    let everything = FaultConfig::none().with_drop(1.0);
    let window = FaultWindow::new(
        HeapWindow::new(4096).unwrap(),
        everything.clone().with_fault_index_stores(false),
        8,
    );
    window.store_u64(0, 7, Ordering::Release).unwrap();
    assert_eq!(
        window.load_u64(0, Ordering::Acquire),
        Ok(7),
        "turned off: indices land intact"
    );
    assert_eq!(window.injected().dropped, 0);

    window.set_config(everything);
    window.store_u64(0, 8, Ordering::Release).unwrap();
    assert_eq!(window.load_u64(0, Ordering::Acquire), Ok(7), "dropped");
    assert_eq!(window.injected().dropped, 1);
    // A faulted store is still checked when issued, not when it lands.
    assert!(matches!(
        window.store_u64(4, 1, Ordering::Release),
        Err(WindowError::Misaligned { .. })
    ));
    assert!(matches!(
        window.store_u64(4096, 1, Ordering::Release),
        Err(WindowError::OutOfBounds { .. })
    ));
    assert!(matches!(
        window.store_u64(0, 1, Ordering::Acquire),
        Err(WindowError::InvalidOrdering { .. })
    ));

    window.set_config(
        FaultConfig::none()
            .with_bit_flip(1.0)
            .with_fault_index_stores(true),
    );
    window.store_u64(0, 0, Ordering::Release).unwrap();
    assert_eq!(
        window.load_u64(0, Ordering::Acquire).unwrap().count_ones(),
        1
    );
    // fetch_add is never faulted.
    window.set_config(
        FaultConfig::none()
            .with_drop(1.0)
            .with_fault_index_stores(true),
    );
    let before = window.fetch_add_u64(8, 3, Ordering::AcqRel).unwrap();
    assert_eq!(window.load_u64(8, Ordering::Acquire), Ok(before + 3));
}

// ---- huge pages ---------------------------------------------------------

fn overcommit_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn asking_for_more_reserved_huge_pages_than_are_free_is_a_clear_error() {
    const TEST: &str = "asking_for_more_reserved_huge_pages_than_are_free_is_a_clear_error";
    let Some(reserve) = HugePageReserve::read() else {
        skipped(
            TEST,
            "this kernel has no hugetlbfs (no /proc/sys/vm/nr_hugepages)",
        );
        return;
    };
    if overcommit_huge_pages() > 0 {
        skipped(
            TEST,
            "/proc/sys/vm/nr_hugepages_overcommit > 0 lets the kernel find more pages",
        );
        return;
    }
    // One page more than are free, so the error path is taken whatever
    // this machine has reserved.
    let len = (reserve.free as usize + 1) * (2 << 20);
    let reserved = ShmOptions::default().with_huge_pages(HugePages::Reserved);
    let error = ShmWindow::create_memfd("huge", len, &reserved).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, WindowError::HugePagesUnavailable { .. }),
        "{message}"
    );
    assert!(message.contains("/proc/sys/vm/nr_hugepages"), "{message}");
    assert!(
        message.contains(&format!("is {}", reserve.total)),
        "{message}"
    );

    // Falling back is possible, but only when asked for.
    let fallback = ShmOptions::default().with_huge_pages(HugePages::ReservedOrTransparent);
    let window = ShmWindow::create_memfd("huge-or-thp", len, &fallback).unwrap();
    assert_eq!(window.page_backing(), PageBacking::TransparentAdvised);
    assert_eq!(window.len(), len);

    // A named window on tmpfs cannot have reserved pages.
    let error = ShmWindow::create_named(&unique_name("huge"), 2 << 20, &reserved).unwrap_err();
    assert!(error.to_string().contains("hugetlbfs"), "{error}");
}

#[test]
fn reserved_huge_pages_back_a_window_when_reserved() {
    const TEST: &str = "reserved_huge_pages_back_a_window_when_reserved";
    let free = HugePageReserve::read().map_or(0, |r| r.free);
    if free < 2 {
        skipped(
            TEST,
            &format!(
                "needs 2 free reserved 2 MiB huge pages and {free} are free \
                 (reserve some as root: `echo 8 > /proc/sys/vm/nr_hugepages`)"
            ),
        );
        return;
    }
    let reserved = ShmOptions::default().with_huge_pages(HugePages::Reserved);
    // Rounded up to whole 2 MiB pages.
    let window = ShmWindow::create_memfd("huge", 3 << 20, &reserved).unwrap();
    assert_eq!(window.len(), 4 << 20);
    assert_eq!(window.page_backing(), PageBacking::Reserved2MiB);
    let data = pattern(11, 3 << 20);
    window.write(1 << 20, &data).unwrap();
    let peer = ShmWindow::from_fd(window.fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(peer.page_backing(), PageBacking::Reserved2MiB);
    let mut back = vec![0; data.len()];
    peer.read(1 << 20, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn transparent_huge_pages_are_advice_that_always_maps() {
    let options = ShmOptions::default().with_huge_pages(HugePages::Transparent);
    let window = ShmWindow::create_memfd("thp", 4 << 20, &options).unwrap();
    assert_eq!(window.page_backing(), PageBacking::TransparentAdvised);
    window.write(0, &[1; 4096]).unwrap();
    let window = ShmWindow::create_named(&unique_name("thp"), 4 << 20, &options).unwrap();
    assert_eq!(window.page_backing(), PageBacking::TransparentAdvised);
    let path: PathBuf = window.path().to_owned();
    drop(window);
    assert!(!path.exists());
}

/// `write_crc`/`read_crc` (one pass where the CPU allows) copy exactly what
/// `write`/`read` copy and take the CRC of exactly those bytes, on every
/// kind of window, at any length and misalignment; out-of-range calls
/// touch nothing.
#[test]
fn copies_with_crc_equal_a_copy_then_a_crc_on_every_kind_of_window() {
    let len = 1 << 20;
    let data = pattern(77, 300_000);
    for (kind, window) in every_kind(len) {
        for (size, offset) in [
            (0, 0),
            (1, 5),
            (255, 1),
            (256, 4096),
            (4097, 13),
            (65_456, 80),
            (262_144, 1 << 19),
        ] {
            let src = &data[offset % 31..offset % 31 + size];
            let mut crc = Crc32c::new();
            crc.update(b"header");
            window.write_crc(offset, src, &mut crc).unwrap();
            let mut expected = Crc32c::new();
            expected.update(b"header");
            expected.update(src);
            assert_eq!(
                crc.finish(),
                expected.finish(),
                "{kind}: write_crc of {size} at {offset}"
            );
            // A faulting window damages what lands (that is its job); the
            // CRC above is still of what the caller meant to send.
            if kind.starts_with("fault(all") {
                continue;
            }
            let mut back = vec![0u8; size];
            window.read(offset, &mut back).unwrap();
            assert!(
                back == src,
                "{kind}: write_crc wrote other bytes ({size} at {offset})"
            );
            let mut read_back = vec![0u8; size + 3];
            let mut crc = Crc32c::new();
            window
                .read_crc(offset, &mut read_back[3..], &mut crc)
                .unwrap();
            assert!(&read_back[3..] == src, "{kind}: read_crc read other bytes");
            assert_eq!(
                crc.finish(),
                crc32c(src),
                "{kind}: read_crc of {size} at {offset}"
            );
        }
        let mut crc = Crc32c::new();
        assert!(
            is_out_of_bounds(window.write_crc(len - 10, &data[..11], &mut crc), len - 10),
            "{kind}"
        );
        assert_eq!(
            crc.finish(),
            Crc32c::new().finish(),
            "{kind}: a refused write fed the CRC"
        );
        let mut dst = vec![0u8; 11];
        assert!(
            is_out_of_bounds(window.read_crc(len - 10, &mut dst, &mut crc), len - 10),
            "{kind}"
        );
    }
}
