#!/usr/bin/env python3
"""Writes the committed seed corpus: valid packets of every kind (for
wire_parse) and short scripts that connect, exchange data and misbehave (for
engine_packets). Run from fuzz/; deterministic."""
import os
import struct

def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def packet(kind, epoch=2, peer_epoch=1, seq=0, ack=0, sack=0, msg_id=0, msg_len=0,
           index=0, count=0, xmit=1, credit=8, payload=b"", flags=0):
    header = struct.pack("<4sBBHIIQQQQQIIIIII", b"BLNK", 1, kind, flags, epoch, peer_epoch,
                         seq, ack, sack, msg_id, msg_len, index, count, xmit, credit,
                         len(payload), 0)
    assert len(header) == 80
    crc = crc32c(header[:76] + payload)
    return header[:76] + struct.pack("<I", crc) + payload

def write(target, name, data):
    os.makedirs(f"corpus/{target}", exist_ok=True)
    with open(f"corpus/{target}/seed-{name}", "wb") as f:
        f.write(data)

seeds = {
    "data-single": packet(1, seq=0, msg_len=5, count=1, payload=b"hello"),
    "data-first-of-two": packet(1, seq=0, msg_len=7, count=2, payload=b"abcd"),
    "data-last-of-two": packet(1, seq=1, msg_len=7, index=1, count=2, payload=b"efg"),
    "ack": packet(2, ack=3, sack=0b101),
    "nak": packet(3, seq=17),
    "heartbeat": packet(4),
    "hello": packet(4, peer_epoch=0),
    "close": packet(5),
}
for name, data in seeds.items():
    write("wire_parse", name, b"\x00" + data)
    write("wire_parse", name + "-nocrc-selector", b"\x04" + data)

# engine_packets scripts: op 0 builds a packet from the bytes that follow
# (see the target); op 5 lets time pass; op 6 sends; op 7 takes events.
def op_packet(kind, epoch_sel=2, addressed=1, seq=0, ack=0, msg_id=0, msg_len=0,
              index=0, count=0, credit=8, payload_units=0):
    small = lambda v: bytes([0, v])  # "small" form: value % 8
    return (bytes([0, payload_units, kind - 1, 0, epoch_sel, addressed])
            + small(seq) + small(ack) + struct.pack("<Q", 0) + small(msg_id)
            + small(msg_len) + bytes([0]) + small(index) + small(count)
            + struct.pack("<I", 7) + small(credit) + bytes([1]))

hello = op_packet(4)
write("engine_packets", "hello-then-data",
      hello + op_packet(1, count=1, msg_len=0) + bytes([7]))
write("engine_packets", "send-and-ack",
      hello + bytes([6, 0, 3]) + op_packet(2, ack=1) + bytes([7, 5, 0, 4]))
write("engine_packets", "restart-mid-message",
      hello + op_packet(1, count=2, msg_len=1) + op_packet(4, epoch_sel=1) + bytes([7]))
write("engine_packets", "silence", hello + bytes([5, 255] + [0] * 8) * 4)

# tcp_records scripts: op 0 seals the plaintext that follows (two-byte
# length first); op 1 seals frames of packets (a count, then each packet
# with its two-byte length); op 2 flips a bit; op 3 replays a record; op 4
# drops the last one; op 5 appends the attacker's own bytes.
def sealed_frames(*packets):
    return bytes([1, len(packets)]) + b"".join(
        struct.pack("<H", len(p)) + p for p in packets)

hello_packet = packet(4, peer_epoch=0)
data_packet = packet(1, seq=0, msg_len=5, count=1, payload=b"hello")
write("tcp_records", "two-records",
      sealed_frames(hello_packet) + sealed_frames(data_packet))
write("tcp_records", "flipped", sealed_frames(hello_packet, data_packet) + bytes([2, 40, 0]))
write("tcp_records", "replayed", sealed_frames(hello_packet) + bytes([3, 0, 0]))
write("tcp_records", "plaintext-then-garbage",
      bytes([0, 5, 0]) + b"abcde" + bytes([5, 4, 0]) + b"\x10\x00xy")
