"""python -m barlink.bench: barlink from Python between two processes, with
its yardsticks measured in the same run:

- ``python``: two Python processes over ``barlink.connect("local:...")``:
  ``send`` of a bytes object (read in place), or with ``--send writable``
  of a bytearray (as a numpy array or a tensor is: lent for the call, or
  copied), and ``recv(copy=False)``;
- ``cli-barlink``: ``barlink bench --paths barlink`` (the Rust link between
  two processes), the same sizes;
- ``shm-pipe``: plain Python: ``multiprocessing.shared_memory`` slots and a
  pipe (one copy in, one copy out, no checksum).

Rounds alternate the three (python and shm-pipe for every size, then the
CLI), so all of them see the same drift of a shared machine; ratios are
taken round by round and their medians reported. Bandwidth: a warm-up
window, then a timed window of messages ended by the receiver's one-byte
"got them all" (as the CLI does); latency: one message there and the same
size back, halved, the median of the round trips.
"""

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Dict, List, Optional

import barlink
from barlink._units import parse_size

SLOTS = 4
HEADER = struct.Struct("<II")
def human(size: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def arguments(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m barlink.bench",
        description="barlink from Python between two processes, beside the CLI's "
        "barlink row and a plain-Python baseline, measured in the same run.",
    )
    parser.add_argument("--sizes", help="message sizes, e.g. 64,4K,64K,1M,16M (the default)")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 5; quick 3)")
    parser.add_argument(
        "--bytes-per-window", type=parse_size, help="payload bytes per window (64M; quick 8M)"
    )
    parser.add_argument("--lat-iters", type=int, help="round trips per latency sample (2000)")
    parser.add_argument("--quick", action="store_true", help="a run of under 30 seconds")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--barlink", help="the barlink command (default: found)")
    parser.add_argument("--no-cli", action="store_true", help="leave the CLI row out")
    parser.add_argument(
        "--send", choices=("bytes", "writable"), default="bytes",
        help="what the python row sends: bytes (read-only, held in place until "
        "acknowledged; the default) or writable (a bytearray, as a numpy array "
        "or tensor is: the caller's again when send returns)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    listed = args.sizes or ("64,64K,1M" if args.quick else "64,4K,64K,1M,16M")
    try:
        args.sizes = [parse_size(s) for s in listed.split(",")]
    except ValueError as error:
        parser.error(f"--sizes: {error}")
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.bytes_per_window = args.bytes_per_window or ((8 << 20) if args.quick else (64 << 20))
    args.lat_iters = args.lat_iters or (500 if args.quick else 2000)
    if args.rounds < 1 or args.lat_iters < 1:
        parser.error("--rounds and --lat-iters must be at least 1")
    return args


def messages_per_window(args: argparse.Namespace, size: int) -> int:
    return max(16, min(20_000, args.bytes_per_window // size))


def lat_iters(args: argparse.Namespace, size: int) -> int:
    return max(8, min(args.lat_iters, (256 << 20) // size))


def read_exact(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise ConnectionError("the other bench process went away")
        data += chunk
    return data


class ShmPipe:
    """Plain Python: SLOTS shared-memory slots, headers and credits over pipes."""

    def __init__(self, shm: shared_memory.SharedMemory, data_fd: int, back_fd: int, slot: int):
        self.shm, self.buf = shm, shm.buf
        self.data_fd, self.back_fd, self.slot = data_fd, back_fd, slot

    def send_window(self, message: bytes, count: int) -> None:
        size, outstanding = len(message), 0
        for i in range(count):
            if outstanding == SLOTS:
                read_exact(self.back_fd, 1)
                outstanding -= 1
            offset = (i % SLOTS) * self.slot
            self.buf[offset : offset + size] = message
            os.write(self.data_fd, HEADER.pack(i % SLOTS, size))
            outstanding += 1
        read_exact(self.back_fd, outstanding)

    def recv_window(self, out: bytearray, count: int) -> None:
        for _ in range(count):
            slot, size = HEADER.unpack(read_exact(self.data_fd, HEADER.size))
            offset = slot * self.slot
            out[:size] = self.buf[offset : offset + size]
            os.write(self.back_fd, b"c")

    def ping(self, message: bytes, out: bytearray) -> None:
        size = len(message)
        self.buf[:size] = message
        os.write(self.data_fd, HEADER.pack(0, size))
        _, size = HEADER.unpack(read_exact(self.back_fd, HEADER.size))
        out[:size] = self.buf[self.slot : self.slot + size]

    def pong(self, out: bytearray) -> None:
        _, size = HEADER.unpack(read_exact(self.data_fd, HEADER.size))
        out[:size] = self.buf[:size]
        self.buf[self.slot : self.slot + size] = out[:size]
        os.write(self.back_fd, HEADER.pack(1, size))


def attach(shm_name: str) -> shared_memory.SharedMemory:
    """The parent's shared memory, which the parent alone unlinks (before
    Python 3.13 an attaching process's resource tracker unlinks it too)."""
    try:
        return shared_memory.SharedMemory(name=shm_name, track=False)
    except TypeError:
        from multiprocessing import resource_tracker

        shm = shared_memory.SharedMemory(name=shm_name)
        resource_tracker.unregister(shm._name, "shared_memory")
        return shm


def child(args: argparse.Namespace) -> int:
    """The receiving process: follows the parent's schedule."""
    name, shm_name, fds, control = args.child
    data_fd, back_fd = map(int, fds.split(","))
    control_fd = int(control)
    link = barlink.connect(f"local:{name}", "connect", 30.0, peer_timeout=120.0)
    shm = attach(shm_name)
    pipe = ShmPipe(shm, data_fd, back_fd, max(args.sizes))
    out = bytearray(max(args.sizes))
    try:
        # A byte per round from the parent; the CLI runs while this waits.
        while read_exact(control_fd, 1) == b"g":
            for size in args.sizes:
                for _ in range(2):  # a warm-up window, then the timed one
                    for _ in range(messages_per_window(args, size)):
                        link.recv(timeout=60, copy=False)
                    link.send(b"d")
                    pipe.recv_window(out, messages_per_window(args, size))
                for _ in range(lat_iters(args, size)):
                    link.send(link.recv(timeout=60, copy=False))
                for _ in range(lat_iters(args, size)):
                    pipe.pong(out)
    finally:
        del pipe
        shm.close()
        link.close(timeout=5)
    return 0


def cli_rows(args: argparse.Namespace, command: str) -> Dict[int, dict]:
    """One run of `barlink bench --paths barlink` over the sizes."""
    run = subprocess.run(
        [
            command, "bench", "--paths", "barlink", "--json", "--windows", "1",
            "--sizes", ",".join(map(str, args.sizes)),
            "--bytes-per-window", str(args.bytes_per_window),
        ],
        capture_output=True, text=True, timeout=600,
    )
    if run.returncode != 0:
        raise RuntimeError(f"{command} bench failed ({run.returncode}): {run.stderr.strip()}")
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {row["size_bytes"]: row for row in rows if row.get("path") == "barlink"}


def find_cli(args: argparse.Namespace) -> Optional[str]:
    if args.no_cli:
        return None
    if args.barlink:
        return args.barlink
    if os.environ.get("BARLINK_BIN"):
        return os.environ["BARLINK_BIN"]
    built = Path(__file__).resolve().parents[2] / "target" / "release" / "barlink"
    if built.is_file():
        return str(built)
    return shutil.which("barlink")


def parent(args: argparse.Namespace) -> int:
    cli = find_cli(args)
    name = f"pybench-{os.getpid()}"
    largest = max(args.sizes)
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * largest)
    data_r, data_w = os.pipe()
    back_r, back_w = os.pipe()
    control_r, control_w = os.pipe()
    peer = subprocess.Popen(
        [
            sys.executable, "-m", "barlink.bench", "--child", name, shm.name,
            f"{data_r},{back_w}", str(control_r),
            "--sizes", ",".join(map(str, args.sizes)),
            "--bytes-per-window", str(args.bytes_per_window),
            "--lat-iters", str(args.lat_iters), "--rounds", str(args.rounds),
        ],
        pass_fds=(data_r, back_w, control_r),
    )
    for fd in (data_r, back_w, control_r):
        os.close(fd)
    link = barlink.connect(f"local:{name}", "accept", 30.0, peer_timeout=120.0)
    pipe = ShmPipe(shm, data_w, back_r, largest)
    samples: Dict[str, Dict[int, List[float]]] = {
        key: {size: [] for size in args.sizes}
        for key in ("python", "shm-pipe", "cli-barlink", "python-lat", "shm-pipe-lat", "cli-lat")
    }
    out = bytearray(largest)
    cli_note = None
    if not cli:
        cli_note = "left out (--no-cli)" if args.no_cli else "no barlink command (cargo build --release, or --barlink PATH)"
    try:
        for round_ in range(args.rounds):
            os.write(control_w, b"g")
            for size in args.sizes:
                plain = bytes([round_ % 251]) * size
                message = bytearray(plain) if args.send == "writable" else plain
                count = messages_per_window(args, size)
                for timed in (False, True):  # a warm-up window, as the CLI has
                    started = time.perf_counter()
                    for _ in range(count):
                        link.send(message)
                    link.recv(timeout=60)
                    python = count * size / (time.perf_counter() - started) / 1e9
                    started = time.perf_counter()
                    pipe.send_window(plain, count)
                    shm_pipe = count * size / (time.perf_counter() - started) / 1e9
                samples["python"][size].append(python)
                samples["shm-pipe"][size].append(shm_pipe)
                one_way = []
                for _ in range(lat_iters(args, size)):
                    started = time.perf_counter()
                    link.send(message)
                    link.recv(timeout=60, copy=False)
                    one_way.append((time.perf_counter() - started) / 2 * 1e6)
                samples["python-lat"][size].append(statistics.median(one_way))
                one_way = []
                for _ in range(lat_iters(args, size)):
                    started = time.perf_counter()
                    pipe.ping(plain, out)
                    one_way.append((time.perf_counter() - started) / 2 * 1e6)
                samples["shm-pipe-lat"][size].append(statistics.median(one_way))
            if cli:
                try:
                    rows = cli_rows(args, cli)
                except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
                    cli, cli_note = None, f"the CLI run failed: {error}"
                    continue
                for size in args.sizes:
                    if size in rows:
                        samples["cli-barlink"][size].append(rows[size]["gbps"])
                        samples["cli-lat"][size].append(rows[size]["lat_p50_us"])
        os.write(control_w, b"q")
        stats = link.stats()
        # Both sides close at once: each drives its own link.
        link.close(timeout=10)
    finally:
        os.close(control_w)
        peer.wait(timeout=30)
        del pipe
        shm.close()
        shm.unlink()
        link.close(timeout=5)
    report(args, samples, cli_note, stats)
    return 0 if peer.returncode == 0 else 1


def pairwise(top: List[float], bottom: List[float]) -> Optional[float]:
    ratios = [a / b for a, b in zip(top, bottom) if b > 0]
    return statistics.median(ratios) if ratios else None


def report(args, samples, cli_note: Optional[str], stats) -> None:
    cpu = barlink.cpu()
    build = barlink._warn_unless_release("barlink.bench")
    medians = {
        key: {size: (statistics.median(v) if v else None) for size, v in per_size.items()}
        for key, per_size in samples.items()
    }
    if args.json:
        for size in args.sizes:
            for path, lat in (("python", "python-lat"), ("cli-barlink", "cli-lat"), ("shm-pipe", "shm-pipe-lat")):
                if medians[path][size] is None:
                    continue
                print(json.dumps({
                    "path": path, "size_bytes": size,
                    "gbps": round(medians[path][size], 3),
                    "gbps_min": round(min(samples[path][size]), 3),
                    "gbps_max": round(max(samples[path][size]), 3),
                    "lat_p50_us": round(medians[lat][size], 3),
                    "vs_cli_barlink": _round(pairwise(samples[path][size], samples["cli-barlink"][size])),
                    "rounds": len(samples[path][size]),
                    "send": args.send if path == "python" else None,
                    "cpu": cpu["model"], "cpu_features": cpu["features"],
                    "copy_crc_kernel": cpu["copy_crc_kernel"], "copy_kernel": cpu["copy_kernel"],
                    "cpu_isa_limit": cpu["isa_limit"], "build": build,
                }))
        return
    print(f"# python -m barlink.bench: barlink {barlink.__version__}, Python {sys.version.split()[0]}")
    limit = f" (kernels limited to {cpu['isa_limit']} by BARLINK_CPU_ISA)" if cpu["isa_limit"] else ""
    print(f"# cpu: {cpu['model']} ({', '.join(cpu['features'])}){limit}; copy+crc: {cpu['copy_crc_kernel']}; copy: {cpu['copy_kernel']}; build: {build}")
    sent = "bytes" if args.send == "bytes" else "bytearray"
    print(f"# {args.rounds} rounds, medians; ratios taken round by round. python: send({sent}) + recv(copy=False)")
    if cli_note:
        print(f"# cli-barlink: not measured: {cli_note}")
    header = f"{'size':>6} {'python GB/s':>12} {'cli GB/s':>9} {'py/cli':>7} {'shm-pipe':>9} {'py/shm':>7} {'py lat us':>10} {'cli lat':>8} {'shm lat':>8}"
    print(header)
    for size in args.sizes:
        def cell(value, width, digits=3):
            return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"
        print(
            f"{human(size):>6} {cell(medians['python'][size], 12)} {cell(medians['cli-barlink'][size], 9)} "
            f"{cell(pairwise(samples['python'][size], samples['cli-barlink'][size]), 7, 2)} "
            f"{cell(medians['shm-pipe'][size], 9)} "
            f"{cell(pairwise(samples['python'][size], samples['shm-pipe'][size]), 7, 2)} "
            f"{cell(medians['python-lat'][size], 10, 2)} {cell(medians['cli-lat'][size], 8, 2)} "
            f"{cell(medians['shm-pipe-lat'][size], 8, 2)}"
        )
    if stats:
        print(
            f"# python link: retransmits {stats['retransmits_nak'] + stats['retransmits_timeout'] + stats['retransmits_sack']}, "
            f"crc failures {stats['crc_failures']}; sends lent {stats.get('messages_lent', 0)}, copied {stats.get('messages_copied', 0)}"
        )


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def main(argv: Optional[List[str]] = None) -> int:
    args = arguments(argv)
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
