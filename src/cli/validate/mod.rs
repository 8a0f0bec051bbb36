//! `barlink validate`: a data-integrity test of a P2P path.
//!
//! Two windows — two shared-memory windows in this process by default, or
//! the BARs of one or two PCI devices — are tested twice:
//!
//! 1. **Raw window writes.** Each pattern (walking ones, address in
//!    address, seeded random) is written over the tested range of every
//!    window with [`Window::write`] in page-sized pieces, fenced, read back
//!    with [`Window::read`] and compared word by word. Mismatches are
//!    counted per offset range and the first ones are shown with what was
//!    expected and what was found. All windows are written before any is
//!    read, so that windows that alias each other show too.
//! 2. **Through the link.** A [`RingLink`] on each side (one thread each),
//!    rings in the windows, sends messages of mixed sizes carrying the same
//!    patterns both ways; every delivered message is checked byte for byte
//!    against its generator. The link's CRC failures (corruption it caught
//!    and had resent) are reported with its retransmissions, and anything
//!    lost, corrupted or duplicated — which the protocol must make
//!    impossible — is counted.
//!
//! The verdict: PASS (nothing wrong anywhere), WARN (raw writes clean, but
//! the link caught corrupt packets: the path corrupts data under load and
//! barlink repaired it), FAIL (raw errors, a failed link, or — should be
//! impossible — a wrong delivery).
//!
//! `--inject-faults RATE` wraps the windows in a bit-flipping
//! [`FaultWindow`] to show that the validator catches corruption: the raw
//! phase must then find errors and the link must catch CRC failures and
//! still deliver everything intact.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use barlink_topology::Bdf;
use barlink_topology::pci::resource::{BarSpace, parse_resource};
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::sim::SplitMix64;
use barlink_transport::window::{FaultConfig, FaultWindow, ShmOptions, ShmWindow, Window};
use barlink_transport::{EngineConfig, SendError, Stats};
use barlink_vfio::bind::{self, DeviceSpec};
use barlink_vfio::{BarWindow, Container, SysfsBar, SysfsBarOptions, VfioEnv, VfioError};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use super::args::{JsonArg, SysfsRootArg};
use super::{CommandError, Status, human_size, parse_size};

/// What `barlink validate --help` adds below the options.
const AFTER_HELP: &str = "\
What it does:
  Phase 1 writes walking ones, address-in-address (each 8-byte word holds its
  own offset) and seeded random patterns over the tested range of each window
  with plain CPU writes, fences, reads everything back and compares: errors are
  reported per offset range, with the first bad words (expected/found).
  Phase 2 runs a barlink link over the same windows (a ring in each, one thread
  per side) and sends messages of mixed sizes carrying the same patterns both
  ways; every delivered byte is checked.

Verdicts and exit status:
  PASS  (exit 0) no raw error, and the link never saw a corrupt packet.
  WARN  (exit 0; 1 with --strict) raw writes were clean, but the link caught
        corrupt packets and resent them: the path corrupts data under load.
        barlink delivered every byte intact; software without an end-to-end
        check (plain P2P copies, NCCL) on this path would not. WARN exits 0
        because data moved by barlink is safe, as the doctor's WARN does; use
        --strict where anything else will use the path.
  FAIL  (exit 1) raw writes read back wrong, or the link failed, or the link
        delivered something wrong (impossible by design: report it).
  Exit 2 on bad usage, 3 when the device cannot be found, opened or mapped.

Devices:
  --device BDF         one device: both rings in the two halves of one BAR.
  --device BDF,BDF     two devices: each BAR is one side's receive window, as
                       two GPUs would use them.
  A device is an address (0000:01:00.0) or vendor:device (10de:2684,
  10de:2684#1 for the second match). --via auto uses VFIO when the device is
  bound to vfio-pci and its sysfs resourceN(_wc) file otherwise (root needed).

  THE TESTED RANGE OF EACH BAR IS OVERWRITTEN. On a GPU whose driver exposes
  its memory through BAR1, use an idle GPU or an --offset/--size range nothing
  else uses.

  Reads across PCIe are uncached and slow (often 10-100x slower than writes);
  a BAR run takes longer than shared memory. That is expected: the validator
  reads everything back on purpose. Progress goes to stderr on a terminal.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// VFIO if the device is bound to vfio-pci, else sysfs.
    Auto,
    /// The device's region through VFIO (bound to vfio-pci).
    Vfio,
    /// The sysfs resourceN file (resourceN_wc when it exists).
    Sysfs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InjectInto {
    /// Raw writes and the link's writes.
    Both,
    /// Raw writes only.
    Raw,
    /// The link's writes only.
    Link,
}

#[derive(Debug, Args)]
#[command(
    after_help = "PASS exits 0, WARN 0 (1 with --strict), FAIL 1; bad usage 2; a device that \
                  cannot be found, opened or mapped 3. --help says more.",
    after_long_help = AFTER_HELP
)]
pub struct ValidateArgs {
    /// The BARs to test: one device (both rings in halves of one BAR) or two
    /// (each BAR one side's receive window), by address or vendor:device.
    /// Default: two shared-memory windows in this process.
    #[arg(
        long,
        value_name = "SPEC[,SPEC]",
        value_delimiter = ',',
        env = "BARLINK_DEVICE"
    )]
    device: Vec<String>,
    /// BAR index. Default: the device's largest memory BAR.
    #[arg(long, value_name = "N", env = "BARLINK_BAR")]
    bar: Option<u32>,
    /// How to map the BAR: auto (VFIO when bound to vfio-pci, else sysfs),
    /// vfio, or sysfs (resourceN_wc / resourceN; the device keeps its driver).
    #[arg(long, value_enum, default_value = "auto", env = "BARLINK_VIA")]
    via: Via,
    /// Where the tested range starts in each BAR (a multiple of 4K).
    #[arg(long, default_value = "0", value_parser = parse_size, env = "BARLINK_OFFSET")]
    offset: usize,
    /// Bytes of each window to test (a multiple of 4K). Default: the BAR from
    /// --offset on, up to 256M; shared memory 64M; with --quick 4M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_SIZE")]
    size: Option<usize>,
    /// Payload bytes sent through the link in each direction. Default 256M;
    /// with --quick 16M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_LINK_BYTES")]
    link_bytes: Option<usize>,
    /// Messages sent through the link in each direction (instead of
    /// --link-bytes).
    #[arg(long, env = "BARLINK_MESSAGES", conflicts_with = "link_bytes")]
    messages: Option<u64>,
    /// Largest message; sizes are mixed from 8 bytes up to this.
    #[arg(long, default_value = "1M", value_parser = parse_size, env = "BARLINK_MAX_SIZE")]
    max_size: usize,
    /// The link's packet size (a ring slot holds one).
    #[arg(long, default_value = "16K", value_parser = parse_size, env = "BARLINK_MTU")]
    mtu: usize,
    /// Flip one bit in this fraction of the writes (0..=0.5), to show that
    /// corruption is caught: the raw phase must then FAIL and the link must
    /// catch CRC failures and still deliver everything intact.
    #[arg(
        long,
        value_name = "RATE",
        default_value_t = 0.0,
        env = "BARLINK_INJECT_FAULTS"
    )]
    inject_faults: f64,
    /// Which phase --inject-faults applies to.
    #[arg(long, value_enum, default_value = "both", env = "BARLINK_INJECT_INTO")]
    inject_into: InjectInto,
    /// Seed of the random pattern, the message sizes and injected faults.
    #[arg(long, default_value_t = 1, env = "BARLINK_SEED")]
    seed: u64,
    /// Seconds the link phase may take before it is failed. Default 600;
    /// with --quick 60.
    #[arg(long, value_name = "SECS", env = "BARLINK_TIMEOUT")]
    timeout: Option<u64>,
    /// Exit 1 on WARN too (the path corrupted packets that barlink repaired).
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    sysfs: SysfsRootArg,
    /// A short run (under 20 seconds on shared memory): 4M per window, 16M
    /// through the link each way.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: JsonArg,
}

// ------------------------------------------------------------------ patterns

/// Added per word to the random pattern's SplitMix64 state (its own
/// increment), so that any word of the stream can be started at.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    /// Word n holds a single one bit at position (n + key) mod 64: every
    /// data line carries a lone one in turn.
    WalkingOnes,
    /// Each word holds its own byte offset (XOR the key): a write that
    /// lands at the wrong address shows where it came from.
    AddressInAddress,
    /// SplitMix64 output; word n of a stream is independent of the others.
    Random,
}

impl Pattern {
    const ALL: [Pattern; 3] = [
        Pattern::WalkingOnes,
        Pattern::AddressInAddress,
        Pattern::Random,
    ];

    fn name(self) -> &'static str {
        match self {
            Pattern::WalkingOnes => "walking-ones",
            Pattern::AddressInAddress => "address-in-address",
            Pattern::Random => "random",
        }
    }

    /// Fills `buf` with the words of the stream `key` that start at byte
    /// offset `at` (a multiple of 8); a last partial word is cut short.
    fn fill(self, key: u64, at: u64, buf: &mut [u8]) {
        debug_assert!(at.is_multiple_of(8));
        let first = at / 8;
        match self {
            Pattern::WalkingOnes => {
                for (i, word) in buf.chunks_mut(8).enumerate() {
                    let bit = (first + i as u64).wrapping_add(key) % 64;
                    put(word, 1u64 << bit);
                }
            }
            Pattern::AddressInAddress => {
                for (i, word) in buf.chunks_mut(8).enumerate() {
                    put(word, (at + 8 * i as u64) ^ key);
                }
            }
            Pattern::Random => {
                let mut rng = SplitMix64::new(key.wrapping_add(first.wrapping_mul(GAMMA)));
                for word in buf.chunks_mut(8) {
                    put(word, rng.next_u64());
                }
            }
        }
    }
}

fn put(word: &mut [u8], value: u64) {
    let len = word.len();
    word.copy_from_slice(&value.to_le_bytes()[..len]);
}

/// The little-endian word of up to 8 bytes.
fn word_of(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

// ------------------------------------------------------------------ the windows

/// One window tested by the raw phase.
struct RawWindow {
    name: String,
    window: Arc<dyn Window>,
    /// Offset of the window in its BAR (0 for shared memory): the offsets
    /// reported, and the address-in-address pattern's values.
    base: usize,
}

/// What is tested: the windows of the raw phase and the two receive
/// windows of the link.
struct Target {
    kind: &'static str,
    /// One line per window, for people.
    description: Vec<String>,
    devices: Vec<Value>,
    raw: Vec<RawWindow>,
    /// Side A's receive window, side B's.
    rings: [Arc<dyn Window>; 2],
    size: usize,
}

const PAGE: usize = 4096;
const MAX_DEFAULT_SIZE: usize = 256 << 20;
const SHM_DEFAULT_SIZE: usize = 64 << 20;
const QUICK_SIZE: usize = 4 << 20;

fn default_size(args: &ValidateArgs, full: usize) -> usize {
    if args.quick { QUICK_SIZE } else { full }
}

fn shm_target(args: &ValidateArgs) -> Result<Target, CommandError> {
    for (given, name) in [
        (args.bar.is_some(), "--bar"),
        (args.offset != 0, "--offset"),
        (args.via != Via::Auto, "--via"),
    ] {
        if given {
            return Err(CommandError::usage(format!(
                "{name} applies to --device only (without it, shared memory is tested)"
            )));
        }
    }
    let size = args
        .size
        .unwrap_or_else(|| default_size(args, SHM_DEFAULT_SIZE));
    check_size(size)?;
    let options = ShmOptions::default();
    let mut windows = Vec::new();
    for side in ["a", "b"] {
        let window = ShmWindow::create_memfd(&format!("barlink-validate-{side}"), size, &options)
            .map_err(|e| CommandError::environment(format!("shared memory: {e}")))?;
        windows.push(Arc::new(window) as Arc<dyn Window>);
    }
    Ok(Target {
        kind: "shm",
        description: vec![
            format!(
                "A = memfd barlink-validate-a, {} (side A's receive ring)",
                human_size(size)
            ),
            format!(
                "B = memfd barlink-validate-b, {} (side B's receive ring)",
                human_size(size)
            ),
        ],
        devices: vec![],
        raw: vec![
            RawWindow {
                name: "A".into(),
                window: windows[0].clone(),
                base: 0,
            },
            RawWindow {
                name: "B".into(),
                window: windows[1].clone(),
                base: 0,
            },
        ],
        rings: [windows[0].clone(), windows[1].clone()],
        size,
    })
}

fn check_size(size: usize) -> Result<(), CommandError> {
    if size < 16 * PAGE || !size.is_multiple_of(PAGE) {
        return Err(CommandError::usage(format!(
            "--size {size} must be a multiple of 4K and at least 64K"
        )));
    }
    Ok(())
}

/// A device resolved, with how it will be mapped.
struct Device {
    spec: String,
    bdf: Bdf,
    via: Via,
    index: u32,
    bar_len: u64,
    /// The device opened through VFIO (VFIO route only).
    vfio: Option<barlink_vfio::VfioDevice>,
}

fn env_error(spec: &str, error: &VfioError) -> CommandError {
    CommandError::environment(format!("device {spec}: {error}"))
}

fn device_target(args: &ValidateArgs) -> Result<Target, CommandError> {
    if args.device.len() > 2 {
        return Err(CommandError::usage(format!(
            "--device takes one or two devices, not {}",
            args.device.len()
        )));
    }
    if !args.offset.is_multiple_of(PAGE) {
        return Err(CommandError::usage(format!(
            "--offset {} is not a multiple of 4K",
            args.offset
        )));
    }
    let root = args.sysfs.sysfs_root.as_path();
    let dev_dir = if root == Path::new("/") {
        PathBuf::from("/dev/vfio")
    } else {
        root.join("dev/vfio")
    };
    let env = VfioEnv::with_roots(root, dev_dir);
    let mut container: Option<Container> = None;
    let mut devices: Vec<Device> = Vec::new();
    for spec in &args.device {
        let spec = spec.trim();
        let parsed: DeviceSpec = spec
            .parse()
            .map_err(|e: VfioError| CommandError::usage(format!("--device: {e}")))?;
        let bdf = parsed.resolve(root).map_err(|e| env_error(spec, &e))?;
        if devices.iter().any(|d| d.bdf == bdf) {
            return Err(CommandError::usage(format!(
                "--device names {bdf} twice: give two different devices, or one for both rings"
            )));
        }
        let via = match args.via {
            Via::Auto if bind::driver_of(root, bdf).as_deref() == Some(bind::VFIO_PCI) => Via::Vfio,
            Via::Auto => Via::Sysfs,
            via => via,
        };
        let device = if via == Via::Vfio {
            if container.is_none() {
                // One container for both devices: two GPUs behind one
                // switch without ACS share an IOMMU group, which only one
                // container may hold.
                container = Some(Container::open_in(env.clone()).map_err(|e| env_error(spec, &e))?);
            }
            let opened = container
                .as_ref()
                .expect("just opened")
                .open_device(bdf)
                .map_err(|e| env_error(spec, &e))?;
            let (index, bar_len) = match args.bar {
                Some(index) => {
                    let info = opened.region_info(index).map_err(|e| env_error(spec, &e))?;
                    if let Some(reason) = info.unmappable_reason() {
                        let error = VfioError::RegionNotMappable {
                            bdf,
                            index,
                            flags: info.flags,
                            size: info.size,
                            reason,
                        };
                        return Err(env_error(spec, &error));
                    }
                    (index, info.size)
                }
                None => largest_vfio_bar(&opened).map_err(|e| env_error(spec, &e))?,
            };
            Device {
                spec: spec.to_string(),
                bdf,
                via,
                index,
                bar_len,
                vfio: Some(opened),
            }
        } else {
            let (index, bar_len) =
                sysfs_bar(root, bdf, args.bar).map_err(|e| env_error(spec, &e))?;
            Device {
                spec: spec.to_string(),
                bdf,
                via,
                index,
                bar_len,
                vfio: None,
            }
        };
        devices.push(device);
    }
    // The tested range: the same offsets in each BAR.
    let smallest = devices.iter().map(|d| d.bar_len).min().unwrap_or(0);
    let available = usize::try_from(smallest)
        .unwrap_or(usize::MAX)
        .saturating_sub(args.offset);
    if available == 0 {
        return Err(CommandError::usage(format!(
            "--offset {:#x} is beyond the BAR ({} bytes)",
            args.offset, smallest
        )));
    }
    let size = match args.size {
        Some(size) if size > available => {
            return Err(CommandError::usage(format!(
                "--offset {:#x} + --size {} is beyond the BAR ({} bytes)",
                args.offset, size, smallest
            )));
        }
        Some(size) => size,
        None => default_size(args, MAX_DEFAULT_SIZE).min(available) / PAGE * PAGE,
    };
    check_size(size)?;
    let mut bars = Vec::new();
    let mut description = Vec::new();
    let mut json_devices = Vec::new();
    for device in &devices {
        let bar = map_bar(device, args, size).map_err(|e| env_error(&device.spec, &e))?;
        let region = bar
            .slice(args.offset, size)
            .map_err(|e| CommandError::environment(format!("device {}: {e}", device.spec)))?;
        if !region.writable() {
            return Err(CommandError::environment(format!(
                "device {}: BAR {} is read-only: nothing can be written through it",
                device.spec, device.index
            )));
        }
        description.push(format!(
            "{}: BAR {} ({}), {} tested from offset {:#x}, through {}",
            device.bdf,
            device.index,
            human_size(usize::try_from(device.bar_len).unwrap_or(usize::MAX)),
            human_size(size),
            args.offset,
            bar.source()
        ));
        json_devices.push(json!({
            "spec": device.spec,
            "bdf": device.bdf.to_string(),
            "bar": device.index,
            "bar_bytes": device.bar_len,
            "via": match device.via { Via::Vfio => "vfio", _ => "sysfs" },
            "source": bar.source().to_string(),
            "offset": args.offset,
            "size_bytes": size,
        }));
        bars.push(region);
    }
    let raw: Vec<RawWindow> = devices
        .iter()
        .zip(&bars)
        .map(|(device, region)| RawWindow {
            name: device.bdf.to_string(),
            window: Arc::new(region.clone()),
            base: args.offset,
        })
        .collect();
    let rings: [Arc<dyn Window>; 2] = if let [one] = bars.as_slice() {
        let half = size / 2;
        description.push(format!(
            "side A's ring in the first half ({}), side B's in the second",
            human_size(half)
        ));
        let slice = |at| -> Result<Arc<dyn Window>, CommandError> {
            Ok(Arc::new(one.slice(at, half).map_err(|e| {
                CommandError::environment(format!("device {}: {e}", devices[0].spec))
            })?))
        };
        [slice(0)?, slice(half)?]
    } else {
        description.push(format!(
            "side A receives in {} (B writes it), side B in {} (A writes it)",
            devices[0].bdf, devices[1].bdf
        ));
        [Arc::new(bars[0].clone()), Arc::new(bars[1].clone())]
    };
    Ok(Target {
        kind: "device",
        description,
        devices: json_devices,
        raw,
        rings,
        size,
    })
}

/// The largest mappable BAR (0-5) of a device opened through VFIO.
///
/// Asks for the six BAR regions one by one: `VfioDevice::regions` fails as
/// a whole when a later region (the VGA one of ivshmem, for one) answers
/// `EINVAL`.
fn largest_vfio_bar(device: &barlink_vfio::VfioDevice) -> Result<(u32, u64), VfioError> {
    let best = (0..device.info().num_regions.min(6))
        .filter_map(|index| device.region_info(index).ok())
        .filter(|r| r.unmappable_reason().is_none())
        .max_by_key(|r| r.size);
    match best {
        Some(region) => Ok((region.index, region.size)),
        None => Err(VfioError::RegionNotMappable {
            bdf: device.bdf(),
            index: 0,
            flags: 0,
            size: 0,
            reason: "no BAR of the device can be mapped (see `lspci -v`); name one with --bar"
                .into(),
        }),
    }
}

/// BAR `index` (or the largest memory BAR) from the device's sysfs
/// `resource` file: its index and size.
fn sysfs_bar(root: &Path, bdf: Bdf, index: Option<u32>) -> Result<(u32, u64), VfioError> {
    let path = bind::device_dir(root, bdf).join("resource");
    let text = std::fs::read_to_string(&path).map_err(|e| VfioError::Sysfs {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    let (bars, _) = parse_resource(&text);
    let usable = |b: &&barlink_topology::pci::resource::Bar| {
        b.space == BarSpace::Memory && b.size > 0 && !b.unassigned
    };
    match index {
        Some(index) => match bars.iter().find(|b| u32::from(b.index) == index) {
            Some(bar) if usable(&bar) => Ok((index, bar.size)),
            // Not a usable memory BAR: the open says precisely why.
            _ => {
                let options = SysfsBarOptions {
                    env: VfioEnv::with_roots(root, "/dev/vfio"),
                    ..SysfsBarOptions::default()
                };
                let bar = SysfsBar::open_with(&bdf.to_string(), index, &options)?;
                Ok((index, bar.len() as u64))
            }
        },
        None => bars
            .iter()
            .filter(usable)
            .max_by_key(|b| b.size)
            .map(|b| (u32::from(b.index), b.size))
            .ok_or_else(|| VfioError::RegionNotMappable {
                bdf,
                index: 0,
                flags: 0,
                size: 0,
                reason: format!(
                    "{} shows no memory BAR with an address; name one with --bar",
                    path.display()
                ),
            }),
    }
}

fn map_bar(device: &Device, args: &ValidateArgs, size: usize) -> Result<BarWindow, VfioError> {
    match &device.vfio {
        Some(opened) => opened.map_region(device.index),
        None => {
            let options = SysfsBarOptions {
                env: VfioEnv::with_roots(&args.sysfs.sysfs_root, "/dev/vfio"),
                prefer_write_combining: true,
                len: Some(args.offset + size),
            };
            SysfsBar::open_with(&device.bdf.to_string(), device.index, &options)
        }
    }
}

// ------------------------------------------------------------------ progress

/// A line on stderr, rewritten in place, when stderr is a terminal.
struct Progress {
    on: bool,
}

impl Progress {
    fn show(&self, text: &str) {
        if self.on {
            eprint!("\r{text:<72}\r");
            let _ = std::io::stderr().flush();
        }
    }

    fn clear(&self) {
        self.show("");
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

// ------------------------------------------------------------------ phase 1

/// Bytes per raw write call: a page, so that a fault injected per write
/// hits a page, as one bad TLP would.
const WRITE_PIECE: usize = PAGE;
/// Bytes per raw read call.
const READ_PIECE: usize = 1 << 20;
/// Bad words listed per window and pattern.
const FIRST_ERRORS: usize = 8;
/// Of those, shown in the text report.
const FIRST_ERRORS_SHOWN: usize = 3;

#[derive(Debug, Clone, Default)]
struct Bucket {
    bad_words: u64,
    bad_bytes: u64,
}

#[derive(Debug, Clone)]
struct BadWord {
    offset: usize,
    expected: u64,
    found: u64,
}

#[derive(Debug)]
struct RawResult {
    window: String,
    pattern: Pattern,
    base: usize,
    len: usize,
    bucket_len: usize,
    buckets: Vec<Bucket>,
    bad_words: u64,
    bad_bytes: u64,
    flipped_bits: u64,
    first: Vec<BadWord>,
    write_s: f64,
    read_s: f64,
}

impl RawResult {
    fn to_json(&self) -> Value {
        let ranges: Vec<Value> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (start, end) = self.bucket_range(i);
                json!({
                    "start": start,
                    "end": end,
                    "bad_words": b.bad_words,
                    "bad_bytes": b.bad_bytes,
                })
            })
            .collect();
        let first: Vec<Value> = self
            .first
            .iter()
            .map(|w| {
                json!({
                    "offset": w.offset,
                    "expected": format!("{:#018x}", w.expected),
                    "found": format!("{:#018x}", w.found),
                })
            })
            .collect();
        json!({
            "window": self.window,
            "pattern": self.pattern.name(),
            "offset": self.base,
            "bytes": self.len,
            "bad_words": self.bad_words,
            "bad_bytes": self.bad_bytes,
            "flipped_bits": self.flipped_bits,
            "write_s": round3(self.write_s),
            "read_s": round3(self.read_s),
            "ranges": ranges,
            "first_errors": first,
        })
    }

    /// First and last offset (in the BAR) of range `i`.
    fn bucket_range(&self, i: usize) -> (usize, usize) {
        let start = self.base + i * self.bucket_len;
        let end = (start + self.bucket_len).min(self.base + self.len) - 1;
        (start, end)
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The stream key of `pattern` in window `index`: the random pattern
/// differs per window (so windows that alias each other show), the others
/// are the same everywhere.
fn raw_key(pattern: Pattern, seed: u64, index: usize) -> u64 {
    match pattern {
        Pattern::Random => seed ^ (index as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
        _ => 0,
    }
}

/// Phase 1: every pattern written over every window, then read back.
fn raw_phase(
    target: &Target,
    writers: &[Arc<dyn Window>],
    args: &ValidateArgs,
    progress: &Progress,
) -> Result<Vec<RawResult>, CommandError> {
    let bucket_len = (1usize << 20).max(target.size / 16);
    // Bytes written and read, for the progress line.
    let total = (2 * target.size * target.raw.len() * Pattern::ALL.len()) as u64;
    let mut done = 0u64;
    let mut results = Vec::new();
    let mut piece = vec![0u8; WRITE_PIECE];
    let mut got = vec![0u8; READ_PIECE];
    let mut want = vec![0u8; READ_PIECE];
    let window_error = |name: &str, e: &dyn std::fmt::Display| {
        CommandError::environment(format!("window {name}: {e}"))
    };
    for pattern in Pattern::ALL {
        let mut write_s = Vec::new();
        for (index, (raw, writer)) in target.raw.iter().zip(writers).enumerate() {
            let key = raw_key(pattern, args.seed, index);
            let started = Instant::now();
            for at in (0..target.size).step_by(WRITE_PIECE) {
                let len = WRITE_PIECE.min(target.size - at);
                pattern.fill(key, (raw.base + at) as u64, &mut piece[..len]);
                writer
                    .write(at, &piece[..len])
                    .map_err(|e| window_error(&raw.name, &e))?;
                if at.is_multiple_of(16 << 20) {
                    progress.show(&format!(
                        "validate: raw {} writing {} ({:.0}%)",
                        pattern.name(),
                        raw.name,
                        100.0 * (done + at as u64) as f64 / total as f64
                    ));
                }
            }
            writer.store_fence();
            write_s.push(started.elapsed().as_secs_f64());
            done += target.size as u64;
        }
        for (index, raw) in target.raw.iter().enumerate() {
            let key = raw_key(pattern, args.seed, index);
            let started = Instant::now();
            let mut result = RawResult {
                window: raw.name.clone(),
                pattern,
                base: raw.base,
                len: target.size,
                bucket_len,
                buckets: vec![Bucket::default(); target.size.div_ceil(bucket_len)],
                bad_words: 0,
                bad_bytes: 0,
                flipped_bits: 0,
                first: Vec::new(),
                write_s: write_s[index],
                read_s: 0.0,
            };
            for at in (0..target.size).step_by(READ_PIECE) {
                let len = READ_PIECE.min(target.size - at);
                raw.window
                    .read(at, &mut got[..len])
                    .map_err(|e| window_error(&raw.name, &e))?;
                pattern.fill(key, (raw.base + at) as u64, &mut want[..len]);
                if got[..len] != want[..len] {
                    compare_words(&mut result, at, &got[..len], &want[..len]);
                }
                progress.show(&format!(
                    "validate: raw {} reading {} ({:.0}%)",
                    pattern.name(),
                    raw.name,
                    100.0 * (done + (at + len) as u64) as f64 / total as f64
                ));
            }
            done += target.size as u64;
            result.read_s = started.elapsed().as_secs_f64();
            results.push(result);
        }
    }
    progress.clear();
    Ok(results)
}

/// Counts the words that differ in a piece read at `at` (window offset).
fn compare_words(result: &mut RawResult, at: usize, got: &[u8], want: &[u8]) {
    for (i, (g, w)) in got.chunks(8).zip(want.chunks(8)).enumerate() {
        if g == w {
            continue;
        }
        let offset = at + 8 * i;
        let (found, expected) = (word_of(g), word_of(w));
        let bad_bytes = g.iter().zip(w).filter(|(a, b)| a != b).count() as u64;
        result.bad_words += 1;
        result.bad_bytes += bad_bytes;
        result.flipped_bits += u64::from((found ^ expected).count_ones());
        let bucket = &mut result.buckets[offset / result.bucket_len];
        bucket.bad_words += 1;
        bucket.bad_bytes += bad_bytes;
        if result.first.len() < FIRST_ERRORS {
            result.first.push(BadWord {
                offset: result.base + offset,
                expected,
                found,
            });
        }
    }
}

// ------------------------------------------------------------------ phase 2

/// The messages one side sends: their count and contents follow from the
/// seed, so the receiver regenerates each one to check it.
#[derive(Debug, Clone, Copy)]
struct Stream {
    seed: u64,
    count: u64,
    max_size: usize,
}

impl Stream {
    fn rng(&self, index: u64) -> SplitMix64 {
        SplitMix64::new(self.seed ^ index.wrapping_mul(GAMMA))
    }

    /// Message `index`'s length: mostly small and medium, some large (mixed
    /// sizes cross packet boundaries at every alignment).
    fn len(&self, index: u64) -> usize {
        let mut rng = self.rng(index);
        let max = self.max_size.max(8) as u64;
        let len = 8 + match rng.below(10) {
            0..=3 => rng.below(256),
            4..=6 => rng.below(16 << 10),
            7..=8 => rng.below(256 << 10),
            _ => rng.below(max),
        };
        len.min(max) as usize
    }

    /// Message `index`: its index (8 bytes, little-endian), then the
    /// pattern `index % 3` keyed by the index.
    fn message(&self, index: u64, buf: &mut Vec<u8>) {
        let len = self.len(index);
        buf.clear();
        buf.resize(len, 0);
        buf[..8].copy_from_slice(&index.to_le_bytes());
        let pattern = Pattern::ALL[(index % 3) as usize];
        let key = match pattern {
            Pattern::WalkingOnes => index,
            Pattern::AddressInAddress => index << 40,
            Pattern::Random => self.seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03),
        };
        pattern.fill(key, 8, &mut buf[8..]);
    }

    /// The messages whose lengths add up to at least `bytes`.
    fn count_for(seed: u64, max_size: usize, bytes: usize) -> u64 {
        let mut stream = Stream {
            seed,
            count: 0,
            max_size,
        };
        let mut total = 0usize;
        while total < bytes && stream.count < 100_000_000 {
            total += stream.len(stream.count);
            stream.count += 1;
        }
        stream.count
    }

    fn bytes(&self) -> u64 {
        (0..self.count).map(|i| self.len(i) as u64).sum()
    }
}

/// Messages a side queues beyond those acknowledged.
const MAX_QUEUED: u64 = 64;

/// What one side of the link saw.
#[derive(Debug, Default)]
struct SideOutcome {
    sent: u64,
    completed: u64,
    received: u64,
    received_bytes: u64,
    lost: u64,
    corrupted: u64,
    duplicated: u64,
    /// Messages never delivered because the link failed (each failed with
    /// the link's error, not lost silently).
    undelivered: u64,
    /// The first wrong delivery, for the report.
    first_wrong: Option<String>,
    stats: Stats,
    error: Option<String>,
}

struct SideShared<'a> {
    done: &'a AtomicBool,
    peer_done: &'a AtomicBool,
    abort: &'a AtomicBool,
    received_bytes: &'a AtomicU64,
    deadline: Instant,
    timeout: Duration,
}

/// Runs one side: sends its stream, checks every message of the peer's,
/// until both sides have everything (or an error, or the deadline).
fn run_side(
    mut link: RingLink<Arc<dyn Window>>,
    send: Stream,
    receive: Stream,
    shared: &SideShared<'_>,
) -> SideOutcome {
    let mut out = SideOutcome::default();
    let mut expected = 0u64;
    let mut want = Vec::new();
    let mut pending: Option<Vec<u8>> = None;
    'run: loop {
        let mut busy = false;
        // A bounded number ahead of the acknowledgements: messages are
        // generated as they are queued, and the engine's own queue holds
        // thousands.
        while out.sent < send.count && out.sent - link.completed() < MAX_QUEUED {
            let data = pending.take().unwrap_or_else(|| {
                let mut buf = Vec::new();
                send.message(out.sent, &mut buf);
                buf
            });
            match link.send(data) {
                Ok(_) => {
                    out.sent += 1;
                    busy = true;
                }
                Err(SendError::QueueFull(back)) => {
                    pending = Some(back);
                    break;
                }
                Err(error) => {
                    out.error = Some(format!("message {} refused: {error}", out.sent));
                    break 'run;
                }
            }
        }
        match link.progress() {
            Ok(moved) => busy |= moved,
            Err(error) => {
                out.error = Some(error.to_string());
                break;
            }
        }
        loop {
            let got = match link.try_recv() {
                Ok(Some(got)) => got,
                Ok(None) => break,
                Err(error) => {
                    out.error = Some(error.to_string());
                    break 'run;
                }
            };
            busy = true;
            check_delivery(&mut out, &mut expected, &receive, &got, &mut want);
            shared
                .received_bytes
                .fetch_add(got.len() as u64, Ordering::Relaxed);
            link.recycle(got);
        }
        let done = expected >= receive.count && link.completed() >= send.count;
        if done {
            shared.done.store(true, Ordering::Release);
            if shared.peer_done.load(Ordering::Acquire) {
                break;
            }
        }
        if shared.abort.load(Ordering::Relaxed) {
            out.error = Some("stopped: the other side failed".into());
            break;
        }
        if Instant::now() >= shared.deadline {
            out.error = Some(format!(
                "timed out after {:?} (--timeout): {expected}/{} received, {}/{} acknowledged",
                shared.timeout,
                receive.count,
                link.completed(),
                send.count
            ));
            break;
        }
        if !busy {
            thread::yield_now();
        }
    }
    if out.error.is_some() {
        shared.abort.store(true, Ordering::Relaxed);
    }
    // What never arrived: failed with the error when the link failed (on
    // either side), lost when the link claims success (it cannot, as the
    // loop ends only with everything here; counted to be sure).
    let missing = receive.count.saturating_sub(expected);
    if out.error.is_some() {
        out.undelivered += missing;
    } else {
        out.lost += missing;
    }
    out.completed = link.completed();
    out.stats = link.engine().stats().clone();
    out
}

/// Checks one delivered message against the peer's stream.
fn check_delivery(
    out: &mut SideOutcome,
    expected: &mut u64,
    receive: &Stream,
    got: &[u8],
    want: &mut Vec<u8>,
) {
    out.received += 1;
    out.received_bytes += got.len() as u64;
    let index = got.get(..8).map_or(u64::MAX, word_of);
    if index >= receive.count {
        out.corrupted += 1;
        out.first_wrong.get_or_insert_with(|| {
            format!(
                "a {}-byte message with index {index:#x}, beyond the {} sent",
                got.len(),
                receive.count
            )
        });
        return;
    }
    if index < *expected {
        out.duplicated += 1;
        out.first_wrong
            .get_or_insert_with(|| format!("message {index} delivered again"));
        return;
    }
    if index > *expected {
        out.lost += index - *expected;
        out.first_wrong
            .get_or_insert_with(|| format!("messages {}..{index} skipped", *expected));
    }
    receive.message(index, want);
    if got != want.as_slice() {
        out.corrupted += 1;
        let at = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        out.first_wrong.get_or_insert_with(|| {
            format!(
                "message {index}: {} bytes arrived, {} sent, first difference at {at:?}",
                got.len(),
                want.len()
            )
        });
    }
    *expected = index + 1;
}

#[derive(Debug)]
struct Direction {
    name: &'static str,
    messages_sent: u64,
    messages: u64,
    bytes: u64,
    crc_failures: u64,
    retransmits: u64,
    /// Retransmissions by cause: NAK (corruption reported), timeout, SACK.
    retransmits_by: [u64; 3],
    naks: u64,
    lost: u64,
    corrupted: u64,
    duplicated: u64,
    undelivered: u64,
    first_wrong: Option<String>,
}

impl Direction {
    fn between(name: &'static str, sender: &SideOutcome, receiver: &SideOutcome) -> Direction {
        Direction {
            name,
            messages_sent: sender.sent,
            messages: receiver.received,
            bytes: receiver.received_bytes,
            crc_failures: receiver.stats.crc_failures + receiver.stats.malformed,
            retransmits: sender.stats.retransmits(),
            retransmits_by: [
                sender.stats.retransmits_nak,
                sender.stats.retransmits_timeout,
                sender.stats.retransmits_sack,
            ],
            naks: receiver.stats.naks_sent,
            lost: receiver.lost,
            undelivered: receiver.undelivered,
            corrupted: receiver.corrupted,
            duplicated: receiver.duplicated,
            first_wrong: receiver.first_wrong.clone(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "direction": self.name,
            "messages_sent": self.messages_sent,
            "messages": self.messages,
            "bytes": self.bytes,
            "crc_failures_caught": self.crc_failures,
            "naks": self.naks,
            "retransmits": self.retransmits,
            "retransmits_nak": self.retransmits_by[0],
            "retransmits_timeout": self.retransmits_by[1],
            "retransmits_sack": self.retransmits_by[2],
            "lost": self.lost,
            "undelivered": self.undelivered,
            "corrupted": self.corrupted,
            "duplicated": self.duplicated,
            "first_wrong_delivery": self.first_wrong,
        })
    }
}

struct LinkResult {
    directions: Vec<Direction>,
    error: Option<String>,
    elapsed_s: f64,
    mtu: usize,
}

impl LinkResult {
    fn sum(&self, field: impl Fn(&Direction) -> u64) -> u64 {
        self.directions.iter().map(field).sum()
    }

    fn wrong(&self) -> u64 {
        self.sum(|d| d.lost + d.corrupted + d.duplicated)
    }
}

fn engine_config(args: &ValidateArgs) -> EngineConfig {
    EngineConfig {
        mtu: args.mtu,
        max_message_len: args.max_size.max(8) as u64,
        // Reads of a ring in a BAR are slow (uncached, across PCIe; under
        // emulation slower still): timers for a slow medium. Corruption is
        // resent on NAK at once, whatever the timers.
        initial_rto: Duration::from_millis(100),
        min_rto: Duration::from_millis(20),
        max_rto: Duration::from_secs(2),
        max_transmissions: 64,
        peer_timeout: Duration::from_secs(30),
        ..EngineConfig::default()
    }
}

/// Phase 2: a link over the two rings, a stream each way.
fn link_phase(
    target: &Target,
    peers: [Arc<dyn Window>; 2],
    args: &ValidateArgs,
    config: &EngineConfig,
    streams: [Stream; 2],
    progress: &Progress,
) -> Result<LinkResult, CommandError> {
    let setup = |e: &dyn std::fmt::Display| CommandError::environment(format!("link setup: {e}"));
    for ring in &target.rings {
        let geometry = Geometry::for_window(ring.len(), config.mtu).map_err(|e| {
            CommandError::usage(format!(
                "the rings ({} each) cannot hold packets of --mtu {}: {e}; use a larger --size or a smaller --mtu",
                human_size(ring.len()),
                config.mtu
            ))
        })?;
        init_ring(&**ring, geometry, 1).map_err(|e| setup(&e))?;
    }
    // Side A reads its own ring and writes B's (through `peers[1]`, which
    // may inject faults); side B the other way round.
    let [peer_of_b, peer_of_a] = peers;
    let link_a: RingLink<Arc<dyn Window>> =
        RingLink::new(target.rings[0].clone(), peer_of_a, config.clone(), 1)
            .map_err(|e| setup(&e))?;
    let link_b: RingLink<Arc<dyn Window>> =
        RingLink::new(target.rings[1].clone(), peer_of_b, config.clone(), 1)
            .map_err(|e| setup(&e))?;
    let timeout = Duration::from_secs(
        args.timeout
            .unwrap_or(if args.quick { 60 } else { 600 })
            .max(1),
    );
    let started = Instant::now();
    let deadline = started + timeout;
    let (done_a, done_b, abort) = (
        AtomicBool::new(false),
        AtomicBool::new(false),
        AtomicBool::new(false),
    );
    let received = AtomicU64::new(0);
    let total: u64 = streams.iter().map(Stream::bytes).sum();
    let [a_to_b, b_to_a] = streams;
    let (side_a, side_b) = thread::scope(|scope| {
        let shared_a = SideShared {
            done: &done_a,
            peer_done: &done_b,
            abort: &abort,
            received_bytes: &received,
            deadline,
            timeout,
        };
        let shared_b = SideShared {
            done: &done_b,
            peer_done: &done_a,
            abort: &abort,
            received_bytes: &received,
            deadline,
            timeout,
        };
        let a = scope.spawn(move || run_side(link_a, a_to_b, b_to_a, &shared_a));
        let b = scope.spawn(move || run_side(link_b, b_to_a, a_to_b, &shared_b));
        while !(a.is_finished() && b.is_finished()) {
            thread::sleep(Duration::from_millis(100));
            progress.show(&format!(
                "validate: link {} of {} ({:.0} s)",
                mib(received.load(Ordering::Relaxed)),
                mib(total),
                started.elapsed().as_secs_f64()
            ));
        }
        let panicked = |_| SideOutcome {
            error: Some("the side's thread panicked".into()),
            ..SideOutcome::default()
        };
        (
            a.join().unwrap_or_else(panicked),
            b.join().unwrap_or_else(panicked),
        )
    });
    progress.clear();
    let error = match (&side_a.error, &side_b.error) {
        (Some(a), Some(b)) if b.starts_with("stopped") => Some(format!("side A: {a}")),
        (Some(a), Some(b)) if a.starts_with("stopped") => Some(format!("side B: {b}")),
        (Some(a), Some(b)) => Some(format!("side A: {a}; side B: {b}")),
        (Some(a), None) => Some(format!("side A: {a}")),
        (None, Some(b)) => Some(format!("side B: {b}")),
        (None, None) => None,
    };
    Ok(LinkResult {
        directions: vec![
            Direction::between("A->B", &side_a, &side_b),
            Direction::between("B->A", &side_b, &side_a),
        ],
        error,
        elapsed_s: started.elapsed().as_secs_f64(),
        mtu: config.mtu,
    })
}

// ------------------------------------------------------------------ the run

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// A window wrapped to flip bits in writes.
type Faulty = Arc<FaultWindow<Arc<dyn Window>>>;

/// Wraps each window in a bit-flipping [`FaultWindow`] (or not), returning
/// the windows to write through and the wrappers to count faults on.
fn writers(
    windows: &[Arc<dyn Window>],
    rate: f64,
    seed: u64,
) -> (Vec<Arc<dyn Window>>, Vec<Faulty>) {
    if rate <= 0.0 {
        return (windows.to_vec(), Vec::new());
    }
    let faulty: Vec<Faulty> = windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            Arc::new(FaultWindow::new(
                w.clone(),
                FaultConfig::none().with_bit_flip(rate),
                seed ^ (i as u64 + 1).wrapping_mul(GAMMA),
            ))
        })
        .collect();
    let as_windows = faulty
        .iter()
        .map(|f| f.clone() as Arc<dyn Window>)
        .collect();
    (as_windows, faulty)
}

fn injected(faulty: &[Faulty]) -> u64 {
    faulty.iter().map(|f| f.injected().bit_flips).sum()
}

pub fn run(args: &ValidateArgs) -> Result<Status, CommandError> {
    if !(0.0..=0.5).contains(&args.inject_faults) {
        return Err(CommandError::usage(format!(
            "--inject-faults {} is outside 0..=0.5",
            args.inject_faults
        )));
    }
    if args.messages == Some(0) || args.link_bytes == Some(0) {
        return Err(CommandError::usage(
            "--messages and --link-bytes must be at least 1",
        ));
    }
    if args.max_size < 8 {
        return Err(CommandError::usage(
            "--max-size must be at least 8 (each message carries its index)",
        ));
    }
    let config = engine_config(args);
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let target = if args.device.is_empty() {
        shm_target(args)?
    } else {
        device_target(args)?
    };
    let started = Instant::now();
    let progress = Progress {
        on: std::io::stderr().is_terminal(),
    };
    let rate = |phase: InjectInto| {
        if args.inject_into == InjectInto::Both || args.inject_into == phase {
            args.inject_faults
        } else {
            0.0
        }
    };
    let streams = {
        let count = |seed| match args.messages {
            Some(count) => count,
            None => Stream::count_for(
                seed,
                args.max_size,
                args.link_bytes
                    .unwrap_or(if args.quick { 16 << 20 } else { 256 << 20 }),
            ),
        };
        let seed_ab = args.seed ^ 0xA2B0_0000_0000_0001;
        let seed_ba = args.seed ^ 0xB2A0_0000_0000_0002;
        [
            Stream {
                seed: seed_ab,
                count: count(seed_ab),
                max_size: args.max_size,
            },
            Stream {
                seed: seed_ba,
                count: count(seed_ba),
                max_size: args.max_size,
            },
        ]
    };

    if !args.output.json {
        print_header(&target, args, &config, &streams);
    }
    let raw_windows: Vec<Arc<dyn Window>> = target.raw.iter().map(|r| r.window.clone()).collect();
    let (raw_writers, raw_faulty) = writers(&raw_windows, rate(InjectInto::Raw), args.seed ^ 0x5A);
    let raw = raw_phase(&target, &raw_writers, args, &progress)?;
    let raw_injected = injected(&raw_faulty);
    if !args.output.json {
        print_raw(&raw, raw_injected, rate(InjectInto::Raw) > 0.0);
    }

    let (link_writers, link_faulty) =
        writers(&target.rings, rate(InjectInto::Link), args.seed ^ 0x1C);
    let peers: [Arc<dyn Window>; 2] = [link_writers[0].clone(), link_writers[1].clone()];
    let link = link_phase(&target, peers, args, &config, streams, &progress)?;
    let link_injected = injected(&link_faulty);
    if !args.output.json {
        print_link(&link, link_injected, rate(InjectInto::Link) > 0.0);
    }

    let (verdict, reason) = judge(&raw, &link, raw_injected + link_injected);
    let elapsed = started.elapsed().as_secs_f64();
    if args.output.json {
        let doc = json!({
            "command": "validate",
            "target": target.kind,
            "devices": target.devices,
            "windows": target.raw.iter().map(|r| json!({"name": r.name, "offset": r.base, "size_bytes": target.size})).collect::<Vec<_>>(),
            "size_bytes": target.size,
            "seed": args.seed,
            "inject_faults": args.inject_faults,
            "inject_into": match args.inject_into { InjectInto::Both => "both", InjectInto::Raw => "raw", InjectInto::Link => "link" },
            "raw": {
                "patterns": raw.iter().map(RawResult::to_json).collect::<Vec<_>>(),
                "bad_words": raw.iter().map(|r| r.bad_words).sum::<u64>(),
                "bad_bytes": raw.iter().map(|r| r.bad_bytes).sum::<u64>(),
                "injected_bit_flips": raw_injected,
            },
            "link": {
                "mtu": link.mtu,
                "messages": link.sum(|d| d.messages),
                "bytes": link.sum(|d| d.bytes),
                "crc_failures_caught": link.sum(|d| d.crc_failures),
                "retransmits": link.sum(|d| d.retransmits),
                "lost": link.sum(|d| d.lost),
                "undelivered": link.sum(|d| d.undelivered),
                "corrupted": link.sum(|d| d.corrupted),
                "duplicated": link.sum(|d| d.duplicated),
                "error": link.error,
                "elapsed_s": round3(link.elapsed_s),
                "injected_bit_flips": link_injected,
                "directions": link.directions.iter().map(Direction::to_json).collect::<Vec<_>>(),
            },
            "verdict": verdict.name(),
            "reason": reason,
            "elapsed_s": round3(elapsed),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON values always serialize")
        );
    } else {
        println!();
        println!("validate: {} — {reason}", verdict.name());
    }
    Ok(match verdict {
        Verdict::Pass => Status::Ok,
        Verdict::Warn if args.strict => Status::CheckFailed,
        Verdict::Warn => Status::Ok,
        Verdict::Fail => Status::CheckFailed,
    })
}

fn judge(raw: &[RawResult], link: &LinkResult, injected: u64) -> (Verdict, String) {
    let raw_bad: u64 = raw.iter().map(|r| r.bad_words).sum();
    let raw_bytes: u64 = raw.iter().map(|r| r.len as u64).sum();
    let caught = link.sum(|d| d.crc_failures);
    let messages = link.sum(|d| d.messages);
    let bytes = link.sum(|d| d.bytes);
    let wrong = link.wrong();
    let mut fail = Vec::new();
    if wrong > 0 {
        fail.push(format!(
            "THE LINK DELIVERED {} LOST, {} CORRUPTED AND {} DUPLICATED MESSAGES. This must be \
             impossible (every packet carries a CRC-32C, every message a sequence number): \
             please report it with this output",
            link.sum(|d| d.lost),
            link.sum(|d| d.corrupted),
            link.sum(|d| d.duplicated)
        ));
    }
    if raw_bad > 0 {
        let patterns: Vec<&str> = Pattern::ALL
            .iter()
            .filter(|p| raw.iter().any(|r| r.pattern == **p && r.bad_words > 0))
            .map(|p| p.name())
            .collect();
        fail.push(format!(
            "{raw_bad} of {} words read back wrong after raw writes ({}): this path corrupts \
             data; do not move data over it without an end-to-end check",
            raw_bytes / 8,
            patterns.join(", ")
        ));
    }
    if let Some(error) = &link.error {
        fail.push(format!(
            "the link failed: {error} ({} messages were not delivered: failed with that error, not lost silently)",
            link.sum(|d| d.undelivered)
        ));
    }
    let note = if injected > 0 {
        format!(" ({injected} bit flips were injected on purpose by --inject-faults)")
    } else {
        String::new()
    };
    if !fail.is_empty() {
        if caught > 0 {
            fail.push(format!(
                "the link caught {caught} corrupt packets and resent them"
            ));
        }
        return (Verdict::Fail, format!("{}{note}", fail.join("; ")));
    }
    let summary = format!(
        "{} written and read back raw with no error; {messages} messages ({}) through the link, every byte verified",
        mib(raw_bytes),
        mib(bytes)
    );
    if caught > 0 {
        return (
            Verdict::Warn,
            format!(
                "{summary}, but the link caught {caught} corrupt packets and resent them: \
                 this path corrupts data under load. barlink delivered everything intact; \
                 software without an end-to-end check would not{note}"
            ),
        );
    }
    (Verdict::Pass, format!("{summary}, no corrupt packet{note}"))
}

// ------------------------------------------------------------------ text

fn print_header(
    target: &Target,
    args: &ValidateArgs,
    config: &EngineConfig,
    streams: &[Stream; 2],
) {
    let what = match target.kind {
        "shm" => "shared memory (two memfd windows in this process)".to_string(),
        _ if target.raw.len() == 1 => format!("one BAR, {} tested", human_size(target.size)),
        _ => format!("two BARs, {} of each tested", human_size(target.size)),
    };
    println!("# barlink validate: {what}");
    for line in &target.description {
        println!("#   {line}");
    }
    println!(
        "# seed {}; link: MTU {}, messages 8 B..{} ({} A->B, {} B->A)",
        args.seed,
        human_size(config.mtu),
        human_size(args.max_size),
        streams[0].count,
        streams[1].count
    );
    if args.inject_faults > 0.0 {
        println!(
            "# --inject-faults {}: one bit flipped in that fraction of the writes ({})",
            args.inject_faults,
            match args.inject_into {
                InjectInto::Both => "raw and link phases",
                InjectInto::Raw => "raw phase only",
                InjectInto::Link => "link phase only",
            }
        );
    }
}

fn print_raw(raw: &[RawResult], injected: u64, injecting: bool) {
    println!();
    println!(
        "phase 1: raw window writes ({} pieces, store fence, read back, 8-byte words compared)",
        human_size(WRITE_PIECE)
    );
    let width = raw.iter().map(|r| r.window.len()).max().unwrap_or(6).max(6);
    println!(
        "  {:<width$}  {:<18} {:>8} {:>10} {:>10} {:>13} {:>9} {:>9}  result",
        "window", "pattern", "bytes", "bad words", "bad bytes", "bits flipped", "write s", "read s"
    );
    for r in raw {
        println!(
            "  {:<width$}  {:<18} {:>8} {:>10} {:>10} {:>13} {:>9.3} {:>9.3}  {}",
            r.window,
            r.pattern.name(),
            human_size(r.len),
            r.bad_words,
            r.bad_bytes,
            r.flipped_bits,
            r.write_s,
            r.read_s,
            if r.bad_words == 0 { "ok" } else { "ERRORS" }
        );
    }
    if injecting {
        println!("  injected: {injected} bit flips");
    }
    if raw.iter().any(|r| r.bad_words > 0) {
        println!("  errors by offset range:");
        for r in raw.iter().filter(|r| r.bad_words > 0) {
            for (i, bucket) in r.buckets.iter().enumerate() {
                if bucket.bad_words > 0 {
                    let (start, end) = r.bucket_range(i);
                    println!(
                        "    {:<width$}  {:<18}  {start:#010x}-{end:#010x}  {} bad words, {} bad bytes",
                        r.window,
                        r.pattern.name(),
                        bucket.bad_words,
                        bucket.bad_bytes
                    );
                }
            }
        }
        println!(
            "  first bad words (up to {FIRST_ERRORS_SHOWN} per window and pattern; --json has {FIRST_ERRORS}):"
        );
        for r in raw.iter().filter(|r| r.bad_words > 0) {
            for w in r.first.iter().take(FIRST_ERRORS_SHOWN) {
                println!(
                    "    {:<width$}  {:<18}  at {:#010x}: expected {:#018x} found {:#018x} (differs {:#018x})",
                    r.window,
                    r.pattern.name(),
                    w.offset,
                    w.expected,
                    w.found,
                    w.expected ^ w.found
                );
            }
        }
    }
}

fn print_link(link: &LinkResult, injected: u64, injecting: bool) {
    println!();
    println!(
        "phase 2: through the link (a ring in each window, one thread per side, CRC-32C on every packet; {:.1} s)",
        link.elapsed_s
    );
    let mut table = String::new();
    let _ = writeln!(
        table,
        "  {:<9} {:>9} {:>12} {:>11} {:>12} {:>6} {:>10} {:>11}",
        "direction",
        "messages",
        "bytes",
        "crc caught",
        "retransmits",
        "lost",
        "corrupted",
        "duplicated"
    );
    let mut row = |name: &str, d: [u64; 7]| {
        let _ = writeln!(
            table,
            "  {:<9} {:>9} {:>12} {:>11} {:>12} {:>6} {:>10} {:>11}",
            name,
            d[0],
            mib(d[1]),
            d[2],
            d[3],
            d[4],
            d[5],
            d[6]
        );
    };
    for d in &link.directions {
        row(
            d.name,
            [
                d.messages,
                d.bytes,
                d.crc_failures,
                d.retransmits,
                d.lost,
                d.corrupted,
                d.duplicated,
            ],
        );
    }
    row(
        "total",
        [
            link.sum(|d| d.messages),
            link.sum(|d| d.bytes),
            link.sum(|d| d.crc_failures),
            link.sum(|d| d.retransmits),
            link.sum(|d| d.lost),
            link.sum(|d| d.corrupted),
            link.sum(|d| d.duplicated),
        ],
    );
    print!("{table}");
    if injecting {
        println!("  injected: {injected} bit flips into the link's writes");
    }
    for d in &link.directions {
        if let Some(first) = &d.first_wrong {
            println!("  {}: first wrong delivery: {first}", d.name);
        }
    }
    if let Some(error) = &link.error {
        println!(
            "  the link failed: {error}; {} messages not delivered (failed with that error)",
            link.sum(|d| d.undelivered)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_the_same_filled_whole_or_in_pieces() {
        for pattern in Pattern::ALL {
            let mut whole = vec![0u8; 4096];
            pattern.fill(7, 8192, &mut whole);
            let mut pieces = vec![0u8; 4096];
            for at in (0..4096).step_by(512) {
                pattern.fill(7, 8192 + at as u64, &mut pieces[at..at + 512]);
            }
            assert_eq!(whole, pieces, "{}", pattern.name());
        }
    }

    #[test]
    fn patterns_hold_what_their_names_say() {
        let mut buf = vec![0u8; 80];
        Pattern::AddressInAddress.fill(0, 0x1000, &mut buf);
        assert_eq!(word_of(&buf[8..16]), 0x1008);
        Pattern::WalkingOnes.fill(0, 0, &mut buf);
        assert_eq!(word_of(&buf[..8]), 1);
        assert_eq!(word_of(&buf[24..32]), 8);
        assert!(buf.chunks(8).all(|w| word_of(w).count_ones() == 1));
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        Pattern::Random.fill(1, 0, &mut a);
        Pattern::Random.fill(2, 0, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn messages_replay_and_carry_their_index() {
        let stream = Stream {
            seed: 3,
            count: 100,
            max_size: 1 << 20,
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for index in [0, 1, 2, 57] {
            stream.message(index, &mut a);
            stream.message(index, &mut b);
            assert_eq!(a, b);
            assert_eq!(word_of(&a[..8]), index);
            assert!(a.len() >= 8 && a.len() <= 1 << 20);
        }
        let count = Stream::count_for(3, 1 << 20, 16 << 20);
        assert!(count > 10, "{count}");
    }

    #[test]
    fn a_delivery_that_differs_is_counted_by_kind() {
        let stream = Stream {
            seed: 9,
            count: 10,
            max_size: 4096,
        };
        let mut out = SideOutcome::default();
        let (mut expected, mut want, mut msg) = (0u64, Vec::new(), Vec::new());
        stream.message(0, &mut msg);
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        stream.message(3, &mut msg);
        let last = msg.len() - 1;
        msg[last] ^= 0x10;
        check_delivery(&mut out, &mut expected, &stream, &msg, &mut want);
        assert_eq!((out.duplicated, out.lost, out.corrupted), (1, 2, 1));
        assert_eq!(expected, 4);
    }

    #[test]
    fn word_errors_land_in_their_offset_range() {
        let mut result = RawResult {
            window: "A".into(),
            pattern: Pattern::Random,
            base: 0x10_0000,
            len: 4 << 20,
            bucket_len: 1 << 20,
            buckets: vec![Bucket::default(); 4],
            bad_words: 0,
            bad_bytes: 0,
            flipped_bits: 0,
            first: vec![],
            write_s: 0.0,
            read_s: 0.0,
        };
        let want = vec![0u8; 64];
        let mut got = want.clone();
        got[17] = 0x81;
        compare_words(&mut result, (2 << 20) + 64, &got, &want);
        assert_eq!(
            (result.bad_words, result.bad_bytes, result.flipped_bits),
            (1, 1, 2)
        );
        assert_eq!(result.buckets[2].bad_words, 1);
        assert_eq!(result.first[0].offset, 0x10_0000 + (2 << 20) + 64 + 16);
        assert_eq!(result.bucket_range(2), (0x30_0000, 0x3f_ffff));
    }
}
