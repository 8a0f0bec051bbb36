//! The C ABI of libibverbs that this crate uses, and the loader that opens
//! the library at run time.
//!
//! Nothing here is linked at build time: `libibverbs.so.1` is opened with
//! `dlopen` (through `libloading`) on first use, as NCCL does with its own
//! `ibvcore.h`, so the crate builds with only Rust and a C compiler and a
//! binary starts on hosts without RDMA libraries. A missing library or
//! symbol becomes [`RdmaError::NotAvailable`] naming it.
//!
//! The `#[repr(C)]` definitions below are written by hand from rdma-core's
//! `verbs.h` (rdma-core 44, Debian 12), and only for what the crate uses.
//! Structs whose tails we never touch are still defined in full so that
//! their sizes match. The layout test at the bottom (`layout`) compiles a C
//! program against the real header, when one is installed, and compares
//! every size and offset used here (`scripts/rdma-layout.sh` installs the
//! header and runs it).
//!
//! ABI notes:
//! - `ibv_query_port` and `ibv_reg_mr` are macros in current headers; the
//!   exported functions of the same name (symbol version IBVERBS_1.1, the
//!   default that `dlsym` returns) are the fallbacks those macros call, so
//!   calling them directly is supported. `ibv_query_port`'s export fills a
//!   prefix of `ibv_port_attr` (up to `link_layer`): zero the struct first.
//! - `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline`
//!   in the header: they call through `context->ops`, and so do we.
//! - `ibv_reg_dmabuf_mr` is IBVERBS_1.12 (rdma-core 34 and later); it is
//!   optional here, and its absence is reported as unsupported.
#![allow(unsafe_code)]
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::RdmaError;

/// The library names tried, in order.
pub(crate) const LIBRARY_NAMES: [&str; 2] = ["libibverbs.so.1", "libibverbs.so"];

// ------------------------------------------------------------------ consts

pub(crate) const IBV_SYSFS_NAME_MAX: usize = 64;
pub(crate) const IBV_SYSFS_PATH_MAX: usize = 256;

// enum ibv_qp_type
pub(crate) const IBV_QPT_RC: c_uint = 2;

// enum ibv_qp_state
pub(crate) const IBV_QPS_RESET: c_uint = 0;
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
pub(crate) const IBV_QPS_SQD: c_uint = 4;
pub(crate) const IBV_QPS_SQE: c_uint = 5;
pub(crate) const IBV_QPS_ERR: c_uint = 6;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_CAP: c_int = 1 << 19;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;

// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub(crate) const IBV_WR_SEND: c_uint = 2;
pub(crate) const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub(crate) const IBV_WR_RDMA_READ: c_uint = 4;

// enum ibv_send_flags
pub(crate) const IBV_SEND_FENCE: c_uint = 1 << 0;
pub(crate) const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub(crate) const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub(crate) const IBV_SEND_INLINE: c_uint = 1 << 3;

// enum ibv_wc_flags
pub(crate) const IBV_WC_GRH: c_uint = 1 << 0;
pub(crate) const IBV_WC_WITH_IMM: c_uint = 1 << 1;

// enum ibv_wc_opcode (the values the crate names)
pub(crate) const IBV_WC_SEND: c_uint = 0;
pub(crate) const IBV_WC_RDMA_WRITE: c_uint = 1;
pub(crate) const IBV_WC_RDMA_READ: c_uint = 2;
pub(crate) const IBV_WC_RECV: c_uint = 1 << 7;
pub(crate) const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

// enum ibv_port_state
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;
// IBV_LINK_LAYER_*
pub(crate) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// ------------------------------------------------------------------ structs

/// `struct _ibv_device_ops`: two pointers the library uses internally.
#[repr(C)]
pub(crate) struct _ibv_device_ops {
    pub(crate) _dummy1: *mut c_void,
    pub(crate) _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub(crate) struct ibv_device {
    pub(crate) _ops: _ibv_device_ops,
    pub(crate) node_type: c_int,
    pub(crate) transport_type: c_int,
    pub(crate) name: [c_char; IBV_SYSFS_NAME_MAX],
    pub(crate) dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub(crate) dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub(crate) ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A function pointer slot of `ibv_context_ops` that this crate never calls.
pub(crate) type OpaqueFn = *mut c_void;

pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`: the provider's data-path entry points (the
/// `static inline` `ibv_post_send`/`ibv_post_recv`/`ibv_poll_cq` call
/// these). Slots the crate does not use are opaque pointers.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    pub(crate) _compat_query_device: OpaqueFn,
    pub(crate) _compat_query_port: OpaqueFn,
    pub(crate) _compat_alloc_pd: OpaqueFn,
    pub(crate) _compat_dealloc_pd: OpaqueFn,
    pub(crate) _compat_reg_mr: OpaqueFn,
    pub(crate) _compat_rereg_mr: OpaqueFn,
    pub(crate) _compat_dereg_mr: OpaqueFn,
    pub(crate) alloc_mw: OpaqueFn,
    pub(crate) bind_mw: OpaqueFn,
    pub(crate) dealloc_mw: OpaqueFn,
    pub(crate) _compat_create_cq: OpaqueFn,
    pub(crate) poll_cq: Option<PollCqFn>,
    pub(crate) req_notify_cq: OpaqueFn,
    pub(crate) _compat_cq_event: OpaqueFn,
    pub(crate) _compat_resize_cq: OpaqueFn,
    pub(crate) _compat_destroy_cq: OpaqueFn,
    pub(crate) _compat_create_srq: OpaqueFn,
    pub(crate) _compat_modify_srq: OpaqueFn,
    pub(crate) _compat_query_srq: OpaqueFn,
    pub(crate) _compat_destroy_srq: OpaqueFn,
    pub(crate) post_srq_recv: OpaqueFn,
    pub(crate) _compat_create_qp: OpaqueFn,
    pub(crate) _compat_query_qp: OpaqueFn,
    pub(crate) _compat_modify_qp: OpaqueFn,
    pub(crate) _compat_destroy_qp: OpaqueFn,
    pub(crate) post_send: Option<PostSendFn>,
    pub(crate) post_recv: Option<PostRecvFn>,
    pub(crate) _compat_create_ah: OpaqueFn,
    pub(crate) _compat_destroy_ah: OpaqueFn,
    pub(crate) _compat_attach_mcast: OpaqueFn,
    pub(crate) _compat_detach_mcast: OpaqueFn,
    pub(crate) _compat_async_event: OpaqueFn,
}

/// `struct ibv_context`.
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) abi_compat: *mut c_void,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_int,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

/// `union ibv_gid` (the `global` view is only there for the alignment).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union ibv_gid {
    pub(crate) raw: [u8; 16],
    pub(crate) global: [u64; 2],
}

/// `struct ibv_pd`.
#[repr(C)]
pub(crate) struct ibv_pd {
    pub(crate) context: *mut ibv_context,
    pub(crate) handle: u32,
}

/// `struct ibv_comp_channel` (never dereferenced: always null here).
pub(crate) enum ibv_comp_channel {}

/// `struct ibv_cq`.
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut ibv_comp_channel,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) cond: libc::pthread_cond_t,
    pub(crate) comp_events_completed: u32,
    pub(crate) async_events_completed: u32,
}

/// `struct ibv_srq` (never dereferenced: always null here).
pub(crate) enum ibv_srq {}

/// `struct ibv_qp`.
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) cond: libc::pthread_cond_t,
    pub(crate) events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_send_wr_rdma {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr` (the union's largest member).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_send_wr_atomic {
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) rkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (`ud` is smaller than `atomic`
/// and not used here).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union ibv_send_wr_wr {
    pub(crate) rdma: ibv_send_wr_rdma,
    pub(crate) atomic: ibv_send_wr_atomic,
}

/// `struct ibv_send_wr`. The anonymous `imm_data`/`invalidate_rkey` union
/// is `imm_data` (network byte order); the trailing anonymous union
/// (`bind_mw`, `tso`) is opaque, sized as `bind_mw`.
#[repr(C)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    pub(crate) imm_data: u32,
    pub(crate) wr: ibv_send_wr_wr,
    pub(crate) qp_type: u32,
    pub(crate) bind_mw: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

/// `struct ibv_wc`. `imm_data` is in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

// ------------------------------------------------------------------ loader

/// The entry points of libibverbs this crate calls, resolved once.
pub(crate) struct Verbs {
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub(crate) get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    pub(crate) open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub(crate) create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub(crate) query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    /// IBVERBS_1.12; `None` on older libraries.
    pub(crate) reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// Which file was opened (for messages).
    pub(crate) library: &'static str,
    /// Keeps the library mapped for the life of the process (never closed:
    /// providers register atexit handlers and threads).
    _lib: libloading::Library,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// libibverbs, loaded on first use; the error (library or symbol missing)
/// is remembered, so every call reports the same reason.
pub(crate) fn verbs() -> Result<&'static Verbs, RdmaError> {
    static VERBS: OnceLock<Result<Verbs, RdmaError>> = OnceLock::new();
    VERBS.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Verbs, RdmaError> {
    let mut errors = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading libibverbs runs its ELF constructors, which only
        // initialise the library's own state (no symbol interposition of
        // ours, no Rust objects touched); it is the library this module's
        // declarations describe.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return resolve(lib, name),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(RdmaError::NotAvailable {
        reason: format!("cannot load libibverbs ({})", errors.join("; ")),
    })
}

fn resolve(lib: libloading::Library, library: &'static str) -> Result<Verbs, RdmaError> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is looked up by its C name, and the field
            // it is stored in has the signature verbs.h declares for it
            // (checked by hand; the structs they take are checked by the
            // layout test). The pointer is copied out of the `Symbol` and
            // stays valid because the `Library` is kept in `Verbs` forever.
            match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                Ok(s) => *s,
                Err(e) => {
                    return Err(RdmaError::NotAvailable {
                        reason: format!("{library} lacks the symbol {}: {e}", $name),
                    });
                }
            }
        }};
    }
    // SAFETY: as in `sym!`; a missing optional symbol is `None`.
    let reg_dmabuf_mr = unsafe { lib.get(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s);
    Ok(Verbs {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        get_device_guid: sym!("ibv_get_device_guid"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_device: sym!("ibv_query_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        query_qp: sym!("ibv_query_qp"),
        reg_mr: sym!("ibv_reg_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        reg_dmabuf_mr,
        library,
        _lib: lib,
    })
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The error number of a verbs call that returns `int`: rdma-core returns
/// the errno value itself (positive) from most, `-1` with `errno` set from
/// a few.
pub(crate) fn rc_errno(rc: c_int) -> i32 {
    if rc > 0 { rc } else { errno() }
}

// ------------------------------------------------------------ layout check

#[cfg(test)]
mod layout {
    //! Compares every size and offset above with the real `verbs.h`, by
    //! compiling a C program that prints them. Needs the header
    //! (`libibverbs-dev`) and `gcc`; without them it says SKIPPED.
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::mem::{offset_of, size_of};
    use std::path::Path;
    use std::process::Command;

    const HEADER: &str = "/usr/include/infiniband/verbs.h";

    macro_rules! table {
        ( types { $( $kind:ident $ty:ident { $( $($f:ident).+ ),* } )* }
          consts { $( $c:ident ),* } ) => {
            fn rust_values() -> BTreeMap<String, i128> {
                let mut m = BTreeMap::new();
                $(
                    m.insert(format!("sizeof {}", stringify!($ty)), size_of::<$ty>() as i128);
                    $(
                        m.insert(
                            format!("{}.{}", stringify!($ty), stringify!($($f).+).replace(' ', "")),
                            offset_of!($ty, $($f).+) as i128,
                        );
                    )*
                )*
                $( m.insert(stringify!($c).to_string(), $c as i128); )*
                m
            }
            fn c_program() -> String {
                let mut s = String::from(
                    "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
                );
                $(
                    s += &format!(
                        "printf(\"sizeof {ty} %zu\\n\", sizeof({kind} {ty}));\n",
                        ty = stringify!($ty), kind = stringify!($kind),
                    );
                    $(
                        let path = stringify!($($f).+).replace(' ', "");
                        s += &format!(
                            "printf(\"{ty}.{path} %zu\\n\", offsetof({kind} {ty}, {path}));\n",
                            ty = stringify!($ty), kind = stringify!($kind),
                        );
                    )*
                )*
                $(
                    s += &format!(
                        "printf(\"{c} %lld\\n\", (long long)({c}));\n",
                        c = stringify!($c),
                    );
                )*
                s + "return 0;\n}\n"
            }
        };
    }

    table! {
        types {
            struct ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
            struct ibv_context_ops { poll_cq, post_send, post_recv, _compat_async_event }
            struct ibv_context { device, ops, ops.poll_cq, ops.post_send, ops.post_recv, cmd_fd,
                                 async_fd, num_comp_vectors, mutex, abi_compat }
            struct ibv_device_attr { fw_ver, node_guid, sys_image_guid, max_mr_size, vendor_id,
                                     vendor_part_id, hw_ver, max_qp, max_qp_wr, max_sge, max_cq,
                                     max_cqe, max_mr, max_pd, max_qp_rd_atom, max_qp_init_rd_atom,
                                     atomic_cap, max_srq_sge, max_pkeys, local_ca_ack_delay,
                                     phys_port_cnt }
            struct ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags,
                                   max_msg_sz, pkey_tbl_len, lid, sm_lid, active_width,
                                   active_speed, phys_state, link_layer, flags, port_cap_flags2 }
            union ibv_gid { raw }
            struct ibv_pd { context, handle }
            struct ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond,
                            comp_events_completed, async_events_completed }
            struct ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num,
                            state, qp_type, mutex, cond, events_completed }
            struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
                                max_inline_data }
            struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, cap.max_inline_data,
                                      qp_type, sq_sig_all }
            struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
            struct ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
            struct ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
                                 sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr,
                                 ah_attr.grh.dgid, ah_attr.grh.sgid_index, ah_attr.grh.hop_limit,
                                 ah_attr.grh.traffic_class, ah_attr.dlid, ah_attr.is_global,
                                 ah_attr.port_num, alt_ah_attr, pkey_index, alt_pkey_index,
                                 en_sqd_async_notify, sq_draining, max_rd_atomic,
                                 max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
                                 rnr_retry, alt_port_num, alt_timeout, rate_limit }
            struct ibv_sge { addr, length, lkey }
            struct ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr,
                                 wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic.rkey, qp_type,
                                 bind_mw }
            struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
            struct ibv_wc { wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
                            wc_flags, pkey_index, slid, sl, dlid_path_bits }
            struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        }
        consts {
            IBV_SYSFS_NAME_MAX, IBV_SYSFS_PATH_MAX, IBV_QPT_RC,
            IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE,
            IBV_QPS_ERR,
            IBV_QP_STATE, IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV,
            IBV_QP_PATH_MTU, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
            IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
            IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_CAP, IBV_QP_DEST_QPN,
            IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
            IBV_ACCESS_REMOTE_ATOMIC,
            IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
            IBV_WR_RDMA_READ,
            IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE,
            IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ,
            IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM,
            IBV_PORT_ACTIVE, IBV_LINK_LAYER_UNSPECIFIED, IBV_LINK_LAYER_INFINIBAND,
            IBV_LINK_LAYER_ETHERNET
        }
    }

    #[test]
    fn layout_matches_verbs_h() {
        if !Path::new(HEADER).exists() {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED layout_matches_verbs_h: no {HEADER} (install libibverbs-dev, or run \
                 scripts/rdma-layout.sh)"
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("barlink-rdma-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c_program()).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
        let built = match Command::new(&cc).arg("-o").arg(&exe).arg(&src).output() {
            Ok(out) => out,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED layout_matches_verbs_h: cannot run the C compiler {cc}: {e}"
                );
                return;
            }
        };
        assert!(
            built.status.success(),
            "{cc} failed on the layout program ({}):\n{}",
            src.display(),
            String::from_utf8_lossy(&built.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let mut c = BTreeMap::new();
        for line in text.lines() {
            let (k, v) = line.rsplit_once(' ').unwrap();
            c.insert(k.to_string(), v.parse::<i128>().unwrap());
        }
        let rust = rust_values();
        assert_eq!(
            c.len(),
            rust.len(),
            "the C program printed a different set of entries"
        );
        let mismatches: Vec<String> = rust
            .iter()
            .filter(|(k, v)| c.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: Rust {v}, C {:?}", c.get(k)))
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            mismatches.is_empty(),
            "the ABI definitions in rdma/src/sys.rs differ from {HEADER}:\n  {}",
            mismatches.join("\n  ")
        );
        println!(
            "layout: {} sizes, offsets and constants match {HEADER}",
            rust.len()
        );
    }
}
