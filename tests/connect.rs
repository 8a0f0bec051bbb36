//! The facade's `connect`: which path it picks for a peer, and why, from
//! the PCI topology (fixture trees) and from where the peer is; and a link
//! set up through it between two threads of this host.

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use barlink::{
    BarEnds, BarRef, ConnectError, ConnectOptions, PathKind, Peer, Role, choose_path, connect,
};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Says on the real stderr, past the harness's capture, why a test checked
/// less than it could, so test-all counts it as skipped.
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn bars(own: &str, peer: &str) -> BarEnds {
    let bar = |device: &str| BarRef {
        device: device.to_string(),
        bar: 1,
        offset: 0,
        len: 4 << 20,
    };
    BarEnds {
        own: bar(own),
        peer: bar(peer),
    }
}

fn local() -> Peer {
    Peer::Local {
        name: "x".to_string(),
    }
}

#[test]
fn peers_parse_as_local_names_or_remote_addresses() {
    let parse = |text: &str| text.parse::<Peer>().unwrap();
    assert_eq!(parse("local:kv"), Peer::Local { name: "kv".into() });
    assert_eq!(parse("kv"), Peer::Local { name: "kv".into() });
    assert_eq!(
        parse("rdma://10.0.0.2:18515"),
        Peer::Rdma {
            addr: "10.0.0.2:18515".into()
        }
    );
    assert_eq!(
        parse("tcp://10.0.0.2:18616"),
        Peer::Tcp {
            addr: "10.0.0.2:18616".into()
        }
    );
    assert_eq!(
        parse("node7:18515"),
        Peer::Remote {
            addr: "node7:18515".into()
        }
    );
    assert!(matches!(
        "".parse::<Peer>(),
        Err(ConnectError::Usage { .. })
    ));
}

#[test]
fn a_local_peer_without_bar_windows_goes_through_host_memory() {
    let decision = choose_path(&local(), &ConnectOptions::default()).unwrap();
    assert_eq!(decision.path, PathKind::HostBounce);
    assert!(decision.reason.contains("no BAR windows"), "{decision}");
}

#[test]
fn two_gpus_the_topology_clears_for_p2p_get_bar_p2p_and_the_reason() {
    let options = ConnectOptions {
        bars: Some(bars("0000:01:00.0", "0000:02:00.0")),
        sysfs_root: fixture("desktop-2x4090"),
        ..ConnectOptions::default()
    };
    let decision = choose_path(&local(), &options).unwrap();
    assert_eq!(decision.path, PathKind::BarP2p, "{decision}");
    assert!(
        decision.reason.contains("GPU0") && decision.reason.contains("PHB"),
        "{decision}"
    );
}

#[test]
fn acs_an_iommu_or_a_small_bar_sends_the_pair_through_host_memory() {
    for (tree, own, peer, why) in [
        ("acs-cascade-4gpu", "0000:05:00.0", "0000:06:00.0", "ACS"),
        ("iommu-translating", "0000:19:00.0", "0000:1a:00.0", "IOMMU"),
        (
            "small-bar1",
            "0000:21:00.0",
            "0000:41:00.0",
            "BAR1 is 256 MiB",
        ),
    ] {
        let options = ConnectOptions {
            bars: Some(bars(own, peer)),
            sysfs_root: fixture(tree),
            ..ConnectOptions::default()
        };
        let decision = choose_path(&local(), &options).unwrap();
        assert_eq!(decision.path, PathKind::HostBounce, "{tree}: {decision}");
        assert!(decision.reason.contains(why), "{tree}: {decision}");
        // Forcing BAR P2P is possible and still says what auto would do.
        let forced = choose_path(
            &local(),
            &ConnectOptions {
                force: Some(PathKind::BarP2p),
                ..options
            },
        )
        .unwrap();
        assert_eq!(forced.path, PathKind::BarP2p);
        assert!(
            forced.reason.contains("forced") && forced.reason.contains(why),
            "{forced}"
        );
    }
}

#[test]
fn a_device_that_cannot_be_found_never_risks_p2p() {
    let options = ConnectOptions {
        bars: Some(bars("0000:7f:00.0", "0000:02:00.0")),
        sysfs_root: fixture("desktop-2x4090"),
        ..ConnectOptions::default()
    };
    let decision = choose_path(&local(), &options).unwrap();
    assert_eq!(decision.path, PathKind::HostBounce, "{decision}");
    assert!(decision.reason.contains("cannot be found"), "{decision}");
}

/// This host has no RDMA device (or no libibverbs): a remote peer has no
/// path, and the error says RDMA is what is missing.
#[test]
fn a_remote_peer_without_rdma_is_no_path_with_the_reason() {
    if barlink::rdma::device::devices().is_ok() {
        skipped(
            "a_remote_peer_without_rdma_is_no_path_with_the_reason",
            "this host has an RDMA device; the guest tests cover RDMA",
        );
        return;
    }
    let peer: Peer = "rdma://192.0.2.1:18515".parse().unwrap();
    let error = choose_path(&peer, &ConnectOptions::default()).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, ConnectError::NoPath { .. }), "{text}");
    assert!(
        text.contains("another node") && text.contains("RDMA"),
        "{text}"
    );
    let error = connect::<Vec<u8>>(&peer, Role::Connect, &ConnectOptions::default()).unwrap_err();
    assert!(matches!(error, ConnectError::NoPath { .. }), "{error}");
}

#[test]
fn connect_and_accept_by_name_move_messages_and_say_host_bounce() {
    let name = format!("connect-test-{}", std::process::id());
    let peer = Peer::Local { name };
    let accepting = {
        let peer = peer.clone();
        thread::spawn(move || {
            let mut connection = connect(&peer, Role::Accept, &ConnectOptions::default()).unwrap();
            for index in 0..100u32 {
                let got = connection.recv(TIMEOUT).unwrap();
                assert_eq!(got, vec![index as u8; index as usize * 100]);
            }
            connection.send(b"done".to_vec(), TIMEOUT).unwrap();
            connection.flush(TIMEOUT).unwrap();
            connection.decision
        })
    };
    let mut connection = connect(&peer, Role::Connect, &ConnectOptions::default()).unwrap();
    assert_eq!(connection.decision.path, PathKind::HostBounce);
    for index in 0..100u32 {
        connection
            .send(vec![index as u8; index as usize * 100], TIMEOUT)
            .unwrap();
    }
    assert_eq!(connection.recv(TIMEOUT).unwrap(), b"done");
    let decision = accepting.join().unwrap();
    assert_eq!(decision.path, PathKind::HostBounce);
    assert_eq!(connection.stats().crc_failures, 0);
}

/// Without RDMA here, a peer named only by its address is reached over
/// TCP, and the decision says why; over loopback the link moves messages,
/// sealed when asked.
#[test]
fn a_remote_peer_without_rdma_goes_over_tcp_sealed_when_asked() {
    use barlink::transport::auth::{PeerAuth, SecretKey};
    if barlink::rdma::device::devices().is_ok_and(|d| !d.is_empty()) {
        skipped(
            "a_remote_peer_without_rdma_goes_over_tcp_sealed_when_asked",
            "this host has RDMA",
        );
        return;
    }
    let key = SecretKey::from_hex(&"5a".repeat(32)).unwrap();
    let options = ConnectOptions {
        auth: Some(PeerAuth::PreSharedKey {
            key,
            source: "the test".to_string(),
        }),
        encrypt: true,
        ..ConnectOptions::default()
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let decision = choose_path(&Peer::Remote { addr: addr.clone() }, &options).unwrap();
    assert_eq!(decision.path, PathKind::Tcp, "{decision}");
    assert!(decision.reason.contains("no RDMA here"), "{decision}");
    let server_options = options.clone();
    let server_addr = addr.clone();
    let accepting = thread::spawn(move || {
        let mut server = connect::<Vec<u8>>(
            &Peer::Remote { addr: server_addr },
            Role::Accept,
            &server_options,
        )
        .unwrap();
        let got = server.recv(Duration::from_secs(10)).unwrap();
        server.send(got, Duration::from_secs(10)).unwrap();
        server.flush(Duration::from_secs(10)).unwrap();
        server.decision
    });
    let mut client = connect::<Vec<u8>>(&Peer::Tcp { addr }, Role::Connect, &options).unwrap();
    client
        .send(b"over tcp".to_vec(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(client.recv(Duration::from_secs(10)).unwrap(), b"over tcp");
    let server_decision = accepting.join().unwrap();
    for decision in [&client.decision, &server_decision] {
        assert_eq!(decision.path, PathKind::Tcp);
        assert!(decision.reason.contains("pre-shared key"), "{decision}");
        assert!(
            decision.reason.contains("every packet sealed"),
            "{decision}"
        );
        // Where the buffers stop growing matters across a long path.
        assert!(decision.reason.contains("socket buffers"), "{decision}");
    }
    assert!(matches!(client.link, barlink::connect::AnyLink::Tcp(_)));
}

/// A peer on another node that never answers ends `connect` within the
/// setup timeout (the C face's `timeout_ms`), not after the TCP channel's
/// own limits (5 s to authenticate, retries for many seconds).
#[test]
fn a_silent_tcp_peer_ends_connect_within_the_setup_timeout() {
    use barlink::transport::auth::{PeerAuth, SecretKey};
    if barlink::rdma::device::devices().is_ok_and(|d| !d.is_empty()) {
        skipped(
            "a_silent_tcp_peer_ends_connect_within_the_setup_timeout",
            "this host has RDMA",
        );
        return;
    }
    // Connections complete in the kernel; nobody ever speaks on them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let options = ConnectOptions {
        auth: Some(PeerAuth::PreSharedKey {
            key: SecretKey::from_hex(&"5a".repeat(32)).unwrap(),
            source: "the test".to_string(),
        }),
        setup_timeout: Duration::from_millis(300),
        ..ConnectOptions::default()
    };
    let started = std::time::Instant::now();
    let error = connect::<Vec<u8>>(&Peer::Tcp { addr }, Role::Connect, &options)
        .expect_err("nobody answers");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?} with a 300 ms setup timeout: {error}"
    );
    assert!(error.to_string().contains("time ran out"), "{error}");
}

/// One listener serves peer after peer, on a link name and on a TCP port,
/// each accepted link saying its path; a second listener on the same name
/// is refused.
#[test]
fn a_listener_accepts_many_peers_on_a_name_and_on_a_tcp_port() {
    use barlink::Listener;
    use barlink::transport::auth::{PeerAuth, SecretKey};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = ConnectOptions {
        auth: Some(PeerAuth::PreSharedKey {
            key: SecretKey::from_hex(&"3c".repeat(32)).unwrap(),
            source: "the test".to_string(),
        }),
        ..ConnectOptions::default()
    };
    let mut peers = vec![Peer::Local {
        name: format!("listener-test-{}", std::process::id()),
    }];
    if barlink::rdma::device::devices().is_ok_and(|d| !d.is_empty()) {
        skipped(
            "a_listener_accepts_many_peers_on_a_name_and_on_a_tcp_port (its TCP part)",
            "this host has RDMA",
        );
    } else {
        peers.push(Peer::Tcp {
            addr: format!("127.0.0.1:{port}"),
        });
    }
    for peer in peers {
        let listener = Listener::bind(&peer, &options).unwrap();
        if let Peer::Local { .. } = peer {
            let again = Listener::bind(&peer, &options).unwrap_err();
            assert!(again.to_string().contains("in use"), "{again}");
        }
        let clients: Vec<_> = (0..3u8)
            .map(|index| {
                let (peer, options) = (peer.clone(), options.clone());
                thread::spawn(move || {
                    let mut link = connect::<Vec<u8>>(&peer, Role::Connect, &options).unwrap();
                    link.send(vec![index; 1000], TIMEOUT).unwrap();
                    assert_eq!(link.recv(TIMEOUT).unwrap(), vec![index + 100; 10]);
                    link.close(TIMEOUT).unwrap();
                    link.decision.path
                })
            })
            .collect();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let mut link = listener.accept::<Vec<u8>>().unwrap();
            assert_eq!(link.decision.path, listener.decision().path);
            let got = link.recv(TIMEOUT).unwrap();
            assert_eq!(got.len(), 1000);
            seen.push(got[0]);
            link.send(vec![got[0] + 100; 10], TIMEOUT).unwrap();
            link.flush(TIMEOUT).unwrap();
        }
        for client in clients {
            assert_eq!(client.join().unwrap(), listener.decision().path);
        }
        seen.sort();
        assert_eq!(seen, [0, 1, 2], "{peer:?}");
    }
}

#[path = "support/bar_fixture.rs"]
mod bar_fixture;

/// Two threads name the two BAR windows of a fixture tree (ordinary files
/// as `resource2`) in text, as the C config and Python do: the facade
/// picks BAR P2P, says why, and messages cross intact.
#[test]
fn bar_windows_named_in_text_carry_a_link_between_two_threads() {
    let fixture = bar_fixture::BarFixture::new("connect");
    let len = 8 << 20;
    let options = |own: usize| ConnectOptions {
        bars: barlink::BarEnds::from_texts(
            Some(&fixture.window(own, 0, len)),
            Some(&fixture.window(1 - own, 0, len)),
        )
        .unwrap(),
        sysfs_root: fixture.root.clone(),
        setup_timeout: TIMEOUT,
        ..ConnectOptions::default()
    };
    let decision = choose_path(&local(), &options(0)).unwrap();
    assert_eq!(decision.path, PathKind::BarP2p, "{decision}");
    assert!(decision.reason.contains("not GPUs"), "{decision}");
    let accept_options = options(1);
    let accepting = thread::spawn(move || {
        let mut connection = connect(&local(), Role::Accept, &accept_options).unwrap();
        for index in 0..200u32 {
            let got = connection.recv(TIMEOUT).unwrap();
            assert_eq!(got, vec![index as u8; index as usize * 997]);
        }
        connection.send(b"done".to_vec(), TIMEOUT).unwrap();
        connection.flush(TIMEOUT).unwrap();
        connection.decision
    });
    let mut connection = connect(&local(), Role::Connect, &options(0)).unwrap();
    // A second link claiming the live link's receive window is refused at
    // once, and the live link's ring is left alone.
    let refused = connect::<Vec<u8>>(&local(), Role::Connect, &options(0)).unwrap_err();
    let text = refused.to_string();
    assert!(
        text.contains("in use as another link's receive ring"),
        "{text}"
    );
    for index in 0..200u32 {
        connection
            .send(vec![index as u8; index as usize * 997], TIMEOUT)
            .unwrap();
    }
    assert_eq!(connection.recv(TIMEOUT).unwrap(), b"done");
    assert_eq!(accepting.join().unwrap().path, PathKind::BarP2p);
    assert!(matches!(
        connection.link,
        barlink::connect::AnyLink::BarP2p(_)
    ));
    assert_eq!(connection.stats().crc_failures, 0);
}
