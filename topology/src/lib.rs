//! PCI discovery, topology and path choice, and the platform doctor — the
//! part of barlink that decides, before any data moves, whether GPU
//! peer-to-peer over PCIe BARs can work on this machine and which path each
//! transfer takes. It reads sysfs only: no device is opened, nothing is
//! mapped (that is `barlink-vfio`).
//!
//! Layers, bottom up:
//! * [`sysfs`] — reading files under a configurable root, with typed errors.
//! * [`pci`] — a PCI function and its parts: addresses, classes, BARs,
//!   links, config space (ACS, Resizable BAR, port types).
//! * [`diag`] — diagnostics: what could not be read and what that means.
//! * [`tree`] — the PCI tree read from sysfs, with its diagnostics.
//! * [`iommu`], [`platform`] — system state, and [`platform::discover`] which
//!   reads everything into a [`Platform`].
//! * [`aperture`] — whether a GPU's BAR1 can expose its memory.
//! * [`topology`] — PIX/PXB/PHB/NODE/SYS classification and path choice.
//! * [`render`], [`doctor`] — text and JSON for the `topo` and `doctor`
//!   commands.
//!
//! Reading sysfs needs no privileges, but non-root readers see only the
//! first 64 bytes of config space; reports say so.
//!
//! ```no_run
//! use std::path::Path;
//! use barlink_topology::{PathPolicy, Topology, doctor, render};
//!
//! let topology = Topology::discover(Path::new("/"), PathPolicy::default())?;
//! print!("{}", render::topo_text(&topology));
//! let report = doctor::run(&topology);
//! print!("{}", report.render_text());
//! std::process::exit(if report.has_failures() { 1 } else { 0 });
//! # Ok::<(), barlink_topology::DiscoveryError>(())
//! ```
#![forbid(unsafe_code)]

pub mod aperture;
pub mod diag;
pub mod doctor;
pub mod iommu;
pub mod pci;
pub mod platform;
pub mod render;
pub mod sysfs;
pub mod topology;
pub mod tree;

pub use diag::Diagnostic;
pub use doctor::{Check, DoctorReport, Verdict};
pub use pci::address::Bdf;
pub use platform::{DiscoveryError, Platform, discover};
pub use topology::{Pair, PathChoice, PathClass, PathPolicy, Topology};
