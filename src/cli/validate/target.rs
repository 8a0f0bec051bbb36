//! What `validate` tests: two shared-memory windows, or the BARs of one or
//! two devices — the windows of the raw phase and the two rings' windows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use barlink_transport::window::{ShmOptions, ShmWindow, Window};
use barlink_vfio::open::{BarOpener, BarRoute, FoundBar};
use barlink_vfio::{BarWindow, DeviceSpec, VfioEnv, VfioError};
use serde_json::{Value, json};

use super::args::{ValidateArgs, Via};
use crate::cli::{CommandError, human_size};

/// One window tested by the raw phase.
pub struct TestedWindow {
    pub name: String,
    pub window: Arc<dyn Window>,
    /// Offset of the window in its BAR (0 for shared memory): the offsets
    /// reported, and the address-in-address pattern's values.
    pub base: usize,
}

/// What is tested: the windows of the raw phase and the two receive
/// windows of the link.
pub struct Target {
    pub kind: &'static str,
    /// One line per window, for people.
    pub description: Vec<String>,
    pub devices: Vec<Value>,
    pub raw: Vec<TestedWindow>,
    /// Side A's receive window, side B's.
    pub rings: [Arc<dyn Window>; 2],
    pub size: usize,
}

pub const PAGE: usize = 4096;
const MAX_DEFAULT_SIZE: usize = 256 << 20;
const SHM_DEFAULT_SIZE: usize = 64 << 20;
const QUICK_SIZE: usize = 4 << 20;

fn default_size(args: &ValidateArgs, full: usize) -> usize {
    if args.quick { QUICK_SIZE } else { full }
}

pub fn shm_target(args: &ValidateArgs) -> Result<Target, CommandError> {
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
            TestedWindow {
                name: "A".into(),
                window: windows[0].clone(),
                base: 0,
            },
            TestedWindow {
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

/// A device's BAR found, under the name it was given.
struct Device {
    spec: String,
    bar: FoundBar,
}

fn env_error(spec: &str, error: &dyn std::fmt::Display) -> CommandError {
    CommandError::environment(format!("device {spec}: {error}"))
}

pub fn device_target(args: &ValidateArgs) -> Result<Target, CommandError> {
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
    let devices = find_devices(args)?;
    let size = tested_size(args, &devices)?;
    let mut bars = Vec::new();
    let mut description = Vec::new();
    let mut json_devices = Vec::new();
    for Device { spec, bar } in &devices {
        let region = bar
            .map_range(args.offset, size)
            .map_err(|e| env_error(spec, &e))?;
        if !region.writable() {
            return Err(CommandError::environment(format!(
                "device {spec}: BAR {} is read-only: nothing can be written through it",
                bar.index()
            )));
        }
        description.push(format!(
            "{}: BAR {} ({}), {} tested from offset {:#x}, through {}",
            bar.bdf(),
            bar.index(),
            human_size(usize::try_from(bar.bar_len()).unwrap_or(usize::MAX)),
            human_size(size),
            args.offset,
            region.source()
        ));
        json_devices.push(json!({
            "spec": spec,
            "bdf": bar.bdf().to_string(),
            "bar": bar.index(),
            "bar_bytes": bar.bar_len(),
            "via": match bar.route() { BarRoute::Vfio => "vfio", _ => "sysfs" },
            "source": region.source().to_string(),
            "offset": args.offset,
            "size_bytes": size,
        }));
        bars.push(region);
    }
    let raw: Vec<TestedWindow> = devices
        .iter()
        .zip(&bars)
        .map(|(device, region)| TestedWindow {
            name: device.bar.bdf().to_string(),
            window: Arc::new(region.clone()),
            base: args.offset,
        })
        .collect();
    let rings = rings(&devices, &bars, size, &mut description)?;
    Ok(Target {
        kind: "device",
        description,
        devices: json_devices,
        raw,
        rings,
        size,
    })
}

/// The devices of `--device`, each with the BAR to test found.
fn find_devices(args: &ValidateArgs) -> Result<Vec<Device>, CommandError> {
    let root = args.sysfs.sysfs_root.as_path();
    let dev_dir = if root == Path::new("/") {
        PathBuf::from("/dev/vfio")
    } else {
        root.join("dev/vfio")
    };
    let mut opener = BarOpener::new(VfioEnv::with_roots(root, dev_dir));
    let route = match args.via {
        Via::Auto => BarRoute::Auto,
        Via::Vfio => BarRoute::Vfio,
        Via::Sysfs => BarRoute::Sysfs,
    };
    let mut devices: Vec<Device> = Vec::new();
    for spec in &args.device {
        let spec = spec.trim();
        let parsed: DeviceSpec = spec
            .parse()
            .map_err(|e: VfioError| CommandError::usage(format!("--device: {e}")))?;
        let bdf = parsed.resolve(root).map_err(|e| env_error(spec, &e))?;
        if devices.iter().any(|d| d.bar.bdf() == bdf) {
            return Err(CommandError::usage(format!(
                "--device names {bdf} twice: give two different devices, or one for both rings"
            )));
        }
        let bar = opener
            .find(bdf, args.bar, route)
            .map_err(|e| env_error(spec, &e))?;
        devices.push(Device {
            spec: spec.to_string(),
            bar,
        });
    }
    Ok(devices)
}

/// The tested range's length: the same offsets in each BAR.
fn tested_size(args: &ValidateArgs, devices: &[Device]) -> Result<usize, CommandError> {
    let smallest = devices.iter().map(|d| d.bar.bar_len()).min().unwrap_or(0);
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
    Ok(size)
}

/// The two rings' windows: the two halves of one BAR, or one BAR each.
fn rings(
    devices: &[Device],
    bars: &[BarWindow],
    size: usize,
    description: &mut Vec<String>,
) -> Result<[Arc<dyn Window>; 2], CommandError> {
    Ok(if let [one] = bars {
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
            devices[0].bar.bdf(),
            devices[1].bar.bdf()
        ));
        [Arc::new(bars[0].clone()), Arc::new(bars[1].clone())]
    })
}
