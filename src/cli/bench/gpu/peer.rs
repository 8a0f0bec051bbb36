//! The receiving process of `bench --gpu` (`barlink bench-gpu-peer`): it
//! exports its landing buffer for the CUDA IPC baseline, receives every
//! window into device memory, checks what landed, and answers.

use std::io::Write;
use std::path::Path;

use barlink::gpu::{DeviceLanding, Staged, StagingPool, send_from_device};
use barlink::{ConnectOptions, Peer, Role, connect};

use super::plan::{GpuPeerPlan, STEP_TIMEOUT, payload};
use super::{LANDING_DEPTH, engine_config, hex};
use crate::cli::bench::shm::watch_parent;
use crate::cli::gpu;

/// Runs the peer's half of the schedule; prints `ipc ...` first and
/// `wrong N,N,...` (windows that landed wrong, per size) last on stdout,
/// for the parent.
pub fn run_child(plan: &GpuPeerPlan) -> Result<(), String> {
    watch_parent();
    let gpu = gpu::open(plan.gpu_device, Path::new("/")).map_err(|e| e.to_string())?;
    let max = plan.max_size();
    let landing = gpu.context.alloc(max).map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout();
    let line = match landing.ipc_handle() {
        Ok(handle) => format!("ipc {}", hex(&handle.0)),
        Err(error) => format!("ipc-refused {error}"),
    };
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing to the parent: {e}"))?;
    let options = ConnectOptions {
        engine: engine_config(plan.mtu, plan.window, max),
        ..ConnectOptions::default()
    };
    let peer = Peer::Local {
        name: plan.name.clone(),
    };
    let mut link = connect::<Staged>(&peer, Role::Connect, &options).map_err(|e| e.to_string())?;
    let pool = StagingPool::new(gpu.context.clone(), 64 << 20);
    let mut receiver = DeviceLanding::new(gpu.context.clone(), max, LANDING_DEPTH);
    let mut wrong = Vec::new();
    let mut landed = Vec::new();
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        let expected = payload(size);
        let mut wrong_here = 0u64;
        for _ in 0..plan.windows {
            for _ in 0..count {
                let len = receiver
                    .recv(&mut link, &landing, 0, STEP_TIMEOUT)
                    .map_err(|e| e.to_string())?;
                wrong_here += u64::from(len != size);
            }
            landed.resize(size, 0);
            landing.read(0, &mut landed).map_err(|e| e.to_string())?;
            wrong_here += u64::from(landed != expected);
            send_from_device(&mut link, &pool, &landing, 0, 1, STEP_TIMEOUT)
                .map_err(|e| e.to_string())?;
        }
        for _ in 0..plan.lat_iters {
            receiver
                .recv(&mut link, &landing, 0, STEP_TIMEOUT)
                .map_err(|e| e.to_string())?;
            send_from_device(&mut link, &pool, &landing, 0, size, STEP_TIMEOUT)
                .map_err(|e| e.to_string())?;
        }
        wrong.push(wrong_here.to_string());
    }
    link.flush(STEP_TIMEOUT).map_err(|e| e.to_string())?;
    writeln!(stdout, "wrong {}", wrong.join(","))
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing to the parent: {e}"))?;
    // The parent maps `landing` (CUDA IPC) until it says it let go: freeing
    // exported memory that another process still maps is undefined.
    receiver
        .recv(&mut link, &landing, 0, STEP_TIMEOUT)
        .map_err(|e| e.to_string())?;
    link.close(STEP_TIMEOUT).map_err(|e| e.to_string())
}
