//! PCI discovery, topology and path choice, the platform doctor, and the
//! VFIO and sysfs BAR-window layer — the part of barlink that decides,
//! before any data moves, whether GPU peer-to-peer over PCIe BARs can work
//! on this machine and which path each transfer takes, and then maps the
//! BARs that the links move data through.
//!
//! Layers, bottom up:
//! * [`sysfs`] — reading files under a configurable root, with typed errors.
//! * [`pci`] — the PCI tree: addresses, classes, BARs, links, config space
//!   (ACS, Resizable BAR, port types).
//! * [`iommu`], [`platform`] — system state, and [`platform::discover`] which
//!   reads everything into a [`Platform`].
//! * [`aperture`] — whether a GPU's BAR1 can expose its memory.
//! * [`topology`] — PIX/PXB/PHB/NODE/SYS classification and path choice.
//! * [`render`], [`doctor`] — text and JSON for the `topo` and `doctor`
//!   commands.
//! * [`diag`] — diagnostics: what could not be read and what that means.
//!
//! Reading sysfs needs no privileges, but non-root readers see only the
//! first 64 bytes of config space; reports say so.
//!
//! BAR windows and VFIO (see `docs/VFIO.md`):
//! * [`sys`] — the system-call trait [`sys::VfioSys`] (one method per VFIO
//!   ioctl, mmap, pread...), [`sys::LinuxSys`] over libc and
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
//! * [`error`] — [`VfioError`], whose messages say what to check or run.
//!
//! `unsafe` is denied crate-wide and allowed only in `sys` (the ioctls and
//! mmap) and `memory` (the one holder of raw pointers into mapped memory);
//! the topology modules forbid it outright. No `&[u8]` into device memory
//! ever exists: windows copy in and out, and use atomics for indices.
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
//!
//! The topology report and the doctor:
//!
//! ```no_run
//! use std::path::Path;
//! use barlink_vfio::{PathPolicy, Topology, doctor, render};
//!
//! let topology = Topology::discover(Path::new("/"), PathPolicy::default())?;
//! print!("{}", render::topo_text(&topology));
//! let report = doctor::run(&topology);
//! print!("{}", report.render_text());
//! std::process::exit(if report.has_failures() { 1 } else { 0 });
//! # Ok::<(), barlink_vfio::DiscoveryError>(())
//! ```
#![deny(unsafe_code)]

// Topology and discovery: no unsafe, ever.
#[forbid(unsafe_code)]
pub mod aperture;
#[forbid(unsafe_code)]
pub mod diag;
#[forbid(unsafe_code)]
pub mod doctor;
#[forbid(unsafe_code)]
pub mod iommu;
#[forbid(unsafe_code)]
pub mod pci;
#[forbid(unsafe_code)]
pub mod platform;
#[forbid(unsafe_code)]
pub mod render;
#[forbid(unsafe_code)]
pub mod sysfs;
#[forbid(unsafe_code)]
pub mod topology;

// VFIO and BAR windows: unsafe only where system calls and raw mappings are.
#[forbid(unsafe_code)]
pub mod bar;
#[forbid(unsafe_code)]
pub mod bind;
#[forbid(unsafe_code)]
pub mod container;
#[forbid(unsafe_code)]
pub mod device;
#[forbid(unsafe_code)]
pub mod error;
#[allow(unsafe_code)]
mod memory;
#[allow(unsafe_code)]
pub mod sys;

pub use bar::{BarSource, BarWindow, DmaBuffer, DmaTarget, SysfsBar, SysfsBarOptions};
pub use bind::{BindOutcome, DeviceSpec, bind_to_vfio_pci};
pub use container::{Container, DmaMapping, IommuType, VfioEnv};
pub use device::{DeviceInfo, RegionInfo, VfioDevice};
pub use diag::Diagnostic;
pub use doctor::{Check, DoctorReport, Verdict};
pub use error::VfioError;
pub use pci::address::Bdf;
pub use platform::{DiscoveryError, Platform, discover};
pub use topology::{Connection, Pair, PathChoice, PathPolicy, Topology};
