//! Real dma-bufs for the tests of `barlink_register_dmabuf`, from the
//! virtual GEM driver (`vgem`: a DRM driver with no hardware whose buffers
//! export as dma-bufs the CPU may map, as IGT's PRIME tests use it), and
//! the exchange the tests run over them.
//!
//! The host kernels here have no dma-buf exporter at all (no vgem, no
//! udmabuf); the QEMU guest of `tests/vm/run.sh` loads vgem.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use barlink_ffi::barlink_status::*;
use barlink_ffi::*;
use rustix::ioctl::{Updater, ioctl, opcode};
use rustix::mm::{MapFlags, ProtFlags};

use super::{last_error, recv};

/// `struct drm_mode_create_dumb`.
#[repr(C)]
#[derive(Default)]
struct CreateDumb {
    height: u32,
    width: u32,
    bpp: u32,
    flags: u32,
    handle: u32,
    pitch: u32,
    size: u64,
}

/// `struct drm_prime_handle`.
#[repr(C)]
#[derive(Default)]
struct PrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}

const DRM_IOCTL_MODE_CREATE_DUMB: rustix::ioctl::Opcode =
    opcode::read_write::<CreateDumb>(b'd', 0xB2);
const DRM_IOCTL_PRIME_HANDLE_TO_FD: rustix::ioctl::Opcode =
    opcode::read_write::<PrimeHandle>(b'd', 0x2D);
/// `DRM_CLOEXEC | DRM_RDWR` (`O_CLOEXEC | O_RDWR`).
const EXPORT_FLAGS: u32 = 0o2_000_000 | 0o2;
/// `DMA_BUF_IOCTL_SYNC` and its flags.
const DMA_BUF_IOCTL_SYNC: rustix::ioctl::Opcode = opcode::write::<u64>(b'b', 0);
const SYNC_WRITE: u64 = 2;
const SYNC_END: u64 = 4;

/// A dma-buf of `len` bytes or more, exported by vgem.
#[derive(Debug)]
pub struct DmaBuf {
    pub fd: OwnedFd,
    pub len: usize,
    /// The vgem device: the buffer's GEM handle lives while it is open.
    _card: std::fs::File,
}

/// The byte at `i` of every test dma-buf.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 12)) as u8
}

/// The vgem card's device file, if the driver is loaded.
fn vgem_card() -> Option<std::path::PathBuf> {
    let cards = std::fs::read_dir("/sys/class/drm").ok()?;
    for card in cards.flatten() {
        let name = card.file_name().to_string_lossy().into_owned();
        if !name.starts_with("card") || name.contains('-') {
            continue;
        }
        // vgem's device is the platform device "vgem".
        let Ok(device) = std::fs::read_link(card.path().join("device")) else {
            continue;
        };
        if device.file_name().is_some_and(|d| d == "vgem") {
            return Some(std::path::Path::new("/dev/dri").join(name));
        }
    }
    None
}

/// A vgem dma-buf of at least `len` bytes filled with [`pattern`], or why
/// there is none.
pub fn vgem_dmabuf(len: usize) -> Result<DmaBuf, String> {
    let path = vgem_card().ok_or(
        "no vgem device in /sys/class/drm (the kernel has no dma-buf exporter the CPU may map; \
         modprobe vgem)",
    )?;
    let card = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut dumb = CreateDumb {
        width: 1024,
        height: u32::try_from(len.div_ceil(4096)).unwrap(),
        bpp: 32,
        ..CreateDumb::default()
    };
    // SAFETY: the ioctl reads and writes one `drm_mode_create_dumb`.
    unsafe {
        ioctl(
            &card,
            Updater::<DRM_IOCTL_MODE_CREATE_DUMB, _>::new(&mut dumb),
        )
    }
    .map_err(|e| format!("DRM_IOCTL_MODE_CREATE_DUMB on {}: {e}", path.display()))?;
    let mut prime = PrimeHandle {
        handle: dumb.handle,
        flags: EXPORT_FLAGS,
        fd: -1,
    };
    // SAFETY: the ioctl reads and writes one `drm_prime_handle`.
    unsafe {
        ioctl(
            &card,
            Updater::<DRM_IOCTL_PRIME_HANDLE_TO_FD, _>::new(&mut prime),
        )
    }
    .map_err(|e| format!("DRM_IOCTL_PRIME_HANDLE_TO_FD: {e}"))?;
    // SAFETY: the kernel just made this descriptor for us.
    let fd = unsafe { OwnedFd::from_raw_fd(prime.fd) };
    let size = usize::try_from(dumb.size).unwrap();
    fill(&fd, size)?;
    Ok(DmaBuf {
        fd,
        len: size,
        _card: card,
    })
}

/// Writes [`pattern`] into the whole dma-buf through a mapping of its own,
/// bracketed as the kernel asks.
fn fill(fd: &OwnedFd, len: usize) -> Result<(), String> {
    // SAFETY: a new shared mapping chosen by the kernel, unmapped below.
    let map = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| format!("mmap of the vgem dma-buf: {e}"))?;
    let sync = |flags: u64| {
        // SAFETY: DMA_BUF_IOCTL_SYNC reads one u64.
        unsafe {
            ioctl(
                fd.as_fd(),
                rustix::ioctl::Setter::<DMA_BUF_IOCTL_SYNC, u64>::new(flags),
            )
        }
        .map_err(|e| format!("DMA_BUF_IOCTL_SYNC {flags}: {e}"))
    };
    sync(SYNC_WRITE)?;
    let bytes: Vec<u8> = (0..len).map(pattern).collect();
    // SAFETY: `len` bytes mapped writable just above; nothing else maps them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.cast::<u8>(), len) };
    sync(SYNC_END | SYNC_WRITE)?;
    // SAFETY: the mapping made above, of this length.
    unsafe { rustix::mm::munmap(map, len) }.map_err(|e| format!("munmap: {e}"))
}

/// Registers `len` bytes at `offset` of `dmabuf`.
pub fn register(dmabuf: &DmaBuf, offset: u64, len: usize) -> *mut barlink_buffer {
    let mut buffer = std::ptr::null_mut();
    // SAFETY: a writable out-pointer; nothing writes the dma-buf.
    let status = unsafe {
        barlink_register_dmabuf(
            std::os::fd::AsRawFd::as_raw_fd(&dmabuf.fd),
            offset,
            len,
            &mut buffer,
        )
    };
    assert_eq!(status, BARLINK_OK, "{}", last_error());
    buffer
}

/// Sends `count` messages of `block` bytes from a registered range that
/// starts at `offset` in the dma-buf, from `a` to `b` (which `receive`
/// drives on a thread of its own), and checks every byte that arrived
/// against [`pattern`]; then deregisters. Returns `a`'s stats.
pub fn exchange(
    a: *mut barlink_link,
    b: *mut barlink_link,
    buffer: *mut barlink_buffer,
    offset: usize,
    block: usize,
    count: usize,
) -> barlink_stats {
    let receiver = std::thread::spawn({
        let b = b as usize;
        move || {
            let b = b as *mut barlink_link;
            let mut buf = vec![0u8; block];
            for i in 0..count {
                let (status, len) = recv(b, &mut buf, 60_000);
                assert_eq!(status, BARLINK_OK, "message {i}: {}", last_error());
                assert_eq!(len, block);
                let start = offset + i * block;
                if let Some(bad) = (0..block).find(|&j| buf[j] != pattern(start + j)) {
                    panic!(
                        "message {i}: byte {bad} is {:#x}, want {:#x}",
                        buf[bad],
                        pattern(start + bad)
                    );
                }
            }
            // Acknowledge the last one.
            let _ = barlink_progress(b);
        }
    });
    let mut requests = Vec::new();
    for i in 0..count {
        let mut request = 0;
        // SAFETY: a writable out-pointer; the range lies in the registration.
        let status = unsafe {
            barlink_post_send_buffer(a, buffer, i * block, block, i as u64, &mut request)
        };
        assert_eq!(status, BARLINK_OK, "post {i}: {}", last_error());
        requests.push(request);
    }
    for request in requests {
        assert_eq!(
            barlink_wait(a, request, 60_000),
            BARLINK_OK,
            "{}",
            last_error()
        );
    }
    receiver
        .join()
        .expect("the receiver found every byte intact");
    deregister_when_idle(a, buffer);
    let mut stats = barlink_stats {
        struct_size: std::mem::size_of::<barlink_stats>() as u32,
        ..barlink_stats::default()
    };
    // SAFETY: a whole, writable stats struct of the size given.
    assert_eq!(unsafe { barlink_get_stats(a, &mut stats) }, BARLINK_OK);
    stats
}

/// Deregisters `buffer` once no RDMA write from it is in flight, driving
/// `link` meanwhile (a write's completion can come after the message's
/// acknowledgement), for at most 30 s.
pub fn deregister_when_idle(link: *mut barlink_link, buffer: *mut barlink_buffer) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match barlink_deregister_buffer(buffer) {
            BARLINK_OK => break,
            BARLINK_BUSY if std::time::Instant::now() < deadline => {
                let _ = barlink_progress(link);
            }
            status => panic!("deregister: {status:?}: {}", last_error()),
        }
    }
}
