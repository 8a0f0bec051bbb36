//! Where the secrets of remote setup come from: a pre-shared key, or this
//! node's private key and the public keys of the peers it accepts, read
//! from files (or a key from the environment), never from a command line.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

use super::AuthError;

/// Names the file holding the pre-shared key (64 hex digits).
pub const PSK_FILE_VAR: &str = "BARLINK_PSK_FILE";
/// Holds the pre-shared key itself (64 hex digits), when a file cannot be
/// used.
pub const PSK_VAR: &str = "BARLINK_PSK";
/// Names the file holding this node's private key (64 hex digits).
pub const KEY_FILE_VAR: &str = "BARLINK_KEY_FILE";
/// Names the file listing the public keys of the peers this node accepts.
pub const PEER_KEYS_VAR: &str = "BARLINK_PEER_KEYS";

/// 32 secret bytes. Shown nowhere: `Debug` prints only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey(pub(super) [u8; 32]);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        self.0.fill(0);
    }
}

impl SecretKey {
    /// A key from its 64 hex digits.
    pub fn from_hex(text: &str) -> Result<SecretKey, String> {
        parse_key(text).map(SecretKey)
    }

    /// 32 random bytes from the operating system.
    pub fn random() -> Result<SecretKey, AuthError> {
        let pair = snow::Builder::new(super::PINNED_PATTERN.parse().map_err(AuthError::noise)?)
            .generate_keypair()
            .map_err(AuthError::noise)?;
        let mut key = [0u8; 32];
        key.copy_from_slice(&pair.private);
        Ok(SecretKey(key))
    }

    /// The X25519 public key of this private key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(curve25519_dalek::MontgomeryPoint::mul_base_clamped(self.0).to_bytes())
    }

    /// The 64 hex digits (for writing a new key file).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// An X25519 public key; shown as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// How remote setup proves who is on the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAuth {
    /// No authentication: whoever reaches the port first gets the ring's
    /// address and key. Only when asked for by name (`--insecure`).
    Insecure,
    /// Both sides hold the same 32-byte key.
    PreSharedKey {
        key: SecretKey,
        /// Where it came from, for messages.
        source: String,
    },
    /// Each side has a key pair and accepts only the listed public keys.
    PinnedKeys {
        private: SecretKey,
        peers: Vec<PublicKey>,
        /// Where they came from, for messages.
        source: String,
    },
}

/// The three ways, as both sides announce them before authenticating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    Insecure = 0,
    PreSharedKey = 1,
    PinnedKeys = 2,
}

impl AuthMode {
    pub fn from_byte(byte: u8) -> Option<AuthMode> {
        match byte {
            0 => Some(AuthMode::Insecure),
            1 => Some(AuthMode::PreSharedKey),
            2 => Some(AuthMode::PinnedKeys),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            AuthMode::Insecure => "no authentication (--insecure)",
            AuthMode::PreSharedKey => "a pre-shared key",
            AuthMode::PinnedKeys => "pinned public keys",
        }
    }
}

impl PeerAuth {
    /// Whether a peer that authenticated against `used` (proving
    /// `peer_key`, with pinned keys) is one this would accept: the same
    /// mode and secret, and with pinned keys a peer this lists. Where the
    /// keys came from does not matter, nor the order of the list.
    pub fn would_accept(&self, used: &PeerAuth, peer_key: Option<PublicKey>) -> bool {
        match (self, used) {
            (PeerAuth::Insecure, PeerAuth::Insecure) => true,
            (
                PeerAuth::PreSharedKey { key: ours, .. },
                PeerAuth::PreSharedKey { key: theirs, .. },
            ) => ours == theirs,
            (
                PeerAuth::PinnedKeys {
                    private: ours,
                    peers,
                    ..
                },
                PeerAuth::PinnedKeys {
                    private: theirs, ..
                },
            ) => ours == theirs && peer_key.is_some_and(|key| peers.contains(&key)),
            _ => false,
        }
    }

    pub fn mode(&self) -> AuthMode {
        match self {
            PeerAuth::Insecure => AuthMode::Insecure,
            PeerAuth::PreSharedKey { .. } => AuthMode::PreSharedKey,
            PeerAuth::PinnedKeys { .. } => AuthMode::PinnedKeys,
        }
    }

    /// In words, for `doctor` and a link's decision text.
    pub fn describe(&self) -> String {
        match self {
            PeerAuth::Insecure => {
                "UNAUTHENTICATED: anyone who reaches the port can take the link (--insecure)"
                    .to_string()
            }
            PeerAuth::PreSharedKey { source, .. } => {
                format!("authenticated with a pre-shared key ({source})")
            }
            PeerAuth::PinnedKeys {
                private,
                peers,
                source,
            } => format!(
                "authenticated with pinned keys ({source}; this node's public key {}, {} peer key{})",
                private.public_key(),
                peers.len(),
                if peers.len() == 1 { "" } else { "s" }
            ),
        }
    }

    /// The pre-shared key in the file at `path`.
    pub fn psk_file(path: &Path) -> Result<PeerAuth, AuthError> {
        Ok(PeerAuth::PreSharedKey {
            key: read_secret(path)?,
            source: format!("from {}", path.display()),
        })
    }

    /// This node's private key in `key_file` and the peers' public keys
    /// listed in `peers_file`.
    pub fn pinned_key_files(key_file: &Path, peers_file: &Path) -> Result<PeerAuth, AuthError> {
        let private = read_secret(key_file)?;
        let peers = read_public_keys(peers_file)?;
        Ok(PeerAuth::PinnedKeys {
            private,
            peers,
            source: format!("key {}, peers {}", key_file.display(), peers_file.display()),
        })
    }

    /// What the environment configures ([`PSK_FILE_VAR`], [`PSK_VAR`], or
    /// [`KEY_FILE_VAR`] with [`PEER_KEYS_VAR`]). Nothing configured is an
    /// error that says how to configure it: running unauthenticated is
    /// never a default.
    pub fn from_environment() -> Result<PeerAuth, AuthError> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let psk_file = var(PSK_FILE_VAR);
        let psk = var(PSK_VAR);
        let key_file = var(KEY_FILE_VAR);
        let peers = var(PEER_KEYS_VAR);
        let set: Vec<&str> = [
            (PSK_FILE_VAR, psk_file.is_some()),
            (PSK_VAR, psk.is_some()),
            (KEY_FILE_VAR, key_file.is_some()),
            (PEER_KEYS_VAR, peers.is_some()),
        ]
        .iter()
        .filter(|(_, present)| *present)
        .map(|(name, _)| *name)
        .collect();
        match (psk_file, psk, key_file, peers) {
            (None, None, None, None) => Err(AuthError::NotConfigured),
            (Some(path), None, None, None) => PeerAuth::psk_file(Path::new(&path)),
            (None, Some(value), None, None) => {
                let value = value.to_str().unwrap_or("");
                let key = SecretKey::from_hex(value).map_err(|why| AuthError::BadKey {
                    source: PSK_VAR.to_string(),
                    why,
                })?;
                Ok(PeerAuth::PreSharedKey {
                    key,
                    source: format!("from {PSK_VAR}"),
                })
            }
            (None, None, Some(key), Some(peers)) => {
                PeerAuth::pinned_key_files(Path::new(&key), Path::new(&peers))
            }
            _ => Err(AuthError::Ambiguous {
                set: set.join(", "),
            }),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits (surrounding whitespace ignored) as 32 bytes.
fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    if text.len() != 64 {
        return Err(format!(
            "a key is 64 hex digits; this one has {} characters",
            text.len()
        ));
    }
    let mut key = [0u8; 32];
    for (index, pair) in text.as_bytes().chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).map_err(|_| "a key is 64 hex digits".to_string())?;
        key[index] = u8::from_str_radix(digits, 16)
            .map_err(|_| format!("{digits:?} at character {} is not hex", index * 2 + 1))?;
    }
    Ok(key)
}

/// Reads a secret from a file that only its owner may read.
fn read_secret(path: &Path) -> Result<SecretKey, AuthError> {
    let source = path.display().to_string();
    let bad = |why: String| AuthError::BadKey {
        source: source.clone(),
        why,
    };
    let metadata = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions());
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "other users may read it (mode {:04o}): `chmod 600 {source}`",
            mode & 0o7777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    SecretKey::from_hex(&text).map_err(bad)
}

/// Reads the accepted public keys: one per line, 64 hex digits, then
/// optionally a space and a label; `#` starts a comment.
fn read_public_keys(path: &Path) -> Result<Vec<PublicKey>, AuthError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| AuthError::BadKey {
        source: source.clone(),
        why: format!("cannot read it: {e}"),
    })?;
    let keys = parse_public_keys(&text).map_err(|why| AuthError::BadKey { source, why })?;
    Ok(keys)
}

/// The keys of a peer-keys file's text.
pub fn parse_public_keys(text: &str) -> Result<Vec<PublicKey>, String> {
    let mut keys = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(key) = line.split_whitespace().next() else {
            continue;
        };
        keys.push(PublicKey(
            parse_key(key).map_err(|why| format!("line {}: {why}", number + 1))?,
        ));
    }
    if keys.is_empty() {
        return Err("it lists no public key (one per line, 64 hex digits)".to_string());
    }
    Ok(keys)
}

/// Paths a new key pair is written to by `barlink keygen`.
pub fn public_key_path(private: &Path) -> PathBuf {
    let mut name = private.as_os_str().to_os_string();
    name.push(".pub");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_from_hex_or_say_why_not() {
        let text = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
        let key = SecretKey::from_hex(text).unwrap();
        assert_eq!(key.0[1], 0x11);
        assert_eq!(key.0[31], 0xff);
        assert!(
            SecretKey::from_hex("abc")
                .unwrap_err()
                .contains("64 hex digits")
        );
        let bad = format!("zz{}", &text[2..64]);
        assert!(SecretKey::from_hex(&bad).unwrap_err().contains("not hex"));
        assert_eq!(format!("{key:?}"), "SecretKey(..)");
    }

    #[test]
    fn peer_key_files_take_comments_and_labels() {
        let a = "11".repeat(32);
        let b = "22".repeat(32);
        let keys = parse_public_keys(&format!("# peers\n{a} node-a\n\n{b}  # node-b\n")).unwrap();
        assert_eq!(keys, vec![PublicKey([0x11; 32]), PublicKey([0x22; 32])]);
        assert!(
            parse_public_keys("# none\n")
                .unwrap_err()
                .contains("no public key")
        );
        assert!(
            parse_public_keys("1234\n")
                .unwrap_err()
                .starts_with("line 1")
        );
    }

    #[test]
    fn the_public_key_is_x25519_of_the_private_one() {
        // RFC 7748 section 6.1, Alice's key pair.
        let private =
            SecretKey::from_hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .unwrap();
        assert_eq!(
            private.public_key().to_string(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("barlink-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("psk");
        std::fs::write(&path, "33".repeat(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = PeerAuth::psk_file(&path).unwrap_err().to_string();
        assert!(
            error.contains("mode 0644") && error.contains("chmod 600"),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            PeerAuth::psk_file(&path).unwrap().mode(),
            AuthMode::PreSharedKey
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
