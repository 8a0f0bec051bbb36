//! The types of the C ABI, exactly as the header declares them.
//!
//! Layout rules (docs/FFI.md, "Versioning"): status codes and constants keep
//! their numbers forever; structs that may grow (`barlink_config`,
//! `barlink_stats`) start with `struct_size` and only ever gain fields at
//! their end; `barlink_completion` is frozen.
#![forbid(unsafe_code)]
// The names are the C names: the header is generated from them.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// Major version of the C ABI: it changes only when a program built against
/// an older header could break. Compare with `barlink_abi_version() >> 16`.
pub const BARLINK_ABI_VERSION_MAJOR: u32 = 0;
/// Minor version of the C ABI: grows when functions, status codes or struct
/// fields are added, or when what a call does within its meaning changes
/// in a way a program may see (0.15: a long `barlink_send` returns before
/// its last packets are acknowledged).
pub const BARLINK_ABI_VERSION_MINOR: u32 = 15;

/// Config flag: back the ring windows with 2 MiB huge pages when the
/// administrator reserved enough, else transparent huge pages.
pub const BARLINK_CONFIG_HUGE_PAGES: u32 = 1;
/// Config flag: admit a peer of any local user (for a service that serves
/// every user and checks them by other means). Without it only the same
/// user, `allow_uids`/`allow_gids` and `BARLINK_ALLOW_UIDS`/`_GIDS` are.
pub const BARLINK_CONFIG_ALLOW_ANY_USER: u32 = 2;
/// Config flag: drive the link from a thread of its own, so packets move,
/// acknowledgements go out and peer loss is noticed while the caller
/// computes between calls (by default the caller's calls drive it).
pub const BARLINK_CONFIG_PROGRESS_THREAD: u32 = 4;
/// Most entries of `allow_uids` and of `allow_gids`.
pub const BARLINK_MAX_ALLOWED_IDS: usize = 8;

/// What every barlink function returns. The numbers are stable: new codes
/// are only ever added. A C program must expect codes it does not know
/// (treat them as errors); `barlink_status_string` names any code.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum barlink_status {
    /// Success.
    BARLINK_OK = 0,
    /// Nothing happened within the timeout; the link is still usable.
    BARLINK_TIMEOUT = 1,
    /// A non-blocking call could not proceed now (the send queue is full):
    /// drive progress (`barlink_poll`) and retry.
    BARLINK_WOULD_BLOCK = 2,
    /// The request has not completed yet (`barlink_test`).
    BARLINK_PENDING = 3,
    /// The link was closed in order, by this side or by the peer.
    BARLINK_CLOSED = 4,
    /// The peer stopped answering (it died, or the path fails one way).
    BARLINK_PEER_LOST = 5,
    /// The link failed: the peer broke the protocol, a packet could not be
    /// delivered intact after every retransmission, or the medium failed.
    BARLINK_LINK_FAILED = 6,
    /// An argument is wrong (a null pointer where one is needed, a bad
    /// length or range, an unknown flag); nothing was done.
    BARLINK_INVALID_ARGUMENT = 7,
    /// The handle is null, was closed, or is not a barlink handle of the
    /// expected kind; nothing was done.
    BARLINK_INVALID_HANDLE = 8,
    /// The caller's buffer cannot hold the message; the needed size was
    /// reported and the message is kept for the next call.
    BARLINK_BUFFER_TOO_SMALL = 9,
    /// The message is longer than the link's `max_message_bytes`.
    BARLINK_MESSAGE_TOO_LONG = 10,
    /// The object is in use (a registered buffer with sends in flight).
    BARLINK_BUSY = 11,
    /// The requested transport is not available in this build or on this
    /// machine.
    BARLINK_NOT_AVAILABLE = 12,
    /// A struct comes from a newer header and sets fields this library does
    /// not know.
    BARLINK_UNSUPPORTED_VERSION = 13,
    /// Another live process listens under the link name.
    BARLINK_NAME_IN_USE = 14,
    /// Nobody listens under the link name.
    BARLINK_NO_LISTENER = 15,
    /// Setting up the link failed (the peer runs an incompatible version,
    /// its windows are unusable, or the handshake broke off).
    BARLINK_SETUP_FAILED = 16,
    /// A system call failed (the message says which and why).
    BARLINK_IO_ERROR = 17,
    /// Memory could not be allocated.
    BARLINK_OUT_OF_MEMORY = 18,
    /// A bug in barlink was caught at the boundary; the message says where.
    /// The handle involved may be unusable: close it.
    BARLINK_INTERNAL = 19,
    /// The other side is a process of a user this side does not admit, or
    /// it does not admit ours; nothing was exchanged. The message names
    /// its uid and pid.
    BARLINK_PEER_NOT_ALLOWED = 20,
    /// A posted receive was cancelled (`barlink_cancel`) before a message
    /// completed it: its completion's status. (ABI 0.9.)
    BARLINK_CANCELED = 21,
}

/// Which medium a link uses (`barlink_config.transport`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum barlink_transport {
    /// The path barlink picks for the peer: shared memory for a link name,
    /// RDMA for an address where this host has an RDMA device, else TCP.
    BARLINK_TRANSPORT_DEFAULT = 0,
    /// Shared-memory windows between processes on one host (memfd): what a
    /// link name gets.
    BARLINK_TRANSPORT_SHM = 1,
    /// The two BAR windows `own_bar` and `peer_bar` name, and nothing else:
    /// packets written straight into the peer device's BAR, whatever the
    /// topology says (the default asks it first and may bounce through host
    /// memory; `barlink_link_path` says what it would have picked).
    BARLINK_TRANSPORT_BAR = 2,
    /// RDMA over ibverbs, and nothing else: an address without an RDMA
    /// device here is `BARLINK_NOT_AVAILABLE` rather than TCP.
    BARLINK_TRANSPORT_RDMA = 3,
}

/// How to set up a link. Call `barlink_config_init` (or zero it and set
/// `struct_size = sizeof(barlink_config)`): every field left zero takes its
/// default. Later versions only add fields at the end.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct barlink_config {
    /// `sizeof(barlink_config)` as the caller's header declares it.
    pub struct_size: u32,
    /// A `barlink_transport` value; 0 = default (shared memory).
    pub transport: u32,
    /// Bytes of each side's receive ring window (at most 4 GiB); 0 =
    /// default (4 MiB plus the control block). Packets in flight: as many as
    /// the ring holds, 4 to 256.
    pub window_bytes: u64,
    /// Longest message either side sends; 0 = default (1 GiB). Both sides
    /// should agree.
    pub max_message_bytes: u64,
    /// Largest packet, header included (256 to 16 MiB); 0 = default (128
    /// KiB: a 64 KiB message is one packet). Both sides must agree.
    pub mtu: u32,
    /// Silence after which the peer counts as lost, in ms; 0 = default
    /// (2000).
    pub peer_timeout_ms: u32,
    /// `BARLINK_CONFIG_*` bits; unknown bits are refused.
    pub flags: u32,
    /// Must be zero.
    pub reserved: u32,
    /// Further users admitted as the peer of a local link (a process of the
    /// same user always is): the first `allow_uid_count` entries count.
    pub allow_uids: [u32; BARLINK_MAX_ALLOWED_IDS],
    /// Entries of `allow_uids` in use (0 to 8).
    pub allow_uid_count: u32,
    /// Peers whose primary group is one of these are admitted.
    pub allow_gids: [u32; BARLINK_MAX_ALLOWED_IDS],
    /// Entries of `allow_gids` in use (0 to 8).
    pub allow_gid_count: u32,
    /// The BAR window this side's ring lives in, for a peer on this host
    /// reached over PCIe BARs: `DEVICE/BAR@OFFSET+LEN`, e.g.
    /// `0000:01:00.0/1@0+8M` (the device as `barlink topo` names it; bytes
    /// in decimal, `0x` hex or with K, M, G). NULL: none. Needs `peer_bar`;
    /// the peer names the same two windows, swapped. Read during the call
    /// only.
    pub own_bar: *const c_char,
    /// The BAR window the peer's ring lives in (which this side writes),
    /// as `own_bar`. NULL: none.
    pub peer_bar: *const c_char,
    /// The root the PCI topology and the BARs' `resourceN` files are read
    /// under; NULL: `/` (a fixture tree in tests).
    pub sysfs_root: *const c_char,
    /// Most bytes of memory in the message copies barlink keeps for
    /// `barlink_send` and `barlink_post_send` until the peer acknowledges
    /// them, as a socket's send buffer: beyond it `barlink_send` waits and
    /// `barlink_post_send` returns `BARLINK_WOULD_BLOCK`. A message larger
    /// than the limit still goes when no copy is held. 0 = default (four
    /// ring windows or 64 MiB, whichever is more). Zero-copy sends from
    /// registered buffers do not count. (ABI 0.7.)
    pub send_queue_bytes: u64,
}

impl Default for barlink_config {
    /// Every field zero, every pointer NULL: the defaults, once
    /// `struct_size` is set.
    fn default() -> Self {
        barlink_config {
            struct_size: 0,
            transport: 0,
            window_bytes: 0,
            max_message_bytes: 0,
            mtu: 0,
            peer_timeout_ms: 0,
            flags: 0,
            reserved: 0,
            allow_uids: [0; BARLINK_MAX_ALLOWED_IDS],
            allow_uid_count: 0,
            allow_gids: [0; BARLINK_MAX_ALLOWED_IDS],
            allow_gid_count: 0,
            own_bar: std::ptr::null(),
            peer_bar: std::ptr::null(),
            sysfs_root: std::ptr::null(),
            send_queue_bytes: 0,
        }
    }
}

/// Counters of one link since it was set up (`barlink_get_stats`). Set
/// `struct_size` before the call; barlink fills as many fields as fit and
/// writes back how many bytes it filled. Later versions only add fields at
/// the end.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct barlink_stats {
    /// In: `sizeof(barlink_stats)` as the caller's header declares it.
    /// Out: the bytes barlink filled.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// Messages the peer acknowledged whole.
    pub messages_sent: u64,
    /// Bytes of the messages the peer acknowledged whole.
    pub message_bytes_sent: u64,
    /// Messages delivered to this side (taken or not yet taken).
    pub messages_received: u64,
    /// Bytes of the messages delivered to this side.
    pub message_bytes_received: u64,
    /// Packets handed to the medium, every kind, retransmissions included.
    pub packets_sent: u64,
    /// Packets that arrived and passed every check.
    pub packets_received: u64,
    /// Retransmissions, whatever their cause.
    pub retransmits: u64,
    /// Packets that arrived with a CRC-32C that did not match.
    pub crc_failures: u64,
    /// Packets refused for any other structural fault.
    pub malformed: u64,
    /// Data packets that had already arrived, dropped.
    pub duplicates: u64,
    /// Times the sender had data but no credit or window to send it.
    pub credit_stalls: u64,
    /// Non-blocking sends posted and not yet reported complete.
    pub requests_in_flight: u64,
    /// Messages received in place (`barlink_recv_message`) and not yet
    /// given back with `barlink_release_message`. Since ABI version 0.5.
    pub messages_held: u64,
    /// Data packets whose payload the RDMA adapter read in place from a
    /// registered buffer (`barlink_post_send_buffer`), copying nothing; 0
    /// on other paths. Since ABI version 0.6.
    pub packets_sent_in_place: u64,
    /// Payload bytes of those packets. Since ABI version 0.6.
    pub bytes_sent_in_place: u64,
    /// Messages of `barlink_send` and `barlink_post_send` whose bytes
    /// barlink copied: every `barlink_post_send`, a short `barlink_send`,
    /// a long one the peer did not acknowledge in time (from its first
    /// packet not acknowledged in order on; when that was under two
    /// packets' payload, the message counts as lent instead), and over
    /// RDMA one from a registered buffer. Counted as the copy is made.
    /// Since ABI version 0.8.
    pub messages_copied: u64,
    /// Long `barlink_send` messages the peer acknowledged while barlink
    /// read them from the caller's memory, copying nothing, or nothing
    /// but their last full packet and the short one after it, copied as
    /// the call returned (on links over rings, since ABI 0.15); counted
    /// when the message completes (possibly after its call returned). A
    /// lent message whose link ended first counts in neither. Since ABI
    /// version 0.8.
    pub messages_lent: u64,
    /// Messages that landed in the caller's memory as they arrived, a
    /// `barlink_post_recv` buffer or a `barlink_recv` one, with no copy
    /// after the checked one out of the medium. A message that began
    /// arriving before its buffer was posted is copied into it instead,
    /// and counts in `messages_received` only. Since ABI version 0.10.
    pub messages_landed: u64,
}

/// One finished non-blocking send or receive (`barlink_poll`). This struct
/// is frozen: it never changes size or layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct barlink_completion {
    /// The id `barlink_post_send*` or `barlink_post_recv` returned.
    pub request: u64,
    /// The caller's tag given with the request.
    pub user_tag: u64,
    /// The message's length in bytes (for a receive too small: the length
    /// needed).
    pub bytes: u64,
    /// A send: `BARLINK_OK` when the peer acknowledged the whole message;
    /// otherwise why it will not be delivered (the link ended). A receive:
    /// `BARLINK_OK` when the message is in the buffer,
    /// `BARLINK_BUFFER_TOO_SMALL`, or why the link ended. Either way barlink
    /// no longer reads or writes the request's memory.
    pub status: barlink_status,
    /// Zero.
    pub reserved: u32,
}

/// A message received in place (`barlink_recv_message`): `len` bytes at
/// `data`, in barlink's memory. Read it there; do not write or free it.
/// It stays valid until `barlink_release_message` gives it back or the
/// link is closed. This struct is frozen: it never changes size or layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct barlink_message {
    /// The message's first byte (not NULL, even for an empty message).
    pub data: *const c_void,
    /// The message's length in bytes.
    pub len: usize,
    /// Which message this is, for `barlink_release_message`.
    pub id: u64,
}

/// A link between two processes. Opaque: never dereferenced by anyone, not
/// even barlink (the value is a registry key).
#[derive(Debug)]
pub struct barlink_link {
    _private: [u8; 0],
}

/// A listening name that accepts links. Opaque.
#[derive(Debug)]
pub struct barlink_listener {
    _private: [u8; 0],
}

/// Caller memory registered for zero-copy sends. Opaque.
#[derive(Debug)]
pub struct barlink_buffer {
    _private: [u8; 0],
}

impl barlink_status {
    /// A short, stable description of the code.
    pub fn describe(code: i32) -> &'static std::ffi::CStr {
        use barlink_status::*;
        let status = match code {
            0 => BARLINK_OK,
            1 => BARLINK_TIMEOUT,
            2 => BARLINK_WOULD_BLOCK,
            3 => BARLINK_PENDING,
            4 => BARLINK_CLOSED,
            5 => BARLINK_PEER_LOST,
            6 => BARLINK_LINK_FAILED,
            7 => BARLINK_INVALID_ARGUMENT,
            8 => BARLINK_INVALID_HANDLE,
            9 => BARLINK_BUFFER_TOO_SMALL,
            10 => BARLINK_MESSAGE_TOO_LONG,
            11 => BARLINK_BUSY,
            12 => BARLINK_NOT_AVAILABLE,
            13 => BARLINK_UNSUPPORTED_VERSION,
            14 => BARLINK_NAME_IN_USE,
            15 => BARLINK_NO_LISTENER,
            16 => BARLINK_SETUP_FAILED,
            17 => BARLINK_IO_ERROR,
            18 => BARLINK_OUT_OF_MEMORY,
            19 => BARLINK_INTERNAL,
            20 => BARLINK_PEER_NOT_ALLOWED,
            21 => BARLINK_CANCELED,
            _ => return c"BARLINK_UNKNOWN_STATUS: a status code this library does not know",
        };
        match status {
            BARLINK_OK => c"BARLINK_OK: success",
            BARLINK_TIMEOUT => c"BARLINK_TIMEOUT: nothing happened within the timeout",
            BARLINK_WOULD_BLOCK => {
                c"BARLINK_WOULD_BLOCK: cannot proceed now; drive progress and retry"
            }
            BARLINK_PENDING => c"BARLINK_PENDING: the request has not completed yet",
            BARLINK_CLOSED => c"BARLINK_CLOSED: the link was closed",
            BARLINK_PEER_LOST => c"BARLINK_PEER_LOST: the peer stopped answering",
            BARLINK_LINK_FAILED => c"BARLINK_LINK_FAILED: the link failed",
            BARLINK_INVALID_ARGUMENT => c"BARLINK_INVALID_ARGUMENT: an argument is wrong",
            BARLINK_INVALID_HANDLE => {
                c"BARLINK_INVALID_HANDLE: null, closed, or not a handle of this kind"
            }
            BARLINK_BUFFER_TOO_SMALL => {
                c"BARLINK_BUFFER_TOO_SMALL: the buffer cannot hold the message"
            }
            BARLINK_MESSAGE_TOO_LONG => {
                c"BARLINK_MESSAGE_TOO_LONG: the message exceeds max_message_bytes"
            }
            BARLINK_BUSY => c"BARLINK_BUSY: the object is in use",
            BARLINK_NOT_AVAILABLE => {
                c"BARLINK_NOT_AVAILABLE: not available in this build or on this machine"
            }
            BARLINK_UNSUPPORTED_VERSION => {
                c"BARLINK_UNSUPPORTED_VERSION: the struct comes from a newer header"
            }
            BARLINK_NAME_IN_USE => c"BARLINK_NAME_IN_USE: another process listens under the name",
            BARLINK_NO_LISTENER => c"BARLINK_NO_LISTENER: nobody listens under the name",
            BARLINK_SETUP_FAILED => c"BARLINK_SETUP_FAILED: the link could not be set up",
            BARLINK_IO_ERROR => c"BARLINK_IO_ERROR: a system call failed",
            BARLINK_OUT_OF_MEMORY => c"BARLINK_OUT_OF_MEMORY: memory could not be allocated",
            BARLINK_INTERNAL => c"BARLINK_INTERNAL: a bug in barlink was caught",
            BARLINK_PEER_NOT_ALLOWED => {
                c"BARLINK_PEER_NOT_ALLOWED: the peer is of a user not admitted, or does not admit ours"
            }
            BARLINK_CANCELED => c"BARLINK_CANCELED: the posted receive was cancelled",
        }
    }
}

// The layouts the header promises; a change here is an ABI break (fields
// are only added at the end). The config's three string pointers make it
// 64-bit only: on a 32-bit target it would gain padding, which
// `read_config` must never see.
const _: () = {
    use std::mem::{align_of, size_of};
    assert!(
        size_of::<barlink_config>() == 40 + 2 * 36 + 3 * 8 + 8 && align_of::<barlink_config>() == 8
    );
    assert!(size_of::<barlink_stats>() == 8 + 18 * 8 && align_of::<barlink_stats>() == 8);
    assert!(size_of::<barlink_completion>() == 32 && align_of::<barlink_completion>() == 8);
    assert!(size_of::<barlink_message>() == 24 && align_of::<barlink_message>() == 8);
    assert!(size_of::<barlink_status>() == 4);
};
