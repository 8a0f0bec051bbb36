//! The sysfs `resourceN` route with the real system calls, over a fixture
//! tree whose `resourceN` files are ordinary files (mmap of a regular file
//! behaves like mmap of a BAR file for everything but caching): choice of
//! `resourceN_wc`, length checks, I/O and missing BARs, and what a window
//! writes landing in the file. Also binding to vfio-pci against a fixture
//! (the writes it makes, and its errors), and the environment errors of
//! the real VFIO path on a host without VFIO.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use barlink_transport::EngineConfig;
use barlink_transport::link::{RingLink, init_ring};
use barlink_transport::ring::Geometry;
use barlink_transport::window::Window;
use barlink_vfio::bind::{bind_to_vfio_pci_in, unbind};
use barlink_vfio::{
    BarSource, BarWindow, BindOutcome, Container, SysfsBar, SysfsBarOptions, VfioDevice, VfioEnv,
    VfioError,
};

struct Fixture {
    root: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// `IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_MEM_64`...
const MEM64_PREF: u64 = 0x0014_220c;
const MEM32: u64 = 0x0004_0200;
const IO: u64 = 0x0004_0101;

impl Fixture {
    fn new() -> Fixture {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("barlink-vfio-sysfsbar-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        Fixture { root }
    }

    fn dir(&self, bdf: &str) -> PathBuf {
        self.root.join("sys/bus/pci/devices").join(bdf)
    }

    /// A device with BARs given as (index, size, flags); memory BARs get a
    /// `resourceN` file of their size (and `_wc` when `wc`).
    fn device(&self, bdf: &str, bars: &[(usize, u64, u64)], wc: bool) {
        let dir = self.dir(bdf);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), "0x1af4\n").unwrap();
        fs::write(dir.join("device"), "0x1110\n").unwrap();
        let mut lines =
            vec![String::from("0x0000000000000000 0x0000000000000000 0x0000000000000000"); 13];
        let mut start = 0xfe00_0000u64;
        for &(index, size, flags) in bars {
            lines[index] = format!("0x{start:016x} 0x{:016x} 0x{flags:016x}", start + size - 1);
            start += size.max(0x1000);
            if flags & 0x100 == 0 {
                let file = fs::File::create(dir.join(format!("resource{index}"))).unwrap();
                file.set_len(size).unwrap();
                if wc && flags & 0x2000 != 0 {
                    let file = fs::File::create(dir.join(format!("resource{index}_wc"))).unwrap();
                    file.set_len(size).unwrap();
                }
            } else {
                fs::write(dir.join(format!("resource{index}")), b"").unwrap();
            }
        }
        fs::write(dir.join("resource"), lines.join("\n") + "\n").unwrap();
    }

    fn options(&self) -> SysfsBarOptions {
        SysfsBarOptions {
            env: VfioEnv::with_roots(&self.root, self.root.join("dev/vfio")),
            ..SysfsBarOptions::default()
        }
    }
}

#[test]
fn a_prefetchable_bar_maps_write_combining_and_writes_land_in_the_file() {
    let fixture = Fixture::new();
    fixture.device(
        "0000:00:11.0",
        &[(0, 256, MEM32), (2, 1 << 20, MEM64_PREF)],
        true,
    );
    let bar = SysfsBar::open_with("0000:00:11.0", 2, &fixture.options()).unwrap();
    assert_eq!(bar.len(), 1 << 20);
    match bar.source() {
        BarSource::Sysfs {
            path,
            write_combining,
            index,
            ..
        } => {
            assert!(*write_combining);
            assert_eq!(*index, 2);
            assert!(path.ends_with("resource2_wc"), "{}", path.display());
        }
        other => panic!("{other:?}"),
    }
    assert!(bar.source().to_string().contains("write-combining"));
    bar.write(4096, b"through sysfs").unwrap();
    bar.store_fence();
    let bytes = fs::read(fixture.dir("0000:00:11.0").join("resource2_wc")).unwrap();
    assert_eq!(&bytes[4096..4109], b"through sysfs");
    // Without the preference, the plain file.
    let mut options = fixture.options();
    options.prefer_write_combining = false;
    let plain = SysfsBar::open_with("1af4:1110", 2, &options).unwrap();
    assert!(matches!(
        plain.source(),
        BarSource::Sysfs {
            write_combining: false,
            ..
        }
    ));
}

#[test]
fn lengths_io_bars_and_missing_bars_are_clear_errors() {
    let fixture = Fixture::new();
    fixture.device(
        "0000:00:12.0",
        &[(0, 128, IO), (2, 64 << 10, MEM64_PREF)],
        false,
    );
    let options = fixture.options();
    let error = SysfsBar::open_with("0000:00:12.0", 0, &options).unwrap_err();
    assert!(
        matches!(error, VfioError::IoSpaceBar { index: 0, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("I/O ports"));
    let error = SysfsBar::open_with("0000:00:12.0", 4, &options).unwrap_err();
    assert!(
        matches!(error, VfioError::RegionNotMappable { index: 4, .. }),
        "{error}"
    );
    let mut long = fixture.options();
    long.len = Some(128 << 10);
    let error = SysfsBar::open_with("0000:00:12.0", 2, &long).unwrap_err();
    assert!(
        matches!(
            error,
            VfioError::BarTooSmall {
                size: 0x10000,
                requested: 0x20000,
                ..
            }
        ),
        "{error}"
    );
    let mut short = fixture.options();
    short.len = Some(4096);
    assert_eq!(
        SysfsBar::open_with("0000:00:12.0", 2, &short)
            .unwrap()
            .len(),
        4096
    );
    let error = SysfsBar::open_with("0000:00:13.0", 2, &options).unwrap_err();
    assert!(matches!(error, VfioError::DeviceNotFound { .. }), "{error}");
    fs::remove_file(fixture.dir("0000:00:12.0").join("resource2")).unwrap();
    let error = SysfsBar::open_with("0000:00:12.0", 2, &options).unwrap_err();
    assert!(
        matches!(error, VfioError::ResourceMissing { .. }),
        "{error}"
    );
}

/// Two windows over the same file stand in for two BARs aliasing one
/// buffer: a ring link runs over them unchanged.
#[test]
fn a_ring_link_runs_over_sysfs_bar_windows() {
    let fixture = Fixture::new();
    fixture.device("0000:00:10.0", &[(2, 4 << 20, MEM64_PREF)], false);
    let options = fixture.options();
    let a = SysfsBar::open_with("0000:00:10.0", 2, &options).unwrap();
    let b = SysfsBar::open_with("0000:00:10.0", 2, &options).unwrap();
    let config = EngineConfig::default();
    let ring_len = (1 << 20) + 256;
    let a_own = a.slice(0, ring_len).unwrap();
    let b_own = b.slice(2 << 20, ring_len).unwrap();
    let geometry = Geometry::for_window(ring_len, config.mtu).unwrap();
    init_ring(&a_own, geometry, 1).unwrap();
    init_ring(&b_own, geometry, 1).unwrap();
    let mut link_a: RingLink<BarWindow> = RingLink::new(
        a_own,
        b.slice(2 << 20, ring_len).unwrap(),
        config.clone(),
        1,
    )
    .unwrap();
    let mut link_b: RingLink<BarWindow> =
        RingLink::new(b_own, a.slice(0, ring_len).unwrap(), config, 1).unwrap();
    let timeout = std::time::Duration::from_secs(10);
    for i in 0..200u32 {
        let message: Vec<u8> = (0..(i * 97) % 20_000).map(|j| (j ^ i) as u8).collect();
        link_a.send(message.clone()).unwrap();
        let got = loop {
            link_a.progress().unwrap();
            if let Some(got) = link_b.try_recv().unwrap() {
                break got;
            }
        };
        assert_eq!(got, message, "message {i}");
    }
    let deadline = std::time::Instant::now() + timeout;
    while link_a.completed() < 200 {
        link_a.progress().unwrap();
        link_b.progress().unwrap();
        assert!(std::time::Instant::now() < deadline, "not acknowledged");
    }
    assert_eq!(link_b.engine().stats().crc_failures, 0);
}

#[test]
fn binding_writes_override_unbind_and_probe_and_reports_failure() {
    let fixture = Fixture::new();
    fixture.device("0000:00:10.0", &[(2, 4096, MEM32)], false);
    let bdf = "0000:00:10.0".parse().unwrap();
    let root = &fixture.root;
    // No vfio-pci driver registered.
    let error = bind_to_vfio_pci_in(root, bdf).unwrap_err();
    assert!(error.to_string().contains("modprobe vfio-pci"), "{error}");
    // Bound to another driver: override, unbind, probe — then the fixture's
    // link does not change, so the bind is reported as failed.
    let drivers = root.join("sys/bus/pci/drivers");
    fs::create_dir_all(drivers.join("vfio-pci")).unwrap();
    fs::create_dir_all(drivers.join("e1000e")).unwrap();
    symlink(
        "../../drivers/e1000e",
        fixture.dir("0000:00:10.0").join("driver"),
    )
    .unwrap();
    let error = bind_to_vfio_pci_in(root, bdf).unwrap_err();
    assert!(matches!(error, VfioError::BindFailed { .. }), "{error}");
    assert!(error.to_string().contains("bound to e1000e"), "{error}");
    let read = |path: &Path| fs::read_to_string(path).unwrap();
    assert_eq!(
        read(&fixture.dir("0000:00:10.0").join("driver_override")),
        "vfio-pci"
    );
    assert_eq!(read(&drivers.join("e1000e/unbind")), "0000:00:10.0");
    assert_eq!(
        read(&root.join("sys/bus/pci/drivers_probe")),
        "0000:00:10.0"
    );
    unbind(root, bdf).unwrap();
    // Already bound: nothing to do.
    fs::remove_file(fixture.dir("0000:00:10.0").join("driver")).unwrap();
    symlink(
        "../../drivers/vfio-pci",
        fixture.dir("0000:00:10.0").join("driver"),
    )
    .unwrap();
    assert_eq!(
        bind_to_vfio_pci_in(root, bdf).unwrap(),
        BindOutcome::AlreadyBound
    );
}

/// On a host without VFIO (this development machine) the real path says so;
/// where VFIO exists, the container opens.
#[test]
fn the_real_vfio_path_reports_a_missing_vfio() {
    let fixture = Fixture::new();
    let env = VfioEnv::with_roots(&fixture.root, fixture.root.join("dev/vfio"));
    let error = Container::open_in(env.clone()).unwrap_err();
    assert!(matches!(error, VfioError::NoVfio { .. }), "{error}");
    assert!(error.to_string().contains("modprobe vfio-pci"));
    let error = VfioDevice::open_in(env, "0000:00:10.0").unwrap_err();
    assert!(matches!(error, VfioError::DeviceNotFound { .. }), "{error}");
    match Container::open() {
        Ok(container) => drop(container),
        Err(VfioError::NoVfio { path }) => assert_eq!(path, Path::new("/dev/vfio/vfio")),
        Err(other) => assert!(
            matches!(
                other,
                VfioError::PermissionDenied { .. } | VfioError::NoIommu { .. }
            ),
            "{other}"
        ),
    }
}

/// A window claimed as a ring is refused to a second open that claims any
/// of its bytes, whatever the process; disjoint windows of the same BAR
/// are not, slices of the claimed mapping share its claim, and the claim
/// ends with the mapping.
#[test]
fn a_claimed_ring_window_is_refused_to_a_second_claim_until_it_is_unmapped() {
    let fixture = Fixture::new();
    fixture.device("0000:00:12.0", &[(2, 1 << 20, MEM64_PREF)], false);
    let open = || SysfsBar::open_with("0000:00:12.0", 2, &fixture.options()).unwrap();
    let first = open().slice(0, 512 << 10).unwrap();
    assert!(
        first.claim_ring().unwrap(),
        "the fixture's file system keeps locks"
    );
    let again = first.slice(4096, 4096).unwrap();
    assert!(
        again.claim_ring().unwrap(),
        "a slice of the claimed mapping is the same claim"
    );
    let overlapping = open().slice(256 << 10, 512 << 10).unwrap();
    match overlapping.claim_ring() {
        Err(VfioError::WindowInUse { path, offset, len }) => {
            assert!(path.ends_with("resource2"), "{}", path.display());
            assert_eq!((offset, len), (256 << 10, 512 << 10));
        }
        other => panic!("an overlapping claim: {other:?}"),
    }
    let text = overlapping.claim_ring().unwrap_err().to_string();
    assert!(
        text.contains("another link's receive ring") && text.contains("0x40000..0xc0000"),
        "{text}"
    );
    let disjoint = open().slice(768 << 10, 256 << 10).unwrap();
    assert!(
        disjoint.claim_ring().unwrap(),
        "disjoint windows of one BAR"
    );
    drop((first, again));
    assert!(
        overlapping.claim_ring().unwrap(),
        "the first mapping is gone, and its claim with it"
    );
}
