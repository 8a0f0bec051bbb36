//! Real ibverbs on soft-RoCE: tests that run inside the QEMU guest of
//! `tests/vm/run.sh`, where `rxe0` sits on `eth0` (10.0.2.15).
//!
//! Every test here is `#[ignore]`d and named `guest_*`; the harness runs
//! them in the guest as root with `--ignored --test-threads=1 guest_`. They
//! need `BARLINK_VM_RDMA_DEV` (set by `tests/vm/guest/init` only when
//! soft-RoCE came up, with `BARLINK_VM_RDMA_GID` and `BARLINK_VM_RDMA_IP`);
//! without it each prints `SKIPPED <name>: ...` and returns, which the
//! harness counts as skipped.
//!
//! Two RC QPs in one process are connected to each other over `rxe0`
//! (loopback through the same port), which exercises the whole verbs path:
//! registration, QP state machine with RoCE v2 global routing, RDMA WRITE
//! (with immediate, inline), SEND/RECV, completions and error completions.

use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::Duration;

use barlink_rdma::device::{self, GidType};
use barlink_rdma::{
    Access, CompletionQueue, Context, HugePolicy, LinkLayer, MemoryOptions, ProtectionDomain,
    QpConfig, QpConnectOptions, QpState, QueuePair, RdmaError, RegisteredMemory, WcOpcode,
    WcStatus, WorkCompletion,
};
use barlink_transport::window::Window;

const WAIT: Duration = Duration::from_secs(30);

/// The soft-RoCE device to use, or `None` after saying SKIPPED.
fn rdma_dev(test: &str) -> Option<String> {
    match std::env::var("BARLINK_VM_RDMA_DEV") {
        Ok(dev) if !dev.is_empty() => Some(dev),
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: needs soft-RoCE in the QEMU guest (tests/vm/run.sh sets \
                 BARLINK_VM_RDMA_DEV)"
            );
            None
        }
    }
}

/// The RoCE v2 GID index of the guest's IPv4 address: from the harness,
/// else from discovery.
fn gid_index(dev: &str) -> u8 {
    if let Some(i) = std::env::var("BARLINK_VM_RDMA_GID")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return i;
    }
    let info = device::device(dev).unwrap();
    info.active_port()
        .and_then(|p| p.roce_v2_gid())
        .map(|g| g.index as u8)
        .expect("no RoCE v2 GID")
}

fn options(dev: &str) -> QpConnectOptions {
    QpConnectOptions {
        sgid_index: gid_index(dev),
        // TCG: the emulated CPU is slow; give acknowledgements time.
        timeout: 18,
        retry_cnt: 7,
        rnr_retry: 7,
        ..QpConnectOptions::default()
    }
}

/// Two RC QPs connected to each other, each with its own CQ.
struct Pair {
    pd: ProtectionDomain,
    a: QueuePair,
    a_cq: CompletionQueue,
    b: QueuePair,
    b_cq: CompletionQueue,
}

fn pair(dev: &str) -> Pair {
    let ctx = Context::open(dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let a_cq = ctx.create_cq(64).unwrap();
    let b_cq = ctx.create_cq(64).unwrap();
    let config = QpConfig {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_inline_data: 64,
        ..QpConfig::default()
    };
    let a = pd.create_rc_qp(&a_cq, &a_cq, &config).unwrap();
    let b = pd.create_rc_qp(&b_cq, &b_cq, &config).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Reset);
    let opts = options(dev);
    let ea = a.local_endpoint(&opts, 0x1234).unwrap();
    let eb = b.local_endpoint(&opts, 0xabcd).unwrap();
    assert!(ea.gid.ipv4().is_some(), "GID {} is not IPv4-mapped", ea.gid);
    a.connect(&ea, &eb, &opts).unwrap();
    b.connect(&eb, &ea, &opts).unwrap();
    assert_eq!(a.state().unwrap(), QpState::ReadyToSend);
    assert_eq!(b.state().unwrap(), QpState::ReadyToSend);
    Pair {
        pd,
        a,
        a_cq,
        b,
        b_cq,
    }
}

fn wait_one(cq: &CompletionQueue) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    cq.wait(&mut wc, 1, WAIT).unwrap();
    wc[0]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

#[test]
#[ignore]
fn guest_discovery_lists_rxe_with_roce_v2_gid() {
    let Some(dev) = rdma_dev("guest_discovery_lists_rxe_with_roce_v2_gid") else {
        return;
    };
    let all = device::devices().unwrap();
    let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
    let info = all
        .iter()
        .find(|d| d.name == dev)
        .unwrap_or_else(|| panic!("{dev} not among {names:?}"));
    let port = info.active_port().expect("no active port");
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert!(port.active_mtu.is_some());
    let gid = port.roce_v2_gid().expect("no RoCE v2 GID");
    assert_eq!(gid.gid_type, Some(GidType::RoceV2));
    if let Ok(ip) = std::env::var("BARLINK_VM_RDMA_IP") {
        assert_eq!(gid.gid.ipv4().map(|a| a.to_string()), Some(ip));
    }
    if let Ok(netdev) = std::env::var("BARLINK_VM_RDMA_NETDEV") {
        assert_eq!(gid.netdev.as_deref(), Some(netdev.as_str()));
    }
    assert!(info.max_qp > 0 && info.max_cqe > 0 && info.max_mr_size > 0);
    // A wrong name lists the real ones.
    match Context::open("nosuch0") {
        Err(RdmaError::DeviceNotFound { available, .. }) => assert!(available.contains(&dev)),
        other => panic!("expected DeviceNotFound, got {other:?}"),
    }
    println!(
        "{} guid {} port {} {:?} mtu {:?} RoCE v2 gid[{}] {} on {:?}; max_qp {} max_cqe {} max_mr_size {}",
        info.name,
        info.node_guid_string(),
        port.port,
        port.state,
        port.active_mtu,
        gid.index,
        gid.gid,
        gid.netdev,
        info.max_qp,
        info.max_cqe,
        info.max_mr_size
    );
}

#[test]
#[ignore]
fn guest_pd_cq_and_registered_memory() {
    let Some(dev) = rdma_dev("guest_pd_cq_and_registered_memory") else {
        return;
    };
    let ctx = Context::open(&dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    assert!(cq.depth() >= 16);
    let mut none = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut none).unwrap(), 0);
    // A bounded wait on an empty CQ times out, typed.
    match cq.wait(&mut none, 1, Duration::from_millis(50)) {
        Err(RdmaError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    let mem = RegisteredMemory::new(&pd, 10_000).unwrap();
    assert_eq!(mem.len(), 10_000);
    assert_eq!(mem.addr() % 4096, 0);
    assert_ne!(mem.rkey(), 0);
    mem.write(100, b"hello").unwrap();
    let mut back = [0u8; 5];
    mem.read(100, &mut back).unwrap();
    assert_eq!(&back, b"hello");
    mem.store_u64(8, 42, std::sync::atomic::Ordering::Release)
        .unwrap();
    assert_eq!(
        mem.load_u64(8, std::sync::atomic::Ordering::Acquire)
            .unwrap(),
        42
    );
    assert!(mem.sge(9_999, 2).is_err());
    assert!(mem.write(9_999, b"ab").is_err());
    // Huge pages when reserved, else ordinary ones.
    let huge = RegisteredMemory::with_options(
        &pd,
        3 << 20,
        &MemoryOptions {
            huge_pages: HugePolicy::Prefer,
            access: Access::RDMA,
        },
    )
    .unwrap();
    println!(
        "registered 10000 B (lkey {:#x}) and 3 MiB (huge pages: {})",
        mem.lkey(),
        huge.huge_pages()
    );
}

#[test]
#[ignore]
fn guest_rc_loopback_write_with_imm_sizes() {
    let Some(dev) = rdma_dev("guest_rc_loopback_write_with_imm_sizes") else {
        return;
    };
    let p = pair(&dev);
    const MIB: usize = 1 << 20;
    let src = RegisteredMemory::new(&p.pd, MIB + 4096).unwrap();
    let dst = RegisteredMemory::new(&p.pd, MIB + 4096).unwrap();
    let remote = dst.remote();
    for (i, &len) in [1usize, 2, 63, 64, 4095, 4096, 4097, 65_536, 300_001, MIB]
        .iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        // A different offset each time, so stale bytes cannot pass.
        let off = (i * 7) % 4096;
        // Staged with the one-pass copy + CRC (as the link stages packets).
        let mut crc_out = barlink_transport::crc::Crc32c::new();
        src.write_crc(off, &data, &mut crc_out).unwrap();
        assert_eq!(crc_out.finish(), barlink_transport::crc::crc32c(&data));
        p.b.post_recv(1000 + i as u64, None).unwrap();
        let imm = 0xC0DE_0000 | i as u32;
        p.a.post_write_imm(
            i as u64,
            &[src.sge(off, len).unwrap()],
            remote.at(off as u64, len).unwrap(),
            imm,
            true,
        )
        .unwrap();
        let sent = wait_one(&p.a_cq);
        sent.result().unwrap();
        assert_eq!(sent.wr_id, i as u64);
        assert_eq!(sent.opcode, WcOpcode::RdmaWrite);
        let got = wait_one(&p.b_cq);
        got.result().unwrap();
        assert_eq!(got.wr_id, 1000 + i as u64);
        assert_eq!(got.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(got.imm_data, Some(imm));
        assert_eq!(got.byte_len as usize, len);
        let mut back = vec![0u8; len];
        dst.read(off, &mut back).unwrap();
        assert!(back == data, "{len} bytes at {off}: the data differs");
        // And read back out of what the adapter placed, CRC in the same pass.
        let mut again = vec![0u8; len];
        let mut crc_in = barlink_transport::crc::Crc32c::new();
        dst.read_crc(off, &mut again, &mut crc_in).unwrap();
        assert!(again == data, "{len} bytes at {off}: read_crc differs");
        assert_eq!(crc_in.finish(), crc_out.finish(), "{len} bytes: CRC");
    }
}

#[test]
#[ignore]
fn guest_rc_loopback_inline_unsignaled_and_send() {
    let Some(dev) = rdma_dev("guest_rc_loopback_inline_unsignaled_and_send") else {
        return;
    };
    let p = pair(&dev);
    let src = RegisteredMemory::new(&p.pd, 8192).unwrap();
    let dst = RegisteredMemory::new(&p.pd, 8192).unwrap();
    let remote = dst.remote();
    // Inline write with immediate, straight from a Rust slice.
    let small = pattern(p.a.max_inline_data().min(48) as usize, 9);
    p.b.post_recv(1, None).unwrap();
    p.a.post_write_inline(
        10,
        &small,
        remote.at(0, small.len()).unwrap(),
        Some(7),
        true,
    )
    .unwrap();
    wait_one(&p.a_cq).result().unwrap();
    let got = wait_one(&p.b_cq);
    got.result().unwrap();
    assert_eq!(
        (got.imm_data, got.byte_len as usize),
        (Some(7), small.len())
    );
    let mut back = vec![0u8; small.len()];
    dst.read(0, &mut back).unwrap();
    assert_eq!(back, small);
    // Too much inline is refused before posting.
    let big = vec![0u8; p.a.max_inline_data() as usize + 1];
    assert!(matches!(
        p.a.post_write_inline(11, &big, remote.at(0, big.len()).unwrap(), None, true),
        Err(RdmaError::InvalidArgument { .. })
    ));
    // Unsignaled plain writes, then a signaled one: in order on an RC QP.
    for k in 0..4u8 {
        src.write(1024 + usize::from(k) * 16, &[k + 1; 16]).unwrap();
        p.a.post_write(
            20 + u64::from(k),
            &[src.sge(1024 + usize::from(k) * 16, 16).unwrap()],
            remote.at(1024 + u64::from(k) * 16, 16).unwrap(),
            false,
        )
        .unwrap();
    }
    p.a.post_write(
        30,
        &[src.sge(0, 1).unwrap()],
        remote.at(4000, 1).unwrap(),
        true,
    )
    .unwrap();
    let done = wait_one(&p.a_cq);
    done.result().unwrap();
    assert_eq!(done.wr_id, 30, "unsignaled writes report nothing");
    let mut back = [0u8; 64];
    dst.read(1024, &mut back).unwrap();
    for k in 0..4 {
        assert!(back[k * 16..k * 16 + 16].iter().all(|&b| b == k as u8 + 1));
    }
    // SEND into a posted receive buffer.
    let msg = pattern(3000, 3);
    src.write(4096, &msg).unwrap();
    p.b.post_recv(2, Some(&dst.sge(4096, 4096).unwrap()))
        .unwrap();
    p.a.post_send(40, &[src.sge(4096, msg.len()).unwrap()], None, true)
        .unwrap();
    wait_one(&p.a_cq).result().unwrap();
    let got = wait_one(&p.b_cq);
    got.result().unwrap();
    assert_eq!(
        (got.opcode, got.byte_len as usize, got.imm_data),
        (WcOpcode::Recv, msg.len(), None)
    );
    let mut back = vec![0u8; msg.len()];
    dst.read(4096, &mut back).unwrap();
    assert_eq!(back, msg);
}

#[test]
#[ignore]
fn guest_bad_rkey_is_a_typed_completion_error() {
    let Some(dev) = rdma_dev("guest_bad_rkey_is_a_typed_completion_error") else {
        return;
    };
    let p = pair(&dev);
    let src = RegisteredMemory::new(&p.pd, 4096).unwrap();
    let dst = RegisteredMemory::new(&p.pd, 4096).unwrap();
    let mut remote = dst.remote();
    remote.rkey ^= 0x5a5a_0000;
    p.b.post_recv(1, None).unwrap();
    p.a.post_write_imm(
        77,
        &[src.sge(0, 64).unwrap()],
        remote.at(0, 64).unwrap(),
        1,
        true,
    )
    .unwrap();
    let wc = wait_one(&p.a_cq);
    let err = wc.result().unwrap_err();
    match &err {
        RdmaError::Completion { status, wr_id, .. } => {
            assert_eq!(*wr_id, 77);
            assert_eq!(*status, WcStatus::RemAccessErr, "{err}");
        }
        other => panic!("expected a completion error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("IBV_WC_REM_ACCESS_ERR") && text.contains("rkey"),
        "{text}"
    );
    // The failed QP is in the error state; further posts are flushed.
    assert_eq!(p.a.state().unwrap(), QpState::Error);
    println!("bad rkey: {text}");
}

/// A dma-buf to register: from `/dev/udmabuf` over a sealed memfd when the
/// kernel has it, else `None` with the reason.
fn udmabuf(len: usize) -> Result<(OwnedFd, OwnedFd), String> {
    // SAFETY: a valid NUL-terminated name; flags are plain bits.
    let memfd = unsafe { libc::memfd_create(c"barlink-dmabuf".as_ptr(), libc::MFD_ALLOW_SEALING) };
    if memfd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `memfd` was just returned and is owned by nothing else.
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    let file = std::fs::File::from(memfd.try_clone().unwrap());
    file.set_len(len as u64).unwrap();
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&memfd),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK,
        )
    };
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
        .map_err(|e| format!("/dev/udmabuf: {e} (the guest kernel has no CONFIG_UDMABUF?)"))?;
    #[repr(C)]
    struct UdmabufCreate {
        memfd: u32,
        flags: u32,
        offset: u64,
        size: u64,
    }
    let mut req = UdmabufCreate {
        memfd: std::os::fd::AsRawFd::as_raw_fd(&memfd) as u32,
        flags: 1, // UDMABUF_FLAGS_CLOEXEC
        offset: 0,
        size: len as u64,
    };
    // _IOW('u', 0x42, struct udmabuf_create)
    const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
    // SAFETY: the request struct has the kernel's layout and outlives the call.
    let fd = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&dev),
            UDMABUF_CREATE,
            &mut req,
        )
    };
    if fd < 0 {
        return Err(format!(
            "UDMABUF_CREATE: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the ioctl returned a new descriptor that we own.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, memfd))
}

#[test]
#[ignore]
fn guest_dmabuf_registration() {
    let Some(dev) = rdma_dev("guest_dmabuf_registration") else {
        return;
    };
    let ctx = Context::open(&dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    const LEN: usize = 1 << 16;
    match udmabuf(LEN) {
        Ok((dmabuf, _memfd)) => {
            match pd.register_dmabuf(dmabuf.as_fd(), 0, LEN, 0x10_0000, Access::RDMA) {
                Ok(mr) => {
                    assert_eq!(mr.addr(), 0x10_0000);
                    assert_eq!(mr.len(), LEN);
                    println!("dma-buf registered: {mr:?}");
                }
                Err(e @ RdmaError::Unsupported { .. }) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "SKIPPED guest_dmabuf_registration: a udmabuf was made, {dev} refuses it: {e}"
                    );
                }
                Err(e) => panic!("dma-buf registration failed untyped: {e:?}"),
            }
        }
        Err(why) => {
            // No dma-buf exporter: still check that the provider's answer
            // to a dma-buf registration is typed (rxe has no such verb, so
            // it answers before looking at the descriptor).
            let memfd = std::fs::File::open("/proc/self/exe").unwrap();
            let err = pd
                .register_dmabuf(memfd.as_fd(), 0, LEN, 0, Access::RDMA)
                .expect_err("registered a non-dma-buf descriptor");
            assert!(
                matches!(
                    err,
                    RdmaError::Unsupported { .. }
                        | RdmaError::Verbs {
                            call: "ibv_reg_dmabuf_mr",
                            ..
                        }
                ),
                "{err:?}"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED guest_dmabuf_registration: no dma-buf to register ({why}); the \
                 provider's answer was typed: {err}"
            );
        }
    }
}
