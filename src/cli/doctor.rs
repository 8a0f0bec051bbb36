//! `barlink doctor`: a thin wrapper over the topology crate's platform
//! checks (`barlink::doctor`). Exits 1 when a check fails.

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
    let report = barlink::doctor::report(&topology);
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
