use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::auth::SecretKey;
use crate::link::IoError;
use crate::rng::SplitMix64;

const TIMEOUT: Duration = Duration::from_secs(20);

fn psk(byte: u8) -> PeerAuth {
    PeerAuth::PreSharedKey {
        key: SecretKey::from_hex(&format!("{byte:02x}").repeat(32)).unwrap(),
        source: "test".to_string(),
    }
}

fn options(auth: PeerAuth, encrypt: bool) -> TcpLinkOptions {
    TcpLinkOptions {
        channel: ChannelOptions {
            connect_timeout: Duration::from_secs(2),
            connect_retries: 20,
            retry_interval: Duration::from_millis(50),
            io_timeout: Duration::from_secs(5),
            auth_timeout: Duration::from_secs(5),
            auth: Some(auth),
            deadline: None,
        },
        engine: EngineConfig {
            mtu: 64 << 10,
            max_message_len: 1 << 22,
            peer_timeout: Duration::from_secs(3),
            ..EngineConfig::default()
        },
        encrypt,
        epoch: 1,
        reconnect: true,
        socket_buffer: None,
    }
}

fn message(seed: u64, index: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = match index % 4 {
        0 => 1 + (rng.next_u64() % 64) as usize,
        1 => 1 + (rng.next_u64() % 4096) as usize,
        2 => 60_000 + (rng.next_u64() % 10_000) as usize,
        _ => 200_000 + (rng.next_u64() % 300_000) as usize,
    };
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

/// Sends `count` messages of `send_seed` and receives `count` of
/// `recv_seed`, checking each; returns how many arrived intact before an
/// error, and the error.
fn exchange(
    link: &mut TcpLink,
    send_seed: u64,
    recv_seed: u64,
    count: u64,
) -> (u64, Option<IoError>) {
    let mut sent = 0;
    let mut received = 0;
    let deadline = Instant::now() + TIMEOUT;
    while received < count && Instant::now() < deadline {
        if sent < count {
            match link.send_blocking(message(send_seed, sent), Duration::from_millis(1)) {
                Ok(_) => sent += 1,
                Err(IoError::Timeout { .. }) => {}
                Err(error) => return (received, Some(error)),
            }
        }
        match link.recv(Duration::from_millis(1)) {
            Ok(data) => {
                assert_eq!(data, message(recv_seed, received), "message {received}");
                received += 1;
            }
            Err(IoError::Timeout { .. }) => {}
            Err(error) => return (received, Some(error)),
        }
    }
    if received < count {
        return (received, Some(IoError::Timeout { after: TIMEOUT }));
    }
    (received, link.flush(TIMEOUT).err())
}

/// A server thread and a client on loopback (through `via` if given).
fn pair(
    client: TcpLinkOptions,
    server: TcpLinkOptions,
    via: Option<fn(SocketAddr) -> SocketAddr>,
) -> (
    Result<TcpLink, TcpSetupError>,
    thread::JoinHandle<Result<TcpLink, TcpSetupError>>,
) {
    let listener = TcpServer::bind("127.0.0.1:0").unwrap();
    let mut addr = listener.local_addr().unwrap();
    if let Some(relay) = via {
        addr = relay(addr);
    }
    let accepting = thread::spawn(move || listener.accept(TIMEOUT, &server));
    (connect(addr, &client), accepting)
}

fn both_ways(encrypt: bool) {
    let (client, server) = pair(options(psk(1), encrypt), options(psk(1), encrypt), None);
    let mut client = client.unwrap();
    let server = thread::spawn(move || {
        let mut link = server.join().unwrap().unwrap();
        let outcome = exchange(&mut link, 2, 1, 400);
        (outcome, link.medium().stats())
    });
    let (received, error) = exchange(&mut client, 1, 2, 400);
    assert_eq!((received, error), (400, None));
    let ((received, error), stats) = server.join().unwrap();
    assert_eq!((received, error), (400, None));
    // On one clean connection: a record or frame the peer could not take
    // would have dropped it (and the engine's resends hidden that).
    for stats in [stats, client.medium().stats()] {
        assert_eq!(
            (stats.connections_lost, stats.reconnects),
            (0, 0),
            "{stats:?}"
        );
    }
    assert_eq!(client.medium().is_encrypted(), encrypt);
    assert_eq!(stats.records_opened > 0, encrypt, "{stats:?}");
    // Asked for 64 KiB packets; sealed, one frame fills a record.
    let mtu = client.engine().config().mtu;
    assert_eq!(mtu, if encrypt { MAX_SEALED_PACKET } else { 64 << 10 });
}

#[test]
fn plain_links_move_mixed_messages_both_ways() {
    both_ways(false);
}

#[test]
fn encrypted_links_move_mixed_messages_both_ways() {
    both_ways(true);
}

#[test]
fn encryption_on_one_side_only_is_refused_on_both() {
    let (client, server) = pair(options(psk(1), true), options(psk(1), false), None);
    let client = client.unwrap_err().to_string();
    let server = server.join().unwrap().unwrap_err().to_string();
    assert!(
        client.contains("this side encrypts and the peer does not"),
        "{client}"
    );
    assert!(
        server.contains("the peer encrypts and this side does not"),
        "{server}"
    );
}

#[test]
fn encryption_without_a_key_is_refused() {
    let error = connect::<Vec<u8>>("127.0.0.1:9", &options(PeerAuth::Insecure, true)).unwrap_err();
    assert!(
        error.to_string().contains("needs authentication"),
        "{error}"
    );
}

#[test]
fn a_wrong_key_links_nothing() {
    let listener = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        listener.accept::<Vec<u8>>(Duration::from_secs(1), &options(psk(1), false))
    });
    let client = connect::<Vec<u8>>(addr, &options(psk(2), false));
    let error = client.unwrap_err().to_string();
    assert!(error.contains("pre-shared keys differ"), "{error}");
    let error = server.join().unwrap().unwrap_err().to_string();
    assert!(error.contains("was refused"), "{error}");
}

/// What the relay does to the client's bytes on their way to the server,
/// on the first connection only.
#[derive(Clone, Copy)]
enum Fault {
    /// Flip one bit of the byte at this offset.
    Flip(u64),
    /// Close both connections once this many bytes went through.
    Cut(u64),
    /// Cut, and accept no further connection.
    CutForGood(u64),
    /// Cut, then keep listening without ever answering: a new connection
    /// is made (the kernel completes it) and then nobody speaks.
    CutThenSilent(u64),
}

/// A relay on loopback in front of `server`, applying `fault` to the
/// client's direction of the first connection; later ones pass clean.
fn relay(server: SocketAddr, fault: Fault) -> SocketAddr {
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = front.local_addr().unwrap();
    thread::spawn(move || {
        for index in 0.. {
            let Ok((client, _)) = front.accept() else {
                return;
            };
            let Ok(upstream) = TcpStream::connect(server) else {
                return;
            };
            let fault = (index == 0).then_some(fault);
            let stop = Arc::new(AtomicBool::new(false));
            pump(
                client.try_clone().unwrap(),
                upstream.try_clone().unwrap(),
                fault,
                stop.clone(),
            );
            pump(upstream, client, None, stop);
            if index == 0 && matches!(fault, Some(Fault::CutForGood(_))) {
                return;
            }
            if index == 0 && matches!(fault, Some(Fault::CutThenSilent(_))) {
                // Holds the listening socket, accepting nothing.
                thread::sleep(Duration::from_secs(30));
                return;
            }
        }
    });
    addr
}

fn pump(mut from: TcpStream, mut to: TcpStream, fault: Option<Fault>, stop: Arc<AtomicBool>) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut offset = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &mut buf[..n];
            match fault {
                Some(Fault::Flip(at)) if (offset..offset + n as u64).contains(&at) => {
                    chunk[(at - offset) as usize] ^= 0x10;
                }
                Some(Fault::Cut(at) | Fault::CutForGood(at) | Fault::CutThenSilent(at))
                    if offset + n as u64 >= at =>
                {
                    stop.store(true, Ordering::Relaxed);
                    let _ = from.shutdown(Shutdown::Both);
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
                _ => {}
            }
            offset += n as u64;
            if to.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// What a run through a relay came to.
struct Outcome {
    /// Messages the server received, each checked intact and in order.
    received: u64,
    error: Option<IoError>,
    crc_failures: u64,
    /// Connections the two sides replaced.
    reconnects: (u64, u64),
    /// The server's socket buffers at the end, as the kernel reports them.
    server_buffers: (usize, usize),
}

/// Runs 200 messages client -> server through a relay with `fault`.
fn through_relay(encrypt: bool, reconnect: bool, fault: fn(SocketAddr) -> SocketAddr) -> Outcome {
    through_relay_with(None, encrypt, reconnect, fault)
}

/// [`through_relay`] with socket buffers of `socket_buffer` bytes.
fn through_relay_with(
    socket_buffer: Option<usize>,
    encrypt: bool,
    reconnect: bool,
    fault: fn(SocketAddr) -> SocketAddr,
) -> Outcome {
    let options = TcpLinkOptions {
        reconnect,
        socket_buffer,
        ..options(psk(1), encrypt)
    };
    let (client, server) = pair(options.clone(), options, Some(fault));
    let mut client = client.unwrap();
    let sender = thread::spawn(move || {
        for index in 0..200 {
            if client.send_blocking(message(5, index), TIMEOUT).is_err() {
                break;
            }
        }
        let _ = client.flush(Duration::from_secs(5));
        client.medium().stats().reconnects
    });
    let mut link = server.join().unwrap().unwrap();
    let mut received = 0;
    let mut error = None;
    while received < 200 {
        match link.recv(TIMEOUT) {
            Ok(data) => {
                assert_eq!(data, message(5, received), "message {received} is wrong");
                received += 1;
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    if error.is_none() {
        // Nothing more, and nothing twice.
        let extra = link.recv(Duration::from_millis(200));
        assert!(extra.is_err(), "a message after the last: {extra:?}");
    }
    let _ = link.flush(Duration::from_secs(5));
    let client_reconnects = sender.join().unwrap();
    Outcome {
        received,
        error,
        crc_failures: link.engine().stats().crc_failures,
        reconnects: (client_reconnects, link.medium().stats().reconnects),
        server_buffers: link.medium().buffer_sizes().unwrap_or_default(),
    }
}

/// Bytes the client sends before its first frame: preamble, the first
/// handshake message (an ephemeral key and a tag), the confirmation (a
/// tag) and the sealed hello, each frame after a 2-byte length.
const CLIENT_SETUP_BYTES: u64 = (crate::auth::PREAMBLE_LEN
    + 2
    + 32
    + crate::auth::SEAL_OVERHEAD
    + 2
    + crate::auth::SEAL_OVERHEAD
    + 2
    + HELLO_LEN
    + crate::auth::SEAL_OVERHEAD) as u64;

#[test]
fn a_flipped_payload_byte_is_caught_and_resent() {
    // Well past setup, inside a packet's payload (frames of 64 KiB).
    let outcome = through_relay(false, false, |s| relay(s, Fault::Flip(3_000_000)));
    assert_eq!((outcome.received, &outcome.error), (200, &None));
    assert!(
        outcome.crc_failures >= 1,
        "the flipped packet failed its CRC"
    );
}

#[test]
fn without_reconnect_a_broken_stream_ends_the_link_with_nothing_wrong_delivered() {
    for (encrypt, fault) in [
        // The length of the first frame after setup: its check fails.
        (
            false,
            (|s| relay(s, Fault::Flip(CLIENT_SETUP_BYTES + 1))) as fn(SocketAddr) -> SocketAddr,
        ),
        // A sealed record: it does not open.
        (true, |s| relay(s, Fault::Flip(3_000_000))),
        (false, |s| relay(s, Fault::Cut(2_000_000))),
    ] {
        let started = Instant::now();
        let outcome = through_relay(encrypt, false, fault);
        let error = outcome.error.expect("the link ended").to_string();
        assert!(outcome.received < 200);
        assert!(
            [
                "frame header fails its check",
                "does not open",
                "closed",
                "TCP connection"
            ]
            .iter()
            .any(|want| error.contains(want)),
            "{error}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_broken_connection_is_replaced_and_nothing_is_lost_or_repeated() {
    for (encrypt, fault) in [
        (
            false,
            (|s| relay(s, Fault::Cut(2_000_000))) as fn(SocketAddr) -> SocketAddr,
        ),
        (false, |s| relay(s, Fault::Flip(CLIENT_SETUP_BYTES + 1))),
        (true, |s| relay(s, Fault::Flip(3_000_000))),
    ] {
        let outcome = through_relay(encrypt, true, fault);
        assert_eq!((outcome.received, &outcome.error), (200, &None));
        assert!(
            outcome.reconnects.0 >= 1 && outcome.reconnects.1 >= 1,
            "{:?}",
            outcome.reconnects
        );
    }
}

#[test]
fn socket_buffers_asked_for_hold_on_every_connection() {
    // A cut connection, so the server's last one replaced its first.
    // Below the usual net.core.wmem_max/rmem_max (208 KiB), so an
    // unprivileged process gets it too.
    let asked = 128 << 10;
    let outcome = through_relay_with(Some(asked), false, true, |s| {
        relay(s, Fault::Cut(2_000_000))
    });
    assert_eq!((outcome.received, &outcome.error), (200, &None));
    assert!(outcome.reconnects.1 >= 1, "{:?}", outcome.reconnects);
    // Twice what was asked (the kernel's bookkeeping), not autotuned.
    assert_eq!(outcome.server_buffers, (2 * asked, 2 * asked));
    let refused = TcpLinkOptions {
        socket_buffer: Some(1000),
        ..options(psk(1), false)
    };
    let error = connect::<Vec<u8>>("127.0.0.1:9", &refused)
        .unwrap_err()
        .to_string();
    assert!(error.contains("64K to 1G"), "{error}");
}

#[test]
fn a_peer_that_does_not_come_back_ends_the_link_within_the_peer_timeout() {
    let started = Instant::now();
    let outcome = through_relay(false, true, |s| relay(s, Fault::CutForGood(2_000_000)));
    let error = outcome.error.expect("the link ended");
    assert!(outcome.received < 200);
    assert!(
        matches!(error, IoError::Closed(crate::LinkError::PeerLost { .. })),
        "{error}"
    );
    // The peer timeout is 3 s; setup and the messages before the cut add
    // a little.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn rounds_go_on_while_an_attempt_to_take_the_peer_back_waits() {
    // After the cut, each attempt to dial the peer again connects and then
    // hears nothing until its own 500 ms run out. The link's rounds must
    // not wait for it: a caller polling with no timeout gets its answer
    // at once, and the link still ends within the peer timeout.
    let (client, server) = pair(
        options(psk(1), false),
        options(psk(1), false),
        Some(|s| relay(s, Fault::CutThenSilent(2_000_000))),
    );
    let mut client = client.unwrap();
    let receiver = thread::spawn(move || {
        let mut link = server.join().unwrap().unwrap();
        while link.recv(TIMEOUT).is_ok() {}
    });
    let deadline = Instant::now() + TIMEOUT;
    let mut index = 0;
    while client.medium().stats().connections_lost == 0 && Instant::now() < deadline {
        if client
            .send_blocking(message(5, index), Duration::from_millis(10))
            .is_ok()
        {
            index += 1;
        }
    }
    let cut = Instant::now();
    assert_eq!(client.medium().stats().connections_lost, 1);
    let mut longest = Duration::ZERO;
    let ended = loop {
        let round = Instant::now();
        let result = client.try_recv();
        longest = longest.max(round.elapsed());
        if let Err(error) = result {
            break error;
        }
        assert!(cut.elapsed() < TIMEOUT, "the link never ended");
    };
    assert!(
        matches!(ended, IoError::Closed(crate::LinkError::PeerLost { .. })),
        "{ended}"
    );
    let stats = client.medium().stats();
    assert!(stats.rejoin_attempts >= 2, "{stats:?}");
    assert_eq!(stats.reconnects, 0, "{stats:?}");
    // Each attempt waits 500 ms; a round has no reason to take a
    // fraction of that (the margin is for a busy two-core machine).
    assert!(
        longest < Duration::from_millis(250),
        "a round took {longest:?} while the attempt waited"
    );
    // The peer timeout is 3 s, counted from the last packet heard.
    assert!(
        cut.elapsed() < Duration::from_secs(5),
        "{:?}",
        cut.elapsed()
    );
    receiver.join().unwrap();
}

/// A TCP connect to `addr` completes (the kernel accepts for the
/// listener) and then nobody says a word.
fn silent_listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

#[test]
fn a_silent_server_ends_the_setup_at_its_deadline() {
    let (_listener, addr) = silent_listener();
    let mut options = options(psk(1), false);
    // Authentication alone may take 5 s, the hello 5 more.
    options.channel = options.channel.ending_within(Duration::from_millis(300));
    let started = Instant::now();
    let error = connect::<Vec<u8>>(addr, &options).expect_err("nobody answers");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?}: a step ran past the setup's deadline ({error})"
    );
    assert!(error.to_string().contains("time ran out"), "{error}");
}

#[test]
fn a_deadline_that_passes_while_retrying_ends_the_connect() {
    // Nobody listens: every attempt is refused at once, and the retries
    // (20, 50 ms apart) alone would take a second.
    let (listener, addr) = silent_listener();
    drop(listener);
    let channel = options(psk(1), false)
        .channel
        .ending_within(Duration::from_millis(200));
    let started = Instant::now();
    let error = channel::connect(addr, &channel).expect_err("nobody listens");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(700), "took {took:?} ({error})");
    assert!(matches!(error, ChannelError::OutOfTime { .. }), "{error}");
}

/// A client thread: links to `addr`, sends `message`, and waits for its
/// acknowledgement (drive the server's link with [`receive_one`]).
fn one_message_client(
    addr: SocketAddr,
    options: TcpLinkOptions,
    message: Vec<u8>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut link = connect::<Vec<u8>>(addr, &options)
            .unwrap_or_else(|error| panic!("a client's setup failed: {error}"));
        link.send_blocking(message, TIMEOUT).unwrap();
        link.flush(TIMEOUT).unwrap();
    })
}

/// The one message `client` sends on `link`; `link` is driven until the
/// client has its acknowledgement, and the client joined.
fn receive_one(link: &mut TcpLink, client: thread::JoinHandle<()>) -> Vec<u8> {
    let data = link.recv(TIMEOUT).unwrap();
    while !client.is_finished() {
        link.progress().unwrap();
    }
    client.join().unwrap();
    data
}

/// An accept with no time to wait (a poll) still sets up a client that
/// is already waiting: it is never taken off the queue only to be dropped
/// mid-handshake.
#[test]
fn an_accept_with_no_time_left_still_sets_up_a_waiting_client() {
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let client = one_message_client(addr, options(psk(1), false), b"polled".to_vec());
    let deadline = Instant::now() + TIMEOUT;
    let mut link = loop {
        match server.accept::<Vec<u8>>(Duration::ZERO, &options(psk(1), false)) {
            Ok(link) => break link,
            Err(TcpSetupError::Channel(ChannelError::Timeout { .. })) => {}
            Err(error) => panic!("a client taken off the queue was dropped: {error}"),
        }
        assert!(Instant::now() < deadline, "no client came");
        thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(receive_one(&mut link, client), b"polled");
}

#[test]
fn a_client_that_never_authenticates_holds_accept_no_longer_than_its_timeout() {
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let silent = TcpStream::connect(server.local_addr().unwrap()).unwrap();
    let started = Instant::now();
    let result = server.accept::<Vec<u8>>(Duration::from_millis(300), &options(psk(1), false));
    let took = started.elapsed();
    assert!(result.is_err(), "a client that said nothing was accepted");
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?}: its 5 s authentication limit outlived the accept's 300 ms"
    );
    drop(silent);
}

#[test]
fn clients_that_say_nothing_hold_back_no_one() {
    // Twenty silent connections, then a client with the key: it is
    // linked at once, not after each silent one's 5 s authentication
    // limit in turn.
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let started = Instant::now();
    let client = one_message_client(addr, options(psk(1), false), b"through".to_vec());
    let mut link = server
        .accept::<Vec<u8>>(TIMEOUT, &options(psk(1), false))
        .unwrap();
    let took = started.elapsed();
    assert_eq!(receive_one(&mut link, client), b"through");
    assert!(took < Duration::from_secs(2), "linked after {took:?}");
    drop(silent);
}

#[test]
fn a_burst_of_clients_is_linked_every_one() {
    // More clients at once than admissions may run: the rest wait in the
    // kernel's queue for a place, and none is cut off mid-handshake.
    const CLIENTS: usize = lobby::MAX_ADMITTING + 16;
    // Links accepted early wait, undriven, while the rest are accepted.
    let patient = || {
        let mut options = options(psk(1), false);
        options.engine.peer_timeout = TIMEOUT;
        options
    };
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| one_message_client(addr, patient(), vec![index as u8; 8]))
        .collect();
    let mut links: Vec<TcpLink> = (0..CLIENTS)
        .map(|_| server.accept(TIMEOUT, &patient()).unwrap())
        .collect();
    let mut seen = vec![false; CLIENTS];
    for link in &mut links {
        let data = link.recv(TIMEOUT).unwrap();
        seen[usize::from(data[0])] = true;
    }
    assert!(seen.iter().all(|&seen| seen), "{seen:?}");
    while !clients.iter().all(thread::JoinHandle::is_finished) {
        for link in &mut links {
            link.progress().unwrap();
        }
    }
    for client in clients {
        client.join().unwrap();
    }
}

/// Whether the server shut `silent`'s connection down (it reads the end
/// of the stream, or an error); what the server sent is read and ignored.
fn was_cut(silent: &TcpStream) -> bool {
    silent.set_nonblocking(true).unwrap();
    let mut bytes = [0u8; 256];
    let mut reader = silent;
    loop {
        match reader.read(&mut bytes) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn a_silent_admission_is_cut_off_only_to_make_room_for_a_waiting_client() {
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..lobby::MAX_ADMITTING)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Every place is taken, past the patience, and nobody else comes:
    // nobody is cut off for nothing.
    let nothing = server.accept::<Vec<u8>>(Duration::from_millis(1500), &options(psk(1), false));
    assert!(nothing.is_err());
    let cut = silent.iter().filter(|s| was_cut(s)).count();
    assert_eq!(cut, 0, "silent clients cut off with nobody waiting");
    // A client with the key comes: the longest-waiting silent one makes
    // room for it.
    let started = Instant::now();
    let client = one_message_client(addr, options(psk(1), false), b"room".to_vec());
    let mut link = server
        .accept::<Vec<u8>>(TIMEOUT, &options(psk(1), false))
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(receive_one(&mut link, client), b"room");
    let cut = silent.iter().filter(|s| was_cut(s)).count();
    assert!(cut >= 1, "no silent client made room");
}

#[test]
fn a_trickle_of_silent_clients_does_not_stretch_an_accept() {
    // A silent client every 50 ms for 2 s: an accept of 300 ms still ends
    // by its timeout plus the 250 ms a client it took may take.
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let trickle = thread::spawn(move || {
        (0..40)
            .map(|_| {
                thread::sleep(Duration::from_millis(50));
                TcpStream::connect(addr).unwrap()
            })
            .collect::<Vec<_>>()
    });
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let result = server.accept::<Vec<u8>>(Duration::from_millis(300), &options(psk(1), false));
    let took = started.elapsed();
    assert!(
        matches!(
            result,
            Err(TcpSetupError::Channel(ChannelError::Timeout { .. }))
        ),
        "{:?}",
        result.err()
    );
    assert!(took < Duration::from_millis(1200), "took {took:?}");
    drop(trickle.join().unwrap());
}

fn pinned(own: u8, peers: &[u8]) -> PeerAuth {
    PeerAuth::PinnedKeys {
        private: SecretKey::from_hex(&format!("{own:02x}").repeat(32)).unwrap(),
        peers: peers
            .iter()
            .map(|&peer| {
                SecretKey::from_hex(&format!("{peer:02x}").repeat(32))
                    .unwrap()
                    .public_key()
            })
            .collect(),
        source: "test".to_string(),
    }
}

/// With pinned keys, only the key that set a link up may take it back:
/// another listed peer that names the link is refused.
#[test]
fn only_the_key_that_set_a_link_up_may_take_it_back() {
    let listener = ChannelListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // What answers at the link's address now holds key 3, which this side
    // lists too; the link was set up with the holder of key 2.
    let answering = thread::spawn(move || {
        let auth = pinned(3, &[1]);
        let channel = options(auth.clone(), false).channel;
        let accepted = listener.accept_authenticated(TIMEOUT, &channel, &auth);
        thread::sleep(Duration::from_millis(300));
        accepted.map(|_| ())
    });
    let ours = options(pinned(1, &[2, 3]), false);
    let resume = Resume {
        rejoin: Rejoin::Redial { addr },
        options: ours.channel.clone(),
        auth: pinned(1, &[2, 3]),
        hello: TcpHello::of(&ours),
        peer_key: Some(SecretKey::from_hex(&"02".repeat(32)).unwrap().public_key()),
    };
    let refused = resume
        .attempt()
        .expect_err("the holder of key 3 took the link back");
    assert!(
        refused.contains("only the peer that set it up"),
        "{refused}"
    );
    answering.join().unwrap().unwrap();
}

/// A peer that holds the key and files connection after connection for
/// links nobody takes holds a bounded number of descriptors.
#[test]
fn connections_filed_for_others_are_bounded() {
    let acceptor = Acceptor::new(ChannelListener::bind("127.0.0.1:0").unwrap());
    let addr = acceptor.listener().local_addr().unwrap();
    let auth = psk(1);
    let link = options(auth.clone(), false);
    let flood = thread::spawn(move || {
        (0..80u64)
            .map(|id| {
                let mut channel = channel::connect(addr, &link.channel).unwrap();
                channel.authenticate(&auth, true).unwrap();
                let hello = TcpHello {
                    resume: true,
                    link_id: 0xF100D + id,
                    ..TcpHello::of(&link)
                };
                channel.send_sealed(&hello.encode(), "test hello").unwrap();
                channel
            })
            .collect::<Vec<_>>()
    });
    let deadline = Instant::now() + TIMEOUT;
    while !flood.is_finished() && Instant::now() < deadline {
        let channel = options(psk(1), false).channel;
        let nothing = acceptor
            .next(
                Want::Resume(7),
                Duration::from_millis(50),
                &channel,
                &psk(1),
            )
            .unwrap();
        assert!(nothing.is_none(), "no connection was for link 7");
    }
    let connections = flood.join().unwrap();
    // Those still queued on the socket are filed by one more look.
    let channel = options(psk(1), false).channel;
    let _ = acceptor.next(
        Want::Resume(7),
        Duration::from_millis(500),
        &channel,
        &psk(1),
    );
    assert_eq!(acceptor.filed_count(), acceptor::MAX_FILED);
    drop(connections);
}

#[test]
fn hellos_are_checked() {
    let ours = TcpHello::of(&options(PeerAuth::Insecure, false));
    assert_eq!(TcpHello::decode(&ours.encode()), Ok(ours));
    let mut bad = ours.encode();
    bad[0] = b'X';
    assert!(
        TcpHello::decode(&bad)
            .unwrap_err()
            .contains("not a barlink TCP hello")
    );
    let mut bad = ours.encode();
    bad[6] = 0x80;
    assert!(TcpHello::decode(&bad).unwrap_err().contains("reserved"));
    let mut bad = ours.encode();
    bad[8..12].copy_from_slice(&(u32::MAX).to_le_bytes());
    assert!(TcpHello::decode(&bad).unwrap_err().contains("MTU"));
    assert!(TcpHello::decode(&bad[..10]).is_err());
    let mut resumed = ours;
    resumed.resume = true;
    resumed.link_id = 0x1234;
    assert_eq!(TcpHello::decode(&resumed.encode()), Ok(resumed));
    let mut other = ours;
    other.engine_mtu = 4096;
    assert!(
        ours.check_agreement(&other)
            .unwrap_err()
            .contains("MTU differs")
    );
}

/// One port, several peers: while a link accepted on it takes its peer back
/// after a cut connection, new peers connect to the same port. Each
/// connection must reach its taker (the resuming link, or the server's
/// accept), so the resumed link loses nothing and every new peer is served.
#[test]
fn new_peers_and_a_resuming_link_share_one_port() {
    let options = options(psk(3), false);
    let server = TcpServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let through_relay = relay(addr, Fault::Cut(2_000_000));
    let resuming_client = {
        let options = options.clone();
        thread::spawn(move || {
            let mut client: TcpLink = connect(through_relay, &options).unwrap();
            for index in 0..200 {
                client.send_blocking(message(7, index), TIMEOUT).unwrap();
            }
            client.flush(TIMEOUT).unwrap();
            client.medium().stats().reconnects
        })
    };
    let mut resumed: TcpLink = server.accept(TIMEOUT, &options).unwrap();
    let receiver = thread::spawn(move || {
        for index in 0..200 {
            let data = resumed.recv(TIMEOUT).unwrap();
            assert_eq!(data, message(7, index), "message {index} is wrong");
        }
        let _ = resumed.flush(Duration::from_secs(5));
        resumed.medium().stats().reconnects
    });
    let new_clients: Vec<_> = (0..4u8)
        .map(|index| {
            let options = options.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(20 * u64::from(index)));
                let mut client: TcpLink = connect(addr, &options).unwrap();
                client.send_blocking(vec![index; 3000], TIMEOUT).unwrap();
                let echo = client.recv(TIMEOUT).unwrap();
                client.close(TIMEOUT).unwrap();
                echo == vec![index; 3000]
            })
        })
        .collect();
    for _ in 0..4 {
        let mut link: TcpLink = server.accept(TIMEOUT, &options).unwrap();
        let data = link.recv(TIMEOUT).unwrap();
        link.send_blocking(data, TIMEOUT).unwrap();
        link.flush(TIMEOUT).unwrap();
    }
    for client in new_clients {
        assert!(client.join().unwrap(), "a new peer got someone else's echo");
    }
    let server_reconnects = receiver.join().unwrap();
    let client_reconnects = resuming_client.join().unwrap();
    assert!(
        server_reconnects >= 1 && client_reconnects >= 1,
        "{server_reconnects} {client_reconnects}"
    );
}
