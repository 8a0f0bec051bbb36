//! Setting up the RDMA link both roles measure over, with the device and
//! GID that perftest is to use too.

use std::time::Duration;

use barlink::connect::{AnyLink, ConnectError, ConnectOptions, PathDecision, Peer, Role};
use barlink_rdma::RdmaLink;
use barlink_rdma::oob::OobOptions;
use barlink_rdma::verbs_queue::{RdmaLinkOptions, VerbsQueue};
use barlink_rdma::{LinkLayer, RdmaError};
use barlink_transport::EngineConfig;

use crate::cli::CommandError;
use crate::cli::bench::args::BenchArgs;
use crate::cli::bench::remote::STEP_TIMEOUT;
use crate::cli::bench::remote::args::RemoteArgs;

/// The setup port, as perftest's.
pub const DEFAULT_PORT: u16 = 18515;
/// The device and GID index perftest should use: the ones barlink uses.
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    /// `None` on InfiniBand (perftest then needs no `-x`).
    pub gid_index: Option<u32>,
}

pub fn local_device(args: &RemoteArgs) -> Result<Device, RdmaError> {
    let info = match &args.rdma_device {
        Some(name) => barlink_rdma::device::device(name)?,
        None => {
            let devices = barlink_rdma::device::devices()?;
            let first_active = devices.iter().position(|d| d.active_port().is_some());
            match first_active {
                Some(index) => devices[index].clone(),
                None => devices.into_iter().next().ok_or(RdmaError::NoDevice {
                    reason: "libibverbs lists no device".into(),
                })?,
            }
        }
    };
    let port = info.ports.iter().find(|p| p.port == 1);
    let gid_index = match (args.gid_index, port) {
        (Some(index), _) => Some(u32::from(index)),
        (None, Some(port)) if port.link_layer == LinkLayer::InfiniBand => None,
        (None, Some(port)) => port.roce_v2_gid().map(|g| g.index),
        (None, None) => None,
    };
    Ok(Device {
        name: info.name,
        gid_index,
    })
}

pub fn connect_options(args: &BenchArgs, device: &Device) -> Result<ConnectOptions, CommandError> {
    // The largest message is fixed (the engine's default) so that the
    // server, which learns the sizes only later, agrees with the client.
    let mut engine: EngineConfig = args.engine_config(1);
    engine.max_message_len = EngineConfig::default().max_message_len;
    // A link waits unpolled while perftest runs: that is the schedule,
    // not a lost peer.
    engine.peer_timeout = STEP_TIMEOUT;
    let slots = engine.send_window.max(8);
    Ok(ConnectOptions {
        setup_timeout: Duration::from_secs(args.remote.accept_timeout),
        rdma: RdmaLinkOptions {
            device: Some(device.name.clone()),
            port: 1,
            gid_index: args.remote.gid_index,
            slots,
            send_queue_depth: (2 * slots).max(128),
            qp_timeout: args.remote.qp_timeout,
            retry_count: 7,
            rnr_retry: 7,
            oob: OobOptions {
                connect_timeout: Duration::from_secs(5),
                connect_retries: 20,
                retry_interval: Duration::from_millis(500),
                io_timeout: STEP_TIMEOUT,
                auth_timeout: STEP_TIMEOUT,
                auth: args.remote.auth.peer_auth()?,
                deadline: None,
            },
            engine: engine.clone(),
            epoch: 1,
        },
        engine,
        ..ConnectOptions::default()
    })
}

pub fn connect_error(error: ConnectError) -> CommandError {
    match error {
        ConnectError::Usage { .. } => CommandError::usage(format!("bench --rdma: {error}")),
        other => CommandError::environment(format!("bench --rdma: {other}")),
    }
}

/// Sets up the link and takes the RDMA link out of the connection.
pub fn link_up<B: AsRef<[u8]>>(
    args: &BenchArgs,
    device: &Device,
    peer: &str,
    role: Role,
) -> Result<(RdmaLink<VerbsQueue, B>, PathDecision), CommandError> {
    let options = connect_options(args, device)?;
    let connection = barlink::connect::<B>(
        &Peer::Remote {
            addr: peer.to_string(),
        },
        role,
        &options,
    )
    .map_err(connect_error)?;
    let decision = connection.decision;
    match connection.link {
        AnyLink::Rdma(link) => Ok((*link, decision)),
        _ => Err(CommandError::environment(format!(
            "bench --rdma: the link is not RDMA ({decision})"
        ))),
    }
}
