//! Safe RAII wrappers over libibverbs: [`Context`] (an open device),
//! [`ProtectionDomain`], [`CompletionQueue`], RC [`QueuePair`]s,
//! [`MemoryRegion`]s (host memory or dma-buf) and [`RegisteredMemory`]
//! (page-aligned memory of our own, registered, and a [`Window`]).
//!
//! Ownership mirrors the verbs object tree: each object holds its parent
//! (by `Arc`) so a context outlives its PDs, a PD its QPs and regions, a
//! CQ the QPs that use it; dropping the last handle destroys the object.
//! All objects are `Send + Sync`: libibverbs and its providers are
//! thread-safe per verb.
//!
//! Nothing here blocks: posts and polls return at once, and
//! [`CompletionQueue::wait`] takes a timeout.
//!
//! Memory the device writes (a receive buffer, the target of a peer's
//! RDMA WRITE) changes outside the program's control, so it is never lent
//! out as `&[u8]`: [`RegisteredMemory`] is read and written by copies and
//! atomics only, through the [`Window`] trait.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use barlink_transport::crc::Crc32c;
use barlink_transport::window::{RawWindow, Window, WindowError};

use crate::error::RdmaError;
use crate::sys::{self, Verbs};
pub use crate::wc_status::WcStatus;

// ================================================================== values

/// A 128-bit GID: an InfiniBand port address, or for RoCE an IPv6 address
/// (IPv4 as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether every byte is zero (an unpopulated GID table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), the form
    /// RoCE uses for an interface's IPv4 address.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let (prefix, addr) = self.0.split_at(12);
        (prefix == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
            .then(|| Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
    }
}

/// Formats as sysfs does: eight groups of four hex digits.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// A path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The MTU of a verbs enum value (1 = 256 ... 5 = 4096).
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The verbs enum value.
    pub fn code(self) -> u32 {
        self as u32 + 1
    }

    /// Bytes.
    pub fn bytes(self) -> usize {
        256 << (self as u32)
    }
}

/// A port's logical state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up, not yet configured by a subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Ready for traffic.
    Active,
    /// Active, deferring.
    ActiveDefer,
    /// Another value.
    Other(u32),
}

impl PortState {
    fn from_code(code: u32) -> PortState {
        match code {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID; GIDs optional).
    InfiniBand,
    /// Ethernet: RoCE (addressed by GID only).
    Ethernet,
    /// Not reported (older drivers; means InfiniBand).
    Unspecified,
}

/// A device's attributes (`ibv_query_device`), the subset that matters
/// for sizing queues and regions.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID (host byte order).
    pub node_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// PCI vendor id (or IEEE OUI).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: i32,
    /// Most work requests per QP queue.
    pub max_qp_wr: i32,
    /// Most scatter/gather entries per work request.
    pub max_sge: i32,
    /// Most CQs.
    pub max_cq: i32,
    /// Most entries per CQ.
    pub max_cqe: i32,
    /// Most memory regions.
    pub max_mr: i32,
    /// Most protection domains.
    pub max_pd: i32,
    /// Most outstanding RDMA READs/atomics a QP may target.
    pub max_qp_rd_atom: i32,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
}

/// A port's attributes (`ibv_query_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Option<Mtu>,
    /// MTU in use (the largest a QP on this port can use).
    pub active_mtu: Option<Mtu>,
    /// Entries in the GID table.
    pub gid_tbl_len: i32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
}

/// Memory access rights of a region or a QP (`enum ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// The local device may write (needed for receives and RDMA READ targets).
    pub const LOCAL_WRITE: Access = Access(sys::IBV_ACCESS_LOCAL_WRITE as u32);
    /// Peers may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(sys::IBV_ACCESS_REMOTE_WRITE as u32);
    /// Peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(sys::IBV_ACCESS_REMOTE_READ as u32);
    /// Peers may do atomics.
    pub const REMOTE_ATOMIC: Access = Access(sys::IBV_ACCESS_REMOTE_ATOMIC as u32);
    /// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ: what ring memory needs.
    pub const RDMA: Access = Access(
        (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ)
            as u32,
    );

    /// The raw flag bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

// ========================================================= device list

/// The names of the RDMA devices libibverbs sees (`ibv_get_device_list`),
/// possibly none. Use [`crate::device::devices`] for full discovery.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let v = sys::verbs()?;
    with_device_list(v, |list| {
        Ok(list
            .iter()
            .map(|&dev| {
                // SAFETY: `dev` is an element of the live list; the name is
                // a NUL-terminated string inside the device struct.
                unsafe { device_name(v, dev) }
            })
            .collect())
    })
}

/// Runs `f` over the device list, freed afterwards.
fn with_device_list<T>(
    v: &'static Verbs,
    f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<T, RdmaError>,
) -> Result<T, RdmaError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        let errno = sys::errno();
        return Err(RdmaError::NoDevice {
            reason: format!(
                "ibv_get_device_list failed: {} (errno {errno}){}",
                crate::error::strerror(errno),
                if errno == libc::ENOSYS {
                    " -- the kernel has no RDMA (ib_uverbs) support"
                } else {
                    ""
                }
            ),
        });
    }
    let n = usize::try_from(n).unwrap_or(0);
    // SAFETY: the library returned an array of `n` device pointers (plus a
    // terminating null), live until `free_device_list`.
    let devices = unsafe { std::slice::from_raw_parts(list, n) };
    let result = f(devices);
    // SAFETY: `list` came from `get_device_list` and is freed once; contexts
    // opened from its devices stay valid (the library refcounts them).
    unsafe { (v.free_device_list)(list) };
    result
}

/// # Safety
/// `dev` must be a live device of a device list.
unsafe fn device_name(v: &Verbs, dev: *mut sys::ibv_device) -> String {
    // SAFETY: per this function's contract; the library returns a pointer
    // into the device struct (NUL-terminated) or null.
    let name = unsafe { (v.get_device_name)(dev) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (see above), valid while `dev` is.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

// ================================================================ Context

struct ContextInner {
    raw: NonNull<sys::ibv_context>,
    name: String,
    node_guid: u64,
    v: &'static Verbs,
}

// SAFETY: an `ibv_context` may be used from any thread (libibverbs is
// thread-safe per verb); it is closed only in `drop`, once.
unsafe impl Send for ContextInner {}
// SAFETY: as above; every method takes `&self` and the library serialises
// what needs it internally.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: opened in `Context::open`, closed once here, after every
        // child object (each holds an `Arc` of this).
        unsafe { (self.v.close_device)(self.raw.as_ptr()) };
    }
}

/// An open RDMA device (`ibv_open_device`). Open one per device per
/// process and share it (it is cheap to clone); everything else is
/// created from it.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the device called `name` (e.g. `mlx5_0`, `rxe0`).
    ///
    /// Errors: [`RdmaError::NotAvailable`] without libibverbs,
    /// [`RdmaError::NoDevice`] when there is no device at all,
    /// [`RdmaError::DeviceNotFound`] (listing the others) when this one is
    /// not there.
    pub fn open(name: &str) -> Result<Context, RdmaError> {
        Context::open_matching(Some(name))
    }

    /// Opens the first device libibverbs lists: for hosts with one NIC.
    pub fn open_first() -> Result<Context, RdmaError> {
        Context::open_matching(None)
    }

    fn open_matching(name: Option<&str>) -> Result<Context, RdmaError> {
        let v = sys::verbs()?;
        with_device_list(v, |list| {
            if list.is_empty() {
                return Err(RdmaError::NoDevice {
                    reason: format!("{} lists no device", v.library),
                });
            }
            let mut names = Vec::new();
            for &dev in list {
                // SAFETY: `dev` is an element of the live list.
                let dev_name = unsafe { device_name(v, dev) };
                if name.is_none_or(|n| n == dev_name) {
                    // SAFETY: as above.
                    let guid = u64::from_be(unsafe { (v.get_device_guid)(dev) });
                    // SAFETY: as above; the context is closed in
                    // `ContextInner::drop`.
                    let raw = unsafe { (v.open_device)(dev) };
                    let raw = NonNull::new(raw)
                        .ok_or_else(|| RdmaError::verbs("ibv_open_device", sys::errno()))?;
                    return Ok(Context {
                        inner: Arc::new(ContextInner {
                            raw,
                            name: dev_name,
                            node_guid: guid,
                            v,
                        }),
                    });
                }
                names.push(dev_name);
            }
            Err(RdmaError::DeviceNotFound {
                name: name.unwrap_or_default().to_string(),
                available: names,
            })
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's node GUID (host byte order).
    pub fn node_guid(&self) -> u64 {
        self.inner.node_guid
    }

    /// The device's attributes and limits.
    pub fn query_device(&self) -> Result<DeviceAttr, RdmaError> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: the context is live; `attr` is a writable struct of the
        // layout verbs.h declares (checked by the layout test).
        let rc = unsafe { (self.inner.v.query_device)(self.inner.raw.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_query_device", sys::rc_errno(rc)));
        }
        // SAFETY: zero-initialised and then filled by the library; all
        // fields are plain integers, valid for any bits.
        let a = unsafe { attr.assume_init() };
        let fw = a.fw_ver.map(|c| c as u8);
        let fw_len = fw.iter().position(|&c| c == 0).unwrap_or(fw.len());
        Ok(DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw[..fw_len]).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            max_mr_size: a.max_mr_size,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_sge: a.max_sge,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_qp_rd_atom: a.max_qp_rd_atom,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// Port `port` (numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, RdmaError> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: the context is live; the exported `ibv_query_port` fills
        // a prefix of `ibv_port_attr` (through `link_layer`), the rest stays
        // zero, as the header's inline wrapper does it.
        let rc =
            unsafe { (self.inner.v.query_port)(self.inner.raw.as_ptr(), port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_query_port", sys::rc_errno(rc)));
        }
        // SAFETY: zeroed then filled; plain integers.
        let a = unsafe { attr.assume_init() };
        Ok(PortAttr {
            state: PortState::from_code(a.state),
            max_mtu: Mtu::from_code(a.max_mtu),
            active_mtu: Mtu::from_code(a.active_mtu),
            gid_tbl_len: a.gid_tbl_len,
            lid: a.lid,
            link_layer: match a.link_layer {
                sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
                sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::Unspecified,
            },
            max_msg_sz: a.max_msg_sz,
        })
    }

    /// GID table entry `index` of `port` (`ibv_query_gid`). Read only the
    /// entries you need: each is a sysfs read in the library.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, RdmaError> {
        let index = c_int::try_from(index).map_err(|_| RdmaError::InvalidArgument {
            what: format!("GID index {index} out of range"),
        })?;
        let mut gid = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: the context is live; `gid` is a writable 16-byte union.
        let rc =
            unsafe { (self.inner.v.query_gid)(self.inner.raw.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_query_gid", sys::rc_errno(rc)));
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// Allocates a protection domain: the scope within which QPs may use
    /// memory regions. One per connection group is typical.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, RdmaError> {
        // SAFETY: the context is live; the PD is freed in `PdInner::drop`.
        let raw = unsafe { (self.inner.v.alloc_pd)(self.inner.raw.as_ptr()) };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_alloc_pd", sys::errno()))?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                raw,
                ctx: self.inner.clone(),
            }),
        })
    }

    /// Creates a completion queue of at least `depth` entries (the device
    /// may round up). Give it room for every signaled send and every posted
    /// receive of the QPs that use it: an overflowing CQ kills them.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, RdmaError> {
        let cqe = c_int::try_from(depth.max(1)).map_err(|_| RdmaError::InvalidArgument {
            what: format!("CQ depth {depth} out of range"),
        })?;
        // SAFETY: the context is live; no completion channel, no context
        // pointer, vector 0; the CQ is destroyed in `CqInner::drop`.
        let raw = unsafe {
            (self.inner.v.create_cq)(
                self.inner.raw.as_ptr(),
                cqe,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_create_cq", sys::errno()))?;
        // SAFETY: the CQ was just created and is live.
        let actual = unsafe { (*raw.as_ptr()).cqe };
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                raw,
                depth: u32::try_from(actual).unwrap_or(depth),
                ctx: self.inner.clone(),
            }),
        })
    }
}

// ======================================================= ProtectionDomain

struct PdInner {
    raw: NonNull<sys::ibv_pd>,
    ctx: Arc<ContextInner>,
}

// SAFETY: a PD is usable from any thread; freed once, in `drop`.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc_pd`, freed once, after every QP and
        // region of it (each holds an `Arc` of this).
        unsafe { (self.ctx.v.dealloc_pd)(self.raw.as_ptr()) };
    }
}

/// A protection domain (`ibv_alloc_pd`): create QPs and register memory
/// in it. Cheap to clone.
#[derive(Clone)]
pub struct ProtectionDomain {
    inner: Arc<PdInner>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name)
            .finish_non_exhaustive()
    }
}

impl ProtectionDomain {
    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.inner.ctx.name
    }

    /// Registers `len` bytes at `addr` with `access` (`ibv_reg_mr`).
    ///
    /// Prefer [`RegisteredMemory`], which owns its memory. This is for
    /// memory that exists already (a registration cache, a caller's
    /// buffer).
    ///
    /// # Safety
    /// `addr..addr + len` must be mapped memory of this process that stays
    /// mapped until the returned region is dropped, and while the region
    /// lives (and any work request that names it is in flight) the memory
    /// must not be accessed through Rust references: the device may read
    /// or write it at any time.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        let access_bits = c_int::try_from(access.0).unwrap_or(0);
        // SAFETY: the PD is live; the range is mapped and ours for the
        // region's lifetime (this function's contract); the MR is
        // deregistered in `MrInner::drop`.
        let raw = unsafe {
            (self.inner.ctx.v.reg_mr)(self.inner.raw.as_ptr(), addr.cast(), len, access_bits)
        };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_reg_mr", sys::errno()))?;
        Ok(MemoryRegion::from_raw(raw, self.inner.clone(), addr as u64))
    }

    /// Registers a dma-buf (`ibv_reg_dmabuf_mr`): `len` bytes at `offset`
    /// into the buffer behind `fd`, addressed by the device (and by
    /// [`Sge`]s and peers) as `iova` onwards. This is how GPU memory is
    /// registered for GPUDirect RDMA with current drivers (the GPU driver
    /// exports the dma-buf).
    ///
    /// [`RdmaError::Unsupported`] when libibverbs predates it (rdma-core
    /// 34, IBVERBS_1.12) or the provider/driver refuses dma-buf (soft-RoCE
    /// does); the library keeps its own reference to the dma-buf, so `fd`
    /// may be closed afterwards.
    pub fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        let v = self.inner.ctx.v;
        let Some(reg) = v.reg_dmabuf_mr else {
            return Err(RdmaError::Unsupported {
                what: format!(
                    "dma-buf registration: {} has no ibv_reg_dmabuf_mr (IBVERBS_1.12, \
                     rdma-core 34 or later)",
                    v.library
                ),
            });
        };
        let access_bits = c_int::try_from(access.0).unwrap_or(0);
        // SAFETY: the PD is live; `fd` is open for the call (borrowed); the
        // device maps the dma-buf itself, no memory of ours is named; the MR
        // is deregistered in `MrInner::drop`.
        let raw = unsafe {
            reg(
                self.inner.raw.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access_bits,
            )
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(MemoryRegion::from_raw(raw, self.inner.clone(), iova)),
            None => {
                let errno = sys::errno();
                if matches!(
                    errno,
                    libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT
                ) {
                    Err(RdmaError::Unsupported {
                        what: format!(
                            "dma-buf registration on {}: the provider or kernel driver refuses \
                             it ({}); soft-RoCE (rxe) and older drivers do not support dma-buf \
                             memory regions -- register a host bounce buffer instead",
                            self.inner.ctx.name,
                            crate::error::strerror(errno)
                        ),
                    })
                } else {
                    Err(RdmaError::verbs("ibv_reg_dmabuf_mr", errno))
                }
            }
        }
    }

    /// Creates a reliable-connected QP whose completions go to `send_cq`
    /// and `recv_cq` (which may be the same CQ). It starts in RESET: bring
    /// it up with [`QueuePair::connect`] once the peer's [`QpEndpoint`] is
    /// known.
    pub fn create_rc_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        config: &QpConfig,
    ) -> Result<QueuePair, RdmaError> {
        if !Arc::ptr_eq(&send_cq.inner.ctx, &self.inner.ctx)
            || !Arc::ptr_eq(&recv_cq.inner.ctx, &self.inner.ctx)
        {
            return Err(RdmaError::InvalidArgument {
                what: "the CQs and the PD of a QP must come from the same Context".into(),
            });
        }
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.inner.raw.as_ptr(),
            recv_cq: recv_cq.inner.raw.as_ptr(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: config.max_send_wr,
                max_recv_wr: config.max_recv_wr,
                max_send_sge: config.max_send_sge,
                max_recv_sge: config.max_recv_sge,
                max_inline_data: config.max_inline_data,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: c_int::from(config.sq_sig_all),
        };
        // SAFETY: the PD and both CQs are live (held below for the QP's
        // lifetime); `init` is a valid attribute struct; the library writes
        // the capabilities it granted back into `init.cap`.
        let raw = unsafe { (self.inner.ctx.v.create_qp)(self.inner.raw.as_ptr(), &mut init) };
        let raw =
            NonNull::new(raw).ok_or_else(|| RdmaError::verbs("ibv_create_qp", sys::errno()))?;
        // SAFETY: the QP was just created and is live.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        Ok(QueuePair {
            raw,
            qp_num,
            cap: init.cap,
            _pd: self.inner.clone(),
            _send_cq: send_cq.inner.clone(),
            _recv_cq: recv_cq.inner.clone(),
            ctx: self.inner.ctx.clone(),
        })
    }
}

// ========================================================= MemoryRegion

/// Registered memory (`ibv_mr`): what the device may access, named by
/// `lkey` locally and `rkey` by peers. Deregistered on drop.
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    pd: Arc<PdInner>,
}

// SAFETY: an MR is usable from any thread; deregistered once, in `drop`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; it is read-only after creation.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register_raw`/`register_dmabuf`,
        // deregistered once; after this the device no longer accesses the
        // memory (the kernel invalidates the key before returning).
        let rc = unsafe { (self.pd.ctx.v.dereg_mr)(self.raw.as_ptr()) };
        debug_assert_eq!(rc, 0, "ibv_dereg_mr failed");
    }
}

impl MemoryRegion {
    fn from_raw(raw: NonNull<sys::ibv_mr>, pd: Arc<PdInner>, addr: u64) -> MemoryRegion {
        // SAFETY: the MR was just registered and is live.
        let (len, lkey, rkey) = unsafe {
            let mr = &*raw.as_ptr();
            (mr.length, mr.lkey, mr.rkey)
        };
        MemoryRegion {
            raw,
            addr,
            len,
            lkey,
            rkey,
            pd,
        }
    }

    /// The address the device uses for the region's first byte (the
    /// virtual address for host memory, the IOVA for dma-buf).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key (for [`Sge`]s).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key (for peers' RDMA WRITE/READ).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// What a peer needs to write into this region: send it out of band.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len as u64,
        }
    }

    /// A scatter/gather entry for `len` bytes at `offset` into the region,
    /// checked against its bounds (and the 4 GiB a work request can carry).
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, RdmaError> {
        check_slice(offset, len, self.len, "memory region")?;
        let length = u32::try_from(len).map_err(|_| RdmaError::InvalidArgument {
            what: format!("an SGE carries less than 4 GiB, not {len} bytes"),
        })?;
        Ok(Sge {
            addr: self.addr + offset as u64,
            length,
            lkey: self.lkey,
        })
    }
}

fn check_slice(offset: usize, len: usize, total: usize, what: &str) -> Result<(), RdmaError> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(RdmaError::InvalidArgument {
            what: format!("{len} bytes at offset {offset} lie outside the {total}-byte {what}"),
        }),
    }
}

/// A local buffer of a work request: a range of a registered region (made
/// only by [`MemoryRegion::sge`] or [`RegisteredMemory::sge`], which check
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

impl Sge {
    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> u32 {
        self.length
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    fn raw(&self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
        }
    }
}

/// A peer's registered region, as it sent it out of band: the target of
/// RDMA WRITEs. Nothing here is trusted; the peer's device checks every
/// access against its registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The peer's address of the region's first byte.
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// The target of a write of `len` bytes at `offset`, checked against
    /// the region's length (so that a bad offset fails here, not as a
    /// remote access error that kills the QP).
    pub fn at(&self, offset: u64, len: usize) -> Result<RemoteAddr, RdmaError> {
        // The fields are the peer's: the address may be anything, so its
        // sum with the offset is checked too (no overflow panic or wrap).
        let addr = self.addr.checked_add(offset);
        match (offset.checked_add(len as u64), addr) {
            (Some(end), Some(addr)) if end <= self.len => Ok(RemoteAddr {
                addr,
                rkey: self.rkey,
            }),
            _ => Err(RdmaError::InvalidArgument {
                what: format!(
                    "{len} bytes at offset {offset} lie outside the peer's {}-byte region",
                    self.len
                ),
            }),
        }
    }
}

/// Where an RDMA WRITE lands: a peer's address and remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The peer's address.
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
}

// ====================================================== RegisteredMemory

/// How [`RegisteredMemory`] backs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePolicy {
    /// Ordinary 4 KiB pages.
    #[default]
    Never,
    /// 2 MiB huge pages (`MAP_HUGETLB`) when some are reserved, else
    /// ordinary pages.
    Prefer,
    /// 2 MiB huge pages or an error (reserve some: `/proc/sys/vm/nr_hugepages`).
    Require,
}

/// Options of [`RegisteredMemory::with_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Page backing.
    pub huge_pages: HugePolicy,
    /// Access rights of the registration.
    pub access: Access,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            huge_pages: HugePolicy::Never,
            access: Access::RDMA,
        }
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// An anonymous private mapping, unmapped on drop.
struct AnonMap {
    base: NonNull<u8>,
    mapped_len: usize,
}

// SAFETY: owned exclusively; accessed only through raw pointers and atomics.
unsafe impl Send for AnonMap {}
// SAFETY: as above.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    fn new(len: usize, huge: bool) -> Result<AnonMap, RdmaError> {
        let unit = if huge { HUGE_PAGE } else { page_size() };
        let mapped_len = len.max(1).checked_next_multiple_of(unit).ok_or_else(|| {
            RdmaError::InvalidArgument {
                what: format!("{len} bytes is more than the address space holds"),
            }
        })?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if huge {
            flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        }
        // SAFETY: a null hint lets the kernel choose the address, so no
        // existing mapping is replaced; the mapping is owned by the returned
        // value and unmapped only in its `drop`.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(RdmaError::verbs("mmap", sys::errno()));
        }
        let base = NonNull::new(raw.cast::<u8>()).ok_or_else(|| RdmaError::verbs("mmap", 0))?;
        Ok(AnonMap { base, mapped_len })
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, owned by this value;
        // no reference into it exists (none is ever handed out), and the
        // registration over it was dropped first (field order of
        // `RegisteredMemory`).
        unsafe { libc::munmap(self.base.as_ptr().cast::<c_void>(), self.mapped_len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Zeroed, page-aligned memory of our own, registered with the device:
/// the buffers RDMA reads from and the rings peers write into.
///
/// The device (and peers, through it) writes this memory at any time, so
/// it is reached only through the [`Window`] accessors (copies and 64-bit
/// atomics, every offset checked) — never as `&[u8]`. Work requests name
/// parts of it with [`RegisteredMemory::sge`]; peers get
/// [`RegisteredMemory::remote`].
pub struct RegisteredMemory {
    // Field order matters: the registration is dropped before the memory.
    mr: MemoryRegion,
    /// The transport's checked accessors over the first `len` bytes of
    /// `map` (copies, the fused copy+CRC, 64-bit atomics); it owns nothing.
    view: RawWindow,
    /// Owns the pages `view` reaches: read by nothing, unmapped on drop,
    /// after the registration.
    _map: AnonMap,
    len: usize,
    huge: bool,
}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("len", &self.len)
            .field("huge_pages", &self.huge)
            .field("mr", &self.mr)
            .finish()
    }
}

impl RegisteredMemory {
    /// `len` bytes (at least 1) of zeroed memory on ordinary pages,
    /// registered in `pd` with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    pub fn new(pd: &ProtectionDomain, len: usize) -> Result<RegisteredMemory, RdmaError> {
        RegisteredMemory::with_options(pd, len, &MemoryOptions::default())
    }

    /// [`RegisteredMemory::new`] with a page backing and access rights.
    pub fn with_options(
        pd: &ProtectionDomain,
        len: usize,
        options: &MemoryOptions,
    ) -> Result<RegisteredMemory, RdmaError> {
        let len = len.max(1);
        let (map, huge) = match options.huge_pages {
            HugePolicy::Never => (AnonMap::new(len, false)?, false),
            HugePolicy::Require => (
                AnonMap::new(len, true).map_err(|e| match e {
                    RdmaError::Verbs { errno, .. } => RdmaError::Unsupported {
                        what: format!(
                            "2 MiB huge pages for {len} bytes: {} (reserve some: echo N > \
                             /proc/sys/vm/nr_hugepages)",
                            crate::error::strerror(errno)
                        ),
                    },
                    other => other,
                })?,
                true,
            ),
            HugePolicy::Prefer => match AnonMap::new(len, true) {
                Ok(m) => (m, true),
                Err(_) => (AnonMap::new(len, false)?, false),
            },
        };
        // SAFETY: `map` is a live private mapping of at least `len` bytes,
        // kept alive by the returned value until after the registration
        // (field order), and never referenced as a Rust slice.
        let mr = unsafe { pd.register_raw(map.base.as_ptr(), len, options.access)? };
        // SAFETY: the first `len` bytes of `map` stay mapped while `view`
        // lives (both are fields of the returned value, and `map` is
        // dropped last), and no Rust reference into them is ever formed:
        // all access goes through the window's accessors.
        let view = unsafe { RawWindow::new(map.base, len) };
        Ok(RegisteredMemory {
            mr,
            view,
            _map: map,
            len,
            huge,
        })
    }

    /// The registration (keys, address).
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The address of the first byte (what [`Sge`]s and peers use).
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Whether 2 MiB huge pages back it.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, RdmaError> {
        self.mr.sge(offset, len)
    }

    /// What a peer needs to write into this memory.
    pub fn remote(&self) -> RemoteRegion {
        self.mr.remote()
    }
}

impl Window for RegisteredMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), WindowError> {
        self.view.write(offset, src)
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.view.read(offset, dst)
    }

    /// One pass: each piece of `src` is loaded once, stored into the
    /// registered memory and folded into the CRC (the transport's fused
    /// kernel, as its own windows use).
    fn write_crc(&self, offset: usize, src: &[u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.view.write_crc(offset, src, crc)
    }

    /// One pass, and the CRC is of the bytes as they landed in `dst` even
    /// if the device writes the source meanwhile.
    fn read_crc(&self, offset: usize, dst: &mut [u8], crc: &mut Crc32c) -> Result<(), WindowError> {
        self.view.read_crc(offset, dst, crc)
    }

    fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, WindowError> {
        self.view.load_u64(offset, order)
    }

    fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), WindowError> {
        self.view.store_u64(offset, value, order)
    }

    fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, WindowError> {
        self.view.fetch_add_u64(offset, value, order)
    }
}

// ====================================================== CompletionQueue

struct CqInner {
    raw: NonNull<sys::ibv_cq>,
    depth: u32,
    ctx: Arc<ContextInner>,
}

// SAFETY: a CQ may be polled from any thread (providers lock internally);
// destroyed once, in `drop`.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created in `create_cq`, destroyed once, after every QP
        // that uses it (each holds an `Arc` of this).
        unsafe { (self.ctx.v.destroy_cq)(self.raw.as_ptr()) };
    }
}

/// A completion queue: where finished work requests are reported. Poll it
/// with [`CompletionQueue::poll`] (never blocks) or
/// [`CompletionQueue::wait`] (bounded). Cheap to clone.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.inner.depth)
            .finish_non_exhaustive()
    }
}

/// The operation a completion reports (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A SEND finished (sender side).
    #[default]
    Send,
    /// An RDMA WRITE (with or without immediate) finished (sender side).
    RdmaWrite,
    /// An RDMA READ finished.
    RdmaRead,
    /// A receive consumed by a SEND (receiver side).
    Recv,
    /// A receive consumed by an RDMA WRITE WITH IMM (receiver side).
    RecvRdmaWithImm,
    /// Another opcode.
    Other(u32),
}

impl WcOpcode {
    fn from_code(code: u32) -> WcOpcode {
        match code {
            sys::IBV_WC_SEND => WcOpcode::Send,
            sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            sys::IBV_WC_RECV => WcOpcode::Recv,
            sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }

    /// Whether this completes a posted receive.
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// One finished work request (from `ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The id given when posting.
    pub wr_id: u64,
    /// Success or what failed.
    pub status: WcStatus,
    /// The operation. Valid only on success (error completions may carry
    /// any value here).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// The immediate value (host byte order) when the peer sent one.
    pub imm_data: Option<u32>,
    /// The provider-specific error code.
    pub vendor_err: u32,
    /// The local QP's number.
    pub qp_num: u32,
}

impl WorkCompletion {
    fn from_raw(wc: &sys::ibv_wc) -> WorkCompletion {
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_code(wc.status),
            opcode: WcOpcode::from_code(wc.opcode),
            byte_len: wc.byte_len,
            imm_data: (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
            vendor_err: wc.vendor_err,
            qp_num: wc.qp_num,
        }
    }

    /// `Ok` on success, else [`RdmaError::Completion`] saying what to check.
    pub fn result(&self) -> Result<(), RdmaError> {
        if self.status == WcStatus::Success {
            Ok(())
        } else {
            Err(RdmaError::Completion {
                status: self.status,
                vendor_err: self.vendor_err,
                wr_id: self.wr_id,
            })
        }
    }
}

/// Completions fetched by one call into the provider.
const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// Entries the CQ holds (at least what was asked for).
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Moves up to `out.len()` finished work requests into `out`, returning
    /// how many; 0 when none are ready. Never blocks. Error completions are
    /// returned like others (check [`WorkCompletion::result`]); `Err` only
    /// when the poll itself failed.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, RdmaError> {
        let mut raw = [sys::ibv_wc::default(); POLL_BATCH];
        let mut filled = 0;
        // SAFETY: the CQ and its context are live (held by `self`).
        let poll_cq = unsafe { (*(*self.inner.raw.as_ptr()).context).ops.poll_cq }.ok_or(
            RdmaError::Unsupported {
                what: "the provider has no poll_cq".into(),
            },
        )?;
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: the CQ is live; `raw` has room for `want` entries of
            // the layout the provider writes.
            let n = unsafe { poll_cq(self.inner.raw.as_ptr(), want as c_int, raw.as_mut_ptr()) };
            // A negative return is a provider error code, not an errno
            // (mlx5 returns -2 for any failure): report EIO, not "ENOENT".
            let Ok(n) = usize::try_from(n) else {
                return Err(RdmaError::verbs("ibv_poll_cq", libc::EIO));
            };
            // The provider wrote at most `want` entries; a larger count
            // (a broken provider) must not index beyond them.
            let n = n.min(want);
            for (dst, wc) in out[filled..].iter_mut().zip(&raw[..n]) {
                *dst = WorkCompletion::from_raw(wc);
            }
            filled += n;
            if n < want {
                break;
            }
        }
        Ok(filled)
    }

    /// Polls until at least `min` completions (at most `out.len()`) are in
    /// `out` or `timeout` passes; returns how many. Spins briefly, then
    /// yields between polls. [`RdmaError::Timeout`] if fewer than `min`
    /// arrived (those that did are in `out`, and the error says how many).
    pub fn wait(
        &self,
        out: &mut [WorkCompletion],
        min: usize,
        timeout: Duration,
    ) -> Result<usize, RdmaError> {
        let min = min.min(out.len());
        let start = Instant::now();
        let mut got = 0;
        let mut idle = 0u32;
        loop {
            let n = self.poll(&mut out[got..])?;
            got += n;
            if got >= min {
                return Ok(got);
            }
            if n == 0 {
                idle += 1;
                if idle.is_multiple_of(64) {
                    if start.elapsed() >= timeout {
                        return Err(RdmaError::Timeout {
                            what: format!("{min} completions ({got} arrived)"),
                            after: timeout,
                        });
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

// ============================================================= QueuePair

/// Sizes of a new QP (`ibv_qp_cap`) and its signaling mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receives.
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline (copied at post time, no lkey needed);
    /// the device may grant more, see [`QueuePair::max_inline_data`].
    pub max_inline_data: u32,
    /// Every send generates a completion, whatever its `signaled` flag.
    pub sq_sig_all: bool,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
            sq_sig_all: false,
        }
    }
}

/// What a side of an RC connection tells its peer out of band: its QP
/// number, first packet sequence number and address (GID for RoCE and
/// global routing, LID for InfiniBand).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// QP number.
    pub qp_num: u32,
    /// The first PSN this side sends with (the peer's `rq_psn`).
    pub psn: u32,
    /// The port's GID at the chosen index (zero: LID-routed InfiniBand).
    pub gid: Gid,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
}

/// Connection parameters for [`QueuePair::connect`]. Both sides should
/// agree on MTU; the defaults suit a real fabric, and under slow software
/// RoCE (rxe under emulation) a longer `timeout` (18–20) helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Local port (from 1).
    pub port: u8,
    /// Local GID index to send from (RoCE v2: the entry of type "RoCE v2"
    /// for the interface's address; see [`crate::device`]).
    pub sgid_index: u8,
    /// IP TTL / GRH hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP << 2 for RoCE v2).
    pub traffic_class: u8,
    /// Path MTU; `None` uses the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries before [`WcStatus::RetryExcErr`] (0–7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0–7; 7 = retry forever).
    pub rnr_retry: u8,
    /// RNR NAK timer this side asks peers to wait (an IB table index; 12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs/atomics this side issues.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READs/atomics this side accepts.
    pub max_dest_rd_atomic: u8,
    /// What the peer may do to this side's memory through this QP.
    pub access: Access,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port: 1,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            path_mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: Access::RDMA,
        }
    }
}

/// A QP's state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Fresh or reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    ReadyToReceive,
    /// Ready to send: connected.
    ReadyToSend,
    /// Send queue drain.
    SendQueueDrain,
    /// Send queue error.
    SendQueueError,
    /// Error: every outstanding request is flushed.
    Error,
    /// Another value.
    Other(u32),
}

impl QpState {
    fn from_code(code: u32) -> QpState {
        match code {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::ReadyToReceive,
            sys::IBV_QPS_RTS => QpState::ReadyToSend,
            sys::IBV_QPS_SQD => QpState::SendQueueDrain,
            sys::IBV_QPS_SQE => QpState::SendQueueError,
            sys::IBV_QPS_ERR => QpState::Error,
            other => QpState::Other(other),
        }
    }
}

/// Most SGEs one work request may list here.
pub const MAX_SGE: usize = 16;

/// A reliable-connected queue pair. Create it with
/// [`ProtectionDomain::create_rc_qp`], exchange [`QpEndpoint`]s with the
/// peer out of band, [`connect`](QueuePair::connect), then post. Posting
/// never blocks: a full queue is an `ibv_post_send` ENOMEM error (poll
/// completions first).
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    qp_num: u32,
    cap: sys::ibv_qp_cap,
    ctx: Arc<ContextInner>,
    _pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
}

// SAFETY: a QP may be used from any thread (posting is serialised by the
// provider); destroyed once, in `drop`.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("device", &self.ctx.name)
            .finish_non_exhaustive()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created in `create_rc_qp`, destroyed once; its PD and CQs
        // are still alive (held by this value until after this).
        unsafe { (self.ctx.v.destroy_qp)(self.raw.as_ptr()) };
    }
}

impl QueuePair {
    /// The QP number (what the peer connects to).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Bytes a send may carry inline, as granted by the device.
    pub fn max_inline_data(&self) -> u32 {
        self.cap.max_inline_data
    }

    /// Send-queue depth granted.
    pub fn max_send_wr(&self) -> u32 {
        self.cap.max_send_wr
    }

    /// Receive-queue depth granted.
    pub fn max_recv_wr(&self) -> u32 {
        self.cap.max_recv_wr
    }

    /// This side's [`QpEndpoint`] for `options` (its GID at
    /// `options.sgid_index` and LID on `options.port`), with first PSN
    /// `psn` (random in production, so that a stale peer's packets miss).
    pub fn local_endpoint(
        &self,
        options: &ConnectOptions,
        psn: u32,
    ) -> Result<QpEndpoint, RdmaError> {
        let ctx = Context {
            inner: self.ctx.clone(),
        };
        let port = ctx.query_port(options.port)?;
        let gid = ctx.query_gid(options.port, u32::from(options.sgid_index))?;
        Ok(QpEndpoint {
            qp_num: self.qp_num,
            psn: psn & 0xff_ffff,
            gid,
            lid: port.lid,
        })
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: c_int) -> Result<(), RdmaError> {
        // SAFETY: the QP is live; `attr` is a valid attribute struct whose
        // fields named by `mask` are set.
        let rc = unsafe { (self.ctx.v.modify_qp)(self.raw.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_modify_qp", sys::rc_errno(rc)));
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: the struct is plain integers and a union of integers, for
        // which all-zero is valid.
        unsafe { MaybeUninit::<sys::ibv_qp_attr>::zeroed().assume_init() }
    }

    /// RESET → INIT on `port`, granting peers `access`. Receives may be
    /// posted from here on (post them before the peer starts sending).
    pub fn to_init(&self, port: u8, access: Access) -> Result<(), RdmaError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access.0;
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR (ready to receive) towards `remote`.
    pub fn to_rtr(&self, remote: &QpEndpoint, options: &ConnectOptions) -> Result<(), RdmaError> {
        let mtu = match options.path_mtu {
            Some(m) => m,
            None => {
                let ctx = Context {
                    inner: self.ctx.clone(),
                };
                ctx.query_port(options.port)?
                    .active_mtu
                    .unwrap_or(Mtu::Mtu1024)
            }
        };
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTR;
        a.path_mtu = mtu.code();
        a.dest_qp_num = remote.qp_num;
        a.rq_psn = remote.psn & 0xff_ffff;
        a.max_dest_rd_atomic = options.max_dest_rd_atomic;
        a.min_rnr_timer = options.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = options.port;
        if !remote.gid.is_zero() {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: remote.gid.0 };
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = options.sgid_index;
            a.ah_attr.grh.hop_limit = options.hop_limit;
            a.ah_attr.grh.traffic_class = options.traffic_class;
        }
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS (ready to send), sending from PSN `psn` (the one this side
    /// advertised in its [`QpEndpoint`]).
    pub fn to_rts(&self, psn: u32, options: &ConnectOptions) -> Result<(), RdmaError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTS;
        a.timeout = options.timeout;
        a.retry_cnt = options.retry_cnt;
        a.rnr_retry = options.rnr_retry;
        a.sq_psn = psn & 0xff_ffff;
        a.max_rd_atomic = options.max_rd_atomic;
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// RESET → INIT → RTR → RTS in one call: `local` is what this side sent
    /// the peer (from [`QueuePair::local_endpoint`]), `remote` what the
    /// peer sent. Post receives between INIT and the peer's first send if
    /// the peer may send at once (or use [`QueuePair::to_init`] first and
    /// then this, which skips INIT when already there).
    pub fn connect(
        &self,
        local: &QpEndpoint,
        remote: &QpEndpoint,
        options: &ConnectOptions,
    ) -> Result<(), RdmaError> {
        if self.state()? == QpState::Reset {
            self.to_init(options.port, options.access)?;
        }
        self.to_rtr(remote, options)?;
        self.to_rts(local.psn, options)
    }

    /// The QP's current state (`ibv_query_qp`). An error completion moves
    /// it to [`QpState::Error`].
    pub fn state(&self) -> Result<QpState, RdmaError> {
        let mut a = Self::zeroed_attr();
        // SAFETY: as in `zeroed_attr`.
        let mut init = unsafe { MaybeUninit::<sys::ibv_qp_init_attr>::zeroed().assume_init() };
        // SAFETY: the QP is live; both out-structs are writable.
        let rc = unsafe {
            (self.ctx.v.query_qp)(self.raw.as_ptr(), &mut a, sys::IBV_QP_STATE, &mut init)
        };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_query_qp", sys::rc_errno(rc)));
        }
        Ok(QpState::from_code(a.qp_state))
    }

    fn post(
        &self,
        wr_id: u64,
        opcode: u32,
        sges: &mut [sys::ibv_sge],
        remote: Option<RemoteAddr>,
        imm: Option<u32>,
        flags: u32,
    ) -> Result<(), RdmaError> {
        // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, integers).
        let mut wr = unsafe { MaybeUninit::<sys::ibv_send_wr>::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.next = ptr::null_mut();
        wr.sg_list = if sges.is_empty() {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data = imm.unwrap_or(0).to_be();
        if let Some(r) = remote {
            wr.wr.rdma = sys::ibv_send_wr_rdma {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP and its context are live.
        let post_send =
            unsafe { (*self.ctx.raw.as_ptr()).ops.post_send }.ok_or(RdmaError::Unsupported {
                what: "the provider has no post_send".into(),
            })?;
        // SAFETY: the QP is live; `wr` and its SGE list are valid for the
        // call (the provider copies them into the send queue, and copies
        // inline data out of the caller's memory before returning); every
        // non-inline SGE was made by `MemoryRegion::sge` and names memory
        // registered for the device, which never holds Rust references (if
        // it has been deregistered since, the device fails the request with
        // a protection error instead of touching it).
        let rc = unsafe { post_send(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_post_send", sys::rc_errno(rc)));
        }
        Ok(())
    }

    fn sge_list(&self, local: &[Sge]) -> Result<[sys::ibv_sge; MAX_SGE], RdmaError> {
        if local.len() > MAX_SGE || local.len() > self.cap.max_send_sge as usize {
            return Err(RdmaError::InvalidArgument {
                what: format!(
                    "{} SGEs in one work request; this QP takes {}",
                    local.len(),
                    self.cap.max_send_sge.min(MAX_SGE as u32)
                ),
            });
        }
        let mut list = [sys::ibv_sge::default(); MAX_SGE];
        for (d, s) in list.iter_mut().zip(local) {
            *d = s.raw();
        }
        Ok(list)
    }

    fn flags(signaled: bool) -> u32 {
        if signaled { sys::IBV_SEND_SIGNALED } else { 0 }
    }

    /// Posts an RDMA WRITE of `local` (gathered in order) to `remote`. The
    /// peer sees no completion. Unsignaled writes (`signaled: false`)
    /// complete silently unless they fail; signal one every so often so
    /// that the send queue's slots are freed.
    pub fn post_write(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_WRITE,
            &mut list[..local.len()],
            Some(remote),
            None,
            Self::flags(signaled),
        )
    }

    /// Posts an RDMA WRITE WITH IMMEDIATE: the data lands at `remote`, then
    /// the peer's next posted receive completes with `imm` (host order)
    /// and the byte count. The peer must have a receive posted (a
    /// zero-length one suffices), else the write waits (RNR) and finally
    /// fails with [`WcStatus::RnrRetryExcErr`]. `local` may be empty: a
    /// pure notification.
    pub fn post_write_imm(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        imm: u32,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_WRITE_WITH_IMM,
            &mut list[..local.len()],
            Some(remote),
            Some(imm),
            Self::flags(signaled),
        )
    }

    /// Posts an RDMA WRITE (with immediate when `imm` is given) whose data
    /// is copied out of `data` during this call (`IBV_SEND_INLINE`): no
    /// registration needed, lowest latency for small writes. `data` may be
    /// at most [`QueuePair::max_inline_data`] bytes.
    pub fn post_write_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        remote: RemoteAddr,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        if data.len() > self.cap.max_inline_data as usize {
            return Err(RdmaError::InvalidArgument {
                what: format!(
                    "{} bytes inline; this QP's max_inline_data is {}",
                    data.len(),
                    self.cap.max_inline_data
                ),
            });
        }
        let mut sge = [sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        }];
        let sges: &mut [sys::ibv_sge] = if data.is_empty() { &mut [] } else { &mut sge };
        let opcode = if imm.is_some() {
            sys::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::IBV_WR_RDMA_WRITE
        };
        self.post(
            wr_id,
            opcode,
            sges,
            Some(remote),
            imm,
            Self::flags(signaled) | sys::IBV_SEND_INLINE,
        )
    }

    /// Posts a SEND of `local` (with immediate when `imm` is given): it
    /// consumes the peer's next posted receive, whose buffer must hold it.
    pub fn post_send(
        &self,
        wr_id: u64,
        local: &[Sge],
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut list = self.sge_list(local)?;
        let opcode = if imm.is_some() {
            sys::IBV_WR_SEND_WITH_IMM
        } else {
            sys::IBV_WR_SEND
        };
        self.post(
            wr_id,
            opcode,
            &mut list[..local.len()],
            None,
            imm,
            Self::flags(signaled),
        )
    }

    /// Posts a receive: `Some(sge)` to take a SEND's payload into, `None`
    /// for a zero-length receive (enough for RDMA WRITE WITH IMM, whose
    /// data goes to the address the writer names). Every receive completes
    /// with a completion on the receive CQ.
    pub fn post_recv(&self, wr_id: u64, local: Option<&Sge>) -> Result<(), RdmaError> {
        let mut sge = local.map(Sge::raw).unwrap_or_default();
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: if local.is_some() {
                &mut sge
            } else {
                ptr::null_mut()
            },
            num_sge: c_int::from(local.is_some()),
        };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP and its context are live.
        let post_recv =
            unsafe { (*self.ctx.raw.as_ptr()).ops.post_recv }.ok_or(RdmaError::Unsupported {
                what: "the provider has no post_recv".into(),
            })?;
        // SAFETY: the QP is live; `wr` and `sge` are valid for the call (the
        // provider copies them); the SGE was made by `MemoryRegion::sge` and
        // names registered memory that never holds Rust references.
        let rc = unsafe { post_recv(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(RdmaError::verbs("ibv_post_recv", sys::rc_errno(rc)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_formats_like_sysfs_and_finds_ipv4() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 2, 15]);
        let gid = Gid(g);
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:020f");
        assert_eq!(gid.ipv4(), Some(Ipv4Addr::new(10, 0, 2, 15)));
        assert!(!gid.is_zero());
        assert!(Gid::default().is_zero());
        assert_eq!(Gid::default().ipv4(), None);
    }

    #[test]
    fn mtu_codes_round_trip() {
        for code in 1..=5 {
            let m = Mtu::from_code(code).unwrap();
            assert_eq!(m.code(), code);
            assert_eq!(m.bytes(), 128 << code);
        }
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
    }

    /// The accessors behind `RegisteredMemory`'s `Window` (no device
    /// needed: the same code over the same kind of mapping).
    #[test]
    fn registered_memory_accessors_check_ranges_and_crc_in_one_pass() {
        use barlink_transport::crc::crc32c;
        let map = AnonMap::new(10_000, false).unwrap();
        assert!(map.mapped_len >= 10_000);
        // SAFETY: `map` outlives `w` (both locals, `w` dropped first) and
        // nothing references its bytes.
        let w = unsafe { RawWindow::new(map.base, 10_000) };
        let data: Vec<u8> = (0..9_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        // One-pass copy + CRC, both ways, at an odd offset.
        let mut crc = Crc32c::new();
        w.write_crc(123, &data, &mut crc).unwrap();
        assert_eq!(crc.finish(), crc32c(&data));
        let mut back = vec![0u8; data.len()];
        let mut crc = Crc32c::new();
        w.read_crc(123, &mut back, &mut crc).unwrap();
        assert_eq!(back, data);
        assert_eq!(crc.finish(), crc32c(&data));
        // Ranges: the logical length bounds, not the (larger) mapping.
        let mut crc = Crc32c::new();
        assert!(matches!(
            w.write_crc(1_001, &data, &mut crc),
            Err(WindowError::OutOfBounds { .. })
        ));
        assert!(w.read(9_999, &mut [0u8; 2]).is_err());
        assert!(w.read(usize::MAX, &mut [0u8; 1]).is_err());
        assert!(w.write(10_000, &[]).is_ok());
        assert!(w.write(10_001, &[]).is_err());
        // Words: aligned and in range.
        assert!(matches!(
            w.load_u64(4, Ordering::Acquire),
            Err(WindowError::Misaligned { .. })
        ));
        assert!(w.load_u64(9_992, Ordering::Acquire).is_ok());
        assert!(w.load_u64(9_996, Ordering::Acquire).is_err());
        w.store_u64(8, 0x0102_0304_0506_0708, Ordering::Release)
            .unwrap();
        let mut bytes = [0u8; 8];
        w.read(8, &mut bytes).unwrap();
        assert_eq!(u64::from_le_bytes(bytes), 0x0102_0304_0506_0708);
    }

    #[test]
    fn remote_region_checks_bounds() {
        let r = RemoteRegion {
            addr: 0x1000,
            rkey: 5,
            len: 100,
        };
        assert_eq!(
            r.at(10, 90).unwrap(),
            RemoteAddr {
                addr: 0x100a,
                rkey: 5
            }
        );
        assert!(r.at(10, 91).is_err());
        assert!(r.at(u64::MAX, 1).is_err());
        // A peer's region whose address would wrap: an error, not a panic.
        let high = RemoteRegion {
            addr: u64::MAX - 10,
            rkey: 5,
            len: 100,
        };
        assert!(high.at(5, 1).is_ok());
        assert!(high.at(20, 1).is_err());
    }
}
