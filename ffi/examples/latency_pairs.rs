//! The one-way latency of the C ABI against the Rust link, taken in turns
//! between one pair of processes (`scripts/ffi-bench.sh` runs it).
//!
//! `ffi_bench` and `barlink bench` run as separate process pairs, and on a
//! shared VM the latency of one launch differs from the next by more than
//! the C ABI's whole cost (docs/ARCHITECTURE.md, design change 84). Here
//! both links join the same two processes: the C link through
//! `libbarlink_c.so`, loaded at run time as a C program links it (its
//! thread-locals, its entry points), the Rust ring link through
//! `barlink_transport`. Each turn pings a run of round trips on the C link
//! in each mode, then as many on the Rust link; a mode's median less the
//! Rust link's is a gap read a few hundred microseconds apart, in the same
//! process placement. A mode's figure is the median of its turns' gaps.
//!
//! Both sides send as `ffi_bench --modes ...` and `barlink bench --paths
//! barlink` do: the C side in each of `--modes` in turn (`c-send`: a
//! blocking `barlink_send` of its bytes, a copy; `c-post-send`:
//! `barlink_post_send`; `c-post-send-buffer`: `barlink_post_send_buffer`
//! from a registered buffer; a posted message's completion is waited for
//! once that side's next message is posted, as `ffi_bench` does) and a
//! receive in place (`barlink_release_and_recv_message`, giving the last
//! message back in the same call; with a library older than ABI 0.14,
//! `barlink_release_message` then `barlink_recv_message`), with the default config but for
//! the peer timeout; the Rust side `send_blocking` of one shared
//! buffer and `recv_into`, with the C defaults' MTU and window. Each
//! link's peer timeout is [`TIMEOUT`]: a link sits unpolled while the
//! other takes its part of a turn.
//!
//! ```text
//! cargo build --release -p barlink-c -p barlink-ffi --lib --example latency_pairs
//! target/release/examples/latency_pairs [--lib target/release/libbarlink_c.so]
//!     [--size 64] [--turns 200] [--per-turn 100] [--json]
//!     [--modes c-send,c-post-send,c-post-send-buffer]
//! ```
//!
//! Exit status: 0, or 1 when a call failed or a message came back wrong,
//! 2 on bad usage, 3 when the library cannot be loaded.

use std::ffi::{CStr, CString, c_char, c_void};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink_ffi::barlink_status::{self, BARLINK_OK, BARLINK_WOULD_BLOCK};
use barlink_ffi::{
    barlink_buffer, barlink_config, barlink_link, barlink_listener, barlink_message,
};
use barlink_transport::link::{LinkConfig, Listener, RingLink, connect};
use barlink_transport::window::ShmWindow;

/// Every call's timeout: a peer that died ends the run within it.
const TIMEOUT: Duration = Duration::from_secs(10);
const TIMEOUT_MS: u32 = 10_000;

/// The default config, with the peer timeout of [`TIMEOUT`].
fn c_config() -> barlink_config {
    barlink_config {
        struct_size: std::mem::size_of::<barlink_config>() as u32,
        peer_timeout_ms: TIMEOUT_MS,
        ..barlink_config::default()
    }
}

/// How the C side sends, as `ffi_bench --modes` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Send,
    PostSend,
    PostSendBuffer,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Send, Mode::PostSend, Mode::PostSendBuffer];

    fn name(self) -> &'static str {
        match self {
            Mode::Send => "c-send",
            Mode::PostSend => "c-post-send",
            Mode::PostSendBuffer => "c-post-send-buffer",
        }
    }
}

type Status = barlink_status;
type Link = *mut barlink_link;
type ListenerHandle = *mut barlink_listener;
type Buffer = *mut barlink_buffer;

/// The entry points of `libbarlink_c.so` this program calls, with the
/// signatures of the crate's own (those `barlink.h` declares), taking the
/// crate's types: the loaded library is the same code.
struct CAbi {
    listen:
        unsafe extern "C" fn(*const c_char, *const barlink_config, *mut ListenerHandle) -> Status,
    accept: unsafe extern "C" fn(ListenerHandle, u32, *mut Link) -> Status,
    connect: unsafe extern "C" fn(*const c_char, *const barlink_config, u32, *mut Link) -> Status,
    send: unsafe extern "C" fn(Link, *const c_void, usize, u32) -> Status,
    post_send: unsafe extern "C" fn(Link, *const c_void, usize, u64, *mut u64) -> Status,
    post_send_buffer: unsafe extern "C" fn(Link, Buffer, usize, usize, u64, *mut u64) -> Status,
    wait: unsafe extern "C" fn(Link, u64, u32) -> Status,
    progress: unsafe extern "C" fn(Link) -> Status,
    register_buffer: unsafe extern "C" fn(*const c_void, usize, *mut Buffer) -> Status,
    deregister_buffer: unsafe extern "C" fn(Buffer) -> Status,
    recv_message: unsafe extern "C" fn(Link, *mut barlink_message, u32) -> Status,
    release_message: unsafe extern "C" fn(Link, *const barlink_message) -> Status,
    /// ABI 0.14; a library before it gives back and receives in two calls.
    release_and_recv_message:
        Option<unsafe extern "C" fn(Link, *mut barlink_message, u32) -> Status>,
    close: unsafe extern "C" fn(Link, u32) -> Status,
    listener_close: unsafe extern "C" fn(ListenerHandle) -> Status,
    last_error: unsafe extern "C" fn() -> *const c_char,
    /// Keeps the entry points mapped.
    _lib: libloading::Library,
}

impl CAbi {
    fn load(path: &str) -> Result<CAbi, String> {
        // SAFETY: loading libbarlink_c runs no constructors of its own
        // beyond the Rust runtime's; the symbols below are looked up by
        // their C names and stored with the signatures barlink.h declares.
        // The library stays loaded in `_lib` for as long as they are used.
        unsafe {
            let lib = libloading::Library::new(path).map_err(|e| format!("loading {path}: {e}"))?;
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("{path} lacks {}: {e}", $name))?
                };
            }
            Ok(CAbi {
                listen: sym!("barlink_listen"),
                accept: sym!("barlink_accept"),
                connect: sym!("barlink_connect"),
                send: sym!("barlink_send"),
                post_send: sym!("barlink_post_send"),
                post_send_buffer: sym!("barlink_post_send_buffer"),
                wait: sym!("barlink_wait"),
                progress: sym!("barlink_progress"),
                register_buffer: sym!("barlink_register_buffer"),
                deregister_buffer: sym!("barlink_deregister_buffer"),
                recv_message: sym!("barlink_recv_message"),
                release_message: sym!("barlink_release_message"),
                release_and_recv_message: lib
                    .get(b"barlink_release_and_recv_message\0")
                    .ok()
                    .map(|symbol| *symbol),
                close: sym!("barlink_close"),
                listener_close: sym!("barlink_listener_close"),
                last_error: sym!("barlink_last_error"),
                _lib: lib,
            })
        }
    }

    /// `status` as a result, with the thread's last error text.
    fn check(&self, status: Status, call: &str) -> Result<(), String> {
        if status == BARLINK_OK {
            return Ok(());
        }
        // SAFETY: barlink_last_error takes nothing and returns a
        // NUL-terminated string valid until this thread's next call.
        let text = unsafe { CStr::from_ptr((self.last_error)()) };
        Err(format!("{call}: {status:?}: {}", text.to_string_lossy()))
    }
}

/// A C link as the turns use it.
struct CLink<'a> {
    abi: &'a CAbi,
    link: Link,
    /// The message received last, given back before the next receive.
    held: Option<barlink_message>,
    /// The request of this side's last posted message, waited for once
    /// the next one is on its way; 0: none.
    pending: u64,
    /// The buffer `c-post-send-buffer` sends from, if registered.
    registered: Buffer,
    /// The memory registered: a field, so it is dropped after `drop` has
    /// closed the link and deregistered it, on every way out.
    registered_bytes: Option<Arc<[u8]>>,
}

impl<'a> CLink<'a> {
    fn new(abi: &'a CAbi, link: Link) -> CLink<'a> {
        CLink {
            abi,
            link,
            held: None,
            pending: 0,
            registered: std::ptr::null_mut(),
            registered_bytes: None,
        }
    }

    /// The link, and the message this side sends (`byte` throughout),
    /// registered if a mode sends from registered memory.
    fn with_message(
        abi: &'a CAbi,
        link: Link,
        byte: u8,
        args: &Args,
    ) -> Result<(CLink<'a>, Arc<[u8]>), String> {
        let mut c = CLink::new(abi, link);
        let message: Arc<[u8]> = vec![byte; args.size].into();
        if args.modes.contains(&Mode::PostSendBuffer) {
            c.register(&message)?;
        }
        Ok((c, message))
    }

    /// Registers `data` for `c-post-send-buffer`, which sends its first
    /// bytes, and keeps it until the link is closed.
    fn register(&mut self, data: &Arc<[u8]>) -> Result<(), String> {
        let data = self.registered_bytes.insert(Arc::clone(data));
        // SAFETY: `data` is readable for its length, nobody writes it, and
        // this link keeps it until `drop` has closed the link and
        // deregistered it.
        let status = unsafe {
            (self.abi.register_buffer)(data.as_ptr().cast(), data.len(), &mut self.registered)
        };
        self.abi.check(status, "barlink_register_buffer")
    }

    /// Waits for this side's last posted message, untimed, once the
    /// peer's answer acknowledged it, as `ffi_bench` does after a mode's
    /// round trips: the next mode starts with nothing of this one's.
    fn settle(&mut self) -> Result<(), String> {
        let pending = std::mem::take(&mut self.pending);
        if pending == 0 {
            return Ok(());
        }
        // SAFETY: `link` is open; `pending` is a request it returned.
        let status = unsafe { (self.abi.wait)(self.link, pending, TIMEOUT_MS) };
        self.abi.check(status, "barlink_wait")
    }

    /// Sends `data` in `mode`, then waits for the completion of this
    /// side's message before it, which the peer's answer in between
    /// acknowledged.
    fn send(&mut self, mode: Mode, data: &[u8]) -> Result<(), String> {
        let answered = std::mem::take(&mut self.pending);
        if mode == Mode::Send {
            // SAFETY: `link` is an open handle; `data` is readable for the
            // call.
            let status =
                unsafe { (self.abi.send)(self.link, data.as_ptr().cast(), data.len(), TIMEOUT_MS) };
            self.abi.check(status, "barlink_send")?;
        } else {
            self.post(mode, data)?;
        }
        if answered != 0 {
            // SAFETY: `link` is open; `answered` is a request it returned.
            let status = unsafe { (self.abi.wait)(self.link, answered, TIMEOUT_MS) };
            self.abi.check(status, "barlink_wait")?;
        }
        Ok(())
    }

    /// Posts `data` (the registered buffer's first bytes for
    /// `c-post-send-buffer`), driving the link while the queue is full.
    fn post(&mut self, mode: Mode, data: &[u8]) -> Result<(), String> {
        // Set by the first full queue: a post that goes at once reads no
        // clock, as the blocking send and the Rust link read none.
        let mut deadline = None;
        loop {
            let mut request = 0;
            let status = if mode == Mode::PostSend {
                // SAFETY: `link` is open; `data` is readable for the call
                // (barlink copies it); `request` is writable.
                unsafe {
                    (self.abi.post_send)(
                        self.link,
                        data.as_ptr().cast(),
                        data.len(),
                        0,
                        &mut request,
                    )
                }
            } else {
                // SAFETY: `link` and `registered` are open; the range is
                // the buffer's first `data.len()` bytes, which it holds
                // (it was registered over a message of this size).
                unsafe {
                    (self.abi.post_send_buffer)(
                        self.link,
                        self.registered,
                        0,
                        data.len(),
                        0,
                        &mut request,
                    )
                }
            };
            if status == BARLINK_OK {
                self.pending = request;
                return Ok(());
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + TIMEOUT);
            if status != BARLINK_WOULD_BLOCK || Instant::now() > deadline {
                let call = if mode == Mode::PostSend {
                    "barlink_post_send"
                } else {
                    "barlink_post_send_buffer"
                };
                return self.abi.check(status, call);
            }
            // SAFETY: `link` is an open handle.
            let status = unsafe { (self.abi.progress)(self.link) };
            self.abi.check(status, "barlink_progress")?;
        }
    }

    /// The next message's first byte and length, received in place, the
    /// last one given back in the same call.
    fn recv(&mut self) -> Result<(u8, usize), String> {
        let mut message = self.held.take().unwrap_or(barlink_message {
            data: std::ptr::null(),
            len: 0,
            id: 0,
        });
        if let Some(release_and_recv) = self.abi.release_and_recv_message {
            // SAFETY: `link` is an open handle; `message` is zeroed or a
            // message this link lent and that was not given back yet.
            let status = unsafe { release_and_recv(self.link, &mut message, TIMEOUT_MS) };
            self.abi.check(status, "barlink_release_and_recv_message")?;
        } else {
            if message.id != 0 {
                // SAFETY: as above.
                let status = unsafe { (self.abi.release_message)(self.link, &message) };
                self.abi.check(status, "barlink_release_message")?;
            }
            // SAFETY: `link` is an open handle; `message` is writable.
            let status = unsafe { (self.abi.recv_message)(self.link, &mut message, TIMEOUT_MS) };
            self.abi.check(status, "barlink_recv_message")?;
        }
        self.held = Some(message);
        let first = if message.len == 0 {
            0
        } else {
            // SAFETY: the message's `len` bytes at `data` stay readable
            // until it is given back.
            unsafe { *message.data.cast::<u8>() }
        };
        Ok((first, message.len))
    }
}

impl Drop for CLink<'_> {
    /// Closes the link, also on an error: the peer learns it at once
    /// rather than after its timeout.
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            // SAFETY: as in `recv`.
            let _ = unsafe { (self.abi.release_message)(self.link, &held) };
        }
        // SAFETY: `link` is open and not used again.
        let _ = unsafe { (self.abi.close)(self.link, 1000) };
        if !self.registered.is_null() {
            // SAFETY: registered by `register` and not used again; the
            // closed link holds none of its memory.
            let _ = unsafe { (self.abi.deregister_buffer)(self.registered) };
        }
    }
}

type RustLink = RingLink<ShmWindow, Arc<[u8]>>;

/// The Rust link's config: the C defaults' MTU and packets in flight, and
/// a peer timeout long enough for the other link's turns.
fn rust_config() -> LinkConfig {
    let mut config = LinkConfig::default();
    config.engine.mtu = 128 << 10;
    config.engine.send_window = 32;
    config.engine.recv_window = 32;
    config.engine.peer_timeout = TIMEOUT;
    config
}

struct Args {
    lib: String,
    size: usize,
    turns: usize,
    per_turn: usize,
    json: bool,
    modes: Vec<Mode>,
    child: Option<String>,
}

const USAGE: &str =
    "usage: latency_pairs [--lib PATH] [--size BYTES] [--turns N] [--per-turn N] [--json]
                     [--modes c-send,c-post-send,c-post-send-buffer]";

fn parse_args() -> Result<Args, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/release/examples/latency_pairs -> target/release/libbarlink_c.so
    let beside = exe
        .parent()
        .and_then(|dir| dir.parent())
        .map(|dir| dir.join("libbarlink_c.so"))
        .filter(|path| path.exists());
    let mut args = Args {
        lib: beside.map_or_else(|| "libbarlink_c.so.0".into(), |p| p.display().to_string()),
        size: 64,
        turns: 200,
        per_turn: 100,
        json: false,
        modes: vec![Mode::Send],
        child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value\n{USAGE}"));
        let number = |text: String| {
            text.parse::<usize>()
                .map_err(|e| format!("{text}: {e}\n{USAGE}"))
        };
        match arg.as_str() {
            "--lib" => args.lib = value("--lib")?,
            "--size" => args.size = number(value("--size")?)?,
            "--turns" => args.turns = number(value("--turns")?)?,
            "--per-turn" => args.per_turn = number(value("--per-turn")?)?,
            "--json" => args.json = true,
            "--modes" => {
                args.modes = value("--modes")?
                    .split(',')
                    .map(|name| {
                        Mode::ALL
                            .into_iter()
                            .find(|mode| mode.name() == name)
                            .ok_or(format!("unknown mode {name}\n{USAGE}"))
                    })
                    .collect::<Result<_, _>>()?;
                let twice = |m: &Mode| args.modes.iter().filter(|n| *n == m).count() > 1;
                if Mode::ALL.iter().any(twice) {
                    return Err(format!("--modes names a mode twice\n{USAGE}"));
                }
            }
            "--child" => args.child = Some(value("--child")?),
            _ => return Err(format!("unknown argument {arg}\n{USAGE}")),
        }
    }
    if args.size == 0 || args.turns == 0 || args.per_turn == 0 {
        return Err(format!(
            "--size, --turns and --per-turn take at least 1\n{USAGE}"
        ));
    }
    Ok(args)
}

/// The order of the modes (indices into `--modes`) in turn `turn`: each
/// turn starts one mode later, so that no mode always runs furthest from
/// the Rust link's part. Both sides compute it alike.
fn turn_order(turn: usize, modes: usize) -> impl Iterator<Item = usize> {
    (0..modes).map(move |k| (turn + k) % modes)
}

/// The child: connects both links, then answers every message with one
/// of the same size, on the parent's schedule.
fn child(abi: &CAbi, args: &Args, name: &str) -> Result<(), String> {
    let mut rust: RustLink =
        connect(&format!("{name}-rust"), &rust_config()).map_err(|e| e.to_string())?;
    let c_name = CString::new(format!("{name}-c")).map_err(|e| e.to_string())?;
    let mut link = std::ptr::null_mut();
    let config = c_config();
    // SAFETY: a NUL-terminated name, a config of `struct_size` readable
    // bytes, a writable handle.
    let status = unsafe { (abi.connect)(c_name.as_ptr(), &config, TIMEOUT_MS, &mut link) };
    abi.check(status, "barlink_connect")?;
    let (mut c, answer) = CLink::with_message(abi, link, 0xA5, args)?;
    let mut buf = Vec::new();
    // One turn more: the parent's warm-up.
    for turn in 0..=args.turns {
        for k in turn_order(turn, args.modes.len()) {
            let mode = args.modes[k];
            for _ in 0..args.per_turn {
                c.recv()?;
                c.send(mode, &answer)?;
            }
        }
        for _ in 0..args.per_turn {
            rust.recv_into(&mut buf, TIMEOUT)
                .map_err(|e| e.to_string())?;
            rust.send_blocking(answer.clone(), TIMEOUT)
                .map_err(|e| e.to_string())?;
        }
    }
    // The parent closes its ends first; answering until then lets its
    // closes finish.
    let _ = rust.flush(TIMEOUT);
    let _ = rust.recv_into(&mut buf, Duration::from_secs(2));
    let _ = c.recv();
    drop(c);
    Ok(())
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn quartiles(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: usize| values[(values.len() - 1) * q / 4];
    (at(1), at(3))
}

/// The CPU as benchmarks here name it: model, and whether the vector
/// features the kernels choose by are present.
fn cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|line| line.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|line| line.split_once(':'))
            .map_or(String::new(), |(_, v)| v.trim().to_string())
    };
    let flags = field("flags");
    let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
    format!(
        "{} (family {} model {}), avx512f {}, vpclmulqdq {}",
        field("model name"),
        field("cpu family"),
        field("model"),
        if has("avx512f") { "yes" } else { "no" },
        if has("vpclmulqdq") { "yes" } else { "no" },
    )
}

/// The parent: sets both links up, pings in turns, prints the figure.
fn parent(abi: &CAbi, args: &Args) -> Result<(), String> {
    let name = format!("latency-pairs-{}", std::process::id());
    let listener = Listener::bind(&format!("{name}-rust")).map_err(|e| e.to_string())?;
    let c_name = CString::new(format!("{name}-c")).map_err(|e| e.to_string())?;
    let mut c_listener = std::ptr::null_mut();
    let config = c_config();
    // SAFETY: a NUL-terminated name, a config of `struct_size` readable
    // bytes, a writable handle.
    let status = unsafe { (abi.listen)(c_name.as_ptr(), &config, &mut c_listener) };
    abi.check(status, "barlink_listen")?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let modes: Vec<&str> = args.modes.iter().map(|mode| mode.name()).collect();
    let mut peer = Command::new(exe)
        .args(["--lib", &args.lib, "--size", &args.size.to_string()])
        .args(["--turns", &args.turns.to_string()])
        .args(["--per-turn", &args.per_turn.to_string(), "--child", &name])
        .args(["--modes", &modes.join(",")])
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    let result = ping(abi, args, &listener, c_listener);
    // SAFETY: the listener handle is open and not used again.
    let _ = unsafe { (abi.listener_close)(c_listener) };
    let status = peer.wait().map_err(|e| e.to_string())?;
    let figures = result?;
    if !status.success() {
        return Err(format!("the child failed: {status}"));
    }
    print(&figures, args);
    Ok(())
}

/// One mode's figures.
struct Figures {
    mode: Mode,
    c_p50: f64,
    rust_p50: f64,
    gap: f64,
    gap_q1: f64,
    gap_q3: f64,
    c_faster_turns: usize,
}

/// Prints each mode's figures: a line each for people, or a JSON object
/// each with `--json`.
fn print(figures: &[Figures], args: &Args) {
    let cpu = cpu();
    if !args.json {
        println!("# cpu: {cpu}");
        println!(
            "# {} B one-way, {} turns of {} round trips a link and mode (C ABI: the mode's send, \
             barlink_release_and_recv_message; Rust ring link: send_blocking, recv_into); C - Rust: the median \
             of the turns' gaps, with their quartiles",
            args.size, args.turns, args.per_turn
        );
    }
    for f in figures {
        if args.json {
            println!(
                "{{\"path\":\"{}\",\"size_bytes\":{},\"turns\":{},\"per_turn\":{},\"c_lat_p50_us\":{:.3},\
                 \"rust_lat_p50_us\":{:.3},\"gap_us\":{:.3},\"gap_q1_us\":{:.3},\"gap_q3_us\":{:.3},\
                 \"c_faster_turns\":{},\"cpu\":{:?}}}",
                f.mode.name(),
                args.size,
                args.turns,
                args.per_turn,
                f.c_p50,
                f.rust_p50,
                f.gap,
                f.gap_q1,
                f.gap_q3,
                f.c_faster_turns,
                cpu
            );
        } else {
            println!(
                "{:<20} C ABI {:.3} us, Rust link {:.3} us (medians of all round trips); C - Rust \
                 {:+.3} us (quartiles {:+.3}, {:+.3}; C faster in {} of {} turns)",
                f.mode.name(),
                f.c_p50,
                f.rust_p50,
                f.gap,
                f.gap_q1,
                f.gap_q3,
                f.c_faster_turns,
                args.turns
            );
        }
    }
}

fn ping(
    abi: &CAbi,
    args: &Args,
    listener: &Listener,
    c_listener: ListenerHandle,
) -> Result<Vec<Figures>, String> {
    let mut rust: RustLink = listener.accept(&rust_config()).map_err(|e| e.to_string())?;
    let mut link = std::ptr::null_mut();
    // SAFETY: an open listener handle and a writable handle.
    let status = unsafe { (abi.accept)(c_listener, TIMEOUT_MS, &mut link) };
    abi.check(status, "barlink_accept")?;
    let (mut c, ping) = CLink::with_message(abi, link, 0x5A, args)?;
    let mut buf = Vec::new();
    // Per mode: every C round trip, and each turn's gap to the Rust half.
    let mut c_all = vec![vec![]; args.modes.len()];
    let mut gaps = vec![vec![]; args.modes.len()];
    let mut rust_all = vec![];
    let mut c_halves = vec![Vec::with_capacity(args.per_turn); args.modes.len()];
    let mut rust_half = Vec::with_capacity(args.per_turn);
    // Turn 0 warms both links up (first packets, buffers) and is not kept.
    for turn in 0..=args.turns {
        for k in turn_order(turn, args.modes.len()) {
            let (mode, half) = (args.modes[k], &mut c_halves[k]);
            half.clear();
            for _ in 0..args.per_turn {
                let start = Instant::now();
                c.send(mode, &ping)?;
                let (first, len) = c.recv()?;
                half.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
                if len != args.size || first != 0xA5 {
                    return Err(format!(
                        "the C link's answer came back as {len} bytes starting {first:#x}"
                    ));
                }
            }
            c.settle()?;
        }
        rust_half.clear();
        for _ in 0..args.per_turn {
            let start = Instant::now();
            rust.send_blocking(ping.clone(), TIMEOUT)
                .map_err(|e| e.to_string())?;
            let len = rust
                .recv_into(&mut buf, TIMEOUT)
                .map_err(|e| e.to_string())?;
            rust_half.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
            if len != args.size || buf[0] != 0xA5 {
                return Err(format!("the Rust link's answer came back as {len} bytes"));
            }
        }
        if turn == 0 {
            continue;
        }
        rust_all.extend_from_slice(&rust_half);
        let rust_median = median(&mut rust_half);
        for (k, half) in c_halves.iter_mut().enumerate() {
            c_all[k].extend_from_slice(half);
            gaps[k].push(median(half) - rust_median);
        }
    }
    // In the child's order: the Rust link first, then the C link.
    let _ = rust.close(TIMEOUT);
    drop(c);
    let rust_p50 = median(&mut rust_all);
    Ok(args
        .modes
        .iter()
        .zip(c_all.iter_mut().zip(&mut gaps))
        .map(|(&mode, (c_all, gaps))| {
            let (gap_q1, gap_q3) = quartiles(gaps);
            Figures {
                mode,
                c_p50: median(c_all),
                rust_p50,
                gap: median(gaps),
                gap_q1,
                gap_q3,
                c_faster_turns: gaps.iter().filter(|gap| **gap < 0.0).count(),
            }
        })
        .collect())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("latency_pairs: {error}");
            return ExitCode::from(2);
        }
    };
    let abi = match CAbi::load(&args.lib) {
        Ok(abi) => abi,
        Err(error) => {
            eprintln!(
                "latency_pairs: {error} (build it: cargo build --release -p barlink-c; or pass --lib)"
            );
            return ExitCode::from(3);
        }
    };
    let result = match &args.child {
        Some(name) => child(&abi, &args, name),
        None => parent(&abi, &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("latency_pairs: {error}");
            ExitCode::from(1)
        }
    }
}
