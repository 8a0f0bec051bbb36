//! dma-buf registration through the C ABI (`barlink_register_dmabuf`):
//! what is refused, and why, on every machine; and, in the QEMU guest of
//! `tests/vm/run.sh`, which loads an exporter the CPU may map (vgem; the
//! hosts here have no dma-buf exporter at all), sends from a dma-buf over
//! shared memory and over soft-RoCE that arrive intact, and a registration
//! that outlives the caller's descriptor. The `guest_*` tests are
//! `#[ignore]`d; anywhere but the guest each says `SKIPPED` and returns.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::ptr;
use std::time::Duration;

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;

mod support;

#[path = "../../tests/support/guest.rs"]
mod guest_support;

use guest_support::{in_guest, say, skipped, wait_with_deadline};
use support::dmabuf::{DmaBuf, exchange, pattern, register, vgem_dmabuf};
use support::{expect, last_error, pair, pair_at};

fn register_raw(fd: i32, offset: u64, len: usize) -> (barlink_status, *mut barlink_buffer) {
    let mut buffer = 7usize as *mut barlink_buffer;
    // SAFETY: a writable out-pointer.
    let status = unsafe { barlink_register_dmabuf(fd, offset, len, &mut buffer) };
    (status, buffer)
}

#[test]
fn what_is_not_a_dmabuf_is_refused_with_what_to_pass() {
    let (status, buffer) = register_raw(-1, 0, 4096);
    expect(status, BARLINK_INVALID_ARGUMENT, "not a file descriptor");
    assert!(buffer.is_null(), "the out-pointer is cleared on failure");

    // An fd that is not open: the kernel answers.
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    let closed = file.as_raw_fd();
    drop(file);
    let (status, _) = register_raw(closed, 0, 4096);
    expect(status, BARLINK_INVALID_ARGUMENT, "is not an open file");

    // Host memory behind a file is not a dma-buf: the message says what is.
    let memfd = std::fs::File::from(
        rustix::fs::memfd_create("not-a-dmabuf", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
    );
    memfd.set_len(8192).unwrap();
    let (status, buffer) = register_raw(memfd.as_raw_fd(), 0, 4096);
    expect(status, BARLINK_INVALID_ARGUMENT, "is not a dma-buf");
    expect(status, BARLINK_INVALID_ARGUMENT, "barlink_register_buffer");
    assert!(buffer.is_null());

    let (status, _) = register_raw(memfd.as_raw_fd(), 0, 0);
    expect(status, BARLINK_INVALID_ARGUMENT, "len is 0");
    let (status, _) = register_raw(memfd.as_raw_fd(), 0, usize::MAX);
    expect(status, BARLINK_INVALID_ARGUMENT, "address space");
    // SAFETY: NULL out-pointer, refused before any use.
    let status = unsafe { barlink_register_dmabuf(memfd.as_raw_fd(), 0, 4096, ptr::null_mut()) };
    expect(status, BARLINK_INVALID_ARGUMENT, "buffer");
}

/// A vgem dma-buf in the guest, where run.sh loads vgem: its absence
/// there is a failure.
fn guest_dmabuf(test: &str, len: usize) -> Option<DmaBuf> {
    if !in_guest(test) {
        return None;
    }
    Some(vgem_dmabuf(len).unwrap_or_else(|why| panic!("{why}")))
}

#[test]
#[ignore = "needs a dma-buf exporter the CPU may map: runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_sends_from_a_dmabuf_arrive_intact_over_shared_memory() {
    let Some(dmabuf) = guest_dmabuf(
        "guest_sends_from_a_dmabuf_arrive_intact_over_shared_memory",
        1 << 20,
    ) else {
        return;
    };
    // A range off a page boundary, so the mapping's head is exercised.
    let (offset, block, count) = (4096 + 100, 64 << 10, 12);
    let buffer = register(&dmabuf, offset as u64, block * count);
    let (a, b) = pair(None);
    let stats = exchange(a, b, buffer, offset, block, count);
    assert_eq!(stats.messages_sent, count as u64);
    assert_eq!(stats.packets_sent_in_place, 0, "shared memory copies once");
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

#[test]
#[ignore = "needs a dma-buf exporter the CPU may map: runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_a_dmabuf_registration_outlives_the_callers_descriptor_and_checks_ranges() {
    let test = "guest_a_dmabuf_registration_outlives_the_callers_descriptor_and_checks_ranges";
    let Some(dmabuf) = guest_dmabuf(test, 256 << 10) else {
        return;
    };
    let len = dmabuf.len;
    let (status, _) = register_raw(dmabuf.fd.as_raw_fd(), 4096, len);
    expect(status, BARLINK_INVALID_ARGUMENT, "lies outside the dma-buf");
    let (status, _) = register_raw(dmabuf.fd.as_raw_fd(), u64::MAX, 1);
    expect(status, BARLINK_INVALID_ARGUMENT, "lies outside the dma-buf");

    let buffer = register(&dmabuf, 0, len);
    // The caller's descriptor goes; barlink holds its own.
    let DmaBuf { fd, .. } = dmabuf;
    drop(fd);
    let (a, b) = pair(None);
    // barlink holds two descriptors of the dma-buf (its mapping's and
    // the NICs'), until the deregistration, even while another thread
    // that looked the buffer up keeps it in its cache.
    let fds_registered = open_fds();
    let (to_looker, looker_hears) = std::sync::mpsc::channel::<()>();
    let (looker_says, from_looker) = std::sync::mpsc::channel::<(barlink_status, String)>();
    let looker = std::thread::spawn({
        let (a, buffer) = (a as usize, buffer as usize);
        move || {
            let status =
                barlink_link_register_buffer(a as *mut barlink_link, buffer as *mut barlink_buffer);
            looker_says.send((status, support::last_error())).unwrap();
            looker_hears.recv().unwrap();
        }
    });
    // Looked up (and cached there) before the deregistration below.
    let (status, why) = from_looker.recv().unwrap();
    assert_eq!(status, BARLINK_OK, "{why}");
    let mut request = 0;
    // SAFETY: a writable out-pointer.
    let status = unsafe { barlink_post_send_buffer(a, buffer, len - 10, 11, 0, &mut request) };
    expect(
        status,
        BARLINK_INVALID_ARGUMENT,
        "outside the registered buffer",
    );
    let stats = exchange(a, b, buffer, 0, 16 << 10, 8);
    assert_eq!(stats.messages_sent, 8);
    assert_eq!(
        open_fds(),
        fds_registered - 2,
        "the deregistered dma-buf is still open"
    );
    to_looker.send(()).unwrap();
    looker.join().unwrap();
    assert_eq!(barlink_close(a, 1000), BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), BARLINK_OK);
}

/// This process's open file descriptors.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("reading /proc/self/fd")
        .count()
}

/// Over RDMA the link offers the NIC the dma-buf itself. Soft-RoCE refuses
/// dma-buf memory regions, so the packets go through the link's staging
/// area, copied through the CPU's mapping. The RDMA settings reach barlink
/// through the environment, as a C program's user gives them, so the
/// exchange runs in a process of its own started with them.
#[test]
#[ignore = "needs a dma-buf exporter and soft-RoCE: runs in the QEMU guest (tests/vm/run.sh)"]
fn guest_sends_from_a_dmabuf_arrive_intact_over_soft_roce() {
    let test = "guest_sends_from_a_dmabuf_arrive_intact_over_soft_roce";
    if !in_guest(test) {
        return;
    }
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(dev), Some(ip)) = (var("BARLINK_VM_RDMA_DEV"), var("BARLINK_VM_RDMA_IP")) else {
        skipped(
            test,
            "needs soft-RoCE in the guest (run.sh sets BARLINK_VM_RDMA_DEV and BARLINK_VM_RDMA_IP)",
        );
        return;
    };
    let psk = std::env::temp_dir().join(format!("barlink-dmabuf-psk-{}", std::process::id()));
    std::fs::write(&psk, format!("{}\n", "5a".repeat(32))).unwrap();
    std::fs::set_permissions(&psk, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--ignored", "--exact", "--nocapture", CHILD])
        .env(CHILD_ADDRESS, format!("rdma://{ip}:18720"))
        .env("BARLINK_PSK_FILE", &psk)
        .env("BARLINK_RDMA_DEVICE", &dev)
        .env("BARLINK_QP_TIMEOUT", "18");
    if let Some(gid) = var("BARLINK_VM_RDMA_GID") {
        child.env("BARLINK_GID_INDEX", gid);
    }
    let mut child = child.spawn().expect("starting the test binary again");
    let status = wait_with_deadline(&mut child, Duration::from_secs(200), CHILD);
    let _ = std::fs::remove_file(&psk);
    assert!(status.success(), "{CHILD}: {status}");
}

/// The half of `guest_sends_from_a_dmabuf_arrive_intact_over_soft_roce`
/// that runs in a process of its own.
const CHILD: &str = "dmabuf_over_rdma_in_a_process_of_its_own";
/// The address it is given.
const CHILD_ADDRESS: &str = "BARLINK_TEST_DMABUF_ADDRESS";

#[test]
#[ignore = "started by guest_sends_from_a_dmabuf_arrive_intact_over_soft_roce, with its RDMA settings"]
fn dmabuf_over_rdma_in_a_process_of_its_own() {
    let Ok(address) = std::env::var(CHILD_ADDRESS) else {
        skipped(
            CHILD,
            "started only by guest_sends_from_a_dmabuf_arrive_intact_over_soft_roce",
        );
        return;
    };
    let dmabuf = vgem_dmabuf(1 << 20).unwrap_or_else(|why| panic!("{why}"));
    let (offset, block, count) = (8192 + 24, 64 << 10, 8);
    let buffer = register(&dmabuf, offset as u64, block * count);
    let (a, b) = pair_at(CString::new(address.clone()).unwrap(), None, 60_000);
    // Asked up front, the NIC's refusal is a status with its reason; host
    // memory it registers.
    let status = barlink_link_register_buffer(a, buffer);
    expect(
        status,
        BARLINK_NOT_AVAILABLE,
        "the RDMA device refused this buffer",
    );
    say(&format!(
        "{CHILD}: registering the dma-buf with the link's NIC: {}",
        last_error()
    ));
    // Host memory holding the pattern `exchange` checks.
    let host: Vec<u8> = (0..64 << 10).map(pattern).collect();
    let mut host_buffer = std::ptr::null_mut();
    // SAFETY: `host` outlives the registration and is not modified.
    let status =
        unsafe { barlink_register_buffer(host.as_ptr().cast(), host.len(), &mut host_buffer) };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    assert_eq!(
        barlink_link_register_buffer(a, host_buffer),
        BARLINK_OK,
        "soft-RoCE registers host memory: {}",
        last_error()
    );
    // What it registered, its NIC reads in place.
    let host_stats = exchange(a, b, host_buffer, 0, host.len(), 1);
    assert!(
        host_stats.packets_sent_in_place > 0,
        "the registered host buffer was copied: {host_stats:?}"
    );
    // Asked again, the same refusal.
    let status = barlink_link_register_buffer(a, buffer);
    expect(
        status,
        BARLINK_NOT_AVAILABLE,
        "the RDMA device refused this buffer",
    );
    let stats = exchange(a, b, buffer, offset, block, count);
    assert_eq!(stats.messages_sent, count as u64 + 1);
    let dmabuf_in_place = stats.packets_sent_in_place - host_stats.packets_sent_in_place;
    say(&format!(
        "{CHILD}: {count} messages of {block} bytes from a vgem dma-buf over {address} intact; \
         packets read in place by the NIC: {dmabuf_in_place} (from the host buffer before: {})",
        host_stats.packets_sent_in_place
    ));
    assert_eq!(
        dmabuf_in_place, 0,
        "soft-RoCE refuses dma-buf memory regions, so its sends are copies: if it now takes \
         them, the NIC read the dma-buf in place, and this test should say so"
    );
    assert_eq!(barlink_close(a, 5000), BARLINK_OK);
    assert_eq!(barlink_close(b, 5000), BARLINK_OK);
}
