"""The other process of a test: `python peer.py MODE PEER [ARGS]`.

echo PEER      connects, sends every message back until the link ends
hold PEER      connects, then waits (to be killed)
turn PEER N    connects, sends one message of N bytes, then turns away (sleeps)
               without calling the link
swap PEER N S  connects, sends N messages of S bytes, then receives N and
               checks them (both sides send before either receives)
send PEER N    connects, sends N messages (i as 8 bytes, then i % 251 repeated
               to the size), then closes in order
sink PEER N S W  connects, waits without calling the link (W: seconds, or
               "stdin": until a line comes on stdin), then receives N
               messages of S bytes into buffers made beforehand, checks
               them against payload(i, S) and answers b"ok" (or which
               were wrong)
"""

import sys
import time

import barlink


def payload(i: int, size: int) -> bytes:
    head = i.to_bytes(8, "little")
    return (head + bytes([i % 251]) * max(0, size - 8))[: max(size, 8)]


def main() -> int:
    mode, peer = sys.argv[1], sys.argv[2]
    # Long enough that a loaded CI machine's stalls never look like loss;
    # the test of a killed peer sets its own, short one on its side.
    options = {"peer_timeout": 10.0}
    link = barlink.connect(peer, "connect", 10.0, **options)
    started = time.monotonic()
    if mode == "echo":
        try:
            while True:
                # Zero-copy both ways: the message's memory goes back out.
                link.send(link.recv(timeout=30, copy=False))
        except barlink.LinkClosed:
            return 0
    if mode == "relay":
        # Every message from this link goes on over a second one: with the
        # test at both ends, a ring of two links.
        onward = barlink.connect(sys.argv[3], "connect", 10.0, **options)
        try:
            while True:
                onward.send(link.recv(timeout=30, copy=False))
        except barlink.LinkClosed:
            return 0
    if mode == "hold":
        print("linked", flush=True)
        time.sleep(60)
        return 0
    if mode == "turn":
        link.send(payload(7, int(sys.argv[3])))
        time.sleep(30)
        return 0
    if mode == "swap":
        count, size = int(sys.argv[3]), int(sys.argv[4])
        for i in range(count):
            link.send(payload(i, size))
        for i in range(count):
            got = link.recv(timeout=30)
            if got != payload(1000 + i, size):
                print(f"message {i}: {len(got)} bytes, starting {got[:16].hex()}", file=sys.stderr)
                return 1
        link.close(timeout=10)
        return 0
    if mode == "send":
        count, size = int(sys.argv[3]), int(sys.argv[4])
        for i in range(count):
            link.send(payload(i, size))
        link.close(timeout=10)
        return 0
    if mode == "sink":
        count, size, wait = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        # Landed in place in memory made ready beforehand, back to back, so
        # that the sender's waits for acknowledgements end soon; checked
        # once all are here.
        landed = [bytearray(size) for _ in range(count)]
        if wait == "stdin":
            sys.stdin.readline()
        else:
            time.sleep(max(0.0, float(wait) - (time.monotonic() - started)))
        for buf in landed:
            link.recv_into(buf, timeout=30)
        wrong = [i for i, buf in enumerate(landed) if buf != payload(i, size)]
        link.send(b"ok" if not wrong else f"wrong: {wrong}".encode())
        link.flush(timeout=30)
        try:
            link.recv(timeout=30)
        except barlink.LinkClosed:
            pass
        return 0
    print(f"unknown mode {mode}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
