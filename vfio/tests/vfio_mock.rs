//! The VFIO layer against the recording mock (`sys::mock::MockSys`) and a
//! small sysfs fixture: the container/group/device sequence, each failure
//! with its typed error, region flags, DMA mapping rules, and teardown
//! order on success and on every error path (the mock records each call).
//! Runs anywhere; the real kernel is exercised by `tests/guest.rs` in the
//! QEMU guest.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use barlink_transport::window::Window;
use barlink_vfio::sys::mock::{MockSys, region_offset};
use barlink_vfio::sys::{
    Errno, GROUP_FLAGS_VIABLE, REGION_FLAG_MMAP, REGION_FLAG_READ, REGION_FLAG_WRITE,
    RawRegionInfo, VFIO_TYPE1_IOMMU, VFIO_TYPE1V2_IOMMU,
};
use barlink_vfio::{Container, DmaBuffer, IommuType, VfioDevice, VfioEnv, VfioError};

/// A sysfs tree with one device per IOMMU group, removed on drop.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("barlink-vfio-mock-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        fs::create_dir_all(root.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        Fixture { root }
    }

    /// A device with vendor:device, bound to `driver`, in `group`.
    fn device(&self, bdf: &str, id: (u16, u16), driver: Option<&str>, group: Option<u32>) {
        let dir = self.root.join("sys/bus/pci/devices").join(bdf);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), format!("0x{:04x}\n", id.0)).unwrap();
        fs::write(dir.join("device"), format!("0x{:04x}\n", id.1)).unwrap();
        if let Some(driver) = driver {
            symlink(
                format!("../../../bus/pci/drivers/{driver}"),
                dir.join("driver"),
            )
            .unwrap();
        }
        if let Some(group) = group {
            symlink(
                format!("../../../kernel/iommu_groups/{group}"),
                dir.join("iommu_group"),
            )
            .unwrap();
            let members = self
                .root
                .join(format!("sys/kernel/iommu_groups/{group}/devices"));
            fs::create_dir_all(&members).unwrap();
            symlink(&dir, members.join(bdf)).unwrap();
        }
    }

    fn env(&self, sys: &Arc<MockSys>) -> VfioEnv {
        VfioEnv::with_roots(&self.root, "/dev/vfio").with_sys(sys.clone())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

const IVSHMEM: (u16, u16) = (0x1af4, 0x1110);

fn standard() -> (Fixture, Arc<MockSys>) {
    let fixture = Fixture::new();
    fixture.device("0000:00:10.0", IVSHMEM, Some("vfio-pci"), Some(5));
    fixture.device("0000:00:11.0", IVSHMEM, Some("vfio-pci"), Some(6));
    (fixture, Arc::new(MockSys::new()))
}

#[test]
fn open_runs_the_vfio_sequence_and_drop_tears_down_in_reverse() {
    let (fixture, sys) = standard();
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    assert_eq!(device.group(), 5);
    assert!(device.info().is_pci());
    assert_eq!(device.container().iommu_type(), IommuType::Type1v2);
    assert_eq!(
        sys.calls(),
        [
            "open /dev/vfio/vfio",
            "get_api_version",
            &format!("check_extension {VFIO_TYPE1V2_IOMMU}"),
            "open /dev/vfio/5",
            "group_get_status /dev/vfio/5",
            "group_set_container /dev/vfio/5",
            &format!("set_iommu {VFIO_TYPE1V2_IOMMU}"),
            "group_get_device_fd 0000:00:10.0",
            "device_get_info",
        ]
    );
    let before = sys.calls().len();
    drop(device);
    assert_eq!(
        sys.calls()[before..],
        [
            "close device:0000:00:10.0",
            "group_unset_container /dev/vfio/5",
            "close /dev/vfio/5",
            "close /dev/vfio/vfio",
        ]
    );
    assert!(sys.open_fds().is_empty());
}

#[test]
fn type1_is_used_when_type1v2_is_missing() {
    let (fixture, sys) = standard();
    sys.state().extensions = vec![VFIO_TYPE1_IOMMU];
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    assert_eq!(device.container().iommu_type(), IommuType::Type1);
    assert!(
        sys.calls()
            .contains(&format!("set_iommu {VFIO_TYPE1_IOMMU}"))
    );
}

#[test]
fn teardown_unmaps_dma_then_regions_then_closes_device_group_container() {
    let (fixture, sys) = standard();
    let env = fixture.env(&sys);
    let container = Container::open_in(env.clone()).unwrap();
    let ivshmem = container
        .open_device("0000:00:10.0".parse().unwrap())
        .unwrap();
    let other = container
        .open_device("0000:00:11.0".parse().unwrap())
        .unwrap();
    // The IOMMU is selected once, for the first group.
    assert_eq!(sys.ops().iter().filter(|op| **op == "set_iommu").count(), 1);
    let bar = ivshmem.map_region(2).unwrap();
    assert_eq!(bar.len(), 16 << 20);
    bar.write(4096, b"peer").unwrap();
    let ram = DmaBuffer::new_in(&env, 8192).unwrap();
    let ram_map = container.map_dma(0x10_0000, &ram).unwrap();
    let bar_map = container
        .map_dma(0x100_0000, &bar.slice(0, 1 << 20).unwrap())
        .unwrap();
    assert_eq!(bar_map.iova(), 0x100_0000);
    assert_eq!(sys.state().dma.len(), 2);
    // A device nothing else holds is torn down when dropped.
    let before = sys.calls().len();
    drop(other);
    assert_eq!(
        sys.calls()[before..],
        [
            "close device:0000:00:11.0",
            "group_unset_container /dev/vfio/6",
            "close /dev/vfio/6",
        ]
    );
    let before = sys.calls().len();
    // Drop the handles in the "wrong" order: ownership keeps the order right.
    drop(container);
    drop(ivshmem);
    drop(bar);
    drop(ram);
    assert_eq!(sys.calls().len(), before, "nothing torn down while in use");
    drop(ram_map);
    drop(bar_map);
    assert_eq!(
        sys.calls()[before..],
        [
            "unmap_dma iova=0x100000 size=0x2000",
            "munmap 0x2000",
            "unmap_dma iova=0x1000000 size=0x100000",
            "munmap 0x1000000",
            "close device:0000:00:10.0",
            "group_unset_container /dev/vfio/5",
            "close /dev/vfio/5",
            "close /dev/vfio/vfio",
        ]
    );
    assert!(sys.open_fds().is_empty());
    assert_eq!(sys.live_mappings(), 0);
}

#[test]
fn a_group_that_is_not_viable_names_the_devices_to_fix_and_is_closed() {
    let fixture = Fixture::new();
    fixture.device("0000:01:00.0", (0x10de, 0x2684), Some("vfio-pci"), Some(12));
    fixture.device(
        "0000:01:00.1",
        (0x10de, 0x22ba),
        Some("snd_hda_intel"),
        Some(12),
    );
    let sys = Arc::new(MockSys::new());
    sys.state().group_flags = 0;
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:01:00.0").unwrap_err();
    match &error {
        VfioError::GroupNotViable { group, blockers } => {
            assert_eq!(*group, 12);
            assert_eq!(blockers.len(), 1);
            assert_eq!(blockers[0].device, "0000:01:00.1");
            assert_eq!(blockers[0].driver.as_deref(), Some("snd_hda_intel"));
        }
        other => panic!("{other}"),
    }
    assert!(
        error
            .to_string()
            .contains("0000:01:00.1 (bound to snd_hda_intel)")
    );
    // Never joined, so never unset; both descriptors closed, group first.
    let calls = sys.calls();
    assert!(!calls.iter().any(|c| c.starts_with("group_set_container")));
    assert!(!calls.iter().any(|c| c.starts_with("group_unset_container")));
    assert_eq!(
        calls[calls.len() - 2..],
        ["close /dev/vfio/12", "close /dev/vfio/vfio"]
    );
    assert!(sys.open_fds().is_empty());
}

#[test]
fn a_failed_set_iommu_unsets_and_closes_everything() {
    let (fixture, sys) = standard();
    sys.fail("set_iommu", libc::ENODEV);
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
    assert!(matches!(error, VfioError::NoIommu { .. }), "{error}");
    assert!(error.to_string().contains("vfio_iommu_type1"));
    let calls = sys.calls();
    assert_eq!(
        calls[calls.len() - 3..],
        [
            "group_unset_container /dev/vfio/5",
            "close /dev/vfio/5",
            "close /dev/vfio/vfio"
        ]
    );
    assert!(sys.open_fds().is_empty());
}

#[test]
fn a_failed_device_open_or_info_tears_down_what_was_built() {
    for op in ["group_get_device_fd", "device_get_info"] {
        let (fixture, sys) = standard();
        sys.fail(op, libc::EIO);
        let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
        assert!(matches!(error, VfioError::System { .. }), "{op}: {error}");
        let calls = sys.calls();
        let tail: Vec<&str> = calls[calls.len() - 3..]
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(
            tail,
            [
                "group_unset_container /dev/vfio/5",
                "close /dev/vfio/5",
                "close /dev/vfio/vfio"
            ],
            "{op}"
        );
        assert!(sys.open_fds().is_empty(), "{op}");
    }
    // A failure of the mapping itself leaves the device open for the caller.
    let (fixture, sys) = standard();
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    sys.fail("mmap", libc::ENOMEM);
    let error = device.map_region(2).unwrap_err();
    assert!(matches!(error, VfioError::MapFailed { .. }), "{error}");
    drop(device);
    assert!(sys.open_fds().is_empty());
}

#[test]
fn environment_problems_are_typed_and_say_what_to_do() {
    // No VFIO at all.
    let (fixture, sys) = standard();
    sys.fail_open(Path::new("/dev/vfio/vfio"), libc::ENOENT);
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
    assert!(matches!(error, VfioError::NoVfio { .. }), "{error}");
    assert!(error.to_string().contains("modprobe vfio-pci"));
    // Wrong API version: the container is closed again.
    let (fixture, sys) = standard();
    sys.state().api_version = 1;
    let error = Container::open_in(fixture.env(&sys)).unwrap_err();
    assert_eq!(
        error,
        VfioError::ApiVersion {
            found: 1,
            expected: 0
        }
    );
    assert!(sys.open_fds().is_empty());
    // No type1 backend.
    let (fixture, sys) = standard();
    sys.state().extensions.clear();
    let error = Container::open_in(fixture.env(&sys)).unwrap_err();
    assert!(matches!(error, VfioError::NoIommu { .. }), "{error}");
    assert!(sys.open_fds().is_empty());
    // Group node root-only.
    let (fixture, sys) = standard();
    sys.fail_open(Path::new("/dev/vfio/5"), libc::EACCES);
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
    assert_eq!(
        error,
        VfioError::PermissionDenied {
            path: "/dev/vfio/5".into(),
            errno: Errno(libc::EACCES)
        }
    );
    assert!(error.to_string().contains("chown $USER /dev/vfio/5"));
    assert!(sys.open_fds().is_empty());
    // Group held elsewhere.
    let (fixture, sys) = standard();
    sys.fail_open(Path::new("/dev/vfio/5"), libc::EBUSY);
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
    assert!(
        matches!(error, VfioError::GroupBusy { group: 5, .. }),
        "{error}"
    );
    // Node missing although bound.
    let (fixture, sys) = standard();
    sys.fail_open(Path::new("/dev/vfio/5"), libc::ENOENT);
    let error = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap_err();
    assert!(
        matches!(error, VfioError::GroupNodeMissing { group: 5, .. }),
        "{error}"
    );
}

#[test]
fn devices_not_bound_without_group_or_absent_are_refused_before_any_ioctl() {
    let fixture = Fixture::new();
    fixture.device("0000:00:10.0", IVSHMEM, None, Some(5));
    fixture.device("0000:00:11.0", IVSHMEM, Some("nvidia"), Some(6));
    fixture.device("0000:00:12.0", IVSHMEM, Some("vfio-pci"), None);
    let sys = Arc::new(MockSys::new());
    let env = fixture.env(&sys);
    let error = VfioDevice::open_in(env.clone(), "0000:00:10.0").unwrap_err();
    assert_eq!(
        error,
        VfioError::NotBoundToVfio {
            bdf: "0000:00:10.0".parse().unwrap(),
            driver: None
        }
    );
    assert!(error.to_string().contains("driver_override"), "{error}");
    let error = VfioDevice::open_in(env.clone(), "0000:00:11.0").unwrap_err();
    assert!(error.to_string().contains("is bound to nvidia"), "{error}");
    let error = VfioDevice::open_in(env.clone(), "0000:00:12.0").unwrap_err();
    assert!(matches!(error, VfioError::NoIommuGroup { .. }), "{error}");
    let error = VfioDevice::open_in(env.clone(), "0000:00:1f.0").unwrap_err();
    assert!(matches!(error, VfioError::DeviceNotFound { .. }), "{error}");
    let error = VfioDevice::open_in(env, "not-a-device").unwrap_err();
    assert!(matches!(error, VfioError::BadDeviceSpec { .. }), "{error}");
    assert!(
        sys.ops()
            .iter()
            .all(|op| ["open", "get_api_version", "check_extension", "close"].contains(op)),
        "{:?}",
        sys.calls()
    );
    assert!(sys.open_fds().is_empty());
}

#[test]
fn devices_open_by_vendor_and_device_in_address_order() {
    let (fixture, sys) = standard();
    fixture.device("0000:00:14.0", (0x1234, 0x11e8), Some("vfio-pci"), Some(9));
    let env = fixture.env(&sys);
    let second = VfioDevice::open_in(env.clone(), "1af4:1110#1").unwrap();
    assert_eq!(second.bdf().to_string(), "0000:00:11.0");
    drop(second);
    let edu = VfioDevice::open_in(env.clone(), "1234:11e8").unwrap();
    assert_eq!(edu.bdf().to_string(), "0000:00:14.0");
    drop(edu);
    let error = VfioDevice::open_in(env.clone(), "1af4:1110#2").unwrap_err();
    match &error {
        VfioError::NoMatchingDevice { found, .. } => assert_eq!(found.len(), 2),
        other => panic!("{other}"),
    }
    assert!(
        error.to_string().contains("0000:00:10.0, 0000:00:11.0"),
        "{error}"
    );
    let error = VfioDevice::open_in(env, "dead:beef").unwrap_err();
    assert!(
        error.to_string().contains("lspci -nn -d dead:beef"),
        "{error}"
    );
}

#[test]
fn regions_are_mapped_only_as_their_flags_allow() {
    let (fixture, sys) = standard();
    {
        let mut state = sys.state();
        // BAR 4: read-only, mmappable. BAR 3: sparse (an MSI-X table inside).
        state.regions.insert(
            4,
            RawRegionInfo {
                flags: REGION_FLAG_READ | REGION_FLAG_MMAP,
                index: 4,
                size: 8192,
                offset: region_offset(4),
                sparse_areas: None,
                caps_unreadable: None,
            },
        );
        state.regions.insert(
            3,
            RawRegionInfo {
                flags: REGION_FLAG_READ | REGION_FLAG_WRITE | REGION_FLAG_MMAP,
                index: 3,
                size: 16384,
                offset: region_offset(3),
                sparse_areas: Some(vec![(0, 4096), (8192, 8192)]),
                caps_unreadable: None,
            },
        );
        // BAR 5: its capability chain could not be read.
        state.regions.insert(
            5,
            RawRegionInfo {
                flags: REGION_FLAG_READ | REGION_FLAG_WRITE | REGION_FLAG_MMAP,
                index: 5,
                size: 16384,
                offset: region_offset(5),
                sparse_areas: None,
                caps_unreadable: Some("the capability chain points outside".into()),
            },
        );
    }
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    let regions = device.regions().unwrap();
    assert_eq!(regions.len(), 9);
    let mappable: Vec<u32> = regions
        .iter()
        .filter(|r| r.unmappable_reason().is_none())
        .map(|r| r.index)
        .collect();
    assert_eq!(mappable, [2, 4]);
    // Config space: no MMAP flag.
    let error = device.map_region(7).unwrap_err();
    match &error {
        VfioError::RegionNotMappable { index, flags, .. } => {
            assert_eq!(*index, 7);
            assert_eq!(*flags & REGION_FLAG_MMAP, 0);
        }
        other => panic!("{other}"),
    }
    assert!(error.to_string().contains("pread/pwrite"), "{error}");
    // A 256-byte register BAR without MMAP.
    assert!(matches!(
        device.map_region(0),
        Err(VfioError::RegionNotMappable { index: 0, .. })
    ));
    // An empty BAR, and an index past the device's regions.
    let error = device.map_region(1).unwrap_err();
    assert!(
        error.to_string().contains("no BAR at this index"),
        "{error}"
    );
    assert!(matches!(
        device.map_region(20),
        Err(VfioError::NoSuchRegion {
            index: 20,
            count: 9,
            ..
        })
    ));
    // Sparse.
    let error = device.map_region(3).unwrap_err();
    assert!(
        error.to_string().contains("0x0+0x1000, 0x2000+0x2000"),
        "{error}"
    );
    // A capability chain that could not be read: not "all of it".
    let error = device.map_region(5).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("capability chain could not be read (the capability chain points outside)"),
        "{error}"
    );
    // Read-only: mapped, reads work, writes are refused, not faulted.
    let rom_like = device.map_region(4).unwrap();
    assert!(!rom_like.writable());
    assert!(rom_like.write(0, &[1]).is_err());
    let mut byte = [7u8];
    rom_like.read(0, &mut byte).unwrap();
    assert!(
        sys.calls()
            .iter()
            .any(|c| c.starts_with("mmap device:0000:00:10.0 0x40000000000+0x2000"))
    );
    // Config space through pread/pwrite: bus mastering.
    let command = device.enable_bus_master().unwrap();
    assert_eq!(command & 0x6, 0x6);
    let mut id = [0u8; 4];
    device.read_config(0, &mut id).unwrap();
    assert_eq!(id, [0xf4, 0x1a, 0x10, 0x11]);
    assert!(device.read_config(250, &mut [0u8; 8]).is_err());
}

#[test]
fn dma_mappings_check_alignment_overlap_and_iommu() {
    let (fixture, sys) = standard();
    let env = fixture.env(&sys);
    let container = Container::open_in(env.clone()).unwrap();
    let ram = DmaBuffer::new_in(&env, 4096).unwrap();
    // No device yet: no IOMMU selected.
    let error = container.map_dma(0x1000, &ram).unwrap_err();
    assert!(
        error.to_string().contains("open a device in it first"),
        "{error}"
    );
    let device = container
        .open_device("0000:00:10.0".parse().unwrap())
        .unwrap();
    let error = container.map_dma(0x1001, &ram).unwrap_err();
    assert!(error.to_string().contains("page"), "{error}");
    let bar = device.map_region(2).unwrap();
    let error = container
        .map_dma(0x10_0000, &bar.slice(64, 4096).unwrap())
        .unwrap_err();
    assert!(matches!(error, VfioError::DmaMapFailed { .. }), "{error}");
    let first = container.map_dma(0x1000, &ram).unwrap();
    let error = container.map_dma(0x1000, &ram).unwrap_err();
    assert!(error.to_string().contains("overlaps"), "{error}");
    sys.fail("map_dma", libc::ENOMEM);
    let error = container.map_dma(0x8000, &ram).unwrap_err();
    assert!(error.to_string().contains("ulimit -l"), "{error}");
    first.unmap().unwrap();
    assert!(sys.state().dma.is_empty());
    assert_eq!(sys.state().group_flags, GROUP_FLAGS_VIABLE);
}

#[test]
fn a_bar_window_slices_and_behaves_as_a_window() {
    let (fixture, sys) = standard();
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    let bar = device.map_region(2).unwrap();
    let ring = bar.slice(1 << 20, 4096).unwrap();
    assert_eq!(ring.len(), 4096);
    assert_eq!(ring.offset_in_bar(), 1 << 20);
    ring.write(0, b"abc").unwrap();
    let mut back = [0u8; 3];
    bar.read(1 << 20, &mut back).unwrap();
    assert_eq!(&back, b"abc");
    assert!(ring.write(4094, b"abc").is_err());
    assert!(bar.slice(16 << 20, 1).is_err());
    assert!(
        ring.fetch_add_u64(0, 1, std::sync::atomic::Ordering::SeqCst)
            .is_err()
    );
    ring.store_u64(8, 42, std::sync::atomic::Ordering::Release)
        .unwrap();
    assert_eq!(
        bar.load_u64((1 << 20) + 8, std::sync::atomic::Ordering::Acquire),
        Ok(42)
    );
    assert!(bar.source().to_string().contains("BAR 2 of 0000:00:10.0"));
}

/// A region the device does not implement answers EINVAL (ivshmem's VGA
/// region did, in the guest): `regions()` leaves it out instead of failing
/// for the whole device; any other failure is still an error.
#[test]
fn regions_leave_out_what_the_kernel_says_is_not_there() {
    let (fixture, sys) = standard();
    let device = VfioDevice::open_in(fixture.env(&sys), "0000:00:10.0").unwrap();
    assert_eq!(device.regions().unwrap().len(), 9);
    sys.fail("device_get_region_info", libc::EINVAL);
    assert!(device.regions().unwrap().is_empty());
    sys.fail("device_get_region_info", libc::EIO);
    assert!(device.regions().is_err());
}
