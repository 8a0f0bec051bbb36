//! VFIO and sysfs BAR windows: PCI BARs mapped into this process as memory
//! windows the links move data through, DMA mappings in an IOMMU domain,
//! and binding devices to vfio-pci. Which devices to use, and whether
//! peer-to-peer between them can work, is `barlink-topology`'s part.
//!
//! The modules (see `docs/VFIO.md`):
//! * [`sys`] — the system-call trait [`sys::VfioSys`] (one method per VFIO
//!   ioctl, mmap, pread...), [`sys::LinuxSys`] over libc and rustix and
//!   [`sys::mock::MockSys`] for tests.
//! * [`container`] — [`Container`] (an IOMMU domain), groups, and
//!   [`DmaMapping`]s of host memory or of a peer device's BAR.
//! * [`device`] — [`VfioDevice`]: open by address or `vendor:device`,
//!   regions, config space, [`VfioDevice::map_region`].
//! * [`bar`] — [`BarWindow`] (a [`barlink_transport::window::Window`] over
//!   a BAR: plug it into `RingLink` unchanged), [`SysfsBar`] (the
//!   `resourceN` route for devices kept on their vendor driver),
//!   [`DmaBuffer`].
//! * [`bind`] — driver and group lookups, [`bind_to_vfio_pci`].
//! * [`env`] — [`VfioEnv`]: the system calls and roots everything above
//!   runs in (the real system, or fixtures and the mock).
//! * [`error`] — [`VfioError`], whose messages say what to check or run.
//!
//! `unsafe` is denied crate-wide and allowed only in `sys` (the ioctls,
//! mmap and munmap, and `sys::region`, which hands a mapping's addresses to
//! the kernel). Every access to mapped memory goes through the transport's
//! `window::DeviceMemory`: no `&[u8]` into device memory ever exists;
//! windows copy in and out, and use atomics for indices.
//!
//! ```no_run
//! use barlink_transport::window::Window;
//! use barlink_vfio::{SysfsBar, VfioDevice};
//!
//! let device = VfioDevice::open("0000:00:10.0")?; // bound to vfio-pci
//! let bar = device.map_region(2)?;
//! bar.write(0, b"hello")?;
//! let peer = SysfsBar::open("1af4:1110#1", 2)?; // resource2(_wc)
//! println!("{} bytes via {}", peer.len(), peer.source());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

// Unsafe only where system calls and raw mappings are.
#[forbid(unsafe_code)]
pub mod bar;
#[forbid(unsafe_code)]
pub mod bind;
#[forbid(unsafe_code)]
pub mod container;
#[forbid(unsafe_code)]
pub mod device;
#[forbid(unsafe_code)]
pub mod env;
#[forbid(unsafe_code)]
pub mod error;
pub mod open;
#[allow(unsafe_code)]
pub mod sys;

pub use bar::{BarSource, BarWindow, DmaBuffer, SysfsBar, SysfsBarOptions};
pub use bind::{BindOutcome, DeviceSpec, bind_to_vfio_pci};
pub use container::{Container, DmaMapping, DmaTarget, IommuType};
pub use device::{RegionInfo, VfioDevice, VfioDeviceInfo};
pub use env::VfioEnv;
pub use error::VfioError;
