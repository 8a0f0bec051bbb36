"""Two parties take turns on one GPU, each turn a 4 KiB copy to the device
and back (synchronous, from pinned host memory), the turn passed through
a pipe: as two processes (two CUDA contexts, as `barlink bench --gpu`
runs its two ends on one GPU) and as two threads of one process (one
context). Prints the medians of a turn (half a round trip, the pipe's
signal included) and of the copies alone, and of one party copying
alone. With `cpu` the same runs on CPU tensors: the pipe's and Python's
share of a turn on this machine.

    python3 scripts/gpu_turns.py [cuda|cpu] [TURNS]

Needs torch. scripts/gpu-check.sh runs it on a GPU machine.
"""
import os, sys, time, threading, statistics, subprocess

DEVICE, ITERS = "cuda", 2000
WARM = 200
N = 1024  # float32: 4 KiB

def party(rfd, wfd, first, iters):
    import torch
    dev = torch.zeros(N, device=DEVICE)
    host = torch.ones(N)
    if DEVICE == "cuda":
        host = host.pin_memory()
        torch.cuda.synchronize()
    copies, starts = [], []
    for i in range(iters):
        if not (first and i == 0):
            os.read(rfd, 1)
        t = time.perf_counter()
        starts.append(t)
        dev.copy_(host)
        host.copy_(dev)
        copies.append(time.perf_counter() - t)
        os.write(wfd, b"x")
    turns = [(b - a) / 2 for a, b in zip(starts[WARM:], starts[WARM + 1:])]
    return statistics.median(turns), statistics.median(copies[WARM:])

def run_threads(iters):
    ar, aw = os.pipe(); br, bw = os.pipe()
    th = threading.Thread(target=party, args=(ar, bw, False, iters))
    th.start()
    result = party(br, aw, True, iters)
    th.join()
    return result

def run_processes(iters):
    ar, aw = os.pipe(); br, bw = os.pipe()
    p = subprocess.Popen([sys.executable, __file__, "--child", DEVICE, str(iters), str(ar), str(bw)],
                         pass_fds=(ar, bw))
    result = party(br, aw, True, iters)
    p.wait()
    return result

def run_alone(iters):
    import torch
    dev = torch.zeros(N, device=DEVICE)
    host = torch.ones(N)
    if DEVICE == "cuda":
        host = host.pin_memory()
    copies = []
    for _ in range(iters):
        t = time.perf_counter(); dev.copy_(host); host.copy_(dev); copies.append(time.perf_counter() - t)
    return None, statistics.median(copies[WARM:])

if __name__ == "__main__":
    if sys.argv[1] == "--child":
        DEVICE, iters, rfd, wfd = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        party(rfd, wfd, False, iters)
        sys.exit(0)
    DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    import torch
    if DEVICE == "cuda":
        print("gpu:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    for name, fn in [("one party alone", run_alone), ("two threads, one context", run_threads),
                     ("two processes, two contexts", run_processes)]:
        turn, copy = fn(ITERS)
        shown = f"turn {turn*1e6:8.1f} us" if turn else " " * 16
        print(f"{name:30} {shown}   copies to the device and back {copy*1e6:7.1f} us (medians)", flush=True)
