//! What `validate` tests: two shared-memory windows, or the BARs of one or
//! two devices — the windows of the raw phase and the two rings' windows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use barlink_transport::window::{ShmOptions, ShmWindow, Window};
use barlink_vfio::bind::{self, DeviceSpec};
use barlink_vfio::pci::resource::{BarSpace, parse_resource};
use barlink_vfio::{BarWindow, Bdf, Container, SysfsBar, SysfsBarOptions, VfioEnv, VfioError};
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
    let raw: Vec<TestedWindow> = devices
        .iter()
        .zip(&bars)
        .map(|(device, region)| TestedWindow {
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
    let usable = |b: &&barlink_vfio::pci::resource::Bar| {
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
