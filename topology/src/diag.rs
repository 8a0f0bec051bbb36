//! Typed diagnostics: what could not be read, and what that means for the
//! verdicts built on it.
//!
//! Discovery never stops at the first bad file. Each problem becomes a
//! [`Diagnostic`] naming its subject (a device or the system), the problem,
//! and the consequence in words ("ACS state unknown: pairs through this bridge
//! are reported unverified"), so that every report can say what it could not
//! check.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::pci::address::Bdf;
use crate::pci::config::ConfigAccess;
use crate::sysfs::ReadError;

/// What a diagnostic is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// System-wide state: IOMMU, kernel command line, CPU, NUMA.
    System,
    /// One PCI function.
    Device(Bdf),
    /// An entry of `sys/bus/pci/devices` that is not (or does not lead to) a
    /// device.
    Entry(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::System => write!(f, "system"),
            Subject::Device(bdf) => write!(f, "{bdf}"),
            Subject::Entry(name) => write!(f, "entry {name:?}"),
        }
    }
}

/// The problem itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A file or link could not be read or parsed.
    Read(ReadError),
    /// Configuration space was only partly readable.
    ConfigLimited { access: ConfigAccess, bytes: usize },
    /// Configuration space was read but its capability lists are corrupt.
    ConfigInconsistent { detail: String },
    /// A line of the `resource` file could not be decoded.
    ResourceLine { line: usize, text: String },
    /// A name in `sys/bus/pci/devices` is not a PCI address.
    NotAPciAddress { name: String },
    /// A device's canonical path is not under `sys/devices/pci…`, so the
    /// bridges above it are unknown.
    PathOutsideDeviceTree { path: String },
    /// The kernel reported a link speed of "Unknown".
    LinkSpeedUnknown { attribute: &'static str },
}

impl Problem {
    /// A short machine-readable name for the kind of problem.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Read(error) => error.kind(),
            Problem::ConfigLimited { .. } => "config-limited",
            Problem::ConfigInconsistent { .. } => "config-inconsistent",
            Problem::ResourceLine { .. } => "malformed",
            Problem::NotAPciAddress { .. } => "not-a-pci-address",
            Problem::PathOutsideDeviceTree { .. } => "path-outside-device-tree",
            Problem::LinkSpeedUnknown { .. } => "link-speed-unknown",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Read(error) => write!(f, "{error}"),
            Problem::ConfigLimited { access, bytes } => match access {
                ConfigAccess::HeaderOnly => write!(
                    f,
                    "only the first {bytes} bytes of config space are readable (the kernel limits non-root readers to the header)"
                ),
                ConfigAccess::NoExtendedSpace => write!(
                    f,
                    "config space is {bytes} bytes: no extended capabilities (conventional PCI, or no extended config access on this platform)"
                ),
                ConfigAccess::Truncated => {
                    write!(
                        f,
                        "config space is only {bytes} bytes, shorter than a header"
                    )
                }
                ConfigAccess::Full | ConfigAccess::Unreadable => {
                    write!(f, "config space: {bytes} bytes")
                }
            },
            Problem::ConfigInconsistent { detail } => write!(f, "config space: {detail}"),
            Problem::ResourceLine { line, text } => {
                write!(f, "resource line {line} {text:?} is not three hex numbers")
            }
            Problem::NotAPciAddress { name } => {
                write!(f, "{name:?} in sys/bus/pci/devices is not a PCI address")
            }
            Problem::PathOutsideDeviceTree { path } => {
                write!(f, "device path {path} is not under sys/devices/pciDDDD:BB")
            }
            Problem::LinkSpeedUnknown { attribute } => {
                write!(f, "{attribute} reads \"Unknown\"")
            }
        }
    }
}

/// One thing that could not be read, and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub subject: Subject,
    pub problem: Problem,
    /// What this means for the report's verdicts, in words.
    pub consequence: String,
}

impl Diagnostic {
    pub fn new(subject: Subject, problem: Problem, consequence: impl Into<String>) -> Diagnostic {
        Diagnostic {
            subject,
            problem,
            consequence: consequence.into(),
        }
    }

    /// Shorthand for a device diagnostic about a read error.
    pub fn device_read(bdf: Bdf, error: ReadError, consequence: impl Into<String>) -> Diagnostic {
        Diagnostic::new(Subject::Device(bdf), Problem::Read(error), consequence)
    }

    /// Shorthand for a system diagnostic about a read error.
    pub fn system_read(error: ReadError, consequence: impl Into<String>) -> Diagnostic {
        Diagnostic::new(Subject::System, Problem::Read(error), consequence)
    }

    /// The device this is about, if any.
    pub fn device(&self) -> Option<Bdf> {
        match self.subject {
            Subject::Device(bdf) => Some(bdf),
            _ => None,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} — {}",
            self.subject, self.problem, self.consequence
        )
    }
}

impl Serialize for Diagnostic {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut state = serializer.serialize_struct("Diagnostic", 4)?;
        state.serialize_field("subject", &self.subject.to_string())?;
        state.serialize_field("kind", self.problem.kind())?;
        state.serialize_field("problem", &self.problem.to_string())?;
        state.serialize_field("consequence", &self.consequence)?;
        state.end()
    }
}
