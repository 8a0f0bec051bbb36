use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use super::*;

fn hello() -> Hello {
    Hello {
        epoch: 3,
        qpn: 0x11,
        psn: 0xABCDE,
        lid: 0,
        gid_index: 1,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15],
        path_mtu: 1024,
        ring_addr: 0x7f00_0000_0000,
        ring_rkey: 0x1234,
        ring: RingShape::for_mtu(64, 8192).unwrap(),
        credit_addr: 0x7f00_0000_0000,
        credit_rkey: 0x1234,
        engine_mtu: 8192,
        max_message_len: 1 << 30,
        crc: true,
    }
}

fn options() -> OobOptions {
    OobOptions {
        connect_timeout: Duration::from_millis(500),
        connect_retries: 2,
        retry_interval: Duration::from_millis(50),
        io_timeout: Duration::from_millis(500),
        auth_timeout: Duration::from_millis(500),
        auth: Some(PeerAuth::Insecure),
        deadline: None,
    }
}

fn psk(byte: u8) -> PeerAuth {
    let hex = format!("{byte:02x}").repeat(32);
    PeerAuth::PreSharedKey {
        key: barlink_transport::auth::SecretKey::from_hex(&hex).unwrap(),
        source: "test".to_string(),
    }
}

/// A listener on 127.0.0.1 and a client connected to it, neither
/// authenticated yet.
fn connected_raw() -> (OobStream, OobStream) {
    let listener = OobListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || connect(addr, &options()).unwrap());
    let server = listener.accept(Duration::from_secs(5), &options()).unwrap();
    (server, client.join().unwrap())
}

/// Connected and through authentication (without keys, as the hello
/// tests need raw access to what follows).
fn connected() -> (OobStream, OobStream) {
    let (mut server, mut client) = connected_raw();
    let client = std::thread::spawn(move || {
        client.authenticate(&PeerAuth::Insecure, true).unwrap();
        client
    });
    server.authenticate(&PeerAuth::Insecure, false).unwrap();
    (server, client.join().unwrap())
}

#[test]
fn hello_round_trips() {
    let ours = hello();
    assert_eq!(Hello::decode(&ours.encode()).unwrap(), ours);
}

#[test]
fn exchange_and_ready_over_tcp() {
    let (mut server, mut client) = connected();
    let mut theirs = hello();
    theirs.qpn = 0x22;
    theirs.epoch = 9;
    let peer = std::thread::spawn(move || {
        let got = client.exchange(&theirs).unwrap();
        client.ready().unwrap();
        got
    });
    let got = server.exchange(&hello()).unwrap();
    server.ready().unwrap();
    assert_eq!(got.qpn, 0x22);
    assert_eq!(got.epoch, 9);
    assert_eq!(peer.join().unwrap(), hello());
}

/// Sends `bytes` as the client's hello; returns the server's verdict.
fn server_reads(bytes: Vec<u8>) -> OobError {
    let (mut server, mut client) = connected();
    let writer = std::thread::spawn(move || {
        let _ = client.send_frame(&bytes);
        // Keep the connection open until the server has judged.
        let mut sink = [0u8; HELLO_LEN];
        let _ = client.read_exact(&mut sink, "test");
        client
    });
    let error = server.exchange(&hello()).unwrap_err();
    drop(server);
    let _ = writer.join();
    error
}

fn with(edit: impl FnOnce(&mut Hello)) -> Vec<u8> {
    let mut hello = hello();
    edit(&mut hello);
    hello.encode().to_vec()
}

/// Re-checksums bytes edited after encoding.
fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32c(&bytes[..92]);
    bytes[92..96].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn bad_hellos_are_typed_errors() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            resealed({
                let mut b = hello().encode().to_vec();
                b[0] = b'X';
                b
            }),
            "not a barlink hello",
        ),
        (
            resealed({
                let mut b = hello().encode().to_vec();
                b[4] = 1;
                b
            }),
            "hello version 1, this build 4",
        ),
        (
            {
                let mut b = hello().encode().to_vec();
                b[50] ^= 4;
                b
            },
            "checksum",
        ),
        (with(|h| h.ring.slots = 0), "ring slots is 0"),
        (with(|h| h.ring.slots = 1 << 20), "ring slots is 1048576"),
        (
            with(|h| h.ring.slot_size = 4096),
            "slots hold 4096 bytes, less than its MTU of 8192",
        ),
        (with(|h| h.ring.slot_size = 8200), "slot size is 8200"),
        (with(|h| h.qpn = 0x0100_0000), "qpn is 16777216"),
        (with(|h| h.epoch = 0), "epoch is 0"),
        (with(|h| h.path_mtu = 1500), "path MTU is 1500"),
        (
            with(|h| h.ring_addr = u64::MAX - 100),
            "wrap around the address space",
        ),
        (
            with(|h| {
                h.engine_mtu = 4096;
            }),
            "engine MTU differs: 8192 here, 4096 at the peer",
        ),
        (with(|h| h.crc = false), "CRC differs"),
        (
            with(|h| h.ring.slot_size = 1 << 20),
            "ring slot size differs: 8192 here, 1048576 at the peer",
        ),
        (
            resealed({
                let mut b = hello().encode().to_vec();
                b[88] = 1;
                b
            }),
            "reserved",
        ),
    ];
    for (bytes, expected) in cases {
        let error = server_reads(bytes);
        assert!(
            matches!(error, OobError::BadHello(_)),
            "{expected}: {error:?}"
        );
        let text = error.to_string();
        assert!(text.contains(expected), "{expected:?} not in {text:?}");
    }
}

#[test]
fn short_hello_then_close_is_peer_closed() {
    let error = {
        let (mut server, mut client) = connected();
        client
            .write_all(&(HELLO_LEN as u16).to_le_bytes(), "test")
            .unwrap();
        client.write_all(&hello().encode()[..40], "test").unwrap();
        drop(client);
        server.exchange(&hello()).unwrap_err()
    };
    assert!(
        matches!(error, OobError::Channel(ChannelError::PeerClosed { .. })),
        "{error:?}"
    );
}

#[test]
fn silent_peer_times_out_within_the_io_timeout() {
    let (mut server, _client) = connected();
    let started = Instant::now();
    let error = server.exchange(&hello()).unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(error, OobError::Channel(ChannelError::Timeout { .. })),
        "{error:?}"
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // A trickle of bytes does not extend the deadline.
    let (mut server, mut client) = connected();
    let trickle = std::thread::spawn(move || {
        let mut framed = (HELLO_LEN as u16).to_le_bytes().to_vec();
        framed.extend_from_slice(&hello().encode());
        for byte in framed.iter().take(50) {
            if client.write_all(&[*byte], "test").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = Instant::now();
    let error = server.exchange(&hello()).unwrap_err();
    assert!(
        matches!(error, OobError::Channel(ChannelError::Timeout { .. })),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(900));
    trickle.join().unwrap();
}

#[test]
fn nobody_listening_is_refused_within_the_configured_time() {
    let port = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let error = connect(("127.0.0.1", port), &options()).unwrap_err();
    let took = started.elapsed();
    match &error {
        OobError::Channel(ChannelError::Refused { attempts, .. }) => assert_eq!(*attempts, 3),
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("is the server side started"));
    // Two pauses of 50 ms between three attempts.
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn accept_with_nobody_coming_times_out() {
    let listener = OobListener::bind("127.0.0.1:0").unwrap();
    let started = Instant::now();
    let error = listener
        .accept(Duration::from_millis(200), &options())
        .unwrap_err();
    assert!(
        matches!(error, OobError::Channel(ChannelError::Timeout { .. })),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn wrong_ready_byte_is_a_protocol_error() {
    let (mut server, mut client) = connected();
    client.send_frame(b"X").unwrap();
    let error = server.ready().unwrap_err();
    assert!(
        matches!(error, OobError::Channel(ChannelError::Protocol { .. })),
        "{error:?}"
    );
}

#[test]
fn a_hello_before_authentication_is_refused() {
    let (mut server, _client) = connected_raw();
    let error = server.exchange(&hello()).unwrap_err();
    assert!(
        error.to_string().contains("must be authenticated"),
        "{error}"
    );
}

#[test]
fn the_hello_travels_sealed_after_a_pre_shared_key() {
    let (mut server, mut client) = connected_raw();
    let peer = std::thread::spawn(move || {
        client.authenticate(&psk(4), true).unwrap();
        assert!(client.is_authenticated());
        let got = client.exchange(&hello()).unwrap();
        client.ready().unwrap();
        got
    });
    server.authenticate(&psk(4), false).unwrap();
    assert_eq!(server.exchange(&hello()).unwrap(), hello());
    server.ready().unwrap();
    assert_eq!(peer.join().unwrap(), hello());
}

/// A client with `auth` tries a server that requires `psk(1)`, then a
/// client with the right key comes: the first is refused and gets
/// nothing, the second gets its hello.
fn refused_then_served(auth: PeerAuth) -> OobError {
    let listener = OobListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let clients = std::thread::spawn(move || {
        let mut wrong = connect(addr, &options()).unwrap();
        let refused = wrong.authenticate(&auth, true).unwrap_err();
        // Whatever the wrong client reads now is all it gets: nothing.
        let mut rest = [0u8; 1];
        let after = wrong.read_exact(&mut rest, "test");
        assert!(after.is_err(), "the refused client received {rest:?}");
        let mut right = connect(addr, &options()).unwrap();
        right.authenticate(&psk(1), true).unwrap();
        assert_eq!(right.exchange(&hello()).unwrap(), hello());
        refused
    });
    let mut server = listener
        .accept_authenticated(Duration::from_secs(10), &options(), &psk(1))
        .unwrap();
    assert_eq!(server.exchange(&hello()).unwrap(), hello());
    clients.join().unwrap()
}

#[test]
fn a_wrong_key_gets_nothing_and_the_server_keeps_listening() {
    let refused = refused_then_served(psk(2));
    assert!(
        matches!(
            refused,
            OobError::Channel(ChannelError::Auth(AuthError::RefusedByPeer { .. }))
        ),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("pre-shared keys differ"),
        "{refused}"
    );
    let mismatch = refused_then_served(PeerAuth::Insecure);
    assert!(
        mismatch
            .to_string()
            .contains("no authentication (--insecure)"),
        "{mismatch}"
    );
}

#[test]
fn a_server_whose_clients_all_fail_says_why() {
    let listener = OobListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut wrong = connect(addr, &options()).unwrap();
        let _ = wrong.authenticate(&psk(2), true);
    });
    let error = listener
        .accept_authenticated(Duration::from_millis(800), &options(), &psk(1))
        .unwrap_err();
    client.join().unwrap();
    let text = error.to_string();
    assert!(
        text.contains("was refused") && text.contains("another pre-shared key"),
        "{text}"
    );
}

#[test]
fn silent_clients_hold_back_no_one() {
    // Each silent client alone would hold a server that authenticates one
    // client at a time for its 500 ms authentication limit: twenty, 10 s.
    let listener = OobListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let clients = std::thread::spawn(move || {
        let _silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let mut right = connect(addr, &options()).unwrap();
        right.authenticate(&psk(1), true).unwrap();
        right.exchange(&hello()).unwrap();
    });
    let started = Instant::now();
    let mut server = listener
        .accept_authenticated(Duration::from_secs(10), &options(), &psk(1))
        .unwrap();
    server.exchange(&hello()).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    clients.join().unwrap();
}
