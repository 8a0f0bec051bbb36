//! Opening a BAR by device address: the one place that picks the route
//! (VFIO or sysfs), finds the BAR and maps a range of it, for every caller
//! that starts from an address (`barlink validate`, `barlink::connect`).
//!
//! Two steps, because a caller may need every BAR's size before it knows
//! the range to map (the same offsets in two devices' BARs):
//! [`BarOpener::find`] resolves the route, opens the device through VFIO
//! where that is the route, and finds the BAR and its size;
//! [`FoundBar::map_range`] maps bytes of it. [`open_bar_range`] does both
//! for one BAR of a device named by address or `vendor:device`.
//!
//! Devices found through one [`BarOpener`] share one VFIO container: two
//! GPUs behind one switch without ACS share an IOMMU group, which only one
//! container may hold.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::Path;

use barlink_transport::window::{Window, WindowError};

use crate::bind::{self, VFIO_PCI};
use crate::{
    BarWindow, Container, DeviceSpec, SysfsBar, SysfsBarOptions, VfioDevice, VfioEnv, VfioError,
};
use barlink_topology::Bdf;
use barlink_topology::pci::resource::{Bar, BarSpace, parse_resource};

/// How a BAR is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarRoute {
    /// VFIO when the device is bound to vfio-pci, sysfs otherwise.
    Auto,
    /// The device's region through VFIO (the device bound to vfio-pci).
    Vfio,
    /// The sysfs `resourceN` file (`resourceN_wc` where it exists); the
    /// device keeps its driver.
    Sysfs,
}

/// A BAR found on a device, not mapped yet.
#[derive(Debug)]
pub struct FoundBar {
    bdf: Bdf,
    route: BarRoute,
    index: u32,
    bar_len: u64,
    /// The device opened through VFIO (VFIO route only).
    device: Option<VfioDevice>,
    env: VfioEnv,
}

impl FoundBar {
    /// The device's address.
    pub fn bdf(&self) -> Bdf {
        self.bdf
    }

    /// The route taken: [`BarRoute::Vfio`] or [`BarRoute::Sysfs`], never
    /// `Auto`.
    pub fn route(&self) -> BarRoute {
        self.route
    }

    /// The BAR's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The BAR's size in bytes.
    pub fn bar_len(&self) -> u64 {
        self.bar_len
    }

    /// Maps bytes `offset..offset + len` of the BAR: a window over that
    /// range, whose [`BarWindow::source`] says how it was mapped. Through
    /// sysfs only the BAR's first `offset + len` bytes are mapped.
    pub fn map_range(&self, offset: usize, len: usize) -> Result<BarWindow, BarOpenError> {
        let bar = match &self.device {
            Some(device) => device.map_region(self.index),
            None => {
                let options = SysfsBarOptions {
                    env: self.env.clone(),
                    prefer_write_combining: true,
                    len: Some(offset + len),
                };
                SysfsBar::open_with(&self.bdf.to_string(), self.index, &options)
            }
        }
        .map_err(BarOpenError::Open)?;
        bar.slice(offset, len).map_err(BarOpenError::Range)
    }
}

/// Why a range of a BAR could not be mapped.
#[derive(Debug)]
#[non_exhaustive]
pub enum BarOpenError {
    /// The device or its BAR could not be found, opened or mapped.
    Open(VfioError),
    /// The range does not fit the mapping.
    Range(WindowError),
}

impl fmt::Display for BarOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BarOpenError::Open(error) => error.fmt(f),
            BarOpenError::Range(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for BarOpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BarOpenError::Open(error) => Some(error),
            BarOpenError::Range(error) => Some(error),
        }
    }
}

/// Finds devices' BARs by address, through VFIO or sysfs.
#[derive(Debug)]
pub struct BarOpener {
    env: VfioEnv,
    /// Opened with the first device found through VFIO.
    container: Option<Container>,
}

impl BarOpener {
    /// An opener under `env` (the sysfs root, the VFIO nodes, the system
    /// calls).
    pub fn new(env: VfioEnv) -> BarOpener {
        BarOpener {
            env,
            container: None,
        }
    }

    /// BAR `index` of `bdf` (or, without an index, its largest BAR that can
    /// be mapped), reached as `route` says.
    pub fn find(
        &mut self,
        bdf: Bdf,
        index: Option<u32>,
        route: BarRoute,
    ) -> Result<FoundBar, VfioError> {
        let root = self.env.sysfs_root.clone();
        let route = match route {
            BarRoute::Auto if bind::driver_of(&root, bdf).as_deref() == Some(VFIO_PCI) => {
                BarRoute::Vfio
            }
            BarRoute::Auto => BarRoute::Sysfs,
            route => route,
        };
        let (index, bar_len, device) = if route == BarRoute::Vfio {
            let device = self.open_device(bdf)?;
            let (index, bar_len) = match index {
                Some(index) => (index, mappable_region(&device, index)?),
                None => largest_vfio_bar(&device)?,
            };
            (index, bar_len, Some(device))
        } else {
            let (index, bar_len) = sysfs_bar(&self.env, &root, bdf, index)?;
            (index, bar_len, None)
        };
        Ok(FoundBar {
            bdf,
            route,
            index,
            bar_len,
            device,
            env: self.env.clone(),
        })
    }

    fn open_device(&mut self, bdf: Bdf) -> Result<VfioDevice, VfioError> {
        if self.container.is_none() {
            self.container = Some(Container::open_in(self.env.clone())?);
        }
        self.container
            .as_ref()
            .expect("just opened")
            .open_device(bdf)
    }
}

/// Bytes `offset..offset + len` of BAR `index` of the device named by
/// `spec` (an address, or `vendor:device[#n]`), reached as `route` says.
pub fn open_bar_range(
    env: &VfioEnv,
    spec: &str,
    index: u32,
    route: BarRoute,
    offset: usize,
    len: usize,
) -> Result<BarWindow, BarOpenError> {
    let bdf = spec
        .parse::<DeviceSpec>()
        .and_then(|spec| spec.resolve(&env.sysfs_root))
        .map_err(BarOpenError::Open)?;
    BarOpener::new(env.clone())
        .find(bdf, Some(index), route)
        .map_err(BarOpenError::Open)?
        .map_range(offset, len)
}

/// The size of region `index` of a device opened through VFIO, if it can
/// be mapped.
fn mappable_region(device: &VfioDevice, index: u32) -> Result<u64, VfioError> {
    let info = device.region_info(index)?;
    match info.unmappable_reason() {
        Some(reason) => Err(VfioError::RegionNotMappable {
            bdf: device.bdf(),
            index,
            flags: info.flags,
            size: info.size,
            reason,
        }),
        None => Ok(info.size),
    }
}

/// The largest mappable BAR (0-5) of a device opened through VFIO.
///
/// Asks for the six BAR regions one by one: `VfioDevice::regions` fails as
/// a whole when a later region (the VGA one of ivshmem, for one) answers
/// `EINVAL`.
fn largest_vfio_bar(device: &VfioDevice) -> Result<(u32, u64), VfioError> {
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
/// `resource` file: its index and size. A BAR that file does not show as
/// a usable memory BAR (or a file that cannot be read) is opened, so that
/// the error says precisely why not.
fn sysfs_bar(
    env: &VfioEnv,
    root: &Path,
    bdf: Bdf,
    index: Option<u32>,
) -> Result<(u32, u64), VfioError> {
    let path = bind::device_dir(root, bdf).join("resource");
    let bars = std::fs::read_to_string(&path).map(|text| parse_resource(&text).0);
    let usable = |b: &&Bar| b.space == BarSpace::Memory && b.size > 0 && !b.unassigned;
    match (index, bars) {
        (Some(index), Ok(bars)) => match bars.iter().find(|b| u32::from(b.index) == index) {
            Some(bar) if usable(&bar) => Ok((index, bar.size)),
            _ => open_for_size(env, bdf, index),
        },
        (Some(index), Err(_)) => open_for_size(env, bdf, index),
        (None, Ok(bars)) => bars
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
        (None, Err(e)) => Err(VfioError::Sysfs {
            path,
            detail: e.to_string(),
        }),
    }
}

/// BAR `index` through its `resourceN` file: its size, or why it cannot
/// be mapped.
fn open_for_size(env: &VfioEnv, bdf: Bdf, index: u32) -> Result<(u32, u64), VfioError> {
    let options = SysfsBarOptions {
        env: env.clone(),
        ..SysfsBarOptions::default()
    };
    let bar = SysfsBar::open_with(&bdf.to_string(), index, &options)?;
    Ok((index, bar.len() as u64))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::*;

    /// A sysfs tree with one device whose `resourceN` files are ordinary
    /// files (mmap of a regular file stands in for a BAR's).
    struct Fixture {
        root: PathBuf,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    const BDF: &str = "0000:00:11.0";

    impl Fixture {
        /// BAR 0: 4 KiB of registers; BAR 2: `bar2` bytes, prefetchable,
        /// with a `resource2_wc`.
        fn new(tag: &str, bar2: u64) -> Fixture {
            let root = std::env::temp_dir()
                .join(format!("barlink-vfio-open-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            let dir = root.join("sys/bus/pci/devices").join(BDF);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("vendor"), "0x1af4\n").unwrap();
            fs::write(dir.join("device"), "0x1110\n").unwrap();
            let mut lines = vec!["0x0 0x0 0x0".to_string(); 13];
            lines[0] = "0x00000000fe000000 0x00000000fe000fff 0x0000000000040200".into();
            lines[2] = format!(
                "0x0000000800000000 0x{:016x} 0x000000000014220c",
                0x8_0000_0000u64 + bar2 - 1
            );
            fs::write(dir.join("resource"), lines.join("\n") + "\n").unwrap();
            for (file, len) in [
                ("resource0", 4096),
                ("resource2", bar2),
                ("resource2_wc", bar2),
            ] {
                fs::File::create(dir.join(file))
                    .unwrap()
                    .set_len(len)
                    .unwrap();
            }
            Fixture { root }
        }

        fn env(&self) -> VfioEnv {
            VfioEnv::with_roots(&self.root, self.root.join("dev/vfio"))
        }

        fn bdf(&self) -> Bdf {
            BDF.parse::<DeviceSpec>()
                .unwrap()
                .resolve(&self.root)
                .unwrap()
        }
    }

    #[test]
    fn auto_takes_sysfs_and_the_largest_bar_of_a_device_on_its_own_driver() {
        let fixture = Fixture::new("largest", 1 << 20);
        let mut opener = BarOpener::new(fixture.env());
        let found = opener.find(fixture.bdf(), None, BarRoute::Auto).unwrap();
        assert_eq!(found.route(), BarRoute::Sysfs);
        assert_eq!((found.index(), found.bar_len()), (2, 1 << 20));
        let window = found.map_range(64 << 10, 4096).unwrap();
        assert_eq!(window.len(), 4096);
        assert_eq!(window.offset_in_bar(), 64 << 10);
        assert!(window.source().to_string().contains("resource2_wc"));
        window.write(0, b"landed").unwrap();
        let file = fs::read(
            fixture
                .root
                .join("sys/bus/pci/devices")
                .join(BDF)
                .join("resource2_wc"),
        )
        .unwrap();
        assert_eq!(&file[64 << 10..(64 << 10) + 6], b"landed");
    }

    #[test]
    fn a_bar_named_by_index_and_the_errors_of_bars_that_cannot_be() {
        let fixture = Fixture::new("index", 1 << 20);
        let mut opener = BarOpener::new(fixture.env());
        let found = opener
            .find(fixture.bdf(), Some(0), BarRoute::Sysfs)
            .unwrap();
        assert_eq!((found.index(), found.bar_len()), (0, 4096));
        let error = opener
            .find(fixture.bdf(), Some(4), BarRoute::Sysfs)
            .unwrap_err();
        assert!(
            matches!(error, VfioError::RegionNotMappable { .. }),
            "{error}"
        );
        let error = found.map_range(4096, 4096).unwrap_err();
        assert!(matches!(error, BarOpenError::Open(_)), "{error}");
    }

    #[test]
    fn one_call_opens_a_range_by_address_or_vendor_and_device() {
        let fixture = Fixture::new("range", 1 << 20);
        for spec in [BDF, "1af4:1110"] {
            let window =
                open_bar_range(&fixture.env(), spec, 2, BarRoute::Sysfs, 8192, 8192).unwrap();
            assert_eq!((window.offset_in_bar(), window.len()), (8192, 8192));
        }
        let error = open_bar_range(&fixture.env(), "zz", 2, BarRoute::Sysfs, 0, 64).unwrap_err();
        assert!(matches!(error, BarOpenError::Open(_)), "{error}");
        let error =
            open_bar_range(&fixture.env(), BDF, 2, BarRoute::Sysfs, 1 << 20, 0).unwrap_err();
        assert!(matches!(error, BarOpenError::Range(_)), "{error}");
    }
}
