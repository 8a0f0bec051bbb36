//! `barlink validate`'s options and the help text below them.

use clap::{Args, ValueEnum};

use crate::cli::args::{GpuDeviceArg, JsonArg, SysfsRootArg};
use crate::cli::parse_size;

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

GPU memory:
  --gpu [--gpu-device N]  the GPU's memory through the CUDA driver: patterns
                       copied host->device and device->device and read back,
                       then messages device->device through a link. Exit 3
                       without a CUDA driver or GPU.

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
    pub device: Vec<String>,
    /// BAR index. Default: the device's largest memory BAR.
    #[arg(long, value_name = "N", env = "BARLINK_BAR")]
    pub bar: Option<u32>,
    /// How to map the BAR: auto (VFIO when bound to vfio-pci, else sysfs),
    /// vfio, or sysfs (resourceN_wc / resourceN; the device keeps its driver).
    #[arg(long, value_enum, default_value = "auto", env = "BARLINK_VIA")]
    pub via: Via,
    /// Where the tested range starts in each BAR (a multiple of 4K).
    #[arg(long, default_value = "0", value_parser = parse_size, env = "BARLINK_OFFSET")]
    pub offset: usize,
    /// Bytes of each window to test (a multiple of 4K). Default: the BAR from
    /// --offset on, up to 256M; shared memory 64M; with --quick 4M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_SIZE")]
    pub size: Option<usize>,
    /// Payload bytes sent through the link in each direction. Default 256M;
    /// with --quick 16M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_LINK_BYTES")]
    pub link_bytes: Option<usize>,
    /// Messages sent through the link in each direction (instead of
    /// --link-bytes).
    #[arg(long, env = "BARLINK_MESSAGES", conflicts_with = "link_bytes")]
    pub messages: Option<u64>,
    /// Largest message; sizes are mixed from 8 bytes up to this.
    #[arg(long, default_value = "1M", value_parser = parse_size, env = "BARLINK_MAX_SIZE")]
    pub max_size: usize,
    /// The link's packet size (a ring slot holds one).
    #[arg(long, default_value = "16K", value_parser = parse_size, env = "BARLINK_MTU")]
    pub mtu: usize,
    /// Flip one bit in this fraction of the writes (0..=0.5), index stores
    /// included, to show that corruption is caught: the raw phase must then
    /// FAIL and the link must catch CRC failures, ignore corrupt indices
    /// and still deliver everything intact.
    #[arg(
        long,
        value_name = "RATE",
        default_value_t = 0.0,
        env = "BARLINK_INJECT_FAULTS"
    )]
    pub inject_faults: f64,
    /// Which phase --inject-faults applies to.
    #[arg(long, value_enum, default_value = "both", env = "BARLINK_INJECT_INTO")]
    pub inject_into: InjectInto,
    /// Seed of the random pattern, the message sizes and injected faults.
    #[arg(long, default_value_t = 1, env = "BARLINK_SEED")]
    pub seed: u64,
    /// Seconds the link phase may take before it is failed. Default 600;
    /// with --quick 60.
    #[arg(long, value_name = "SECS", env = "BARLINK_TIMEOUT")]
    pub timeout: Option<u64>,
    /// Exit 1 on WARN too (the path corrupted packets that barlink repaired).
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub sysfs: SysfsRootArg,
    /// A short run (under 20 seconds on shared memory): 4M per window, 16M
    /// through the link each way.
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub output: JsonArg,
    /// Test a GPU's memory instead of windows (CUDA): patterns through the
    /// copy engines and device-to-device copies, then messages from device
    /// memory to device memory through a link. Exits 3 saying what is
    /// missing without a driver or a GPU. --size defaults to 256M (quick 16M).
    #[arg(long, conflicts_with_all = ["device", "inject_faults"])]
    pub gpu: bool,
    #[command(flatten)]
    pub gpu_device: GpuDeviceArg,
}
