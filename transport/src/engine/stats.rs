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
    /// Of those, messages that landed in a target the caller posted (no
    /// copy out of the engine's buffers).
    pub messages_landed: u64,
    /// Of those, messages folded into a combining target as they arrived
    /// (`RecvTarget::combines`).
    pub messages_combined: u64,
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
    /// Every counter with its name, in declaration order: for faces that
    /// report them as a table or a dictionary (Python's `Link.stats()`).
    pub fn fields(&self) -> [(&'static str, u64); 26] {
        [
            ("packets_sent", self.packets_sent),
            ("bytes_sent", self.bytes_sent),
            ("data_packets_sent", self.data_packets_sent),
            ("payload_bytes_sent", self.payload_bytes_sent),
            ("packets_received", self.packets_received),
            ("bytes_received", self.bytes_received),
            ("payload_bytes_received", self.payload_bytes_received),
            ("messages_sent", self.messages_sent),
            ("messages_delivered", self.messages_delivered),
            ("messages_landed", self.messages_landed),
            ("messages_combined", self.messages_combined),
            ("retransmits_nak", self.retransmits_nak),
            ("retransmits_timeout", self.retransmits_timeout),
            ("retransmits_sack", self.retransmits_sack),
            ("crc_failures", self.crc_failures),
            ("malformed", self.malformed),
            ("stale", self.stale),
            ("duplicates", self.duplicates),
            ("out_of_order", self.out_of_order),
            ("credit_violations", self.credit_violations),
            ("credit_stalls", self.credit_stalls),
            ("naks_sent", self.naks_sent),
            ("naks_received", self.naks_received),
            ("acks_sent", self.acks_sent),
            ("heartbeats_sent", self.heartbeats_sent),
            ("peer_restarts", self.peer_restarts),
        ]
    }

    /// All retransmissions, whatever their cause.
    pub fn retransmits(&self) -> u64 {
        self.retransmits_nak + self.retransmits_timeout + self.retransmits_sack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_name_every_counter_once() {
        let stats = Stats::default();
        let debug = format!("{stats:?}");
        let fields = stats.fields();
        assert_eq!(debug.matches(": 0").count(), fields.len());
        for (name, _) in fields {
            assert!(debug.contains(&format!("{name}: 0")), "{name}");
        }
    }
}
