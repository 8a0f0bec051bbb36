"""Two parties take turns on one GPU, each turn a 4 KiB copy to the device
and back (synchronous, from pinned host memory), the turn passed through
a pipe: as two processes (two CUDA contexts, as `barlink bench --gpu`
runs its two ends on one GPU) and as two threads of one process (one
context). Prints the medians of a turn (half a round trip, the pipe's
signal included) and of the copies alone, and of one party copying
alone. With `cpu` the same runs on CPU tensors: the pipe's and Python's
share of a turn on this machine.

    python3 scripts/gpu_turns.py [cuda|cpu] [TURNS]

TURNS (default 2000) counts each party's turns, the first 200 of them
untimed. Needs torch. scripts/gpu-check.sh runs it on a GPU machine.
"""
import os
import statistics
import subprocess
import sys
import threading
import time

WARM = 200
ELEMENTS = 1024  # float32: 4 KiB


def party(device, rfd, wfd, first, turns):
    """Takes `turns` turns, each after the other party's (the first party
    starts); returns the medians of a turn and of the copies. Closes `wfd`
    when it ends, so the other party's next wait ends too if this one
    fails."""
    try:
        import torch

        on_device = torch.zeros(ELEMENTS, device=device)
        host = torch.ones(ELEMENTS)
        if device == "cuda":
            host = host.pin_memory()
            torch.cuda.synchronize()
        copies, starts = [], []
        for turn in range(turns):
            if not (first and turn == 0) and os.read(rfd, 1) != b"x":
                raise RuntimeError("the other party ended before its turn")
            started = time.perf_counter()
            starts.append(started)
            on_device.copy_(host)
            host.copy_(on_device)
            copies.append(time.perf_counter() - started)
            os.write(wfd, b"x")
        # From one turn of this party to its next: two turns.
        turn_times = [(b - a) / 2 for a, b in zip(starts[WARM:], starts[WARM + 1 :])]
        return statistics.median(turn_times), statistics.median(copies[WARM:])
    finally:
        os.close(wfd)


def alone(device, turns):
    import torch

    on_device = torch.zeros(ELEMENTS, device=device)
    host = torch.ones(ELEMENTS)
    if device == "cuda":
        host = host.pin_memory()
    copies = []
    for _ in range(turns):
        started = time.perf_counter()
        on_device.copy_(host)
        host.copy_(on_device)
        copies.append(time.perf_counter() - started)
    return None, statistics.median(copies[WARM:])


def two_threads(device, turns):
    to_first_r, to_first_w = os.pipe()
    to_second_r, to_second_w = os.pipe()
    failed = []

    def second():
        try:
            party(device, to_second_r, to_first_w, False, turns)
        except Exception as error:  # reported by the first party's wait
            failed.append(error)

    thread = threading.Thread(target=second)
    thread.start()
    try:
        result = party(device, to_first_r, to_second_w, True, turns)
    finally:
        thread.join()
        os.close(to_first_r)
        os.close(to_second_r)
    if failed:
        raise failed[0]
    return result


def two_processes(device, turns):
    to_first_r, to_first_w = os.pipe()
    to_second_r, to_second_w = os.pipe()
    child = subprocess.Popen(
        [sys.executable, __file__, "--second", device, str(turns), str(to_second_r), str(to_first_w)],
        pass_fds=(to_second_r, to_first_w),
    )
    # The child holds these ends now: if it dies, this side's read ends.
    os.close(to_second_r)
    os.close(to_first_w)
    try:
        result = party(device, to_first_r, to_second_w, True, turns)
    finally:
        os.close(to_first_r)
        code = child.wait()
    if code != 0:
        raise RuntimeError(f"the second process exited with {code}")
    return result


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--second":
        device, turns, rfd, wfd = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        party(device, rfd, wfd, False, turns)
        return
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    if device not in ("cuda", "cpu") or turns < WARM + 2:
        sys.exit(f"usage: gpu_turns.py [cuda|cpu] [TURNS, at least {WARM + 2}]")
    import torch

    if device == "cuda":
        print("gpu:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    for name, run in [
        ("one party alone", alone),
        ("two threads, one context", two_threads),
        ("two processes, two contexts", two_processes),
    ]:
        turn, copy = run(device, turns)
        shown = f"turn {turn * 1e6:8.1f} us" if turn is not None else " " * 16
        print(f"{device} {name:30} {shown}   copies to the device and back {copy * 1e6:7.1f} us (medians)", flush=True)


if __name__ == "__main__":
    main()
