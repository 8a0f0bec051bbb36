//! Device buffers as a link's messages, against the stand-in CUDA driver
//! (`cuda/tests/mock/libcuda.c`, device memory in host memory): the staged
//! route's bookkeeping, bounds and errors. A real GPU runs the same route
//! in `barlink bench --gpu` and `barlink validate --gpu`
//! (`scripts/gpu-check.sh`).

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use barlink::cuda::mock::{self, MockKind};
use barlink::gpu::{
    Context, Cuda, DeviceLanding, DeviceRecvError, Staged, StagingPool, recv_into_device,
    send_from_device,
};
use barlink::{ConnectOptions, Connection, Peer, Role, connect};

const TIMEOUT: Duration = Duration::from_secs(20);

fn mock_cuda(test: &str) -> Option<Cuda> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-mock");
    let path = mock::build_or_skip(&dir, MockKind::OneDevice, test)?;
    Some(Cuda::load_from(&path).expect("the mock driver loads"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A peer that waits `delay`, then receives `sizes` into device memory at
/// `offset` (message i is `pattern(size, i)`), checks each, and answers
/// "done".
fn checking_receiver(
    peer: &Peer,
    context: &Context,
    sizes: Vec<usize>,
    delay: Duration,
    offset: usize,
) -> thread::JoinHandle<()> {
    let (peer, context) = (peer.clone(), context.clone());
    thread::spawn(move || {
        let mut link = connect::<Vec<u8>>(&peer, Role::Accept, &ConnectOptions::default()).unwrap();
        let landing = context
            .alloc(offset + sizes.iter().copied().max().unwrap_or(1))
            .unwrap();
        thread::sleep(delay);
        for (index, &size) in sizes.iter().enumerate() {
            assert_eq!(
                recv_into_device(&mut link, &landing, offset, TIMEOUT).unwrap(),
                size
            );
            let mut back = vec![0u8; size];
            landing.read(offset, &mut back).unwrap();
            assert!(
                back == pattern(size, index as u8),
                "message {index} changed"
            );
        }
        link.send(b"done".to_vec(), TIMEOUT).unwrap();
        link.flush(TIMEOUT).unwrap();
    })
}

/// A thread that connects to `peer` over host memory and runs `talk` on
/// the link (the side a test does not hold).
fn connecting_peer<T: Send + 'static>(
    peer: &Peer,
    talk: impl FnOnce(&mut Connection<Vec<u8>>) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let peer = peer.clone();
    thread::spawn(move || {
        let mut link =
            connect::<Vec<u8>>(&peer, Role::Connect, &ConnectOptions::default()).unwrap();
        talk(&mut link)
    })
}

#[test]
fn device_ranges_cross_a_link_intact_and_staging_is_reused() {
    let Some(cuda) = mock_cuda("device_ranges_cross_a_link_intact_and_staging_is_reused") else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    let sizes = [1usize, 4095, 4096, 65_536, 1 << 20, 3_000_001];
    let peer = Peer::Local {
        name: format!("gpu-test-{}", std::process::id()),
    };
    let receiver = checking_receiver(&peer, &context, sizes.to_vec(), Duration::ZERO, 7);
    let mut link = connect::<Staged>(&peer, Role::Connect, &ConnectOptions::default()).unwrap();
    let pool = StagingPool::new(context.clone(), 64 << 20);
    let source = context.alloc(4 << 20).unwrap();
    for (index, &size) in sizes.iter().enumerate() {
        source.write(100, &pattern(size, index as u8)).unwrap();
        // Staging copied the range: the next write to the source, before
        // the peer has the message, must not change what it receives.
        send_from_device(&mut link, &pool, &source, 100, size, TIMEOUT).unwrap();
    }
    link.flush(TIMEOUT).unwrap();
    assert_eq!(link.recv(TIMEOUT).unwrap(), b"done");
    receiver.join().unwrap();
    // Every staged buffer came back once the peer acknowledged it.
    assert!(pool.spare_bytes() >= 4 << 20, "{}", pool.spare_bytes());
    assert_eq!(link.stats().crc_failures, 0);
}

#[test]
fn a_message_too_large_for_the_device_buffer_is_handed_back() {
    let Some(cuda) = mock_cuda("a_message_too_large_for_the_device_buffer_is_handed_back") else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    let peer = Peer::Local {
        name: format!("gpu-test-large-{}", std::process::id()),
    };
    let sender = connecting_peer(&peer, |link| {
        link.send(pattern(10_000, 9), TIMEOUT).unwrap();
        link.send(b"x".to_vec(), TIMEOUT).unwrap();
        link.flush(TIMEOUT).unwrap();
        link.recv(TIMEOUT).unwrap()
    });
    let mut link = connect::<Vec<u8>>(&peer, Role::Accept, &ConnectOptions::default()).unwrap();
    let small = context.alloc(8192).unwrap();
    match recv_into_device(&mut link, &small, 0, TIMEOUT) {
        Err(DeviceRecvError::TooLarge { message, room }) => {
            assert_eq!(room, 8192);
            assert_eq!(message, pattern(10_000, 9));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // An offset past the end leaves no room, and says so.
    match recv_into_device(&mut link, &small, 9000, TIMEOUT) {
        Err(DeviceRecvError::TooLarge { message, room }) => {
            assert_eq!((message.as_slice(), room), (&b"x"[..], 0));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    link.send(b"ok".to_vec(), TIMEOUT).unwrap();
    link.flush(TIMEOUT).unwrap();
    assert_eq!(sender.join().unwrap(), b"ok");
}

#[test]
fn staging_pins_no_more_than_its_budget_while_the_peer_lags() {
    let Some(cuda) = mock_cuda("staging_pins_no_more_than_its_budget_while_the_peer_lags") else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    const MESSAGES: usize = 24;
    const SIZE: usize = 1 << 20;
    const BUDGET: usize = 4 << 20;
    let peer = Peer::Local {
        name: format!("gpu-test-budget-{}", std::process::id()),
    };
    // A peer busy elsewhere: every message the sender queues in the
    // meantime would pin a buffer of its own, unbounded.
    let receiver = checking_receiver(
        &peer,
        &context,
        vec![SIZE; MESSAGES],
        Duration::from_millis(300),
        0,
    );
    let mut link = connect::<Staged>(&peer, Role::Connect, &ConnectOptions::default()).unwrap();
    let pool = StagingPool::new(context.clone(), BUDGET);
    let source = context.alloc(SIZE).unwrap();
    let mut most = 0;
    for index in 0..MESSAGES {
        source.write(0, &pattern(SIZE, index as u8)).unwrap();
        send_from_device(&mut link, &pool, &source, 0, SIZE, TIMEOUT).unwrap();
        most = most.max(pool.staged_bytes() + pool.spare_bytes());
    }
    link.flush(TIMEOUT).unwrap();
    assert_eq!(link.recv(TIMEOUT).unwrap(), b"done");
    receiver.join().unwrap();
    assert!(
        most <= BUDGET,
        "{most} bytes pinned at once, budget {BUDGET}"
    );
    assert!(
        most >= 2 * SIZE,
        "only {most} bytes in flight: the budget was not used"
    );
    assert_eq!(pool.staged_bytes(), 0);
}

#[test]
fn messages_land_in_pinned_buffers_and_larger_ones_still_arrive() {
    let Some(cuda) = mock_cuda("messages_land_in_pinned_buffers_and_larger_ones_still_arrive")
    else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    const ROOM: usize = 1 << 20;
    // Twenty that fit the pinned buffers, one larger, one too large for
    // the device buffer (handed back), and one that fits again.
    let mut sizes: Vec<usize> = (0..20).map(|i| 1 + i * 52_021).collect();
    sizes.extend([ROOM + 1, 3 << 20, ROOM]);
    let peer = Peer::Local {
        name: format!("gpu-test-landing-{}", std::process::id()),
    };
    let sender = {
        let sizes = sizes.clone();
        connecting_peer(&peer, move |link| {
            for (index, &size) in sizes.iter().enumerate() {
                link.send(pattern(size, index as u8), TIMEOUT).unwrap();
            }
            link.flush(TIMEOUT).unwrap();
            link.recv(TIMEOUT).unwrap()
        })
    };
    let mut link = connect::<Vec<u8>>(&peer, Role::Accept, &ConnectOptions::default()).unwrap();
    let mut landing = DeviceLanding::new(context.clone(), ROOM, 2);
    let device = context.alloc(2 << 20).unwrap();
    for (index, &size) in sizes.iter().enumerate() {
        let want = pattern(size, index as u8);
        match landing.recv(&mut link, &device, 5, TIMEOUT) {
            Ok(len) => {
                assert_eq!(len, size, "message {index}");
                let mut back = vec![0u8; size];
                device.read(5, &mut back).unwrap();
                assert!(back == want, "message {index} of {size} bytes changed");
            }
            Err(DeviceRecvError::TooLarge { message, room }) => {
                assert_eq!((size, room), (3 << 20, (2 << 20) - 5));
                assert!(message == want, "the handed-back message changed");
            }
            Err(other) => panic!("message {index}: {other}"),
        }
    }
    let (landed, copied) = landing.counts();
    assert_eq!(landed + copied, sizes.len() as u64);
    // The larger ones never fit the pinned buffers; a message that began
    // before a buffer was posted (again) arrives in the link's instead.
    assert!(
        landed >= 1 && copied >= 2,
        "{landed} landed, {copied} copied"
    );
    link.send(b"ok".to_vec(), TIMEOUT).unwrap();
    link.flush(TIMEOUT).unwrap();
    assert_eq!(sender.join().unwrap(), b"ok");
}

#[test]
fn staging_keeps_its_budget_across_message_sizes() {
    let Some(cuda) = mock_cuda("staging_keeps_its_budget_across_message_sizes") else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    const BUDGET: usize = 4 << 20;
    // Rounds of sizes, each round acknowledged before the next: spares of
    // one round's size must make room for the next round's.
    let rounds: Vec<Vec<usize>> = vec![
        vec![1 << 20; 4],
        vec![2 << 20; 2],
        vec![4096; 20],
        vec![3_000_000],
        vec![1 << 20; 3],
    ];
    let sizes: Vec<usize> = rounds.iter().flatten().copied().collect();
    let peer = Peer::Local {
        name: format!("gpu-test-sizes-{}", std::process::id()),
    };
    let receiver = checking_receiver(&peer, &context, sizes, Duration::ZERO, 0);
    let mut link = connect::<Staged>(&peer, Role::Connect, &ConnectOptions::default()).unwrap();
    let pool = StagingPool::new(context.clone(), BUDGET);
    let source = context.alloc(4 << 20).unwrap();
    let mut index = 0;
    for round in &rounds {
        for &size in round {
            source.write(0, &pattern(size, index as u8)).unwrap();
            send_from_device(&mut link, &pool, &source, 0, size, TIMEOUT).unwrap();
            let pinned = pool.staged_bytes() + pool.spare_bytes();
            assert!(
                pinned <= BUDGET,
                "{pinned} bytes pinned after message {index} of {size}"
            );
            index += 1;
        }
        link.flush(TIMEOUT).unwrap();
    }
    assert_eq!(link.recv(TIMEOUT).unwrap(), b"done");
    receiver.join().unwrap();
}

#[test]
fn a_buffer_dropped_by_the_links_own_recv_is_posted_again() {
    let Some(cuda) = mock_cuda("a_buffer_dropped_by_the_links_own_recv_is_posted_again") else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    const MESSAGES: usize = 8;
    let peer = Peer::Local {
        name: format!("gpu-test-repost-{}", std::process::id()),
    };
    // In lockstep: each message goes once the last was answered, so every
    // one begins while the receiver's buffers are posted.
    let sender = connecting_peer(&peer, |link| {
        for index in 0..MESSAGES {
            link.send(pattern(1000 + index, index as u8), TIMEOUT)
                .unwrap();
            assert_eq!(link.recv(TIMEOUT).unwrap(), b"next");
        }
    });
    let mut link = connect::<Vec<u8>>(&peer, Role::Accept, &ConnectOptions::default()).unwrap();
    let mut landing = DeviceLanding::new(context.clone(), 64 << 10, 2);
    let device = context.alloc(64 << 10).unwrap();
    landing.post(&mut link).unwrap();
    for index in 0..MESSAGES {
        let want = pattern(1000 + index, index as u8);
        if index == 2 || index == 3 {
            // Taken past the landing: the buffer it landed in is dropped.
            assert!(
                link.recv(TIMEOUT).unwrap() == want,
                "message {index} changed"
            );
        } else {
            assert_eq!(
                landing.recv(&mut link, &device, 0, TIMEOUT).unwrap(),
                want.len()
            );
            let mut back = vec![0u8; want.len()];
            device.read(0, &mut back).unwrap();
            assert!(back == want, "message {index} changed");
        }
        landing.post(&mut link).unwrap();
        link.send(b"next".to_vec(), TIMEOUT).unwrap();
    }
    sender.join().unwrap();
    // Every message through the landing landed, those after the two
    // dropped buffers too.
    assert_eq!(landing.counts(), (MESSAGES as u64 - 2, 0));
}
