//! The AEAD of a finished handshake, one key and nonce per direction,
//! sealing in place.
//!
//! Each sealed message is a Noise transport message (AES-256-GCM, the
//! nonce's last eight bytes the message's number, big-endian; no
//! associated data), so a peer running any Noise implementation with the
//! same keys opens it. Sealing in place, rather than through `snow`'s
//! transport state (which copies the plaintext into its output first),
//! saves a medium that already holds its bytes in a buffer a copy of every
//! byte each way.
#![forbid(unsafe_code)]

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};

use super::{AuthError, SEAL_OVERHEAD};

/// Both directions' keys and the number of the next message each way.
pub(super) struct RecordKeys {
    send: LessSafeKey,
    recv: LessSafeKey,
    send_nonce: u64,
    recv_nonce: u64,
}

impl RecordKeys {
    /// Keys for the side that sends with `send` and receives with `recv`
    /// (the handshake's split, both nonces at 0).
    pub(super) fn new(send: &[u8; 32], recv: &[u8; 32]) -> Result<RecordKeys, AuthError> {
        let key = |bytes: &[u8; 32]| {
            UnboundKey::new(&AES_256_GCM, bytes)
                .map(LessSafeKey::new)
                .map_err(|_| AuthError::Noise {
                    detail: "the handshake's key does not fit AES-256-GCM".to_string(),
                })
        };
        Ok(RecordKeys {
            send: key(send)?,
            recv: key(recv)?,
            send_nonce: 0,
            recv_nonce: 0,
        })
    }

    /// Encrypts `in_out` where it lies and returns its tag.
    pub(super) fn seal_in_place(&mut self, in_out: &mut [u8]) -> Result<[u8; 16], AuthError> {
        let nonce = next_nonce(&mut self.send_nonce)?;
        let tag: Tag = self
            .send
            .seal_in_place_separate_tag(nonce, Aad::empty(), in_out)
            .map_err(|_| AuthError::Malformed {
                detail: format!("{} bytes are too many to seal at once", in_out.len()),
            })?;
        let mut bytes = [0u8; SEAL_OVERHEAD];
        bytes.copy_from_slice(tag.as_ref());
        Ok(bytes)
    }

    /// Opens `in_out` (ciphertext then tag) where it lies and returns the
    /// plaintext's length (it stays at the front). An altered, replayed,
    /// dropped or reordered message does not open.
    pub(super) fn open_in_place(&mut self, in_out: &mut [u8]) -> Result<usize, AuthError> {
        if in_out.len() < SEAL_OVERHEAD {
            return Err(AuthError::Malformed {
                detail: format!(
                    "a sealed message of {} bytes is shorter than its tag",
                    in_out.len()
                ),
            });
        }
        // The number advances only once a message opened: a failure ends
        // the session anyway, and nothing of it was delivered.
        let number = self.recv_nonce;
        let nonce = nonce_of(number)?;
        let plaintext = self
            .recv
            .open_in_place(nonce, Aad::empty(), in_out)
            .map_err(|_| AuthError::Malformed {
                detail: "a sealed message does not open: altered on the way".to_string(),
            })?;
        let len = plaintext.len();
        self.recv_nonce = number + 1;
        Ok(len)
    }
}

/// The nonce for message `number`, as Noise's AESGCM forms it.
fn nonce_of(number: u64) -> Result<Nonce, AuthError> {
    // Noise reserves the last number; a session never gets near it.
    if number == u64::MAX {
        return Err(AuthError::Malformed {
            detail: "the session sealed 2^64 - 1 messages: it must be set up again".to_string(),
        });
    }
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&number.to_be_bytes());
    Ok(Nonce::assume_unique_for_key(bytes))
}

fn next_nonce(counter: &mut u64) -> Result<Nonce, AuthError> {
    let nonce = nonce_of(*counter)?;
    *counter += 1;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_message_number_is_never_used() {
        assert!(nonce_of(u64::MAX - 1).is_ok());
        assert!(nonce_of(u64::MAX).is_err());
        let mut keys = RecordKeys::new(&[1; 32], &[1; 32]).unwrap();
        keys.send_nonce = u64::MAX;
        assert!(keys.seal_in_place(&mut [0u8; 8]).is_err());
        assert_eq!(keys.send_nonce, u64::MAX, "a refused seal takes no number");
    }
}
