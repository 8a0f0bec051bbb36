//! Per-engine counters, in the manner of ntb_transport's per-queue debugfs
//! statistics and perftest's summary lines.

/// What one engine has seen and done since it was created. Counters only go
/// up; they survive peer restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to the medium, every kind.
    pub packets_sent: u64,
    /// Bytes handed to the medium, headers included.
    pub bytes_sent: u64,
    /// Data packets sent, retransmissions included.
    pub data_packets_sent: u64,
    /// Payload bytes sent in data packets, retransmissions included.
    pub payload_bytes_sent: u64,
    /// Packets that arrived and passed every check.
    pub packets_received: u64,
    /// Bytes that arrived, every packet counted, good or bad.
    pub bytes_received: u64,
    /// Payload bytes of data packets accepted (duplicates excluded).
    pub payload_bytes_received: u64,
    /// Messages whose every fragment the peer acknowledged.
    pub messages_sent: u64,
    /// Messages delivered whole to this side's caller.
    pub messages_delivered: u64,
    /// Retransmissions because the peer reported a corrupt packet (NAK).
    pub retransmits_nak: u64,
    /// Retransmissions because an acknowledgement never came (timeout).
    pub retransmits_timeout: u64,
    /// Retransmissions because later packets were acknowledged first (SACK).
    pub retransmits_sack: u64,
    /// Packets that arrived with a CRC that did not match.
    pub crc_failures: u64,
    /// Packets rejected for any other structural fault (see `WireError`).
    pub malformed: u64,
    /// Packets from an earlier (or retired) epoch of the peer, or addressed
    /// to another epoch of this side, dropped.
    pub stale: u64,
    /// Data packets that had already arrived, dropped.
    pub duplicates: u64,
    /// Data packets that arrived ahead of a gap and were buffered.
    pub out_of_order: u64,
    /// Data packets beyond the credit this side granted, dropped.
    pub credit_violations: u64,
    /// Times the sender had data but no credit or window to send it.
    pub credit_stalls: u64,
    /// NAKs sent.
    pub naks_sent: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// Pure acknowledgements sent.
    pub acks_sent: u64,
    /// Heartbeats sent.
    pub heartbeats_sent: u64,
    /// Times the peer restarted (came back with a new epoch).
    pub peer_restarts: u64,
}

impl Stats {
    /// All retransmissions, whatever their cause.
    pub fn retransmits(&self) -> u64 {
        self.retransmits_nak + self.retransmits_timeout + self.retransmits_sack
    }
}
