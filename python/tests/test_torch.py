"""The torch.distributed backend: ranks as separate processes on this host
(`torch_ranks.py`), every result checked against one computed locally."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/python-test.sh installs it)")

RANKS = Path(__file__).with_name("torch_ranks.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, world: int, timeout: float = 240, peer_timeout: float = 3.0,
              **env_vars):
    """Starts `world` ranks of `scenario`; their exit codes and output."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, BARLINK_PEER_TIMEOUT=str(peer_timeout), **env_vars)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANKS), scenario, str(r), str(world), init],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for r in range(world)
    ]
    outputs = []
    deadline = time.monotonic() + timeout
    for rank in ranks:
        try:
            out, _ = rank.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            out, _ = rank.communicate()
            out += f"\n(killed after {timeout} s)"
        outputs.append(out)
    return [rank.returncode for rank in ranks], outputs


def report(codes, outputs) -> str:
    return "\n".join(f"--- rank {r} exited {c}:\n{o[-3000:]}" for r, (c, o) in enumerate(zip(codes, outputs)))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_operation_dtype_and_reduction_matches_a_local_result(world):
    codes, outputs = run_ranks("matrix", world)
    assert codes == [0] * world, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_cuda_tensors_go_through_host_memory_and_match_a_local_result(world):
    # Only a machine with a CUDA device runs it (scripts/gpu-check.sh on a lent GPU).
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    codes, outputs = run_ranks("cuda", world, peer_timeout=10.0)
    assert codes == [0] * world, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_tensors_staged_as_cuda_ones_are_in_the_order_the_calls_were_made(world):
    # The CUDA path's host stand-ins, exercised on CPU tensors: chained and
    # asynchronous calls, point to point, futures, a strided view, DDP.
    codes, outputs = run_ranks("staged", world)
    assert codes == [0] * world, report(codes, outputs)


def test_a_gather_in_place_is_told_from_one_into_other_memory():
    import torch

    from barlink.torch._algorithms import holds_already, raw

    out = torch.zeros(12, dtype=torch.float32)
    slot = raw(out)[16:32]  # elements 4..8
    assert holds_already(slot, out[4:8])
    assert not holds_already(slot, out[4:8].clone())
    assert not holds_already(slot, out[3:7])  # another start
    assert not holds_already(slot, out[4:7])  # another length
    assert not holds_already(slot, out[4:12:2])  # not contiguous
    assert holds_already(raw(out)[0:0], out[0:0])


def test_tensors_of_a_device_type_the_backend_does_not_take_are_refused():
    import torch

    from barlink.torch._staging import Staging

    host = torch.ones(3)
    staging = Staging("all_reduce")
    assert staging.host(host) is host
    staging.copy_back()
    with pytest.raises(ValueError, match="all_reduce: the barlink backend takes CPU and CUDA tensors, not meta"):
        staging.host(torch.ones(3, device="meta"))


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_in_many_small_chunks_match_a_local_result(world):
    # Chunks of 1 KiB: every ring step is many messages, so steps overlap
    # chunk by chunk and targets are lent across step boundaries.
    codes, outputs = run_ranks("matrix", world, BARLINK_CHUNK_BYTES="1024")
    assert codes == [0] * world, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_irecv_posted_before_isend_and_work_objects(world):
    codes, outputs = run_ranks("async", world)
    assert codes == [0] * world, report(codes, outputs)


def test_a_subgroup_beside_the_world_group():
    codes, outputs = run_ranks("groups", 3)
    assert codes == [0] * 3, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_tensors_of_another_shape_or_dtype_raise_mismatch(world):
    codes, outputs = run_ranks("mismatch", world)
    assert codes == [0] * world, report(codes, outputs)
    text = "\n".join(outputs)
    assert "shape: Mismatch" in text and "dtype: Mismatch" in text, text


def test_a_rank_that_dies_fails_the_others_within_the_peer_timeout():
    codes, outputs = run_ranks("dies", 3, timeout=60, peer_timeout=2.0)
    assert codes[:2] == [0, 0], report(codes, outputs)
    assert all("rank 2" in out or "closed" in out for out in outputs[:2]), report(codes, outputs)


def test_a_link_idle_during_a_long_operation_stays_alive():
    # Rank 1 spends three peer timeouts in a receive from rank 0 while rank
    # 2 waits on rank 1: rank 1 must still answer rank 2 meanwhile.
    codes, outputs = run_ranks("relay", 3, timeout=60, peer_timeout=2.0)
    assert codes == [0] * 3, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_async_op_collectives_return_at_once_and_complete_in_order(world):
    codes, outputs = run_ranks("overlap", world)
    assert codes == [0] * world, report(codes, outputs)


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_data_parallel_trains_as_one_process_on_the_whole_batch(world):
    codes, outputs = run_ranks("ddp", world)
    assert codes == [0] * world, report(codes, outputs)


FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sysfs"


def test_the_ring_runs_through_ranks_whose_gpus_sit_together():
    # Ranks 0 and 2 hold GPUs of one socket, 1 and 3 of the other.
    codes, outputs = run_ranks(
        "placed", 4, BARLINK_SYSFS_ROOT=str(FIXTURES / "server-8gpu-2socket")
    )
    assert codes == [0] * 4, report(codes, outputs)


def test_ranks_linked_over_tcp_with_a_pre_shared_key(tmp_path):
    # As ranks on different hosts would be: TCP links, set up only with the key.
    key = tmp_path / "psk"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    codes, outputs = run_ranks("tcp", 3, BARLINK_TORCH_TRANSPORT="tcp", BARLINK_PSK_FILE=str(key))
    assert codes == [0] * 3, report(codes, outputs)
    assert all("paths" in out for out in outputs), report(codes, outputs)


def test_ranks_on_tcp_without_a_key_are_refused_with_the_reason():
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARLINK_PSK")}
    init = f"tcp://127.0.0.1:{free_port()}"
    env.update(BARLINK_TORCH_TRANSPORT="tcp", BARLINK_PEER_TIMEOUT="3")
    ranks = [
        subprocess.Popen([sys.executable, str(RANKS), "groups", str(r), "2", init],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(2)
    ]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert all(rank.returncode != 0 for rank in ranks), outputs
    text = "\n".join(outputs)
    assert "SetupError" in text and "BARLINK_PSK" in text, text[-3000:]


def test_torchrun_starts_the_ranks():
    port = free_port()
    env = dict(os.environ, BARLINK_PEER_TIMEOUT="3")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(RANKS), "groups", "env", "env", "env"],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(": ok") == 2, result.stdout


@pytest.mark.parametrize("world", [2, 3])
def test_batch_isend_irecv_both_ways_round_the_ring(world):
    codes, outputs = run_ranks("batch", world)
    assert codes == [0] * world, report(codes, outputs)


def test_a_group_bound_with_device_id_to_cuda_or_cpu_works():
    codes, outputs = run_ranks("bound", 2)
    if codes == [77, 77]:
        pytest.skip(outputs[0].strip().splitlines()[-1])
    assert codes == [0, 0], report(codes, outputs)


def test_the_benchmark_checks_what_it_measured():
    result = subprocess.run(
        [sys.executable, "-m", "barlink.torch.bench", "--quick", "--json",
         "--ops", "all_reduce,all_gather,send_recv"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    import json

    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    rows = [row for row in lines if "op" in row]
    assert {row["backend"] for row in rows} == {"barlink", "gloo"}
    assert all(row["wrong"] == 0 for row in rows), rows
    assert all(row["window_warmup_s"] == 0.03 for row in rows), rows
    assert all(row["time_min_us"] <= row["time_us"] <= row["time_max_us"] for row in rows), rows
    assert "cpu" in lines[0]["header"]


def test_the_benchmark_starts_each_window_with_about_its_warmup_of_operations():
    from barlink.torch.bench import main, window_warmup_count

    assert window_warmup_count(0, 0.001) == 0
    assert window_warmup_count(0.03, 0.001) == 30
    assert window_warmup_count(0.03, 0.040) == 1  # at least one
    assert window_warmup_count(0.03, 1e-6) == 10_000  # at most 10,000
    with pytest.raises(SystemExit) as refused:
        main(["--window-warmup", "-1"])
    assert refused.value.code == 2


def test_the_benchmark_on_cuda_tensors_checks_what_it_measured_or_says_why_not():
    import json

    import torch

    result = subprocess.run(
        [sys.executable, "-m", "barlink.torch.bench", "--quick", "--json", "--device", "cuda",
         "--ops", "all_reduce,broadcast,send_recv"],
        capture_output=True, text=True, timeout=300,
    )
    if not torch.cuda.is_available():
        assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
        assert "torch sees no CUDA device" in result.stderr
        pytest.skip("no CUDA device: checked only that --device cuda says so")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    rows = [row for row in lines if "op" in row]
    assert {row["op"] for row in rows if row["backend"] == "barlink"} == {
        "all_reduce", "broadcast", "send_recv"}
    assert all(row["wrong"] == 0 and row["device"] == "cuda" for row in rows), rows
    assert lines[0]["header"]["device"] == "cuda" and lines[0]["header"]["gpu"]
