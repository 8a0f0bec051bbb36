//! `barlink doctor`: a thin wrapper over the topology crate's platform
//! checks. Exits 1 when a check fails.

use barlink_topology::Topology;
use barlink_topology::doctor::{self, Check, Verdict};
use barlink_transport::auth::{AuthError, PSK_FILE_VAR, PeerAuth};
use clap::Args;

use super::args::{JsonArg, PlatformArgs};
use super::{CommandError, Status, print_document};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    output: JsonArg,
}

pub fn run(args: &DoctorArgs) -> Result<Status, CommandError> {
    let topology = args.platform.discover()?;
    let mut report = doctor::run(&topology);
    report.checks.push(remote_auth_check(&topology));
    if args.output.json {
        print_document(&report.to_json());
    } else {
        print!("{}", report.render_text());
    }
    Ok(if report.has_failures() {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

/// Whether links to other nodes would be authenticated, as the environment
/// configures them (`bench --rdma` flags can still override it).
fn remote_auth_check(topology: &Topology) -> Check {
    let has_rdma = topology.nics.iter().any(|n| n.rdma_capable);
    match PeerAuth::from_environment() {
        Ok(auth) => Check::new(
            "remote-auth",
            Verdict::Pass,
            format!("links to other nodes: setup {}", auth.describe()),
        ),
        Err(AuthError::NotConfigured) if !has_rdma => Check::new(
            "remote-auth",
            Verdict::Skip,
            "no RDMA NIC, and no key for links to other nodes (RDMA setup would need one, or --insecure)",
        ),
        Err(AuthError::NotConfigured) => Check::new(
            "remote-auth",
            Verdict::Warn,
            "no key for links to other nodes: RDMA setup refuses to start unless run with --insecure",
        )
        .fix(format!(
            "barlink keygen --psk --out FILE on one node, copy FILE to the other, and set {PSK_FILE_VAR}=FILE on both (docs/SECURITY.md)"
        )),
        Err(error) => Check::new("remote-auth", Verdict::Fail, error.to_string())
            .fix("fix the key configuration named above (docs/SECURITY.md)"),
    }
}
