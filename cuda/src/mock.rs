//! A stand-in CUDA driver for tests on machines without a GPU
//! (`tests/mock/libcuda.c`): device memory is host memory, every device
//! range is checked against the live allocations, IPC and dma-buf export
//! are refused (but for a variant that exports dma-bufs). It proves
//! barlink's calls, bounds and error paths; a real GPU proves the rest
//! (`scripts/gpu-check.sh`).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The stand-in's C source.
pub const SOURCE: &str = include_str!("../tests/mock/libcuda.c");

/// Which stand-in to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MockKind {
    /// One device, 1 GiB, no IPC, no dma-buf.
    OneDevice,
    /// `cuInit` answers `CUDA_ERROR_NO_DEVICE`.
    NoDevice,
    /// One device whose device-to-host copies flip a bit now and then.
    FlipReads,
    /// `cuInit` answers `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`.
    DriverMismatch,
    /// One device that exports dma-bufs of whole host pages.
    DmaBuf,
}

/// Compiles the stand-in into `dir` with the C compiler (`$CC`, else `cc`)
/// and returns the library's path; an error says why it could not (no
/// compiler), for the caller to report as a visible skip.
pub fn build(dir: &Path, kind: MockKind) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let (name, defines): (&str, &[&str]) = match kind {
        MockKind::OneDevice => ("libcuda-mock.so", &[]),
        MockKind::NoDevice => ("libcuda-mock-nodevice.so", &["-DMOCK_NO_DEVICE"]),
        MockKind::FlipReads => ("libcuda-mock-flip.so", &["-DMOCK_FLIP_READS"]),
        MockKind::DriverMismatch => ("libcuda-mock-mismatch.so", &["-DMOCK_DRIVER_MISMATCH"]),
        MockKind::DmaBuf => ("libcuda-mock-dmabuf.so", &["-DMOCK_DMA_BUF"]),
    };
    // Tests build it in parallel: each compiles its own copy and renames it
    // into place, so no one loads a half-written file.
    let unique = format!("{}.{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', "");
    let source = dir.join(format!("libcuda-mock.{unique}.c"));
    std::fs::write(&source, SOURCE).map_err(|e| format!("writing {}: {e}", source.display()))?;
    let built = dir.join(format!("{name}.{unique}.tmp"));
    let library = dir.join(name);
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&built)
        .arg(&source)
        .args(defines)
        .arg("-lpthread")
        .output()
        .map_err(|e| format!("no C compiler ({compiler}: {e})"))?;
    let _ = std::fs::remove_file(&source);
    if !output.status.success() {
        return Err(format!(
            "{compiler} failed on the mock driver: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    std::fs::rename(&built, &library)
        .map_err(|e| format!("renaming {} into place: {e}", built.display()))?;
    Ok(library)
}

/// [`build`] for a test: the library, or `None` after saying on the real
/// stderr (past the harness's capture) `SKIPPED <test>: <why>`, so the
/// skip is counted, never a silent pass.
pub fn build_or_skip(dir: &Path, kind: MockKind, test: &str) -> Option<PathBuf> {
    match build(dir, kind) {
        Ok(path) => Some(path),
        Err(why) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
            None
        }
    }
}
