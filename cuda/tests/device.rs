//! The CUDA layer on a real GPU: runs where a driver and a device exist
//! (`scripts/gpu-check.sh` on a lent GPU machine) and says SKIPPED
//! elsewhere, with the loader's reason.

use barlink_cuda::{Cuda, CudaError};

/// Says on the real stderr, past the harness's capture, why a test checked
/// nothing, so a skip is never a silent pass.
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// The machine's driver and first device, or `None` after a visible skip.
fn real_device(test: &str) -> Option<barlink_cuda::Context> {
    let found = Cuda::load().and_then(|cuda| cuda.device(0)?.context());
    match found {
        Ok(context) => Some(context),
        Err(error) if error.is_environment() => {
            skipped(test, &error.to_string());
            None
        }
        Err(error) => panic!("{test}: the driver loaded but failed: {error}"),
    }
}

#[test]
fn a_real_device_reports_itself() {
    let Some(context) = real_device("a_real_device_reports_itself") else {
        return;
    };
    let info = context.device().info().unwrap();
    println!("device: {info:?}");
    assert!(!info.name.is_empty());
    assert!(info.total_memory > 0);
    assert_eq!(
        info.pci_address.len(),
        "0000:00:00.0".len(),
        "{}",
        info.pci_address
    );
}

#[test]
fn a_real_device_keeps_every_byte() {
    let Some(context) = real_device("a_real_device_keeps_every_byte") else {
        return;
    };
    let len = 64 << 20;
    let data: Vec<u8> = (0..len as u32).map(|i| (i ^ (i >> 9)) as u8).collect();
    let first = context.alloc(len).unwrap();
    let second = context.alloc(len).unwrap();
    first.write(0, &data).unwrap();
    second.copy_from(0, &first, 0, len).unwrap();
    let mut pinned = context.alloc_pinned(len).unwrap();
    pinned.fill_from(&second, 0, len).unwrap();
    assert!(
        pinned.as_ref() == &data[..],
        "device round trip changed bytes"
    );
    let mut odd = vec![0u8; 4099];
    first.read(12_345, &mut odd).unwrap();
    assert_eq!(odd, data[12_345..12_345 + 4099]);
}

#[test]
fn a_real_device_says_which_export_routes_it_allows() {
    let Some(context) = real_device("a_real_device_says_which_export_routes_it_allows") else {
        return;
    };
    let buffer = context.alloc(2 << 20).unwrap();
    match buffer.export_dma_buf() {
        Ok(fd) => println!("dma-buf export: allowed (fd {fd:?})"),
        Err(CudaError::Refused { reason, .. }) => println!("dma-buf export: refused: {reason}"),
        Err(other) => panic!("dma-buf export failed rather than refusing: {other}"),
    }
    match buffer.ipc_handle() {
        Ok(_) => println!("CUDA IPC export: allowed"),
        Err(CudaError::Refused { reason, .. }) => println!("CUDA IPC export: refused: {reason}"),
        Err(other) => panic!("CUDA IPC export failed rather than refusing: {other}"),
    }
}
