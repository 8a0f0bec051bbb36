//! Reading files under a sysfs root, with typed errors.
//!
//! This module owns every filesystem access the discovery code makes: reading
//! small text attributes, the binary `config` file, symlink names, directory
//! listings, and resolving the relative symlinks Linux uses (for example
//! `sys/bus/pci/devices/0000:01:00.0 -> ../../../devices/pci0000:00/...`)
//! *lexically* inside the chosen root, so that a fixture tree can never make
//! discovery read outside it. Nothing here panics on odd input: every failure
//! is a [`ReadError`] that names the path.

use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// Most sysfs attributes are a line or two; anything larger than this is not
/// the file we expected, and reading it whole would be wasted work.
pub const TEXT_LIMIT: u64 = 64 * 1024;

/// Why a file under the sysfs root could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// The file or directory does not exist.
    Missing { path: PathBuf },
    /// The kernel (or the fixture) refused access.
    PermissionDenied { path: PathBuf },
    /// Any other I/O failure, with the error's text.
    Io { path: PathBuf, message: String },
    /// The file is not UTF-8 text where text was expected.
    NotText { path: PathBuf },
    /// The file was read but its contents are not in the expected format.
    Malformed {
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
    /// A symlink's target leaves the sysfs root (or is otherwise unusable).
    BadLink { path: PathBuf, target: String },
}

impl ReadError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Missing { path }
            | ReadError::PermissionDenied { path }
            | ReadError::Io { path, .. }
            | ReadError::NotText { path }
            | ReadError::Malformed { path, .. }
            | ReadError::BadLink { path, .. } => path,
        }
    }

    /// A short machine-readable name for the kind of failure.
    pub fn kind(&self) -> &'static str {
        match self {
            ReadError::Missing { .. } => "missing",
            ReadError::PermissionDenied { .. } => "permission-denied",
            ReadError::Io { .. } => "io-error",
            ReadError::NotText { .. } => "not-text",
            ReadError::Malformed { .. } => "malformed",
            ReadError::BadLink { .. } => "bad-link",
        }
    }

    fn from_io(path: &Path, error: &io::Error) -> ReadError {
        let path = path.to_path_buf();
        match error.kind() {
            io::ErrorKind::NotFound => ReadError::Missing { path },
            io::ErrorKind::PermissionDenied => ReadError::PermissionDenied { path },
            _ => ReadError::Io {
                path,
                message: error.to_string(),
            },
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Missing { path } => write!(f, "{} does not exist", path.display()),
            ReadError::PermissionDenied { path } => {
                write!(f, "{}: permission denied", path.display())
            }
            ReadError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            ReadError::NotText { path } => write!(f, "{} is not UTF-8 text", path.display()),
            ReadError::Malformed {
                path,
                value,
                expected,
            } => write!(
                f,
                "{} holds {:?}, expected {expected}",
                path.display(),
                shorten(value)
            ),
            ReadError::BadLink { path, target } => write!(
                f,
                "{} is a link to {target:?}, which does not resolve inside the sysfs root",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// Quote at most 60 characters of a bad value, so a binary file read as text
/// cannot flood a report.
fn shorten(value: &str) -> String {
    let mut out: String = value.chars().take(60).collect();
    if value.chars().count() > 60 {
        out.push('…');
    }
    out
}

/// Reads a text attribute (at most [`TEXT_LIMIT`] bytes) and trims the
/// trailing newline and surrounding whitespace.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = read_bytes(path, TEXT_LIMIT)?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text.trim().to_string()),
        Err(_) => Err(ReadError::NotText {
            path: path.to_path_buf(),
        }),
    }
}

/// Reads up to `limit` bytes of a file.
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = fs::File::open(path).map_err(|e| ReadError::from_io(path, &e))?;
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::from_io(path, &e))?;
    Ok(bytes)
}

/// Reads a text attribute and parses it with `parse`, turning a parse failure
/// into [`ReadError::Malformed`] that quotes the value.
pub fn read_parsed<T>(
    path: &Path,
    expected: &'static str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, ReadError> {
    let text = read_text(path)?;
    parse(&text).ok_or_else(|| ReadError::Malformed {
        path: path.to_path_buf(),
        value: text,
        expected,
    })
}

/// The last component of a symlink's target: the driver name of a `driver`
/// link, the group number of an `iommu_group` link. The target itself need not
/// exist (fixtures may omit it).
pub fn read_link_name(path: &Path) -> Result<String, ReadError> {
    let target = fs::read_link(path).map_err(|e| ReadError::from_io(path, &e))?;
    match target.file_name().and_then(|n| n.to_str()) {
        Some(name) => Ok(name.to_string()),
        None => Err(ReadError::BadLink {
            path: path.to_path_buf(),
            target: target.display().to_string(),
        }),
    }
}

/// The entry names of a directory, sorted. Names that are not UTF-8 are
/// skipped: sysfs never produces them, and nothing we look for has one.
pub fn list_dir(path: &Path) -> Result<Vec<String>, ReadError> {
    let entries = fs::read_dir(path).map_err(|e| ReadError::from_io(path, &e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReadError::from_io(path, &e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Resolves `link` (a path under `root`) to the path it points at, lexically
/// and inside `root`: a relative target is taken from the link's directory, an
/// absolute one from `root` (a copied tree keeps its meaning), and `..` may not
/// climb above `root`. If `link` is not a symlink it resolves to itself.
///
/// Returns the resolved path relative to `root`.
pub fn resolve_within(root: &Path, link: &Path) -> Result<PathBuf, ReadError> {
    let relative_link = link.strip_prefix(root).map_err(|_| ReadError::BadLink {
        path: link.to_path_buf(),
        target: link.display().to_string(),
    })?;
    let metadata = fs::symlink_metadata(link).map_err(|e| ReadError::from_io(link, &e))?;
    if !metadata.file_type().is_symlink() {
        return Ok(relative_link.to_path_buf());
    }
    let target = fs::read_link(link).map_err(|e| ReadError::from_io(link, &e))?;
    let bad_link = || ReadError::BadLink {
        path: link.to_path_buf(),
        target: target.display().to_string(),
    };
    let mut resolved: Vec<std::ffi::OsString> = Vec::new();
    if target.is_relative()
        && let Some(parent) = relative_link.parent()
    {
        for component in parent.components() {
            if let Component::Normal(part) = component {
                resolved.push(part.to_os_string());
            }
        }
    }
    for component in target.components() {
        match component {
            Component::Normal(part) => resolved.push(part.to_os_string()),
            Component::ParentDir => {
                if resolved.pop().is_none() {
                    return Err(bad_link());
                }
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if resolved.is_empty() {
        return Err(bad_link());
    }
    Ok(resolved.iter().collect())
}

/// Parses a sysfs hex attribute such as `0x030000` or `0x10de` (the `0x` is
/// optional, as some older kernels and hand-made trees omit it).
pub fn parse_hex_u32(text: &str) -> Option<u32> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// Parses a 16-bit hex id such as a vendor or device id.
pub fn parse_hex_u16(text: &str) -> Option<u16> {
    parse_hex_u32(text).and_then(|v| u16::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_attributes_parse_with_or_without_prefix() {
        assert_eq!(parse_hex_u32("0x030000"), Some(0x030000));
        assert_eq!(parse_hex_u32("10de"), Some(0x10de));
        assert_eq!(parse_hex_u16("0x10de"), Some(0x10de));
        assert_eq!(parse_hex_u16("0x10000"), None);
        assert_eq!(parse_hex_u32("0x"), None);
        assert_eq!(parse_hex_u32("zzz"), None);
        assert_eq!(parse_hex_u32("0x123456789"), None);
    }

    #[test]
    fn malformed_error_quotes_a_shortened_value() {
        let error = ReadError::Malformed {
            path: PathBuf::from("x/class"),
            value: "a".repeat(100),
            expected: "a hex class code",
        };
        let text = error.to_string();
        assert!(text.contains("x/class"));
        assert!(text.contains('…'));
        assert!(text.len() < 120);
    }
}
