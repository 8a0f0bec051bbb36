//! The platform checks of `barlink doctor`, as every face reports them:
//! the topology crate's checks of the PCI tree, plus whether links to
//! other nodes would be authenticated as the environment configures them.
#![forbid(unsafe_code)]

use barlink_topology::Topology;
use barlink_topology::doctor::{self, Check, DoctorReport, Verdict};
use barlink_transport::auth::{AuthError, PSK_FILE_VAR, PeerAuth};

/// Every check `barlink doctor` runs on `topology`.
pub fn report(topology: &Topology) -> DoctorReport {
    let mut report = doctor::run(topology);
    report.checks.push(remote_auth_check(topology));
    report
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
