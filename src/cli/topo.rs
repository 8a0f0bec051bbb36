//! `barlink topo`: a thin wrapper over the topology crate's discovery and
//! rendering.

use barlink_topology::render;
use clap::Args;

use super::args::{JsonArg, PlatformArgs};
use super::{CommandError, Status, print_document};

#[derive(Debug, Args)]
pub struct TopoArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    output: JsonArg,
}

pub fn run(args: &TopoArgs) -> Result<Status, CommandError> {
    let topology = args.platform.discover()?;
    if args.output.json {
        print_document(&render::topo_json(&topology));
    } else {
        print!("{}", render::topo_text(&topology));
    }
    Ok(Status::Ok)
}
