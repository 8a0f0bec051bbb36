//! The exported functions. Each one checks its pointers, runs its body
//! inside [`boundary`] (no panic crosses into C; failures leave a message
//! for `barlink_last_error`) and leaves the work to safe code in
//! `link.rs`. All raw-pointer handling of the crate is here and in
//! `payload.rs` (and the mapping of dma-bufs in `dmabuf.rs`).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::size_of;
use std::os::fd::BorrowedFd;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink::loan::LoanWait;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result, boundary, last_error_ptr};
use crate::held::Lent;
use crate::link::{COPY_UNLOCKED_FROM, LentForCall, RecvInto, SettleLoan, Step};
use crate::payload::{CallerMemory, Region, fill_copy};
use crate::peer::{ConfigTexts, ListenerCell, Setup, connect_link};
use crate::registry;
use crate::types::barlink_status::{self, *};
use crate::types::{
    BARLINK_ABI_VERSION_MAJOR, BARLINK_ABI_VERSION_MINOR, barlink_buffer, barlink_completion,
    barlink_config, barlink_link, barlink_listener, barlink_message, barlink_stats,
};

/// Largest `struct_size` accepted: a guard against garbage, far above any
/// real struct.
const MAX_STRUCT_SIZE: usize = 1024;

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("the package version contains a NUL"),
    };

/// Logs to stderr as `BARLINK_LOG` says, from a process's first listen,
/// connect or registration on; silent while it is unset.
fn start_logging() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        barlink::logging::to_stderr(None);
    });
}

fn key<T>(handle: *const T) -> u64 {
    handle.addr() as u64
}

fn handle<T>(value: u64) -> *mut T {
    // Handles are registry keys, never addresses: no provenance, never
    // dereferenced.
    ptr::without_provenance_mut(value as usize)
}

fn millis(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

/// Checks an out-pointer.
fn check_out<T>(out: *mut T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    if !out.is_aligned() {
        return Err(Error::invalid(format!("{what} is misaligned")));
    }
    Ok(())
}

/// Checks a receive buffer of `capacity` bytes at `buf`: non-null unless
/// empty, and within the address space (so a slice can be made of it).
fn check_recv_buffer(buf: *mut c_void, capacity: usize) -> Result<()> {
    if capacity > 0 && buf.is_null() {
        return Err(Error::invalid(format!(
            "buf is NULL but capacity is {capacity}"
        )));
    }
    if capacity > isize::MAX as usize || buf.addr().checked_add(capacity).is_none() {
        return Err(Error::invalid(format!(
            "capacity {capacity} runs past the address space"
        )));
    }
    Ok(())
}

/// Writes through a checked out-pointer.
///
/// # Safety
/// `out` passed [`check_out`] and is valid for a write of `T` (the caller's
/// contract).
unsafe fn put<T>(out: *mut T, value: T) {
    // SAFETY: non-null and aligned (check_out); valid by the caller's contract.
    unsafe { out.write(value) }
}

/// A caller's byte range as a slice; `NULL` is allowed for an empty one.
///
/// # Safety
/// Unless `len` is 0, `data` points to `len` readable bytes that stay valid
/// and unchanged for `'a` (the caller's contract).
unsafe fn bytes<'a>(data: *const c_void, len: usize, what: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Error::invalid(format!(
            "{what} is NULL but its length is {len}"
        )));
    }
    if len > isize::MAX as usize || (data.addr()).checked_add(len).is_none() {
        return Err(Error::invalid(format!(
            "{what}: length {len} runs past the address space"
        )));
    }
    // SAFETY: non-null, the range does not wrap, and by the caller's contract
    // it is readable for `len` bytes while the call runs; u8 needs no alignment.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// The link name as UTF-8.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn name_arg(name: *const c_char) -> Result<String> {
    if name.is_null() {
        return Err(Error::invalid("the link name is NULL"));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) };
    name.to_str()
        .map(str::to_string)
        .map_err(|_| Error::invalid("the link name is not UTF-8"))
}

/// Reads a caller's config, of whatever version of the header it was
/// compiled with: fields beyond its `struct_size` take their defaults;
/// fields beyond this library's size must be zero.
///
/// # Safety
/// `config` is NULL or points to at least `config->struct_size` readable bytes.
unsafe fn read_config(config: *const barlink_config) -> Result<barlink_config> {
    let ours = size_of::<barlink_config>();
    if config.is_null() {
        return Ok(barlink_config {
            struct_size: ours as u32,
            ..barlink_config::default()
        });
    }
    if !config.is_aligned() {
        return Err(Error::invalid("the config pointer is misaligned"));
    }
    // SAFETY: non-null and aligned; the first field is readable by contract.
    let size = unsafe { ptr::addr_of!((*config).struct_size).read() } as usize;
    if !(4..=MAX_STRUCT_SIZE).contains(&size) {
        return Err(Error::invalid(format!(
            "config.struct_size is {size}: set it with barlink_config_init or to sizeof(barlink_config)"
        )));
    }
    if size > CONFIG_SIZE_V0_4
        && size < ours
        && !(size - CONFIG_SIZE_V0_4).is_multiple_of(size_of::<usize>())
    {
        // Part of a field (a pointer, or send_queue_bytes) would come from
        // the caller and part be zero: a value nobody meant.
        return Err(Error::invalid(format!(
            "config.struct_size is {size}: it ends inside a field; set it with barlink_config_init or to sizeof(barlink_config)"
        )));
    }
    // SAFETY: the caller's struct is `size` bytes long (contract); u8 reads
    // need no alignment; the struct has no padding, so no byte is uninit
    // unless the caller left a field uninitialized.
    let given = unsafe { std::slice::from_raw_parts(config.cast::<u8>(), size) };
    if size > ours && given[ours..].iter().any(|&b| b != 0) {
        return Err(Error::new(
            BARLINK_UNSUPPORTED_VERSION,
            format!(
                "the config sets fields beyond the {ours} bytes this library (barlink {}) knows: it was built against a newer header",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let mut raw = [0u8; size_of::<barlink_config>()];
    let n = size.min(ours);
    raw[..n].copy_from_slice(&given[..n]);
    // SAFETY: `raw` holds size_of::<barlink_config>() bytes; every field is
    // an integer or a raw pointer, for which any bit pattern is valid (the
    // pointers are only read through `config_text`); read_unaligned needs
    // no alignment.
    let mut parsed = unsafe { ptr::read_unaligned(raw.as_ptr().cast::<barlink_config>()) };
    parsed.struct_size = ours as u32;
    Ok(parsed)
}

/// A string field of a config as UTF-8; NULL is `None`.
///
/// # Safety
/// `text` is NULL or NUL-terminated, readable for the call.
unsafe fn config_text(text: *const c_char, field: &str) -> Result<Option<String>> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str()
        .map(|text| Some(text.to_string()))
        .map_err(|_| Error::invalid(format!("config.{field} is not UTF-8")))
}

/// A caller's config checked, its strings read.
///
/// # Safety
/// `config` as for `read_config`; its string fields, where its
/// `struct_size` covers them, are NULL or NUL-terminated.
unsafe fn read_setup(config: *const barlink_config) -> Result<Setup> {
    // SAFETY: forwarded caller contract.
    let config = unsafe { read_config(config)? };
    // SAFETY: forwarded caller contract; fields the caller's struct did not
    // cover were zeroed by read_config, so they are NULL.
    let texts = unsafe {
        ConfigTexts {
            own_bar: config_text(config.own_bar, "own_bar")?,
            peer_bar: config_text(config.peer_bar, "peer_bar")?,
            sysfs_root: config_text(config.sysfs_root, "sysfs_root")?,
        }
    };
    Setup::new(&config, texts)
}

// ---------------------------------------------------------------- version

/// The library's version, e.g. "0.1.0". Static: never free it.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_version() -> *const c_char {
    VERSION.as_ptr()
}

/// The C ABI version this library implements:
/// `BARLINK_ABI_VERSION_MAJOR << 16 | BARLINK_ABI_VERSION_MINOR`. A program
/// works with a library of the same major and at least its minor.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_abi_version() -> u32 {
    (BARLINK_ABI_VERSION_MAJOR << 16) | BARLINK_ABI_VERSION_MINOR
}

// ----------------------------------------------------------------- errors

/// The message of this thread's last failed barlink call, or "" if the last
/// call succeeded. Never NULL. Owned by barlink: valid until this thread's
/// next barlink call; copy it to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_last_error() -> *const c_char {
    last_error_ptr()
}

/// A static description of any status code, known or not ("BARLINK_TIMEOUT:
/// ..."). Never NULL, never freed.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_status_string(status: i32) -> *const c_char {
    barlink_status::describe(status).as_ptr()
}

// ----------------------------------------------------------------- config

/// Bytes of `barlink_config` before ABI 0.5 added its string fields: what
/// a program built against an older header allocated.
const CONFIG_SIZE_V0_4: usize = 112;

/// The defaults, in this library's layout.
fn default_config() -> barlink_config {
    barlink_config {
        struct_size: size_of::<barlink_config>() as u32,
        transport: 0,
        window_bytes: barlink_transport::link::LinkConfig::default().window_len as u64,
        max_message_bytes: barlink_transport::engine::EngineConfig::default().max_message_len,
        mtu: crate::config::DEFAULT_MTU as u32,
        peer_timeout_ms: barlink_transport::engine::EngineConfig::default()
            .peer_timeout
            .as_millis() as u32,
        flags: 0,
        reserved: 0,
        ..barlink_config::default()
    }
}

/// Writes the first `size` bytes of the defaults, with `struct_size =
/// size`, into a caller's config of `size` bytes.
///
/// # Safety
/// `config` passed [`check_out`] and is writable for `size` bytes;
/// `size <= size_of::<barlink_config>()`.
unsafe fn put_config_prefix(config: *mut barlink_config, size: usize) {
    let defaults = barlink_config {
        struct_size: size as u32,
        ..default_config()
    };
    // SAFETY: `defaults` is a whole barlink_config (size_of bytes, no
    // padding: every byte initialized); the caller's `size` bytes are
    // writable by contract, and `size` is at most the struct's size; the
    // two do not overlap (one is on this stack).
    unsafe {
        ptr::copy_nonoverlapping(
            (&raw const defaults).cast::<u8>(),
            config.cast::<u8>(),
            size,
        );
    }
}

/// Fills the fields of `barlink_config` as ABI 0.4 declared it (112
/// bytes, `struct_size = 112`): the symbol programs built against older
/// headers call. The header maps `barlink_config_init(config)` to
/// `barlink_config_init_size(config, sizeof *config)`, which fills every
/// field the caller's header has.
///
/// # Safety
/// `config` is NULL (refused) or points to 112 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_config_init(config: *mut barlink_config) -> barlink_status {
    boundary("barlink_config_init", || {
        check_out(config, "config")?;
        // SAFETY: checked; 112 bytes writable by the caller's contract.
        unsafe { put_config_prefix(config, CONFIG_SIZE_V0_4) };
        Ok(())
    })
}

/// Fills `config` (`size` bytes: pass `sizeof *config`) with the defaults
/// and `struct_size = size`, writing no byte past `size`. The fields this
/// library knows beyond `size` stay unset; a `size` larger than this
/// library's struct fills what it knows and leaves the rest zero.
///
/// # Safety
/// `config` is NULL (refused) or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_config_init_size(
    config: *mut barlink_config,
    size: usize,
) -> barlink_status {
    boundary("barlink_config_init_size", || {
        check_out(config, "config")?;
        let ours = size_of::<barlink_config>();
        if !(CONFIG_SIZE_V0_4..=MAX_STRUCT_SIZE).contains(&size) {
            return Err(Error::invalid(format!(
                "size {size}: pass sizeof(barlink_config) (at least {CONFIG_SIZE_V0_4})"
            )));
        }
        if size > ours {
            // SAFETY: `size` bytes are writable by the caller's contract.
            unsafe { ptr::write_bytes(config.cast::<u8>(), 0, size) };
        }
        // SAFETY: checked; writable for `size` bytes, of which at most
        // size_of bytes are written.
        unsafe { put_config_prefix(config, size.min(ours)) };
        if size > ours {
            // A newer header's struct: say its own size, so that its
            // zeroed fields pass read_config's check.
            // SAFETY: as above; struct_size is the first field.
            unsafe { ptr::addr_of_mut!((*config).struct_size).write(size as u32) };
        }
        Ok(())
    })
}

// ------------------------------------------------------------------ links

/// Claims `name` for accepting links. `name` is a peer as every barlink
/// face takes it: a link name on this host (`kv` or `local:kv`: an abstract
/// Unix socket `@barlink/kv`, nothing stays behind after a crash), or an
/// address to listen on for peers on other nodes (`tcp://0.0.0.0:18616`,
/// `rdma://0.0.0.0:18515`, or `0.0.0.0:18515`: RDMA where this host has an
/// RDMA device, else TCP). A link name with `config->own_bar` and
/// `peer_bar` set is reached over those two BAR windows where the topology
/// allows peer-to-peer (each accept pairs the windows; nothing listens).
/// Setup with other nodes is authenticated as
/// `BARLINK_PSK_FILE` (or the other `BARLINK_*` key variables) say; without
/// any, the listen fails saying so. `config` may be NULL for the defaults;
/// accepted links use it. On success `*listener` is a new handle (close it
/// with `barlink_listener_close`); on failure it is set to NULL.
///
/// # Safety
/// `name` is NULL or NUL-terminated; `config` is NULL or a `barlink_config`
/// of `config->struct_size` bytes whose string fields are NULL or
/// NUL-terminated; `listener` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_listen(
    name: *const c_char,
    config: *const barlink_config,
    listener: *mut *mut barlink_listener,
) -> barlink_status {
    boundary("barlink_listen", || {
        start_logging();
        check_out(listener, "listener")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(listener, ptr::null_mut()) };
        // SAFETY: forwarded caller contracts.
        let name = unsafe { name_arg(name)? };
        // SAFETY: forwarded caller contract.
        let setup = unsafe { read_setup(config)? };
        let cell = ListenerCell::bind(&name, setup)?;
        let value = registry::insert_listener(Arc::new(cell))?;
        // SAFETY: as above.
        unsafe { put(listener, handle(value)) };
        Ok(())
    })
}

/// Waits at most `timeout_ms` for a peer to `barlink_connect` to the name,
/// and sets up the link. On success `*link` is a new handle (close it with
/// `barlink_close`); on failure NULL. Several threads may accept on one
/// listener.
///
/// # Safety
/// `link` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_accept(
    listener: *mut barlink_listener,
    timeout_ms: u32,
    link: *mut *mut barlink_link,
) -> barlink_status {
    boundary("barlink_accept", || {
        check_out(link, "link")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(link, ptr::null_mut()) };
        let cell = registry::listener(key(listener))?;
        let accepted = cell.accept(millis(timeout_ms))?;
        let value = registry::insert_link(accepted)?;
        // SAFETY: as above.
        unsafe { put(link, handle(value)) };
        Ok(())
    })
}

/// Releases the name; links already accepted are not affected. A thread
/// inside `barlink_accept` on it finishes that call. The handle is invalid
/// afterwards; closing it again returns `BARLINK_INVALID_HANDLE`. A
/// `tcp://` port stays bound while links accepted on it live: they take
/// their peers back on it after a dropped connection.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_listener_close(listener: *mut barlink_listener) -> barlink_status {
    boundary("barlink_listener_close", || {
        registry::remove_listener(key(listener))?;
        Ok(())
    })
}

/// Connects to the peer `name` names (as `barlink_listen` takes it: a link
/// name, or `tcp://HOST:PORT`, `rdma://HOST:PORT`, `HOST:PORT`), retrying
/// for at most `timeout_ms` while nobody listens, and sets up the link over
/// the path barlink picks (`barlink_link_path` says which and why).
/// `config` may be NULL; both sides should use the same `mtu` and
/// `max_message_bytes`. On success `*link` is a new handle; on failure
/// NULL, with `BARLINK_NOT_AVAILABLE` when no path reaches the peer (an
/// rdma:// peer without an RDMA device here, say).
///
/// # Safety
/// `name` is NULL or NUL-terminated; `config` is NULL or a `barlink_config`
/// of `config->struct_size` bytes whose string fields are NULL or
/// NUL-terminated; `link` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_connect(
    name: *const c_char,
    config: *const barlink_config,
    timeout_ms: u32,
    link: *mut *mut barlink_link,
) -> barlink_status {
    boundary("barlink_connect", || {
        start_logging();
        check_out(link, "link")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(link, ptr::null_mut()) };
        // SAFETY: forwarded caller contracts.
        let name = unsafe { name_arg(name)? };
        // SAFETY: forwarded caller contract.
        let setup = unsafe { read_setup(config)? };
        let cell = connect_link(&name, setup, millis(timeout_ms))?;
        let value = registry::insert_link(cell)?;
        // SAFETY: as above.
        unsafe { put(link, handle(value)) };
        Ok(())
    })
}

/// Closes the link in order: messages already queued are still delivered
/// and the peer is told, for at most `timeout_ms`; then everything is
/// freed. The handle is invalid when this returns, whatever the status
/// (`BARLINK_TIMEOUT`: the orderly part did not finish; the link is closed
/// anyway), except `BARLINK_INVALID_HANDLE` (it was not open). Completions
/// not yet reported are discarded, and barlink holds none of the caller's
/// memory any more. Calls on other threads still inside a call on the link
/// return `BARLINK_CLOSED`.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_close(link: *mut barlink_link, timeout_ms: u32) -> barlink_status {
    boundary("barlink_close", || {
        let cell = registry::remove_link(key(link))?;
        cell.close(millis(timeout_ms))
    })
}

/// Writes the path a link took and why (e.g. `"tcp: the peer is on another
/// node, ...; setup authenticated with a pre-shared key ..."`) into `buf`
/// as a NUL-terminated string. `*len` gets the bytes the text needs,
/// NUL included; `BARLINK_BUFFER_TOO_SMALL` when `capacity` is less (call
/// again with a larger buffer). Works on a link that has ended, until it
/// is closed.
///
/// # Safety
/// Unless `capacity` is 0, `buf` points to `capacity` writable bytes; `len`
/// is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_link_path(
    link: *mut barlink_link,
    buf: *mut c_char,
    capacity: usize,
    len: *mut usize,
) -> barlink_status {
    boundary("barlink_link_path", || {
        let cell = registry::link(key(link))?;
        let text = cell.lock()?.path().to_string();
        // SAFETY: forwarded caller contract.
        unsafe { write_text(&text, buf, capacity, len) }
    })
}

/// As `barlink_link_path`, for the path a listener's links take.
///
/// # Safety
/// As `barlink_link_path`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_listener_path(
    listener: *mut barlink_listener,
    buf: *mut c_char,
    capacity: usize,
    len: *mut usize,
) -> barlink_status {
    boundary("barlink_listener_path", || {
        let cell = registry::listener(key(listener))?;
        let text = cell.decision();
        // SAFETY: forwarded caller contract.
        unsafe { write_text(&text, buf, capacity, len) }
    })
}

/// Copies `text` and a NUL into the caller's `buf`, or says how much room
/// it needs.
///
/// # Safety
/// Unless `capacity` is 0, `buf` points to `capacity` writable bytes; `len`
/// is NULL or writable.
unsafe fn write_text(text: &str, buf: *mut c_char, capacity: usize, len: *mut usize) -> Result<()> {
    check_out(len, "len")?;
    let needed = text.len() + 1;
    // SAFETY: checked; writable by contract.
    unsafe { put(len, needed) };
    if capacity > 0 && buf.is_null() {
        return Err(Error::invalid(format!(
            "buf is NULL but capacity is {capacity}"
        )));
    }
    if capacity < needed {
        return Err(Error::new(
            BARLINK_BUFFER_TOO_SMALL,
            format!("the text needs {needed} bytes, the buffer has {capacity}"),
        )
        .with_needed(needed));
    }
    // SAFETY: `buf` has `capacity >= needed` writable bytes (contract,
    // non-null since capacity > 0); the text is ours and cannot overlap.
    unsafe {
        ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

// ----------------------------------------------------------- blocking I/O

/// Sends `len` bytes at `data`, queues the message and drives the link;
/// the caller may reuse `data` once the call returns. Waits at most
/// `timeout_ms` while the send queue is full (the copies held for
/// unacknowledged sends reached `send_queue_bytes`, or 4096 messages
/// wait). A message shorter than four packets' payload (just under 512
/// KiB at the default MTU) is copied. A longer one is read in place: the
/// call drives the link while the message moves and returns when the
/// peer acknowledges it, or, on a link over rings (host memory, BAR
/// windows), once every packet went out and the peer acknowledged all
/// but the last full one and the short one after it (the call copies
/// those, for their resend if one is lost, and returns: waiting would
/// leave both sides idle while the peer checks them; since ABI 0.15);
/// once the message has not moved for about as long as a copy would
/// take, has moved slower than 1 GB/s, or `timeout_ms` passed (a second
/// wait of at most `timeout_ms`), the call copies the message from its
/// first packet not acknowledged in order on and returns, the message
/// still queued. Over RDMA, bytes of
/// a registered buffer are always copied. A long message that the link
/// dropped unacknowledged while the call waited returns why
/// (`BARLINK_PEER_LOST`, ...). `BARLINK_OK` means queued (for a long
/// message, sent whole and acknowledged but for its last packets, as a
/// rule): `barlink_flush` waits for every
/// acknowledgement; `messages_copied` and `messages_lent` in
/// `barlink_stats` count which way messages went. `data` may be NULL when
/// `len` is 0.
///
/// # Safety
/// Unless `len` is 0, `data` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_send(
    link: *mut barlink_link,
    data: *const c_void,
    len: usize,
    timeout_ms: u32,
) -> barlink_status {
    boundary("barlink_send", || {
        registry::with_link(key(link), |cell| {
            // SAFETY: forwarded caller contract; the slice lives for this call.
            let data = unsafe { bytes(data, len, "data")? };
            // A short message on a ring link with room goes the direct way.
            if data.len() < COPY_UNLOCKED_FROM
                && cell.lock()?.send_copy_direct(data, None)?.is_some()
            {
                return Ok(());
            }
            // Lent bytes are settled before the call returns, whatever happens
            // (a panic included): the guard copies them or ends the link.
            let mut loan = SettleLoan::new(cell);
            // A long copy that fits now is made outside the lock, so that a
            // progress thread moves the link meanwhile; its bytes stay reserved
            // under send_queue_bytes until the step that queues it. Else the
            // payload is made in the first step that finds room for it, under
            // that step's lock (one lock fewer); a full queue gives it back to
            // the slot for the next step.
            let mut slot = None;
            let mut reserved = 0;
            if data.len() >= COPY_UNLOCKED_FROM {
                let mut state = cell.lock()?;
                if let Some(spare) = state.spare_to_send(data)? {
                    state.reserve_copy(data.len());
                    drop(state);
                    reserved = data.len();
                    match fill_copy(spare, data) {
                        Ok(filled) => slot = Some(filled),
                        Err(error) => {
                            cell.lock_even_if_closed().end_reservation(reserved);
                            return Err(error);
                        }
                    }
                }
            }
            let sent = cell.blocking(millis(timeout_ms), |state| {
                if reserved > 0 {
                    state.end_reservation(reserved);
                    reserved = 0;
                }
                if slot.is_none() {
                    state.check_len(data.len())?;
                    // The copies held for unacknowledged sends are at their
                    // limit: wait for acknowledgements, driving the link. (A
                    // lent message waits too: it may need a copy.)
                    if !state.copy_fits(data.len()) {
                        return Ok(Step::Again {
                            moved: state.step(),
                        });
                    }
                    let (payload, source, lent) = state.blocking_payload(data)?;
                    slot = Some((payload, source));
                    loan.loan = lent;
                }
                state.send_step(&mut slot)
            });
            if reserved > 0 {
                // No step ran (the link was closed or broken meanwhile).
                cell.lock_even_if_closed().end_reservation(reserved);
            }
            // Timed out (or failed) with the payload still here: keep a copy
            // for the retry, as a full queue's post does; lent bytes just go.
            if let Some((payload, source)) = slot.take()
                && let Ok(mut state) = cell.lock()
            {
                state.keep_unsent(payload, source);
            }
            let msg_id = sent?;
            if loan.loan.is_none() {
                return Ok(()); // copied: nothing lent
            }
            loan.msg_id = Some(msg_id);
            // Drive the link while the message moves, until the peer
            // acknowledges it. Once it has not moved for about as long as
            // copying the bytes would take (a peer slow to answer, or not
            // reading now), or has moved slowly for long, copy them (if still
            // unacknowledged) and return.
            let mut wait = LoanWait::new(data.len(), Instant::now());
            let waited = cell.blocking(millis(timeout_ms), |state| {
                if state.loan_ended(msg_id) {
                    return Ok(Step::Done(()));
                }
                let moved = state.step();
                // Only the last packets unacknowledged: copying them costs
                // less than waiting for the peer to check them.
                if state.may_copy_tail_and_return(msg_id, data.len()) {
                    return Ok(Step::Done(()));
                }
                if wait.should_copy(state.engine_stats(), Instant::now()) {
                    return Ok(Step::Done(()));
                }
                Ok(Step::Again { moved })
            });
            loan.finish(waited)
        })
    })
}

/// Receives the next message into `buf` (`capacity` bytes), waiting at most
/// `timeout_ms` (0: do one round of progress and return). On `BARLINK_OK`,
/// `*len` is the message's length. On `BARLINK_BUFFER_TOO_SMALL`, `*len`
/// is the length needed and the message stays first in line: call again
/// with a larger buffer. `buf` may be NULL when `capacity` is 0 (to learn
/// the next message's size). Messages that arrived before the link ended
/// are still received; then the call returns why it ended.
///
/// For the length of the call `buf` is lent to the link: a message that
/// fits is assembled there as it arrives, checked packet by packet, with
/// no copy after the one out of the ring. barlink writes `buf` only during
/// the call; on any status but `BARLINK_OK` its contents are unspecified
/// (part of a message may have landed there, and that message is kept
/// whole for the next call).
///
/// # Safety
/// Unless `capacity` is 0, `buf` points to `capacity` writable bytes that
/// nothing else reads or writes during the call; `len` is NULL (refused)
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_recv(
    link: *mut barlink_link,
    buf: *mut c_void,
    capacity: usize,
    len: *mut usize,
    timeout_ms: u32,
) -> barlink_status {
    boundary("barlink_recv", || {
        check_out(len, "len")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(len, 0) };
        check_recv_buffer(buf, capacity)?;
        registry::with_link(key(link), |cell| {
            let mut deliver = |message: &[u8]| {
                // SAFETY: `message.len() <= capacity` (recv_step checks it) and
                // `buf` is writable for `capacity` bytes by contract (non-null
                // when capacity > 0; nothing is copied when the message is
                // empty). The message is in barlink's buffer or in another
                // call's, never in this one's.
                unsafe {
                    ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), message.len())
                }
            };
            // The buffer is lent to the link for the call: the message lands
            // in it. The guard takes it back before returning, whatever the
            // outcome (a panic caught at the boundary included), so barlink
            // writes it only during the call.
            let mut into = LentForCall::new(cell, RecvInto::new(buf.cast::<u8>(), capacity));
            let result = cell.blocking(millis(timeout_ms), |state| {
                state.recv_step(&mut into.into, &mut deliver)
            });
            drop(into);
            match result {
                Ok(n) => {
                    // SAFETY: as above.
                    unsafe { put(len, n) };
                    Ok(())
                }
                Err(error) => {
                    if let Some(needed) = error.needed {
                        // SAFETY: as above.
                        unsafe { put(len, needed) };
                    }
                    Err(error)
                }
            }
        })
    })
}

/// Receives the next message in place, waiting at most `timeout_ms` (0: do
/// one round of progress and return): on `BARLINK_OK`, `*message` says
/// where it lies in barlink's memory and how long it is. No copy is made
/// after the checked one out of the medium. Read it there, then give it
/// back with `barlink_release_message` (or with the next receive,
/// `barlink_release_and_recv_message`); until then its memory is not
/// reused, so hold few at a time. Messages that arrived before the link
/// ended are still received; then the call returns why it ended.
/// `BARLINK_BUSY` while posted receives are pending (they come first). On
/// any status but `BARLINK_OK`, `*message` is zeroed.
///
/// # Safety
/// `message` is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_recv_message(
    link: *mut barlink_link,
    message: *mut barlink_message,
    timeout_ms: u32,
) -> barlink_status {
    boundary("barlink_recv_message", || {
        check_out(message, "message")?;
        // SAFETY: checked; writable by contract.
        unsafe { recv_message_into(link, message, None, timeout_ms) }
    })
}

/// Gives back the message `*message` holds, then receives the next in
/// place into `*message`, as `barlink_release_message` followed by
/// `barlink_recv_message` would, in one call (and one turn of the link's
/// lock): the loop of a receiver that reads each message where it lies,
/// as the Rust link's `recv_into` hands its last buffer back. A
/// `*message` whose `id` is 0 (zeroed, as a failed receive leaves it)
/// holds nothing to give back: start the loop with a zeroed
/// `barlink_message`. A message this link did not lend (released
/// already, from another link, or changed) is refused with
/// `BARLINK_INVALID_ARGUMENT`: nothing is received and `*message` is left
/// as it was, and so it is when the call cannot reach the link
/// (`BARLINK_INVALID_HANDLE`: a closed link gave back all it held;
/// `BARLINK_INTERNAL`). On any other status but `BARLINK_OK`, `*message`
/// is zeroed, its message given back. (ABI 0.14.)
///
/// # Safety
/// `message` is NULL (refused) or points to a readable and writable
/// `barlink_message`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_release_and_recv_message(
    link: *mut barlink_link,
    message: *mut barlink_message,
    timeout_ms: u32,
) -> barlink_status {
    boundary("barlink_release_and_recv_message", || {
        check_out(message, "message")?;
        // SAFETY: checked (non-null, aligned); readable by contract; every
        // field is an integer or a raw pointer (any bit pattern is valid).
        let held = unsafe { message.read() };
        let give_back = (held.id != 0).then_some(Lent::from(held));
        // SAFETY: checked; writable by contract.
        unsafe { recv_message_into(link, message, give_back, timeout_ms) }
    })
}

/// Receives the next message in place into `*message`, giving
/// `give_back` back first (see `barlink_release_and_recv_message`):
/// `*message` is zeroed once its message is given back, at once if there
/// is none to give.
///
/// # Safety
/// `message` is non-null, aligned and writable.
unsafe fn recv_message_into(
    link: *mut barlink_link,
    message: *mut barlink_message,
    give_back: Option<Lent>,
    timeout_ms: u32,
) -> Result<()> {
    let zero = || {
        let empty = barlink_message {
            data: ptr::null(),
            len: 0,
            id: 0,
        };
        // SAFETY: by this function's contract.
        unsafe { put(message, empty) };
    };
    if give_back.is_none() {
        zero();
    }
    registry::with_link(key(link), |cell| {
        let lent = cell.recv_message(millis(timeout_ms), give_back, zero)?;
        // SAFETY: by this function's contract.
        unsafe { put(message, lent.into()) };
        Ok(())
    })
}

/// Gives back a message `barlink_recv_message` lent: its memory goes on to
/// hold a later message, and `message->data` must not be read again. A
/// message this link did not lend (released already, from another link,
/// or changed) is refused with `BARLINK_INVALID_ARGUMENT`. Closing the link
/// releases every message still held.
///
/// # Safety
/// `message` is NULL (refused) or points to a readable `barlink_message`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_release_message(
    link: *mut barlink_link,
    message: *const barlink_message,
) -> barlink_status {
    boundary("barlink_release_message", || {
        if message.is_null() {
            return Err(Error::invalid("message is NULL"));
        }
        if !message.is_aligned() {
            return Err(Error::invalid("message is misaligned"));
        }
        // SAFETY: non-null and aligned; readable by contract; every field
        // is an integer or a raw pointer (any bit pattern is valid).
        let message = unsafe { message.read() };
        registry::with_link(key(link), |cell| {
            cell.lock()?.release_message(Lent::from(message))
        })
    })
}

/// Drives the link until every message sent or posted so far is
/// acknowledged by the peer, for at most `timeout_ms`. `BARLINK_OK` even if
/// the peer closed the link after acknowledging them; why the link ended if
/// some message never will be. Messages beyond about one ring wait for the
/// peer to receive those before them (docs/FFI.md, "Flow control").
#[unsafe(no_mangle)]
pub extern "C" fn barlink_flush(link: *mut barlink_link, timeout_ms: u32) -> barlink_status {
    boundary("barlink_flush", || {
        registry::with_link(key(link), |cell| {
            cell.blocking(millis(timeout_ms), |state| state.flush_step())
        })
    })
}

// ------------------------------------------------------- non-blocking I/O

/// Posts a send without waiting: copies `len` bytes at `data` (the caller
/// may reuse `data` at once), queues the message and drives the link once.
/// `*request` gets an id (never 0) that `barlink_poll`, `barlink_test` and
/// `barlink_wait` report exactly once when the peer acknowledged the
/// message or the link ended. `BARLINK_WOULD_BLOCK`: the send queue is
/// full (as for `barlink_send`); poll and retry. `user_tag` comes back in
/// the completion.
///
/// # Safety
/// Unless `len` is 0, `data` points to `len` readable bytes; `request` is
/// NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_post_send(
    link: *mut barlink_link,
    data: *const c_void,
    len: usize,
    user_tag: u64,
    request: *mut u64,
) -> barlink_status {
    boundary("barlink_post_send", || {
        check_out(request, "request")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(request, 0) };
        registry::with_link(key(link), |cell| {
            // SAFETY: forwarded caller contract; the slice lives for this call.
            let data = unsafe { bytes(data, len, "data")? };
            let mut state = cell.lock()?;
            // A short message on a ring link goes the direct way, as a
            // blocking send's does.
            if data.len() < COPY_UNLOCKED_FROM
                && let Some(msg_id) = state.send_copy_direct(data, Some(user_tag))?
            {
                // SAFETY: as above.
                unsafe { put(request, msg_id + 1) };
                return Ok(());
            }
            let spare = state.spare_to_post(data.len())?;
            let (payload, source) = if data.len() < COPY_UNLOCKED_FROM {
                fill_copy(spare, data)?
            } else {
                // Outside the lock, so that a progress thread (or a call on
                // another thread) moves the link while the bytes are copied;
                // the reservation keeps other calls within send_queue_bytes.
                state.reserve_copy(data.len());
                drop(state);
                let filled = fill_copy(spare, data);
                state = cell.lock_after_copy(data.len())?;
                filled?
            };
            let id = state.post(payload, source, user_tag)?;
            // SAFETY: as above.
            unsafe { put(request, id) };
            Ok(())
        })
    })
}

/// Posts a receive without waiting, and without driving the link (the
/// next call's round does): the next message not yet received lands in
/// `buf` (`capacity` bytes). Posted receives take messages in the
/// order they were posted, before any `barlink_recv` (which returns
/// `BARLINK_BUSY` while some are pending). `*request` gets an id (never 0)
/// that `barlink_poll`, `barlink_test` and `barlink_wait` report exactly
/// once: `BARLINK_OK` with `bytes` the message's length;
/// `BARLINK_BUFFER_TOO_SMALL` with `bytes` the length needed, the message
/// staying first in line for the next receive; or why the link ended.
/// `user_tag` comes back in the completion.
///
/// While no delivered message waits, the buffers are lent to the link, so
/// the messages that come next are assembled in them as they arrive, with
/// no copy after the checked one out of the ring (`messages_landed` in
/// `barlink_stats` counts them). barlink writes `buf`
/// until the completion is reported or the link is closed; its contents
/// are unspecified until then, and after any status but `BARLINK_OK`.
///
/// # Safety
/// Unless `capacity` is 0, `buf` points to `capacity` writable bytes that
/// nothing else reads or writes until the completion is reported or
/// `barlink_close` returned; `request` is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_post_recv(
    link: *mut barlink_link,
    buf: *mut c_void,
    capacity: usize,
    user_tag: u64,
    request: *mut u64,
) -> barlink_status {
    boundary("barlink_post_recv", || {
        check_out(request, "request")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(request, 0) };
        check_recv_buffer(buf, capacity)?;
        registry::with_link(key(link), |cell| {
            let memory = CallerMemory::new(buf.cast::<u8>(), capacity);
            let id = cell.lock()?.post_recv(memory, capacity, user_tag)?;
            // SAFETY: as above.
            unsafe { put(request, id) };
            Ok(())
        })
    })
}

/// Posts a zero-copy send of `len` bytes at `offset` in a registered
/// buffer: barlink reads them straight from the caller's memory into the
/// peer's ring, and again for any retransmission. The caller must neither
/// modify nor free that range until the request's completion is reported
/// (`barlink_poll`/`barlink_test`/`barlink_wait`), or the link is closed.
/// Otherwise as `barlink_post_send`. From a dma-buf
/// (`barlink_register_dmabuf`) the post first opens the CPU's read of it,
/// for which the exporter may wait until the writes it has pending are
/// done; `BARLINK_NOT_AVAILABLE` if it refuses.
///
/// # Safety
/// `request` is NULL (refused) or writable; the registered memory obeys the
/// contract of `barlink_register_buffer` (or `barlink_register_dmabuf`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_post_send_buffer(
    link: *mut barlink_link,
    buffer: *mut barlink_buffer,
    offset: usize,
    len: usize,
    user_tag: u64,
    request: *mut u64,
) -> barlink_status {
    boundary("barlink_post_send_buffer", || {
        check_out(request, "request")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(request, 0) };
        registry::with_link(key(link), |cell| {
            registry::with_buffer(key(buffer), |region| {
                let read = region.begin_cpu_read()?;
                let mut state = cell.lock()?;
                let (payload, source) = state.registered_payload(region, offset, len, read)?;
                let id = state.post(payload, source, user_tag)?;
                // SAFETY: as above.
                unsafe { put(request, id) };
                Ok(())
            })
        })
    })
}

/// Registers `buffer` (from `barlink_register_buffer` or
/// `barlink_register_dmabuf`) with `link`'s device now, rather than at the
/// first send from it over the link, and says whether those sends go in
/// place. Over RDMA the NIC registers the memory (`ibv_reg_mr`, or
/// `ibv_reg_dmabuf_mr` for a dma-buf), once per link: `BARLINK_OK` when it
/// did, and `barlink_post_send_buffer` then sends without a copy;
/// `BARLINK_NOT_AVAILABLE`, with the NIC's reason in `barlink_last_error`,
/// when it refused (a NIC without dma-buf support, memory it cannot pin):
/// sends from the buffer still work, copied through the link's staging
/// area. Other links read registered memory with the CPU and answer
/// `BARLINK_OK` at once. Registration can take milliseconds for large
/// buffers, during which the link is not driven: call it at setup, not per
/// message (a deregistration meanwhile is `BARLINK_BUSY`). On a link that
/// ended, the status it ended with (`BARLINK_PEER_LOST`, ...);
/// `BARLINK_INVALID_HANDLE` for a closed link or a deregistered buffer.
/// (ABI 0.13.)
#[unsafe(no_mangle)]
pub extern "C" fn barlink_link_register_buffer(
    link: *mut barlink_link,
    buffer: *mut barlink_buffer,
) -> barlink_status {
    boundary("barlink_link_register_buffer", || {
        registry::with_link(key(link), |cell| {
            registry::with_buffer(key(buffer), |region| cell.lock()?.register_region(region))
        })
    })
}

/// Drives the link once and takes up to `max` completions of posted sends,
/// oldest first, into `completions`; `*count` says how many. Each
/// completion is reported once. `completions` may be NULL when `max` is 0
/// (progress only).
///
/// # Safety
/// Unless `max` is 0, `completions` points to `max` writable
/// `barlink_completion`s; `count` is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_poll(
    link: *mut barlink_link,
    completions: *mut barlink_completion,
    max: usize,
    count: *mut usize,
) -> barlink_status {
    boundary("barlink_poll", || {
        check_out(count, "count")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(count, 0) };
        if max > 0 {
            check_out(completions, "completions")?;
        }
        registry::with_link(key(link), |cell| {
            let mut written = 0;
            let taken = cell.lock()?.poll(max, |completion| {
                debug_assert!(written < max, "poll handed over more than max");
                // SAFETY: `poll` hands over at most `max` completions, so
                // written < max; the array holds `max` writable, aligned
                // (checked) elements by contract.
                unsafe { completions.add(written).write(completion) };
                written += 1;
            });
            // SAFETY: as above.
            unsafe { put(count, taken) };
            Ok(())
        })
    })
}

/// Whether a posted send finished, driving the link once if not known yet:
/// `BARLINK_OK` (acknowledged; reported now), `BARLINK_PENDING`, or why it
/// failed (`BARLINK_CLOSED`, `BARLINK_PEER_LOST`, ...; reported now).
/// `BARLINK_INVALID_ARGUMENT` for an id that is unknown or already
/// reported.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_test(link: *mut barlink_link, request: u64) -> barlink_status {
    boundary("barlink_test", || {
        registry::with_link(key(link), |cell| match cell.lock()?.test(request)? {
            Step::Done(()) => Ok(()),
            Step::Again { .. } => Err(Error::fixed(
                BARLINK_PENDING,
                c"barlink_test: the request has not completed yet",
            )),
        })
    })
}

/// Like `barlink_test`, but drives the link for at most `timeout_ms` until
/// the request finished (`BARLINK_TIMEOUT` if it did not).
#[unsafe(no_mangle)]
pub extern "C" fn barlink_wait(
    link: *mut barlink_link,
    request: u64,
    timeout_ms: u32,
) -> barlink_status {
    boundary("barlink_wait", || {
        registry::with_link(key(link), |cell| {
            cell.blocking(millis(timeout_ms), |state| state.test(request))
        })
    })
}

/// Like `barlink_wait`, and fills `*completion` as `barlink_poll` would once
/// the request is reported, so that a caller waiting for one posted receive
/// learns its message's length without polling (as `MPI_Wait` fills its
/// status). Returns what `barlink_wait` returns, and `completion->status`
/// is always that status. `completion->request` is the request's id when
/// it was reported now, and 0 on every other return (`BARLINK_TIMEOUT`:
/// not finished yet, still to be reported; an unknown id; a refused call),
/// with the other fields 0. A timeout of 0 tests the request with one round
/// of progress. (ABI 0.11.)
///
/// # Safety
/// `completion` is NULL (refused) or points to a writable
/// `barlink_completion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_wait_completion(
    link: *mut barlink_link,
    request: u64,
    timeout_ms: u32,
    completion: *mut barlink_completion,
) -> barlink_status {
    boundary("barlink_wait_completion", || {
        check_out(completion, "completion")?;
        let unreported = |status| barlink_completion {
            request: 0,
            user_tag: 0,
            bytes: 0,
            status,
            reserved: 0,
        };
        // What a panic below (BARLINK_INTERNAL) leaves.
        // SAFETY: checked; writable by contract.
        unsafe { completion.write(unreported(BARLINK_INTERNAL)) };
        let waited = registry::link(key(link)).and_then(|cell| {
            cell.blocking(millis(timeout_ms), |state| {
                Ok(match state.take_completion(request)? {
                    Step::Done(taken) => Step::Done((taken, state.outcome(&taken))),
                    Step::Again { moved } => Step::Again { moved },
                })
            })
        });
        let (mut filled, outcome) = match waited {
            Ok(reported) => reported,
            Err(error) => (unreported(error.status), Err(error)),
        };
        if let Err(error) = &outcome {
            // The status returned, which names why the link ended once it
            // has (as barlink_wait's does), where the completion may have
            // been made with an earlier reason.
            filled.status = error.status;
        }
        // SAFETY: as above.
        unsafe { completion.write(filled) };
        outcome
    })
}

/// Cancels a posted receive (`barlink_post_recv`) that no message has
/// completed: once the call returns barlink never writes its buffer again,
/// and its completion, reported once by `barlink_poll`, `barlink_test` or
/// `barlink_wait` as any other, has status `BARLINK_CANCELED` and `bytes`
/// 0. Nothing is lost: a message that had begun landing in the buffer goes
/// on arriving in barlink's memory, whole and in order, for the next
/// receive. A receive that completed before the call (its completion not
/// reported yet) is left as it is: `BARLINK_OK`, and its completion says
/// which happened. `BARLINK_INVALID_ARGUMENT` for an id that is not a
/// pending posted receive's (unknown, reported already, or a posted
/// send's: sends cannot be cancelled, their bytes may be on their way).
/// Refused, as every call is, on a link that failed inside
/// (`BARLINK_INTERNAL`) or that `barlink_close` is closing on another
/// thread (`BARLINK_CLOSED`); its buffers are the caller's again once
/// `barlink_close` returned. (ABI 0.9.)
#[unsafe(no_mangle)]
pub extern "C" fn barlink_cancel(link: *mut barlink_link, request: u64) -> barlink_status {
    boundary("barlink_cancel", || {
        let cell = registry::link(key(link))?;
        cell.lock()?.cancel(request)
    })
}

/// Drives the link once (moves packets both ways, runs timers). The calls
/// that send, receive, poll, test, wait or flush do this too; call it when
/// a thread has nothing else to do on the link but wants it to move (e.g.
/// retransmissions, or the acknowledgement of what it last received before
/// it turns to other work). Returns why the link ended, once it has.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_progress(link: *mut barlink_link) -> barlink_status {
    boundary("barlink_progress", || {
        registry::with_link(key(link), |cell| cell.lock()?.progress())
    })
}

// ------------------------------------------------------- registered memory

/// Registers `len` bytes at `ptr` for zero-copy sends on any link
/// (`barlink_post_send_buffer`). barlink never writes the memory and never
/// frees it. The caller keeps it valid until `barlink_deregister_buffer`
/// succeeded, and does not modify a range while a send of it is in flight.
/// On success `*buffer` is a new handle; on failure NULL.
///
/// Over shared memory and BAR windows a send from it is copied once, into
/// the peer's ring, with its CRC. Over RDMA the NIC reads it in place: an
/// RDMA link registers the buffer with its device the first time it sends
/// from it (`packets_sent_in_place` in `barlink_stats` counts those
/// packets); a device that refuses the registration gets a copy instead.
///
/// # Safety
/// `ptr..ptr+len` is memory the caller owns, under the contract above;
/// `buffer` is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_register_buffer(
    ptr: *const c_void,
    len: usize,
    buffer: *mut *mut barlink_buffer,
) -> barlink_status {
    boundary("barlink_register_buffer", || {
        start_logging();
        check_out(buffer, "buffer")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(buffer, ptr::null_mut()) };
        if ptr.is_null() {
            return Err(Error::invalid("ptr is NULL"));
        }
        if len == 0 {
            return Err(Error::invalid("len is 0: register at least one byte"));
        }
        if len > isize::MAX as usize || ptr.addr().checked_add(len).is_none() {
            return Err(Error::invalid(format!(
                "len {len} runs past the address space"
            )));
        }
        let value = registry::insert_buffer(Arc::new(Region::new(ptr.cast::<u8>(), len)))?;
        // SAFETY: as above.
        unsafe { put(buffer, handle(value)) };
        Ok(())
    })
}

/// Registers `len` bytes at `offset` in the dma-buf behind `fd` (memory a
/// driver exported: a GPU's through `cuMemGetHandleForAddressRange`, a DRM
/// buffer through PRIME, a udmabuf) for zero-copy sends on any link, as
/// `barlink_register_buffer` registers host memory. barlink keeps its own
/// reference to the dma-buf: the caller may close `fd` once the call
/// returned. Deregister with `barlink_deregister_buffer`.
///
/// barlink takes every payload's CRC on the CPU, so it maps the range for
/// the CPU (read only) and brackets its reads with `DMA_BUF_IOCTL_SYNC`.
/// Over RDMA an RDMA link registers the dma-buf itself with its device
/// (`ibv_reg_dmabuf_mr`) the first time it sends from it, and the NIC
/// reads it in place; a device that refuses dma-bufs (soft-RoCE does) gets
/// a copy through the CPU's mapping instead (`packets_sent_in_place` in
/// `barlink_stats` says which).
///
/// `BARLINK_NOT_AVAILABLE`, with the reason in `barlink_last_error`, where
/// the kernel refuses the CPU's mapping or access: an exporter that gives
/// the CPU no access, as NVIDIA's exports of device memory do not (or no
/// descriptor is left to duplicate it). `BARLINK_OUT_OF_MEMORY` where the
/// mapping finds no address space: the range is mapped from the dma-buf's
/// first byte, so the `offset` bytes before it take address space too.
/// `BARLINK_INVALID_ARGUMENT` for an fd that is not an open dma-buf, or a
/// range that does not lie within it. (ABI 0.12.)
///
/// # Safety
/// `fd` stays open for the call; `buffer` is NULL (refused) or writable.
/// Neither the CPU nor a device writes a range while a send from it is in
/// flight (until its completion is reported).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_register_dmabuf(
    fd: c_int,
    offset: u64,
    len: usize,
    buffer: *mut *mut barlink_buffer,
) -> barlink_status {
    boundary("barlink_register_dmabuf", || {
        start_logging();
        check_out(buffer, "buffer")?;
        // SAFETY: checked; writable by contract.
        unsafe { put(buffer, ptr::null_mut()) };
        if fd < 0 {
            return Err(Error::invalid(format!(
                "fd {fd} is not a file descriptor: pass the dma-buf's fd"
            )));
        }
        if len == 0 {
            return Err(Error::invalid("len is 0: register at least one byte"));
        }
        if len > isize::MAX as usize {
            return Err(Error::invalid(format!(
                "len {len} runs past the address space"
            )));
        }
        // SAFETY: a non-negative descriptor that the contract keeps open for
        // the call, used only to duplicate it (a closed one is answered by
        // the kernel with EBADF, which `DmaBuf::map` reports); barlink keeps
        // the duplicate, never `fd`.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let dmabuf = DmaBuf::map(fd, offset, len)?;
        let value = registry::insert_buffer(Arc::new(Region::dmabuf(dmabuf)))?;
        // SAFETY: as above.
        unsafe { put(buffer, handle(value)) };
        Ok(())
    })
}

/// Deregisters a buffer: `BARLINK_BUSY` while sends from it are in flight
/// (their completions not yet due), or while an RDMA NIC may still read it
/// (a resend queued when its message was acknowledged; a link being
/// closed on another thread): drive the link and try again. Afterwards
/// the handle is invalid and the caller may free the memory.
#[unsafe(no_mangle)]
pub extern "C" fn barlink_deregister_buffer(buffer: *mut barlink_buffer) -> barlink_status {
    boundary("barlink_deregister_buffer", || {
        // A dma-buf's mapping is let go here, after the registry's lock.
        let unmapped = registry::remove_buffer_if(key(buffer), |region| region.retire())?;
        drop(unmapped);
        Ok(())
    })
}

// ------------------------------------------------------------- statistics

/// Fills `*stats` with the link's counters. Set `stats->struct_size =
/// sizeof(barlink_stats)` first: barlink fills that many bytes at most
/// (a program built against an older header gets the fields it knows) and
/// writes back the bytes it filled. Works after the link ended, until it is
/// closed.
///
/// # Safety
/// `stats` is NULL (refused) or points to `stats->struct_size` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn barlink_get_stats(
    link: *mut barlink_link,
    stats: *mut barlink_stats,
) -> barlink_status {
    boundary("barlink_get_stats", || {
        check_out(stats, "stats")?;
        // SAFETY: non-null and aligned; the first field is readable by contract.
        let size = unsafe { ptr::addr_of!((*stats).struct_size).read() } as usize;
        if !(8..=MAX_STRUCT_SIZE).contains(&size) {
            return Err(Error::invalid(format!(
                "stats.struct_size is {size}: set it to sizeof(barlink_stats)"
            )));
        }
        let cell = registry::link(key(link))?;
        let mut filled = cell.lock()?.stats();
        let n = size.min(size_of::<barlink_stats>());
        filled.struct_size = n as u32;
        // SAFETY: `filled` is a local of size_of::<barlink_stats>() >= n
        // bytes without padding; the caller's struct is `size >= n` writable
        // bytes by contract; they cannot overlap.
        unsafe {
            ptr::copy_nonoverlapping(ptr::addr_of!(filled).cast::<u8>(), stats.cast::<u8>(), n)
        };
        Ok(())
    })
}

#[cfg(test)]
mod direct_tests;
