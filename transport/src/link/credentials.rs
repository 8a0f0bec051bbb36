//! Who is on the other side of a local link, and whether this process
//! lets them in.
//!
//! The abstract Unix socket a link is set up over has no file permissions:
//! any local user can connect to a listener, or bind a name first and wait
//! for a client. Both ends therefore read the kernel's record of the other
//! process (`SO_PEERCRED`: its pid, uid and primary gid when it connected
//! or listened) and go on only with a peer their [`AllowedPeers`] admits.
//! By default that is a process of the same user.
#![forbid(unsafe_code)]

use std::fmt;
use std::os::fd::AsFd;

use super::SetupError;

/// The environment variable that adds uids to every link's allow list
/// (comma-separated; `*` admits every user).
pub const ALLOW_UIDS_VAR: &str = "BARLINK_ALLOW_UIDS";
/// The environment variable that adds gids (a peer's primary group).
pub const ALLOW_GIDS_VAR: &str = "BARLINK_ALLOW_GIDS";

/// A local process as the kernel saw it on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Display for PeerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {} (gid {}), pid {}", self.uid, self.gid, self.pid)
    }
}

impl PeerCredentials {
    /// The process on the other end of `socket` (a connected Unix socket).
    pub fn of_socket(socket: impl AsFd) -> Result<PeerCredentials, SetupError> {
        let cred =
            rustix::net::sockopt::socket_peercred(socket).map_err(|error| SetupError::Io {
                operation: "reading the peer's credentials (SO_PEERCRED)",
                error: error.into(),
            })?;
        Ok(PeerCredentials {
            pid: u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(0),
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
        })
    }
}

/// This process's real uid.
pub fn own_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Which other local users may be the peer of a link. A process of the
/// same user is always admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedPeers {
    /// Further uids admitted.
    pub uids: Vec<u32>,
    /// Peers whose primary gid is one of these are admitted.
    pub gids: Vec<u32>,
    /// Every local user is admitted (for a service that serves all users
    /// and checks them by other means).
    pub anyone: bool,
    /// Also admit what [`ALLOW_UIDS_VAR`] and [`ALLOW_GIDS_VAR`] name.
    pub from_environment: bool,
}

impl Default for AllowedPeers {
    /// The same user, plus whatever the environment allows.
    fn default() -> Self {
        AllowedPeers {
            uids: Vec::new(),
            gids: Vec::new(),
            anyone: false,
            from_environment: true,
        }
    }
}

impl AllowedPeers {
    /// Only the same user, whatever the environment says.
    pub fn same_user_only() -> AllowedPeers {
        AllowedPeers {
            from_environment: false,
            ..AllowedPeers::default()
        }
    }

    /// The list with the environment's entries merged in, checked once
    /// before a setup starts: a malformed variable is an error, never
    /// silently "nobody else".
    pub fn resolve(&self) -> Result<AllowedPeers, SetupError> {
        let mut resolved = AllowedPeers {
            from_environment: false,
            ..self.clone()
        };
        if !self.from_environment {
            return Ok(resolved);
        }
        for (variable, ids) in [
            (ALLOW_UIDS_VAR, &mut resolved.uids),
            (ALLOW_GIDS_VAR, &mut resolved.gids),
        ] {
            let Some(value) = std::env::var_os(variable) else {
                continue;
            };
            let value = value.to_str().ok_or_else(|| SetupError::AllowList {
                detail: format!("{variable} is not UTF-8"),
            })?;
            let (listed, anyone) =
                parse_id_list(value).map_err(|detail| SetupError::AllowList {
                    detail: format!("{variable}={value:?}: {detail}"),
                })?;
            ids.extend(listed);
            resolved.anyone |= anyone && variable == ALLOW_UIDS_VAR;
        }
        Ok(resolved)
    }

    /// Whether `peer` may be the other side of a link of a process run by
    /// `own_uid`.
    pub fn admits(&self, peer: &PeerCredentials, own_uid: u32) -> bool {
        self.anyone
            || peer.uid == own_uid
            || self.uids.contains(&peer.uid)
            || self.gids.contains(&peer.gid)
    }

    /// The allow list in words, for errors and logs.
    pub fn describe(&self) -> String {
        if self.anyone {
            return "every local user".to_string();
        }
        let mut text = "only its own user".to_string();
        if !self.uids.is_empty() {
            text.push_str(&format!(" and uids {:?}", self.uids));
        }
        if !self.gids.is_empty() {
            text.push_str(&format!(" and gids {:?}", self.gids));
        }
        text
    }
}

/// Parses `1000,1001` (spaces allowed around entries); `*` means anyone.
pub fn parse_id_list(text: &str) -> Result<(Vec<u32>, bool), String> {
    let mut ids = Vec::new();
    let mut anyone = false;
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry == "*" {
            anyone = true;
            continue;
        }
        ids.push(entry.parse::<u32>().map_err(|_| {
            format!("{entry:?} is not a numeric id (give ids like 1000,1001, or *)")
        })?);
    }
    Ok((ids, anyone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32) -> PeerCredentials {
        PeerCredentials { pid: 7, uid, gid }
    }

    #[test]
    fn the_same_user_and_only_the_listed_others_are_admitted() {
        let allow = AllowedPeers::same_user_only();
        assert!(allow.admits(&peer(1000, 1000), 1000));
        assert!(!allow.admits(&peer(65534, 65534), 1000));
        assert!(!allow.admits(&peer(0, 0), 1000), "root is another user too");
        let allow = AllowedPeers {
            uids: vec![1001],
            gids: vec![50],
            ..AllowedPeers::same_user_only()
        };
        assert!(allow.admits(&peer(1001, 1001), 1000));
        assert!(allow.admits(&peer(1002, 50), 1000));
        assert!(!allow.admits(&peer(1002, 1002), 1000));
        let anyone = AllowedPeers {
            anyone: true,
            ..AllowedPeers::same_user_only()
        };
        assert!(anyone.admits(&peer(65534, 65534), 1000));
    }

    #[test]
    fn id_lists_parse_or_say_what_is_wrong() {
        assert_eq!(parse_id_list("1000, 1001,"), Ok((vec![1000, 1001], false)));
        assert_eq!(parse_id_list("*"), Ok((vec![], true)));
        assert_eq!(parse_id_list(""), Ok((vec![], false)));
        let error = parse_id_list("1000,alice").unwrap_err();
        assert!(error.contains("\"alice\""), "{error}");
        assert!(parse_id_list("-1").is_err());
        assert!(parse_id_list("4294967296").is_err());
    }

    #[test]
    fn a_socket_pair_shows_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let cred = PeerCredentials::of_socket(&a).unwrap();
        assert_eq!(cred.pid, std::process::id());
        assert_eq!(cred.uid, own_uid());
    }
}
