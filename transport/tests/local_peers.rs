//! Who may be the other side of a link set up by name: other users are
//! refused both ways (the tests that start a peer as `nobody` need root
//! and say so when skipped), and idle or slow connections cost the real
//! peer nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use barlink_transport::EngineConfig;
use barlink_transport::link::{
    AllowedPeers, LinkConfig, Listener, ListenerStats, NamedOptions, RingLink, SetupError, Side,
    connect, connect_named, create_named_ring,
};
use barlink_transport::window::{ShmOptions, WindowError};

const NOBODY: u32 = 65534;
const TIMEOUT: Duration = Duration::from_secs(20);
const CHILD_ROLE: &str = "BARLINK_PEER_TEST_CHILD";

fn unique(tag: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "peers-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn config() -> LinkConfig {
    LinkConfig {
        engine: EngineConfig {
            mtu: 16 * 1024,
            ..EngineConfig::default()
        },
        window_len: 1 << 20,
        setup_timeout: TIMEOUT,
        ..LinkConfig::default()
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether a test that starts a peer as another user can run here; prints
/// the skip when not.
fn can_run_as_nobody(test: &str) -> bool {
    if is_root() {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root to start a peer process as another user (nobody)");
    false
}

/// The child side: `connect,NAME,COUNT` sends COUNT messages and prints
/// `linked`; `listen,NAME` accepts once (3 s) and prints its stats. Either
/// prints `error: ...` when setup fails.
#[test]
#[ignore = "the child side of the tests in this file, which start it with --ignored"]
fn child_role() {
    let Ok(spec) = std::env::var(CHILD_ROLE) else {
        return; // Only meaningful when spawned by the tests below.
    };
    let parts: Vec<&str> = spec.split(',').collect();
    match parts[0] {
        "connect" => match connect::<Vec<u8>>(parts[1], &config()) {
            Ok(mut link) => {
                let count: u64 = parts[2].parse().unwrap();
                for index in 0..count {
                    link.send_blocking(index.to_le_bytes().to_vec(), TIMEOUT)
                        .unwrap();
                }
                link.flush(TIMEOUT).unwrap();
                println!("linked");
            }
            Err(error) => println!("error: {error}"),
        },
        "listen" => {
            let listener = Listener::bind(parts[1]).unwrap();
            println!("listening");
            std::io::stdout().flush().unwrap();
            let config = LinkConfig {
                setup_timeout: Duration::from_secs(3),
                ..config()
            };
            let result = listener.accept::<Vec<u8>>(&config);
            let stats = listener.stats();
            match result {
                Ok(_) => println!("linked {stats:?}"),
                Err(error) => println!("error: {error}; {stats:?}"),
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

/// A copy of this test program that another user can execute (the build
/// directory may not be reachable for it).
fn executable_for_others() -> &'static PathBuf {
    static COPY: OnceLock<PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("barlink-peer-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("local_peers");
        std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    })
}

fn child(spec: &str, as_nobody: bool) -> Command {
    let mut command = if as_nobody {
        let mut command = Command::new(executable_for_others());
        command.uid(NOBODY).gid(NOBODY).current_dir("/");
        command
    } else {
        Command::new(std::env::current_exe().unwrap())
    };
    command
        .args([
            "--exact",
            "child_role",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, spec)
        .env_remove("BARLINK_ALLOW_UIDS")
        .env_remove("BARLINK_ALLOW_GIDS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn finished(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "the child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Accepts on `name` in a thread; the link's messages come back counted.
fn accept_and_count(
    name: &str,
    config: LinkConfig,
    expected: u64,
) -> thread::JoinHandle<(Result<u64, String>, Listener)> {
    let listener = Listener::bind(name).unwrap();
    thread::spawn(move || {
        let result = listener
            .accept::<Vec<u8>>(&config)
            .map_err(|e| e.to_string())
            .map(|mut link: RingLink<_>| {
                for index in 0..expected {
                    let message = link.recv(TIMEOUT).unwrap();
                    assert_eq!(message, index.to_le_bytes());
                }
                expected
            });
        (result, listener)
    })
}

#[test]
fn a_client_of_another_user_is_refused_and_the_listener_keeps_listening() {
    if !can_run_as_nobody("a_client_of_another_user_is_refused_and_the_listener_keeps_listening") {
        return;
    }
    let name = unique("refuse");
    let accepting = accept_and_count(&name, config(), 100);
    // The other user would link to root's listener if it were let in.
    let refused = finished(
        child(&format!("connect,{name},100"), true)
            .env("BARLINK_ALLOW_UIDS", "0")
            .output()
            .unwrap(),
    );
    assert!(refused.contains("error: the listener (uid 0"), "{refused}");
    assert!(
        refused.contains(&format!("pid {}", std::process::id())),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("refused this process (uid {NOBODY})")),
        "{refused}"
    );
    let linked = finished(
        child(&format!("connect,{name},100"), false)
            .output()
            .unwrap(),
    );
    assert!(linked.contains("linked"), "{linked}");
    let (delivered, listener) = accepting.join().unwrap();
    assert_eq!(delivered, Ok(100));
    let stats = listener.stats();
    assert_eq!(
        (stats.refused, stats.accepted),
        (1, 1),
        "one refused, one link: {stats:?}"
    );
}

#[test]
fn other_users_link_when_both_sides_allow_them() {
    if !can_run_as_nobody("other_users_link_when_both_sides_allow_them") {
        return;
    }
    let name = unique("allowed");
    let config = LinkConfig {
        allow: AllowedPeers {
            uids: vec![NOBODY],
            ..AllowedPeers::same_user_only()
        },
        ..config()
    };
    let accepting = accept_and_count(&name, config, 50);
    let linked = finished(
        child(&format!("connect,{name},50"), true)
            .env("BARLINK_ALLOW_UIDS", "0")
            .output()
            .unwrap(),
    );
    assert!(linked.contains("linked"), "{linked}");
    assert_eq!(accepting.join().unwrap().0, Ok(50));
}

#[test]
fn a_name_squatted_by_another_user_gets_nothing() {
    if !can_run_as_nobody("a_name_squatted_by_another_user_gets_nothing") {
        return;
    }
    let name = unique("squat");
    // The squatter admits anyone, so only the client's own check stands
    // between it and root's data.
    let mut squatter = child(&format!("listen,{name}"), true)
        .env("BARLINK_ALLOW_UIDS", "*")
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(squatter.stdout.take().unwrap());
    let mut line = String::new();
    // The test harness may print the test name on the same line.
    while !line.trim_end().ends_with("listening") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let mut stderr = String::new();
            let mut pipe = squatter.stderr.take().unwrap();
            pipe.read_to_string(&mut stderr).unwrap();
            panic!("the squatter ended early: {stderr}");
        }
    }
    let error = connect::<Vec<u8>>(&name, &config()).unwrap_err();
    let SetupError::PeerNotAllowed { peer, .. } = &error else {
        panic!("expected PeerNotAllowed, got {error}");
    };
    assert_eq!((peer.uid, peer.pid), (NOBODY, squatter.id()));
    let text = error.to_string();
    assert!(text.contains(&format!("uid {NOBODY}")), "{text}");
    assert!(text.contains(&format!("pid {}", squatter.id())), "{text}");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(squatter.wait().unwrap().success());
    assert!(
        rest.starts_with("error: "),
        "the squatter got a link: {rest}"
    );
    assert!(rest.contains("accepted: 0"), "{rest}");
}

#[test]
fn a_malformed_allow_list_is_an_error_not_an_empty_list() {
    let name = unique("badenv");
    let _listener = Listener::bind(&name).unwrap();
    let out = finished(
        child(&format!("connect,{name},1"), false)
            .env("BARLINK_ALLOW_UIDS", "1000,alice")
            .output()
            .unwrap(),
    );
    assert!(
        out.contains(
            "error: allow list: BARLINK_ALLOW_UIDS=\"1000,alice\": \"alice\" is not a numeric id"
        ),
        "{out}"
    );
}

fn socket_address(name: &str) -> SocketAddr {
    SocketAddr::from_abstract_name(format!("barlink/{name}")).unwrap()
}

#[test]
fn two_hundred_idle_connections_do_not_delay_the_real_peer() {
    let name = unique("flood");
    let listener = Listener::bind(&name).unwrap();
    let config = config();
    thread::scope(|scope| {
        let accepting = scope.spawn(|| listener.accept::<Vec<u8>>(&config).map(|_| ()));
        let address = socket_address(&name);
        let mut idle: Vec<UnixStream> = (0..200)
            .map(|_| UnixStream::connect_addr(&address).unwrap())
            .collect();
        // A slow peer that reads its welcome and then sends a byte that is
        // no window message, and one that leaves at once.
        let mut slow = UnixStream::connect_addr(&address).unwrap();
        let mut verdict = [0u8; 4];
        slow.read_exact(&mut verdict).unwrap();
        slow.write_all(b"x").unwrap();
        drop(UnixStream::connect_addr(&address).unwrap());
        idle.push(slow);
        let started = Instant::now();
        let link = connect::<Vec<u8>>(&name, &config);
        let took = started.elapsed();
        link.unwrap();
        eprintln!("the real peer linked in {took:?} behind 200 idle connections");
        accepting.join().unwrap().unwrap();
        assert!(
            took < Duration::from_secs(1),
            "the real peer waited {took:?} behind 200 idle connections"
        );
        let stats = listener.stats();
        assert_eq!(stats.accepted, 1, "{stats:?}");
        assert!(stats.evicted >= 1, "at most 64 are held at once: {stats:?}");
        drop(idle);
    });
}

#[test]
fn a_connection_that_sends_nothing_is_dropped_after_the_handshake_timeout() {
    let name = unique("idle");
    let listener = Listener::bind(&name).unwrap();
    let config = LinkConfig {
        handshake_timeout: Duration::from_millis(100),
        setup_timeout: Duration::from_millis(600),
        ..config()
    };
    let address = socket_address(&name);
    let mut idle = UnixStream::connect_addr(&address).unwrap();
    let error = listener.accept::<Vec<u8>>(&config).unwrap_err();
    assert!(matches!(error, SetupError::Timeout { .. }), "{error}");
    assert_eq!(
        listener.stats(),
        ListenerStats {
            timed_out: 1,
            ..ListenerStats::default()
        }
    );
    // It was welcomed, then dropped: it reads the verdict, then the end.
    let mut received = Vec::new();
    idle.set_read_timeout(Some(TIMEOUT)).unwrap();
    idle.read_to_end(&mut received).unwrap();
    assert_eq!(received, b"BLA+");
}

#[test]
fn a_ring_file_of_another_user_gets_nothing() {
    if !can_run_as_nobody("a_ring_file_of_another_user_gets_nothing") {
        return;
    }
    let dir = std::env::temp_dir().join(unique("ring-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let shm = ShmOptions::default().with_dir(&dir);
    let name = unique("squatted");
    // The other side's file, laid out and then owned by another user, as
    // if that user had created it first.
    let kept = shm.clone().with_unlink_on_drop(false);
    let squatted =
        create_named_ring(&format!("{name}.second"), 1 << 20, 16 * 1024, &kept, false).unwrap();
    std::os::unix::fs::chown(
        dir.join(format!("{name}.second")),
        Some(NOBODY),
        Some(NOBODY),
    )
    .unwrap();
    let options = NamedOptions {
        engine: config().engine,
        window_len: 1 << 20,
        shm,
        setup_timeout: Duration::from_secs(2),
        ..NamedOptions::default()
    };
    // Ring files are checked by the window layer: only files of this
    // user, mode 0600, are ever mapped.
    let error = connect_named::<Vec<u8>>(&name, Side::First, &options).unwrap_err();
    assert!(
        matches!(error, SetupError::Window(WindowError::NotPrivate { .. })),
        "{error}"
    );
    assert!(
        error.to_string().contains(&format!("owner uid {NOBODY}")),
        "{error}"
    );
    drop(squatted);
    std::fs::remove_dir_all(&dir).unwrap();
}
