//! `barlink keygen`: the keys remote setup authenticates with — a key pair
//! whose public half the peers pin, or a pre-shared key for both nodes.
//! Secrets are written mode 0600 and never over an existing file.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use barlink_transport::auth::{SecretKey, public_key_path};
use clap::Args;
use serde_json::json;

use super::args::JsonArg;
use super::{CommandError, Status, print_document};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the secret (mode 600). A key pair's public key goes
    /// to FILE.pub as well.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Write a pre-shared key (copy the file to the other node) instead of
    /// a key pair.
    #[arg(long)]
    psk: bool,
    #[command(flatten)]
    output: JsonArg,
}

pub fn run(args: &KeygenArgs) -> Result<Status, CommandError> {
    let secret = SecretKey::random().map_err(|e| CommandError::environment(e.to_string()))?;
    write_new(&args.out, &format!("{}\n", secret.to_hex()), 0o600)?;
    if args.psk {
        if args.output.json {
            print_document(&json!({ "kind": "psk", "psk_file": args.out }));
        } else {
            println!(
                "wrote a pre-shared key to {} (mode 600): give both nodes this file \
                 (--psk-file or BARLINK_PSK_FILE)",
                args.out.display()
            );
        }
        return Ok(Status::Ok);
    }
    let public = secret.public_key();
    let public_path = public_key_path(&args.out);
    write_new(&public_path, &format!("{public}\n"), 0o644)?;
    if args.output.json {
        print_document(&json!({
            "kind": "key-pair",
            "key_file": args.out,
            "public_key_file": public_path,
            "public_key": public.to_string(),
        }));
    } else {
        println!("{public}");
        println!(
            "wrote the private key to {} (mode 600) and the public key above to {}: \
             add the public key to the peers' --peer-keys file",
            args.out.display(),
            public_path.display()
        );
    }
    Ok(Status::Ok)
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CommandError> {
    let failed = |error: std::io::Error| {
        let hint = if error.kind() == std::io::ErrorKind::AlreadyExists {
            ": it exists; keygen never overwrites a key (remove it first)"
        } else {
            ""
        };
        CommandError::environment(format!("keygen: writing {}: {error}{hint}", path.display()))
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)
}
