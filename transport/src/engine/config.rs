//! Engine configuration and its validation.

use std::fmt;
use std::time::Duration;

use crate::wire::{HEADER_LEN, ParseLimits};

/// Smallest packet (header included) the engine will use.
pub const MIN_MTU: usize = 256;
/// Largest packet (header included) the engine will use.
pub const MAX_MTU: usize = 16 << 20;

/// How an engine behaves. Both sides of a link should agree on `mtu`,
/// `max_message_len` and `crc`; the rest is local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Largest packet, header included, in bytes ([`MIN_MTU`]..=[`MAX_MTU`]).
    /// Larger packets amortize the header and per-packet work; a ring slot
    /// must hold one.
    pub mtu: usize,
    /// Largest message this side sends or accepts.
    pub max_message_len: u64,
    /// Most data packets in flight (sent, not yet acknowledged).
    pub send_window: u32,
    /// Most data packets this side buffers ahead of delivery; the credit it
    /// grants its peer. Bounds receive memory at about `recv_window * mtu`,
    /// plus the message being assembled, plus delivered messages the caller
    /// has not taken.
    pub recv_window: u32,
    /// Most messages queued for sending before [`send`](super::Engine::send)
    /// pushes back with [`SendError::QueueFull`](super::SendError::QueueFull).
    pub send_queue_limit: usize,
    /// Retransmission timeout before any round trip was measured.
    pub initial_rto: Duration,
    /// Floor of the measured retransmission timeout.
    pub min_rto: Duration,
    /// Ceiling of the retransmission timeout, backoff included.
    pub max_rto: Duration,
    /// Transmissions of one packet after which the link is declared broken
    /// ([`LinkError::RetransmitLimit`](super::LinkError::RetransmitLimit)).
    pub max_transmissions: u32,
    /// Data packets received before an acknowledgement goes out regardless
    /// of the ack delay (at most a quarter of `recv_window` is used: see
    /// [`ack_threshold`](Self::ack_threshold)).
    pub ack_every: u32,
    /// Longest an acknowledgement is held back hoping to piggyback it.
    pub ack_delay: Duration,
    /// Idle time after which a heartbeat is sent.
    pub heartbeat_interval: Duration,
    /// Silence after which the peer is declared lost.
    pub peer_timeout: Duration,
    /// Take and check a CRC-32C on every packet. Turning it off is for
    /// measuring what it costs, never for data anyone cares about.
    pub crc: bool,
}

impl Default for EngineConfig {
    /// Defaults for a link between processes or devices on one host: 4 KiB
    /// packets, 256-packet windows, sub-millisecond timers, a peer declared
    /// lost after 2 s of silence.
    fn default() -> Self {
        EngineConfig {
            mtu: 4096,
            max_message_len: 1 << 30,
            send_window: 256,
            recv_window: 256,
            send_queue_limit: 4096,
            // Round trips on a ring are microseconds, but a process can be
            // descheduled for milliseconds (a time slice on a busy core is
            // several): a floor of 20 ms keeps such stalls from looking like
            // loss (design change 15). Corruption is resent on NAK, at once,
            // whatever the timer; the timer is the last resort for a packet
            // that vanished.
            initial_rto: Duration::from_millis(20),
            min_rto: Duration::from_millis(20),
            max_rto: Duration::from_secs(1),
            max_transmissions: 32,
            ack_every: 32,
            ack_delay: Duration::from_micros(50),
            heartbeat_interval: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(2),
            crc: true,
        }
    }
}

impl EngineConfig {
    /// Payload bytes in a full packet.
    pub fn max_payload_len(&self) -> u32 {
        // validate() bounds mtu to MAX_MTU, which fits in u32.
        (self.mtu - HEADER_LEN) as u32
    }

    /// Data packets received before an acknowledgement goes out:
    /// `ack_every`, but never more than a quarter of `recv_window`. The
    /// acknowledgement is what refreshes the peer's credit; if it came only
    /// when the whole window had arrived, the peer would stop at every
    /// window's end and wait for it, and this side would then wait for the
    /// peer to start again (with 32-packet windows and `ack_every` 32, a
    /// stream did exactly that).
    pub fn ack_threshold(&self) -> u32 {
        self.ack_every.min(self.recv_window / 4).max(1)
    }

    /// The limits this side's parser applies to what a peer sends.
    pub fn parse_limits(&self) -> ParseLimits {
        ParseLimits {
            max_payload_len: self.max_payload_len(),
            max_message_len: self.max_message_len,
            verify_crc: self.crc,
        }
    }

    /// Checks that the values make a working engine.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(ConfigError::MtuOutOfRange { mtu: self.mtu });
        }
        // A message may not need more fragments than a u32 can count.
        let max_fragments = self
            .max_message_len
            .div_ceil(u64::from(self.max_payload_len()));
        if max_fragments > u64::from(u32::MAX) {
            return Err(ConfigError::MessageTooLongForMtu {
                max_message_len: self.max_message_len,
                mtu: self.mtu,
            });
        }
        for (name, value) in [
            ("send_window", self.send_window),
            ("recv_window", self.recv_window),
            ("max_transmissions", self.max_transmissions),
            ("ack_every", self.ack_every),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        if self.send_queue_limit == 0 {
            return Err(ConfigError::Zero {
                name: "send_queue_limit",
            });
        }
        for (name, value) in [
            ("initial_rto", self.initial_rto),
            ("min_rto", self.min_rto),
            ("heartbeat_interval", self.heartbeat_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroDuration { name });
            }
        }
        if self.min_rto > self.max_rto {
            return Err(ConfigError::Inconsistent {
                what: "min_rto is above max_rto",
            });
        }
        if self.peer_timeout <= self.heartbeat_interval {
            return Err(ConfigError::Inconsistent {
                what: "peer_timeout must exceed heartbeat_interval, or a live but idle peer is declared lost",
            });
        }
        Ok(())
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The MTU is outside [`MIN_MTU`]..=[`MAX_MTU`].
    MtuOutOfRange { mtu: usize },
    /// The largest message would need more than 2^32-1 fragments.
    MessageTooLongForMtu { max_message_len: u64, mtu: usize },
    /// A count that must be positive is zero.
    Zero { name: &'static str },
    /// A duration that must be positive is zero.
    ZeroDuration { name: &'static str },
    /// Two settings contradict each other.
    Inconsistent { what: &'static str },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::MtuOutOfRange { mtu } => write!(
                f,
                "MTU {mtu} is outside {MIN_MTU}..={MAX_MTU} bytes (the {HEADER_LEN}-byte header included)"
            ),
            ConfigError::MessageTooLongForMtu {
                max_message_len,
                mtu,
            } => write!(
                f,
                "max_message_len {max_message_len} needs more than 2^32-1 fragments at MTU {mtu}: raise the MTU or lower the limit"
            ),
            ConfigError::Zero { name } => write!(f, "{name} must be at least 1"),
            ConfigError::ZeroDuration { name } => write!(f, "{name} must be longer than zero"),
            ConfigError::Inconsistent { what } => write!(f, "inconsistent configuration: {what}"),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        EngineConfig::default().validate().unwrap();
    }

    #[test]
    fn mtu_range_is_256_bytes_to_16_mib() {
        for mtu in [256, 4096, 65536, 1 << 20, 16 << 20] {
            let config = EngineConfig {
                mtu,
                ..EngineConfig::default()
            };
            assert_eq!(config.validate(), Ok(()), "mtu {mtu}");
        }
        for mtu in [0, 80, 255, (16 << 20) + 1] {
            let config = EngineConfig {
                mtu,
                ..EngineConfig::default()
            };
            assert_eq!(config.validate(), Err(ConfigError::MtuOutOfRange { mtu }));
        }
    }

    #[test]
    fn acks_go_out_by_a_quarter_of_the_receive_window_at_the_latest() {
        let threshold = |ack_every, recv_window| {
            EngineConfig {
                ack_every,
                recv_window,
                ..EngineConfig::default()
            }
            .ack_threshold()
        };
        assert_eq!(threshold(32, 256), 32, "ack_every when the window is large");
        assert_eq!(threshold(32, 32), 8, "a quarter of a 32-packet window");
        assert_eq!(threshold(32, 2), 1, "never zero");
        assert_eq!(threshold(4, 64), 4, "a smaller ack_every stands");
    }

    #[test]
    fn bad_values_are_named() {
        let zero_window = EngineConfig {
            send_window: 0,
            ..EngineConfig::default()
        };
        assert_eq!(
            zero_window.validate(),
            Err(ConfigError::Zero {
                name: "send_window"
            })
        );
        let deaf = EngineConfig {
            peer_timeout: Duration::from_millis(50),
            ..EngineConfig::default()
        };
        assert!(matches!(
            deaf.validate(),
            Err(ConfigError::Inconsistent { .. })
        ));
        let huge = EngineConfig {
            mtu: 256,
            max_message_len: u64::MAX,
            ..EngineConfig::default()
        };
        assert!(matches!(
            huge.validate(),
            Err(ConfigError::MessageTooLongForMtu { .. })
        ));
        assert!(huge.validate().unwrap_err().to_string().contains("MTU 256"));
    }
}
