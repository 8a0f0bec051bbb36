//! [`Context`]: an open device, the root of the verbs object tree, and its
//! queries (device and port attributes, GIDs).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use super::device_list::{device_name, with_device_list};
use super::values::{DeviceAttr, Gid, LinkLayer, Mtu, PortAttr, PortState};
use crate::error::RdmaError;
use crate::sys::{self, Verbs};

pub(super) struct ContextInner {
    pub(super) raw: NonNull<sys::ibv_context>,
    pub(super) name: String,
    node_guid: u64,
    pub(super) v: &'static Verbs,
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
    pub(super) inner: Arc<ContextInner>,
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
}
