"""Collectives measured in the manner of nccl-tests, barlink beside gloo.

    python -m barlink.torch.bench                  # 2 ranks, 4 KiB .. 256 MiB
    python -m barlink.torch.bench --ranks 2,4 --ops all_reduce,broadcast
    python -m barlink.torch.bench --quick --json

Starts the ranks itself (processes on this host). In every rank both
groups exist side by side, barlink and gloo, and each size is measured on
both in turn, window after window, so the ratio compares the same moment
of a noisy machine; each window starts with untimed operations
(--window-warmup), so that it times the backend, not the machine coming
back to speed after the other's window. A row per operation, size and
backend: the time of one operation (the slowest rank's, median of the
windows), algorithm and bus bandwidth as nccl-tests defines them, and
#wrong, the elements that differ from the result computed locally on
fresh inputs after the timed windows.
The exit status is 1 if any element was wrong.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

from barlink._units import parse_size

# One backend's windows differing by more than this say the machine's
# load changed during the run (as `barlink bench` warns).
UNSTEADY_SPREAD = 1.5

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8")
REDOPS = ("sum", "avg", "min", "max", "product")


def sizes(low: int, high: int, factor: int):
    size = low
    while size <= high:
        yield size
        size *= factor


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw/algbw for each operation."""
    return {
        "all_reduce": 2 * (n - 1) / n,
        "broadcast": 1.0,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "send_recv": 1.0,
    }[op]


def cpu_line() -> str:
    """The CPU as every barlink benchmark names it (model with family,
    model and stepping; vector features; the kernels chosen)."""
    from barlink import cpu

    info = cpu()
    features = ", ".join(info["features"]) or "no vector features"
    return (
        f"{info['model']} ({os.cpu_count()} CPUs; {features}; "
        f"copy+crc {info['copy_crc_kernel']})"
    )


class Case:
    """One operation at one size: its tensors, the call, and the check."""

    def __init__(self, torch, dist, op, size, dtype, redop, rank, n, device):
        self.torch, self.dist, self.op, self.rank, self.n = torch, dist, op, rank, n
        self.device = device
        self.dtype = getattr(torch, dtype)
        self.redop = redop
        element = torch.empty(0, dtype=self.dtype).element_size()
        # size is what nccl-tests calls it: the bytes of the (largest) buffer.
        self.count = max(1, size // element)
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            self.count = max(n, self.count // n * n)
        self.bytes = self.count * element

    def inputs(self, seed: int):
        """Fresh inputs whose results are exact in every dtype."""
        torch = self.torch
        base = torch.arange(self.count, dtype=torch.int64) % 5
        return (base + (self.rank + seed) % 3).to(self.dtype).to(self.device)

    def zeros(self):
        return self.torch.zeros(self.count, dtype=self.dtype, device=self.device)

    def sync(self):
        """Waits for what the calls queued on the device, so a window
        times the work and not its queueing."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def run(self, group, tensor, out):
        dist, op = self.dist, self.op
        if op == "all_reduce":
            dist.all_reduce(tensor, op=self._redop(), group=group)
        elif op == "broadcast":
            dist.broadcast(tensor, src=0, group=group)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, tensor[: self.count // self.n], group=group)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(out[: self.count // self.n], tensor, op=self._redop(), group=group)
        elif op == "all_to_all":
            dist.all_to_all_single(out, tensor, group=group)
        elif op == "send_recv":
            if self.rank == 0:
                dist.send(tensor, 1, group=group)
            elif self.rank == 1:
                dist.recv(out, 0, group=group)

    def _redop(self):
        return {
            "sum": self.dist.ReduceOp.SUM,
            "avg": self.dist.ReduceOp.AVG,
            "min": self.dist.ReduceOp.MIN,
            "max": self.dist.ReduceOp.MAX,
            "product": self.dist.ReduceOp.PRODUCT,
        }[self.redop]

    def expected(self, seed: int):
        """What this rank should hold after `run` on `inputs(seed)`."""
        torch, n = self.torch, self.n
        everyone = [self._input_of(r, seed) for r in range(n)]
        if self.op in ("all_reduce", "reduce_scatter"):
            wide = [t.to(torch.float64) for t in everyone]
            combined = {
                "sum": lambda: sum(wide),
                "avg": lambda: sum(wide) / n,
                "min": lambda: torch.stack(wide).min(0).values,
                "max": lambda: torch.stack(wide).max(0).values,
                "product": lambda: torch.stack(wide).prod(0),
            }[self.redop]()
            if self.redop == "avg" and not self.dtype.is_floating_point:
                combined = torch.trunc(combined)
            combined = combined.to(self.dtype)
            if self.op == "reduce_scatter":
                part = self.count // n
                return combined[self.rank * part : (self.rank + 1) * part]
            return combined
        if self.op == "broadcast":
            return everyone[0]
        if self.op == "all_gather":
            part = self.count // n
            return torch.cat([t[:part] for t in everyone])
        if self.op == "all_to_all":
            part = self.count // n
            return torch.cat([t[self.rank * part : (self.rank + 1) * part] for t in everyone])
        if self.op == "send_recv":
            return everyone[0] if self.rank == 1 else None
        raise ValueError(self.op)

    def _input_of(self, rank: int, seed: int):
        torch = self.torch
        base = torch.arange(self.count, dtype=torch.int64) % 5
        return (base + (rank + seed) % 3).to(self.dtype)

    def wrong(self, group, seed: int) -> int:
        tensor = self.inputs(seed)
        out = self.zeros()
        self.run(group, tensor, out)
        tensor, out = tensor.cpu(), out.cpu()
        want = self.expected(seed)
        if want is None:
            return 0
        if self.op in ("all_reduce", "broadcast"):
            got = tensor
        elif self.op == "reduce_scatter":
            got = out[: self.count // self.n]
        else:
            got = out
        return int((got != want).sum())


# What torch documents gloo to take on CUDA tensors.
GLOO_CUDA_OPS = ("all_reduce", "broadcast")


def measure(torch, dist, groups, case, args, gloo):
    """Each window's time of one operation per backend (the slowest
    rank's), #wrong, and the operations a window ran."""
    tensor = case.inputs(0)
    out = case.zeros()
    if case.op in ("all_reduce",) and case.redop == "product":
        tensor.fill_(1)
    groups = dict(groups)
    refused = {}
    for name, group in groups.items():
        if name == "gloo" and case.device.type == "cuda" and case.op not in GLOO_CUDA_OPS:
            # Not tried: torch 2.11's gloo sends a CUDA tensor's device
            # address to writev and the process dies on the fault.
            refused[name] = "gloo takes CUDA tensors for all_reduce and broadcast only"
            continue
        try:
            for _ in range(args.warmup):
                case.run(group, tensor, out)
        except RuntimeError as error:
            # gloo takes CUDA tensors for some operations only, and refuses
            # the others before anything moves.
            if name == "barlink" or case.device.type == "cpu":
                raise
            refused[name] = str(error).splitlines()[0]
    for name in [name for name in groups if name != "barlink"]:
        # Every rank drops it if any refused (a send_recv's idle ranks
        # never call it), or the windows' barriers would not pair up.
        flag = torch.tensor([int(name in refused)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=gloo)
        if flag.item():
            del groups[name]
            if case.rank == 0:
                why = refused.get(name, "refused on another rank")
                print(f"# {name} cannot {case.op} on {case.device.type} tensors: {why}",
                      file=sys.stderr, flush=True)
    times = {name: [] for name in groups}
    case.sync()
    # One operation's time on each backend, for the count of a window and
    # of its warm-up. Every rank must run as many: rank 0's counts stand.
    once = {}
    for name, group in groups.items():
        started = time.perf_counter()
        case.run(group, tensor, out)
        case.sync()
        once[name] = max(time.perf_counter() - started, 1e-6)
    iters = args.iters or max(1, min(50, int(args.window / once["barlink"])))
    counts = [iters] + [window_warmup_count(args.window_warmup, once[name]) for name in groups]
    agreed = torch.tensor(counts)
    dist.broadcast(agreed, src=0, group=gloo)
    iters, *warm = (int(c) for c in agreed.tolist())
    warm = dict(zip(groups, warm))
    for _ in range(args.windows):
        for name, group in groups.items():
            dist.barrier(group=gloo)
            # Untimed: the machine comes back to speed after the other
            # backend's window (whose waits left its cores idle) on these
            # calls, not on the timed ones.
            for _ in range(warm[name]):
                case.run(group, tensor, out)
            case.sync()
            started = time.perf_counter()
            for _ in range(iters):
                case.run(group, tensor, out)
            case.sync()
            elapsed = torch.tensor([(time.perf_counter() - started) / iters])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
            times[name].append(elapsed.item())
    wrong = {}
    for seed, (name, group) in enumerate(groups.items(), start=1):
        count = torch.tensor([case.wrong(group, seed)], dtype=torch.int64)
        dist.all_reduce(count, group=gloo)
        wrong[name] = int(count.item())
    return times, wrong, iters


def window_warmup_count(seconds: float, once: float) -> int:
    """Untimed operations that start a window: about `seconds` of them, at
    least one, at most 10,000; none for 0."""
    if seconds <= 0:
        return 0
    return max(1, min(10_000, round(seconds / once)))


def rank_main(rank: int, n: int, port: int, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import barlink.torch  # noqa: F401  (registers the backend)

    build = barlink.cpu().get("build", "unknown")
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        # Ranks share the GPUs there are; the context exists before any link.
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    gloo = dist.group.WORLD
    groups = {"barlink": dist.new_group(backend="barlink")}
    if not args.no_gloo:
        groups["gloo"] = dist.new_group(backend="gloo")
    wrong_total = 0
    # The widest spread of one backend's windows: (max/min, row), to warn
    # about below.
    widest = (1.0, None)
    for op in args.ops:
        if op == "send_recv" and n < 2:
            continue
        for size in sizes(args.min_bytes, args.max_bytes, args.factor):
            case = Case(torch, dist, op, size, args.dtype, args.redop, rank, n, device)
            times, wrong, iters = measure(torch, dist, groups, case, args, gloo)
            medians = {name: statistics.median(t) for name, t in times.items()}
            for name, seconds in medians.items():
                algbw = case.bytes / seconds / 1e9
                row = {
                    "op": op,
                    "backend": name,
                    "ranks": n,
                    "size_bytes": case.bytes,
                    "count": case.count,
                    "type": args.dtype,
                    "redop": args.redop if op in ("all_reduce", "reduce_scatter") else "none",
                    "time_us": seconds * 1e6,
                    "time_min_us": min(times[name]) * 1e6,
                    "time_max_us": max(times[name]) * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * bus_factor(op, n),
                    "wrong": wrong[name],
                    "iters": iters,
                    "windows": args.windows,
                    "window_warmup_s": args.window_warmup,
                    "device": args.device,
                    "build": build,
                }
                if name == "barlink" and "gloo" in medians:
                    row["speedup_vs_gloo"] = medians["gloo"] / seconds
                wrong_total += row["wrong"]
                if rank == 0:
                    print_row(row, args.json)
                spread = row["time_max_us"] / row["time_min_us"]
                if spread > widest[0]:
                    widest = (spread, row)
    dist.destroy_process_group()
    spread, row = widest
    if rank == 0 and spread > UNSTEADY_SPREAD and not args.json:
        print(f"# note: the machine's load changed during this run: {row['backend']}'s {row['op']} of "
              f"{row['size_bytes']} B took {row['time_min_us']:.1f}-{row['time_max_us']:.1f} us in "
              f"different windows; the backends take turns, so each ratio saw the same load, but one "
              f"run is not a figure here: run it again (time_min_us/time_max_us in --json)", flush=True)
    if wrong_total:
        print(f"barlink.torch.bench: {wrong_total} wrong element(s)", file=sys.stderr)
        sys.exit(1)


def print_row(row, as_json: bool):
    if as_json:
        print(json.dumps(row), flush=True)
        return
    speedup = row.get("speedup_vs_gloo")
    print(
        f"{row['op']:>14} {row['ranks']:>5} {row['size_bytes']:>12} {row['count']:>11} "
        f"{row['type']:>8} {row['redop']:>7} {row['backend']:>8} {row['time_us']:>11.1f} "
        f"{row['algbw_gbps']:>8.2f} {row['busbw_gbps']:>8.2f} {row['wrong']:>6} "
        f"{'' if speedup is None else f'{speedup:.2f}x':>8}",
        flush=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barlink.torch.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--ranks", default="2", help="comma-separated rank counts (default 2)")
    parser.add_argument("-b", "--min-bytes", default="4K", type=parse_size)
    parser.add_argument("-e", "--max-bytes", default="256M", type=parse_size)
    parser.add_argument("-f", "--factor", default=4, type=int, help="size step (default 4)")
    parser.add_argument("-d", "--dtype", default="float32", choices=DTYPES)
    parser.add_argument("-o", "--redop", default="sum", choices=REDOPS)
    parser.add_argument("-w", "--warmup", default=2, type=int)
    parser.add_argument("-n", "--iters", default=0, type=int,
                        help="operations per window (default: as many as fill --window)")
    parser.add_argument("--window", default=0.1, type=float, help="seconds per window (default 0.1)")
    parser.add_argument("--windows", default=5, type=int, help="windows per backend (default 5)")
    parser.add_argument("--window-warmup", default=0.03, type=float,
                        help="seconds of untimed operations that start every window, at least "
                             "one (default 0.03; 0: none): the machine's cores come back to "
                             "speed after the other backend's window on these")
    parser.add_argument("--no-gloo", action="store_true", help="measure barlink alone")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the tensors live (cuda: ranks share the GPUs there are, "
                             "and gloo takes CUDA tensors too)")
    parser.add_argument("--quick", action="store_true",
                        help="4 KiB, 1 MiB and 16 MiB, 3 windows: a run of seconds")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    for op in args.ops:
        if op not in OPS:
            parser.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        parser.error(f"--ranks: {args.ranks!r} is not a comma-separated list of numbers")
    if any(r < 1 for r in ranks):
        parser.error("--ranks: every count must be at least 1")
    if args.window_warmup < 0:
        parser.error("--window-warmup: seconds, 0 or more")
    if args.min_bytes < 1 or args.max_bytes < args.min_bytes or args.factor < 2:
        parser.error("sizes: need 1 <= --min-bytes <= --max-bytes and --factor >= 2")
    if args.quick:
        args.min_bytes, args.max_bytes, args.factor = 4 << 10, 16 << 20, 16
        args.windows, args.warmup, args.window = 3, 1, 0.05

    import multiprocessing

    import torch

    import barlink

    if args.device == "cuda" and not torch.cuda.is_available():
        print("barlink.torch.bench: --device cuda, but torch sees no CUDA device "
              "(torch.cuda.is_available() is False)", file=sys.stderr)
        return 3
    context = multiprocessing.get_context("spawn")
    kernels = barlink.cpu()
    header = {
        "cpu": cpu_line(),
        "copy_crc_kernel": kernels.get("copy_crc_kernel"),
        "torch": torch.__version__,
        "barlink": barlink.__version__,
        "device": args.device,
        "build": barlink._warn_unless_release("barlink.torch.bench"),
    }
    if args.device == "cuda":
        header["gpu"] = torch.cuda.get_device_name(0)
    if args.json:
        print(json.dumps({"header": header}), flush=True)
    else:
        on = f"; tensors on {header['gpu']} (through host memory)" if args.device == "cuda" else ""
        print(f"# barlink.torch.bench: {header['cpu']}; torch {header['torch']}; "
              f"copy+CRC kernel {header['copy_crc_kernel']}; barlink build {header['build']}{on}")
        print(f"# {'op':>12} {'ranks':>5} {'size(B)':>12} {'count':>11} {'type':>8} {'redop':>7} "
              f"{'backend':>8} {'time(us)':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>6} {'vs gloo':>8}")
    sys.stdout.flush()
    for n in ranks:
        port = free_port()
        # Rank 0 prints the rows; a rank that found a wrong element, or
        # failed, exits non-zero.
        processes = [context.Process(target=rank_main, args=(r, n, port, args))
                     for r in range(n)]
        for p in processes:
            p.start()
        while any(p.exitcode is None for p in processes):
            if any(p.exitcode not in (None, 0) for p in processes):
                # One rank failed: the others fail within their peer
                # timeout; give them that long, then stop them.
                deadline = time.monotonic() + 30
                while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
                    time.sleep(0.1)
                break
            time.sleep(0.1)
        for p in processes:
            if p.exitcode is None:
                p.kill()
            p.join()
        failed = [r for r, p in enumerate(processes) if p.exitcode != 0]
        if failed:
            print(f"barlink.torch.bench: rank(s) {failed} of {n} exited non-zero (see above)",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
