//! The CUDA layer against the stand-in driver (`tests/mock/libcuda.c`):
//! loading, device facts, copies and their bounds, refusals, and the
//! errors a machine without a driver or a GPU gets.

use std::path::PathBuf;

use barlink_cuda::mock::{self, MockKind};
use barlink_cuda::{Cuda, CudaError};

fn scratch() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-mock")
}

/// The stand-in driver, or `None` after a visible skip.
fn mock_driver(test: &str, kind: MockKind) -> Option<Cuda> {
    let path = mock::build_or_skip(&scratch(), kind, test)?;
    Some(Cuda::load_from(&path).expect("the mock driver loads"))
}

#[test]
fn the_device_reports_what_barlink_needs() {
    let Some(cuda) = mock_driver("the_device_reports_what_barlink_needs", MockKind::OneDevice)
    else {
        return;
    };
    assert_eq!(cuda.driver_version().unwrap().to_string(), "12.4");
    assert_eq!(cuda.device_count().unwrap(), 1);
    let info = cuda.device(0).unwrap().info().unwrap();
    assert_eq!(info.name, "barlink mock GPU");
    assert_eq!(info.pci_address, "0000:0a:00.0");
    assert_eq!(info.total_memory, 1 << 30);
    assert_eq!(info.compute_capability, (9, 0));
    assert_eq!(info.copy_engines, 2);
    assert!(!info.dma_buf);
    assert!(info.host_register);
    match cuda.device(3) {
        Err(CudaError::DeviceOutOfRange {
            ordinal: 3,
            count: 1,
        }) => {}
        other => panic!("expected DeviceOutOfRange, got {other:?}"),
    }
}

#[test]
fn bytes_go_to_the_device_and_back_intact() {
    let Some(cuda) = mock_driver(
        "bytes_go_to_the_device_and_back_intact",
        MockKind::OneDevice,
    ) else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let device = context.alloc(data.len()).unwrap();
    device.write(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    device.read(0, &mut back).unwrap();
    assert_eq!(back, data);

    // Device to device, at offsets, then through a pinned buffer.
    let second = context.alloc(data.len()).unwrap();
    second.fill(0xEE).unwrap();
    second.copy_from(10, &device, 20, 1000).unwrap();
    let mut pinned = context.alloc_pinned(2000).unwrap();
    pinned.fill_from(&second, 0, 1020).unwrap();
    assert!(pinned.as_ref()[..10].iter().all(|&b| b == 0xEE));
    assert_eq!(&pinned.as_ref()[10..1010], &data[20..1020]);
    assert!(pinned.as_ref()[1010..1020].iter().all(|&b| b == 0xEE));
}

#[test]
fn ranges_beyond_a_buffer_are_refused_before_the_driver_sees_them() {
    let Some(cuda) = mock_driver(
        "ranges_beyond_a_buffer_are_refused_before_the_driver_sees_them",
        MockKind::OneDevice,
    ) else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    let device = context.alloc(4096).unwrap();
    let mut big = vec![0u8; 4097];
    for result in [
        device.write(1, &[0u8; 4096]),
        device.read(0, &mut big),
        device.read(usize::MAX, &mut [0u8; 2]),
        device.copy_from(4000, &device, 0, 100),
    ] {
        match result {
            Err(CudaError::OutOfBounds { what }) => assert!(what.contains("4096 byte"), "{what}"),
            other => panic!("expected OutOfBounds, got {other:?}"),
        }
    }
    let mut pinned = context.alloc_pinned(16).unwrap();
    assert!(matches!(
        pinned.fill_from(&device, 0, 17),
        Err(CudaError::OutOfBounds { .. })
    ));
    assert!(matches!(
        context.alloc(0),
        Err(CudaError::OutOfBounds { .. })
    ));
}

#[test]
fn routes_the_device_refuses_say_why() {
    let Some(cuda) = mock_driver("routes_the_device_refuses_say_why", MockKind::OneDevice) else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    let device = context.alloc(1 << 20).unwrap();
    match device.export_dma_buf() {
        Err(CudaError::Refused { what, reason }) => {
            assert_eq!(what, "dma-buf export");
            assert!(reason.contains("DMA_BUF_SUPPORTED = 0"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    match device.ipc_handle() {
        Err(CudaError::Refused { what, reason }) => {
            assert_eq!(what, "CUDA IPC export");
            assert!(reason.contains("CUDA_ERROR_NOT_SUPPORTED"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_dma_buf_is_exported_for_whole_host_pages_and_refused_otherwise() {
    let Some(cuda) = mock_driver(
        "a_dma_buf_is_exported_for_whole_host_pages_and_refused_otherwise",
        MockKind::DmaBuf,
    ) else {
        return;
    };
    let context = cuda.device(0).unwrap().context().unwrap();
    assert!(context.device().info().unwrap().dma_buf);
    let whole = context.alloc(2 << 20).unwrap();
    let fd = whole.export_dma_buf().expect("whole pages export");
    assert!(std::os::fd::AsRawFd::as_raw_fd(&fd) >= 0);
    // The driver would answer an invalid value; barlink says why first.
    let ragged = context.alloc(4097).unwrap();
    match ragged.export_dma_buf() {
        Err(CudaError::Refused { what, reason }) => {
            assert_eq!(what, "dma-buf export");
            assert!(reason.contains("host page boundaries"), "{reason}");
            assert!(reason.contains("4097 bytes"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_driver_that_fails_to_start_is_a_fault_not_an_absent_gpu() {
    let Some(path) = mock::build_or_skip(
        &scratch(),
        MockKind::DriverMismatch,
        "a_driver_that_fails_to_start_is_a_fault_not_an_absent_gpu",
    ) else {
        return;
    };
    let error = Cuda::load_from(&path).unwrap_err();
    assert!(!error.is_environment(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
        "{error}"
    );
}

#[test]
fn a_driver_without_a_gpu_says_no_device() {
    let Some(path) = mock::build_or_skip(
        &scratch(),
        MockKind::NoDevice,
        "a_driver_without_a_gpu_says_no_device",
    ) else {
        return;
    };
    let error = Cuda::load_from(&path).unwrap_err();
    assert!(error.is_environment());
    assert!(matches!(error, CudaError::NoDevice { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("CUDA_ERROR_NO_DEVICE"), "{text}");
    assert!(text.contains("nvidia-smi"), "{text}");
}

#[test]
fn a_machine_without_a_driver_is_told_what_to_install() {
    let error = Cuda::load_from(&scratch().join("no-such-libcuda.so.1")).unwrap_err();
    assert!(error.is_environment());
    let text = error.to_string();
    assert!(text.starts_with("no CUDA driver: cannot load"), "{text}");
    assert!(text.contains("BARLINK_CUDA_LIBRARY"), "{text}");
}
