"""One rank of a torch.distributed test over the barlink backend:
`python torch_ranks.py SCENARIO RANK WORLD INIT_METHOD` (RANK and WORLD
may be "env" under torchrun). Exits 0 when every check held; prints what
differed and exits 1 otherwise.

matrix     every operation, dtype and reduction against a local result
async      isend/irecv both ways (receives posted first), Work objects
groups     a subgroup made by new_group beside the world group, and a
           group of one rank; the subgroup destroyed, the world going on
mismatch   ranks give all_reduce tensors of different shapes, then of
           different dtypes of one size: each rank gets barlink.Mismatch
dies       the last rank exits before an all_reduce: the others get an
           error naming it, within the peer timeout
relay      rank 1 waits in a receive from rank 0 for several peer timeouts
           while rank 2 waits for rank 1: the link 1-2, which rank 1's
           operation does not use, must stay alive meanwhile
overlap    rank 1 joins two seconds late: rank 0's async_op collectives
           return at once and complete later, in order, with futures;
           a send, and a collective without async_op, after them wait
           for them to run
ddp        DistributedDataParallel trains a small model three steps, its
           gradients in several buckets (async all_reduces in flight
           together): every rank's parameters match one process trained
           on the whole batch
placed     (BARLINK_SYSFS_ROOT at the 8-GPU two-socket fixture) 4 ranks
           given GPUs 0, 4, 5, 1, alternating sockets: the ring must run
           0 3 1 2, and the ring collectives stay exact over it
tcp        (BARLINK_TORCH_TRANSPORT=tcp) every pair linked over TCP, then
           collectives and irecv-before-isend over those links
batch      batch_isend_irecv both ways round the ring (pipeline
           parallelism's call), three sizes
bound      init_process_group(device_id=...): the rank's CUDA device where
           there is one, else cpu:0 (exits 77 saying SKIPPED where torch
           binds accelerators only); then an all_reduce and a batch
"""

import contextlib
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import barlink
import barlink.torch  # noqa: F401  (registers "barlink")
from barlink._units import parse_size

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64, torch.uint8]
OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "product": dist.ReduceOp.PRODUCT,
}
failures = []


def check(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        failures.append(f"{what}: got {got.flatten()[:6].tolist()}.. want {want.flatten()[:6].tolist()}..")


def values(rank, count, dtype):
    """Small integers, so every dtype holds every result exactly."""
    return ((torch.arange(count) + rank) % 3 + 1).to(dtype)


def reduce_locally(world, count, dtype, op):
    everyone = torch.stack([values(r, count, dtype).to(torch.float64) for r in range(world)])
    result = {
        "sum": lambda: everyone.sum(0),
        "avg": lambda: everyone.sum(0) / world,
        "min": lambda: everyone.min(0).values,
        "max": lambda: everyone.max(0).values,
        "product": lambda: everyone.prod(0),
    }[op]()
    if op == "avg" and not dtype.is_floating_point:
        result = torch.trunc(result)
    return result.to(dtype)


def matrix(rank, world):
    # Below and above the size where small all_reduces change algorithm,
    # and a count that does not split evenly over the ranks.
    for count in (1, 37, 40_001):
        for dtype in DTYPES:
            for name, op in OPS.items():
                if name == "product" and count > 1000:
                    continue
                t = values(rank, count, dtype)
                dist.all_reduce(t, op=op)
                check(f"all_reduce {name} {dtype} x{count}", t, reduce_locally(world, count, dtype, name))
            t = values(rank, count, dtype)
            dist.reduce(t, dst=world - 1)
            if rank == world - 1:
                check(f"reduce {dtype}", t, reduce_locally(world, count, dtype, "sum"))
            else:
                check(f"reduce leaves non-root input {dtype}", t, values(rank, count, dtype))
            t = values(rank, count, dtype)
            dist.broadcast(t, src=1 % world)
            check(f"broadcast {dtype} x{count}", t, values(1 % world, count, dtype))
            outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, values(rank, count, dtype))
            for r in range(world):
                check(f"all_gather {dtype} from {r}", outs[r], values(r, count, dtype))
            flat = torch.zeros(world * count, dtype=dtype)
            dist.all_gather_into_tensor(flat, values(rank, count, dtype))
            check(f"all_gather_into_tensor {dtype}", flat,
                  torch.cat([values(r, count, dtype) for r in range(world)]))
            # In place, as FSDP gathers: the input is this rank's slice.
            flat = torch.zeros(world * count, dtype=dtype)
            own = flat[rank * count:(rank + 1) * count]
            own.copy_(values(rank, count, dtype))
            dist.all_gather_into_tensor(flat, own)
            check(f"all_gather_into_tensor in place {dtype}", flat,
                  torch.cat([values(r, count, dtype) for r in range(world)]))
            # Strided outputs (one element of such, or none, is contiguous
            # to torch whatever its stride).
            for n in (count, 0):
                outs = [torch.zeros(2 * n, dtype=dtype)[::2] for _ in range(world)]
                dist.all_gather(outs, values(rank, n, dtype))
                for r in range(world):
                    check(f"all_gather strided {dtype} x{n} from {r}", outs[r], values(r, n, dtype))
            # The input is the output another rank's part lands in: it is
            # read before that part arrives.
            outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
            outs[(rank + 1) % world].copy_(values(rank, count, dtype))
            dist.all_gather(outs, outs[(rank + 1) % world])
            for r in range(world):
                check(f"all_gather from another's output, {dtype} from {r}", outs[r],
                      values(r, count, dtype))
            full = values(rank, world * count, dtype)
            out = torch.zeros(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, full)
            want = reduce_locally(world, world * count, dtype, "sum")[rank * count:(rank + 1) * count]
            check(f"reduce_scatter_tensor {dtype}", out, want)
            check(f"reduce_scatter_tensor leaves its input {dtype}", full,
                  values(rank, world * count, dtype))
            out = torch.zeros(count, dtype=dtype)
            dist.reduce_scatter(out, list(full.chunk(world)))
            check(f"reduce_scatter {dtype}", out, want)
            # The output is part of the input: this rank's own (in place),
            # or the part another rank is sent.
            for where, part in (("in place", rank), ("into another's part", (rank + 1) % world)):
                whole = values(rank, world * count, dtype)
                into = whole[part * count:(part + 1) * count]
                dist.reduce_scatter_tensor(into, whole)
                check(f"reduce_scatter_tensor {where} {dtype}", into, want)
                parts = list(values(rank, world * count, dtype).chunk(world))
                dist.reduce_scatter(parts[part], parts)
                check(f"reduce_scatter {where} {dtype}", parts[part], want)
            # A strided output.
            strided = torch.zeros(2 * count, dtype=dtype)[::2]
            dist.reduce_scatter_tensor(strided, full)
            check(f"reduce_scatter_tensor strided {dtype}", strided, want)
            out = torch.zeros(world * count, dtype=dtype)
            dist.all_to_all_single(out, values(rank, world * count, dtype))
            want = torch.cat([values(r, world * count, dtype)[rank * count:(rank + 1) * count]
                              for r in range(world)])
            check(f"all_to_all_single {dtype}", out, want)
            # In place: every part received lands where a part to go was.
            same = values(rank, world * count, dtype)
            dist.all_to_all_single(same, same)
            check(f"all_to_all_single in place {dtype}", same, want)
            outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, list(values(rank, world * count, dtype).chunk(world)))
            check(f"all_to_all {dtype}", torch.cat(outs), want)
    # A tensor of three chunks and a bit, from every root: the tree's
    # relays send on a tensor that arrived in several chunks.
    chunk = parse_size(os.environ.get("BARLINK_CHUNK_BYTES", "1M"))
    for root in range(world):
        t = values(rank, 3 * chunk // 4 + 5, torch.int32)
        dist.broadcast(t, src=root)
        check(f"broadcast of 3 chunks from {root}", t, values(root, 3 * chunk // 4 + 5, torch.int32))
    # Uneven splits: rank r sends r+1 rows to everyone.
    rows = [r + 1 for r in range(world)]
    source = torch.full((world * (rank + 1), 3), float(rank))
    out = torch.zeros(sum(rows), 3)
    dist.all_to_all_single(out, source, output_split_sizes=rows, input_split_sizes=[rank + 1] * world)
    check("all_to_all_single uneven", out,
          torch.cat([torch.full((r + 1, 3), float(r)) for r in range(world)]))
    # A non-contiguous tensor is written back where it lives.
    base = torch.zeros(8, 4)
    view = base[:, 1]
    view.copy_(torch.arange(8.0) + rank)
    dist.all_reduce(view)
    check("all_reduce of a strided view", base[:, 1], sum(torch.arange(8.0) + r for r in range(world)))
    check("all_reduce of a strided view leaves the rest", base[:, 0], torch.zeros(8))
    dist.barrier()


def async_ops(rank, world):
    peer = (rank + 1) % world
    source = (rank - 1) % world
    big = torch.full((1 << 20,), float(rank))
    got = torch.zeros(1 << 20)
    # Both ranks post the receive first: it must wait for its Work.
    receive = dist.irecv(got, src=source)
    send = dist.isend(big, dst=peer)
    send.wait()
    receive.wait()
    check("irecv before isend", got, torch.full((1 << 20,), float(source)))
    t = torch.ones(10)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if not work.is_completed():
        failures.append("all_reduce Work not completed after wait()")
    check("async all_reduce", t, torch.full((10,), float(world)))
    future = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    future.wait()
    small = torch.zeros(5)
    receive = dist.irecv(small, src=source)
    dist.send(torch.full((5,), 7.0 + rank), dst=peer)
    deadline = time.monotonic() + 20
    while not receive.is_completed():
        if time.monotonic() > deadline:
            failures.append("irecv never completed by polling is_completed()")
            break
    check("irecv polled", small, torch.full((5,), 7.0 + source))


def groups(rank, world):
    members = [0, world - 1]
    group = dist.new_group(members, backend="barlink")
    t = torch.full((4,), float(rank + 1))
    if rank in members:
        dist.all_reduce(t, group=group)
        check("subgroup all_reduce", t, torch.full((4,), float(1 + world)))
    # A group of one: every collective is this rank's own input.
    solo = dist.new_group([1], backend="barlink")
    if rank == 1:
        t = torch.arange(6.0)
        outs = [torch.zeros(6)]
        dist.all_gather(outs, t, group=solo)
        check("one-rank all_gather", outs[0], t)
        out = torch.zeros(6)
        dist.all_gather_into_tensor(out, t, group=solo)
        check("one-rank all_gather_into_tensor", out, t)
        out = torch.zeros(6)
        dist.reduce_scatter_tensor(out, t, group=solo)
        check("one-rank reduce_scatter_tensor", out, t)
        shifted = torch.arange(7, dtype=torch.float32)
        dist.reduce_scatter_tensor(shifted[1:], shifted[:-1], group=solo)
        check("one-rank reduce_scatter_tensor into its own input, shifted", shifted[1:],
              torch.arange(6, dtype=torch.float32))
        shifted = torch.arange(7, dtype=torch.float32)
        dist.reduce_scatter(shifted[1:], [shifted[:-1]], group=solo)
        check("one-rank reduce_scatter into its own input, shifted", shifted[1:],
              torch.arange(6, dtype=torch.float32))
        u = t.clone()
        dist.all_reduce(u, group=solo)
        check("one-rank all_reduce", u, t)
    t = torch.ones(4)
    dist.all_reduce(t)
    check("world all_reduce after the subgroup", t, torch.full((4,), float(world)))
    # A subgroup destroyed while the world goes on (torch finds it by the
    # name it gave it).
    if rank in members:
        if not group.group_name:
            failures.append("the subgroup has no name")
        dist.destroy_process_group(group)
    t = torch.ones(4)
    dist.all_reduce(t)
    check("world all_reduce after the subgroup was destroyed", t, torch.full((4,), float(world)))


def mismatch(rank, world):
    for label, tensor in (
        ("shape", torch.ones(10 + rank)),
        ("dtype", torch.ones(10, dtype=torch.float32 if rank == 0 else torch.int32)),
    ):
        # A group of its own: a group is out of step after a mismatch.
        group = dist.new_group(backend="barlink")
        try:
            dist.all_reduce(tensor, group=group)
        except barlink.Mismatch as error:
            print(f"rank {rank} {label}: Mismatch: {error}", flush=True)
        except barlink.LinkFailed as error:
            # A rank that found the mismatch closed its links: a rank that
            # did not see it itself learns so.
            print(f"rank {rank} {label}: {type(error).__name__}: {error}", flush=True)
            if world == 2:
                failures.append(f"{label} mismatch with two ranks: {error!r}, not Mismatch")
        else:
            failures.append(f"{label} mismatch: all_reduce returned {tensor[:3].tolist()}")


def dies(rank, world):
    dist.barrier()
    if rank == world - 1:
        os._exit(0)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except (barlink.LinkFailed, TimeoutError) as error:
        took = time.monotonic() - started
        print(f"rank {rank}: {type(error).__name__} after {took:.1f} s: {error}", flush=True)
        if f"rank {world - 1}" not in str(error) and "closed" not in str(error):
            failures.append(f"the error does not name rank {world - 1}: {error}")
        if took > 15:
            failures.append(f"the error came after {took:.1f} s, past the peer timeout")
    else:
        failures.append("all_reduce returned with a rank gone")
    os._exit(1 if failures else 0)


def relay(rank, world):
    peer_timeout = float(os.environ["BARLINK_PEER_TIMEOUT"])
    t = torch.zeros(1024)
    if rank == 0:
        time.sleep(3 * peer_timeout)
        dist.send(values(0, 1024, torch.float32), dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
        dist.send(t, dst=2)
    elif rank == 2:
        dist.recv(t, src=1)
        check("relayed tensor", t, values(0, 1024, torch.float32))


def overlap(rank, world):
    late = 2.0
    if rank == 1:
        time.sleep(late)
    started = time.monotonic()
    total = values(rank, 300_001, torch.float32)
    works = [dist.all_reduce(total, async_op=True)]
    root = values(rank, 1000, torch.int64)
    works.append(dist.broadcast(root, src=1, async_op=True))
    outs = [torch.zeros(40_001, dtype=torch.int32) for _ in range(world)]
    works.append(dist.all_gather(outs, values(rank, 40_001, torch.int32), async_op=True))
    returned = time.monotonic() - started
    if rank == 0:
        # Nothing can complete before rank 1 joins.
        if returned > late / 2:
            failures.append(f"three async_op calls took {returned:.2f} s to return")
        if any(work.is_completed() for work in works):
            failures.append("a collective completed before every rank called it")
    futures = [work.get_future() for work in works]
    futures[-1].wait()
    if not all(work.is_completed() for work in works):
        failures.append("a collective called earlier is still running after the last completed")
    for work in works:
        work.wait()
    check("async all_reduce", total, reduce_locally(world, 300_001, torch.float32, "sum"))
    check("async broadcast", root, values(1, 1000, torch.int64))
    for r in range(world):
        check(f"async all_gather from {r}", outs[r], values(r, 40_001, torch.int32))
    # A send, or a collective without async_op, called while collectives
    # are still queued goes after them. Rank 1 joins late, so rank 0's
    # first collective waits and its second has not started: a send that
    # overtook it would reach rank 1 first and be taken for its data.
    for inline_collective in (False, True):
        first = values(rank, 40_001, torch.float64)
        again = values(rank, 300_001, torch.float32)
        if rank == 1:
            time.sleep(late / 2)
        queued = [dist.all_reduce(first, async_op=True), dist.all_reduce(again, async_op=True)]
        if inline_collective:
            inline = values(rank, 37, torch.int32)
            dist.all_reduce(inline, op=dist.ReduceOp.MAX)
            if not all(work.is_completed() for work in queued):
                failures.append("a collective ran before those queued ahead of it completed")
            check("all_reduce after queued ones", inline,
                  reduce_locally(world, 37, torch.int32, "max"))
        else:
            message = torch.zeros(4096)
            if rank == 0:
                dist.send(values(7, 4096, torch.float32), dst=1)
            elif rank == 1:
                dist.recv(message, src=0)
                check("send after queued collectives", message, values(7, 4096, torch.float32))
        for work in queued:
            work.wait()
        check("queued all_reduce", first, reduce_locally(world, 40_001, torch.float64, "sum"))
        check("queued all_reduce", again, reduce_locally(world, 300_001, torch.float32, "sum"))
    # A receive posted before a collective, which drains it first on the
    # group's thread while this thread waits for it too.
    message = torch.zeros(4096)
    if rank == 1:
        time.sleep(late / 2)
        dist.send(values(9, 4096, torch.float32), dst=0)
    if rank == 0:
        request = dist.irecv(message, src=1)
    behind = dist.all_reduce(values(rank, 37, torch.int64), async_op=True)
    if rank == 0:
        time.sleep(late / 4)  # the group's thread is draining it by now
        request.wait()
        check("irecv drained by a queued collective", message, values(9, 4096, torch.float32))
        if not request.is_completed():
            failures.append("a waited receive is not completed")
    behind.wait()
    # Asking whether a receive completed never waits, not even while the
    # group's thread holds the group in a queued collective (which drains
    # that receive first, and rank 1 sends it late).
    message = torch.zeros(16)
    if rank == 0:
        request = dist.irecv(message, src=1)
        blocked = dist.all_reduce(values(rank, 37, torch.int64), async_op=True)
        time.sleep(late / 8)  # the group's thread is waiting by now
        asked = time.monotonic()
        completed = request.is_completed()
        took = time.monotonic() - asked
        if took > late / 8:
            failures.append(f"is_completed waited {took:.2f} s behind a queued collective")
        if completed:
            failures.append("a receive completed before its message was sent")
    if rank == 1:
        time.sleep(late / 2)
        dist.send(values(5, 16, torch.float32), dst=0)
    if rank != 0:
        blocked = dist.all_reduce(values(rank, 37, torch.int64), async_op=True)
    blocked.wait()
    if rank == 0:
        request.wait()
        check("irecv asked about while queued", message, values(5, 16, torch.float32))
    # A collective called from a future's callback runs on the group's
    # thread at once, as PowerSGD's hook does.
    nested = values(rank, 37, torch.float32)

    def again_from_callback(future):
        dist.all_reduce(nested, async_op=True).wait()
        return future.value()

    chained = dist.all_reduce(values(rank, 37, torch.float32), async_op=True).get_future()
    chained.then(again_from_callback).wait()
    check("all_reduce from a callback", nested, reduce_locally(world, 37, torch.float32, "sum"))


def ddp(rank, world, device=torch.device("cpu")):
    from torch.nn.parallel import DistributedDataParallel

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                   torch.nn.Linear(256, 1)).to(device)

    torch.manual_seed(1)
    inputs, targets = torch.randn(3, world * 8, 64), torch.randn(3, world * 8, 1)
    inputs, targets = inputs.to(device), targets.to(device)
    # Ranks but rank 0 start from other weights: DDP broadcasts rank 0's.
    local = model()
    wrapped = model()
    with torch.no_grad():
        for p in wrapped.parameters():
            p.add_(rank)
    device_ids = [device.index] if device.type == "cuda" else None
    trained = DistributedDataParallel(wrapped, device_ids=device_ids, bucket_cap_mb=0.02)
    mine = slice(rank * 8, (rank + 1) * 8)
    step = torch.optim.SGD(trained.parameters(), lr=0.1)
    reference = torch.optim.SGD(local.parameters(), lr=0.1)
    for i in range(3):
        step.zero_grad()
        torch.nn.functional.mse_loss(trained(inputs[i][mine]), targets[i][mine]).backward()
        step.step()
        reference.zero_grad()
        torch.nn.functional.mse_loss(local(inputs[i]), targets[i]).backward()
        reference.step()
    for (name, got), want in zip(trained.module.named_parameters(), local.parameters()):
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 if device.type == "cuda" else 1e-6):
            failures.append(f"{device} parameter {name} differs by {(got - want).abs().max().item():.3g}")


# The GPU each rank of the placed scenario claims: GPUs 0 and 1 share a
# switch on socket 0, 4 and 5 one on socket 1. The order this gives is not
# its own inverse, so positions and ranks cannot be confused unseen.
PLACED_GPUS = [0, 4, 5, 1]


def placed(rank, world):
    group = dist.group.WORLD
    place = group.place
    print(f"rank {rank} place: {place} ring: {group.ring_order}", flush=True)
    if group.ring_order != [0, 3, 1, 2]:
        failures.append(f"ring order {group.ring_order}, not [0, 3, 1, 2]")
    if place.get("numa") != PLACED_GPUS[rank] // 4:
        failures.append(f"rank {rank} placed on NUMA node {place.get('numa')}")
    for count in (37, 40_001):
        t = values(rank, count, torch.float32)
        dist.all_reduce(t)
        check(f"all_reduce x{count}", t, reduce_locally(world, count, torch.float32, "sum"))
        for root in range(world):
            t = values(rank, count, torch.int32)
            dist.broadcast(t, src=root)
            check(f"broadcast from {root} x{count}", t, values(root, count, torch.int32))
        outs = [torch.zeros(count, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(outs, values(rank, count, torch.int64))
        for r in range(world):
            check(f"all_gather from {r} x{count}", outs[r], values(r, count, torch.int64))
        flat = torch.zeros(world * count, dtype=torch.int64)
        dist.all_gather_into_tensor(flat, values(rank, count, torch.int64))
        check(f"all_gather_into_tensor x{count}", flat,
              torch.cat([values(r, count, torch.int64) for r in range(world)]))
        full = values(rank, world * count, torch.float64)
        want = reduce_locally(world, world * count, torch.float64, "sum")[rank * count:(rank + 1) * count]
        out = torch.zeros(count, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, full)
        check(f"reduce_scatter_tensor x{count}", out, want)
        out = torch.zeros(count, dtype=torch.float64)
        dist.reduce_scatter(out, list(full.chunk(world)))
        check(f"reduce_scatter x{count}", out, want)


def batch(rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    for count in (1, 1000, 300_001):
        to_right = values(rank, count, torch.float32)
        from_left = torch.zeros(count)
        ops = [dist.P2POp(dist.isend, to_right, right), dist.P2POp(dist.irecv, from_left, left)]
        if world > 2:
            to_left = values(rank + 7, count, torch.float32)
            from_right = torch.zeros(count)
            ops += [dist.P2POp(dist.isend, to_left, left), dist.P2POp(dist.irecv, from_right, right)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        check(f"batch from the left x{count}", from_left, values(left, count, torch.float32))
        if world > 2:
            check(f"batch from the right x{count}", from_right, values(right + 7, count, torch.float32))


def bound(rank, world):
    t = values(rank, 1000, torch.float32)
    dist.all_reduce(t)
    check("all_reduce in a bound group", t, reduce_locally(world, 1000, torch.float32, "sum"))
    if torch.cuda.is_available():
        t = values(rank, 1000, torch.float32).cuda()
        dist.all_reduce(t)
        check("all_reduce of a CUDA tensor in a bound group", t.cpu(),
              reduce_locally(world, 1000, torch.float32, "sum"))
    batch(rank, world)


def over_tcp(rank, world):
    # torch keeps a backend written as a ProcessGroup as the group itself.
    paths = dist.group.WORLD.link_paths()
    print(f"rank {rank} paths: {paths}", flush=True)
    if sorted(paths) != [r for r in range(world) if r != rank]:
        failures.append(f"links to {sorted(paths)}, not to every other rank")
    for peer, path in paths.items():
        if not path.startswith("tcp"):
            failures.append(f"the link to rank {peer} took {path}, not TCP")
    big = values(rank, 300_001, torch.float32)
    dist.all_reduce(big)
    check("all_reduce over TCP", big, reduce_locally(world, 300_001, torch.float32, "sum"))
    t = values(rank, 1000, torch.bfloat16)
    dist.broadcast(t, src=world - 1)
    check("broadcast over TCP", t, values(world - 1, 1000, torch.bfloat16))
    async_ops(rank, world)


def on_cuda(rank, world):
    # CUDA tensors through pinned host memory; ranks share the GPUs there are
    # (main() made this rank's device current before linking).
    through_stand_ins(rank, world, torch.device("cuda", torch.cuda.current_device()))


def staged(rank, world):
    # The CUDA path's ordering without a GPU: CPU tensors staged as CUDA
    # ones are (a stand-in filled when the call runs, copied back after).
    from barlink.torch import _staging

    _staging.Staging._staged = lambda self, tensor: True
    through_stand_ins(rank, world, torch.device("cpu"))


def through_stand_ins(rank, world, device):
    cuda = device.type == "cuda"
    peer, source = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for count in (37, 300_001):
            t = values(rank, count, dtype).to(device)
            dist.all_reduce(t)
            check(f"{device} all_reduce {dtype} x{count}", t.cpu(), reduce_locally(world, count, dtype, "sum"))
            if t.device != device:
                failures.append(f"all_reduce moved the tensor to {t.device}")
    # Values queued on the current stream before the call are the ones sent.
    t = torch.zeros(1 << 20, device=device)
    t.add_(rank + 1)
    dist.all_reduce(t)
    check(f"{device} all_reduce after queued work", t.cpu(), torch.full((1 << 20,), float(sum(range(1, world + 1)))))
    for root in range(world):
        t = values(rank, 40_001, torch.int32).to(device)
        dist.broadcast(t, src=root)
        check(f"{device} broadcast from {root}", t.cpu(), values(root, 40_001, torch.int32))
        t = values(rank, 1000, torch.float64).to(device)
        dist.reduce(t, dst=root)
        want = reduce_locally(world, 1000, torch.float64, "sum") if rank == root else values(rank, 1000, torch.float64)
        check(f"{device} reduce to {root}", t.cpu(), want)
    flat = torch.zeros(world * 1000, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(flat, values(rank, 1000, torch.int64).to(device))
    check(f"{device} all_gather_into_tensor", flat.cpu(), torch.cat([values(r, 1000, torch.int64) for r in range(world)]))
    outs = [torch.zeros(1000, device=device) for _ in range(world)]
    dist.all_gather(outs, values(rank, 1000, torch.float32).to(device))
    for r in range(world):
        check(f"{device} all_gather from {r}", outs[r].cpu(), values(r, 1000, torch.float32))
    out = torch.zeros(1000, device=device)
    dist.reduce_scatter_tensor(out, values(rank, world * 1000, torch.float32).to(device))
    want = reduce_locally(world, world * 1000, torch.float32, "sum")[rank * 1000:(rank + 1) * 1000]
    check(f"{device} reduce_scatter_tensor", out.cpu(), want)
    out = torch.zeros(world * 100, device=device)
    dist.all_to_all_single(out, values(rank, world * 100, torch.float32).to(device))
    want = torch.cat([values(r, world * 100, torch.float32)[rank * 100:(rank + 1) * 100] for r in range(world)])
    check(f"{device} all_to_all_single", out.cpu(), want)
    # A non-contiguous view is written back where it lives.
    base = torch.zeros(8, 4, device=device)
    base[:, 1] = torch.arange(8.0, device=device) + rank
    dist.all_reduce(base[:, 1])
    want = sum(torch.arange(8.0) + r for r in range(world))
    check(f"{device} all_reduce of a view", base[:, 1].cpu(), want)
    check(f"{device} all_reduce of a view leaves the rest", base[:, 0].cpu(), torch.zeros(8))
    # Point to point, both ways round the ring, receives posted first.
    got = torch.zeros(1 << 20, device=device)
    receive = dist.irecv(got, src=source)
    dist.isend(torch.full((1 << 20,), float(rank), device=device), dst=peer).wait()
    receive.wait()
    check(f"{device} irecv before isend", got.cpu(), torch.full((1 << 20,), float(source)))
    small = torch.zeros(5, device=device)
    receive = dist.irecv(small, src=source)
    dist.send(torch.full((5,), 7.0 + rank, device=device), dst=peer)
    deadline = time.monotonic() + 20
    while not receive.is_completed():
        if time.monotonic() > deadline:
            failures.append(f"{device} irecv never completed by polling is_completed()")
            break
    check(f"{device} irecv polled", small.cpu(), torch.full((5,), 7.0 + source))
    # A tensor passed twice is one tensor, as on CPU: reduced twice.
    a, b = torch.ones(100, device=device), torch.full((10,), 2.0, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated
        dist.all_reduce_coalesced([a, a, b])
    check(f"{device} all_reduce_coalesced of one tensor twice", a.cpu(), torch.full((100,), float(world ** 2)))
    check(f"{device} all_reduce_coalesced beside it", b.cpu(), torch.full((10,), 2.0 * world))
    # A call takes what the calls before it wrote, an asynchronous one too.
    t = torch.ones(1000, device=device)
    work = dist.all_reduce(t, async_op=True)
    dist.all_reduce(t)
    work.wait()
    check(f"{device} all_reduce after an async one", t.cpu(), torch.full((1000,), float(world * world)))
    t = torch.full((1000,), float(rank), device=device)
    works = [dist.all_reduce(t, async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    check(f"{device} three async all_reduces in a row", t.cpu(),
          torch.full((1000,), float(sum(range(world)) * world ** 2)))
    # Work queued on a side stream before a call is ordered before it, for
    # what the call reads and for what it writes.
    side = torch.cuda.Stream(device) if cuda else None
    with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
        t = torch.empty(1 << 22, device=device)
        t.fill_(rank + 1.0)
        work = dist.all_reduce(t, async_op=True)
        got = torch.empty(1 << 22, device=device)
        got.fill_(-1.0)
        receive = dist.irecv(got, src=source)
        dist.send(torch.full((1 << 22,), 3.0 + rank, device=device), dst=peer)
        receive.wait()
        work.wait()
    check(f"{device} all_reduce of side-stream work", t.cpu(),
          torch.full((1 << 22,), float(sum(range(1, world + 1)))))
    check(f"{device} irecv into side-stream work", got.cpu(), torch.full((1 << 22,), 3.0 + source))
    # Asynchronous: the future holds the device tensor, its result in place.
    t = torch.ones(1000, device=device)
    future = dist.all_reduce(t, async_op=True).get_future()
    value = future.wait()[0]
    if value.device != device or value.data_ptr() != t.data_ptr():
        failures.append(f"the future holds {value.device} {value.data_ptr()}, not the tensor passed")
    check(f"{device} async all_reduce", t.cpu(), torch.full((1000,), float(world)))
    if cuda:
        # CPU tensors still go as they are, in the same group.
        t = values(rank, 37, torch.float32)
        dist.all_reduce(t)
        check("cpu all_reduce beside cuda", t, reduce_locally(world, 37, torch.float32, "sum"))
    # A model on the GPU trains as one process on the whole batch.
    ddp(rank, world, device)


def main():
    scenario, rank, world, init = sys.argv[1:5]
    if rank == "env":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        kwargs = {}
    else:
        rank, world = int(rank), int(world)
        kwargs = {"init_method": init, "rank": rank, "world_size": world}
    if scenario == "placed":
        os.environ["BARLINK_TORCH_GPU"] = str(PLACED_GPUS[rank])
    if scenario == "cuda":
        # The CUDA context first: made while links are up, it could hold the
        # GIL past the peer timeout of the thread that keeps them alive.
        torch.cuda.set_device(rank % torch.cuda.device_count())
        torch.zeros(1, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
    if scenario == "bound":
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
            kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
        else:
            kwargs["device_id"] = torch.device("cpu", 0)
        try:
            dist.init_process_group("barlink", **kwargs)
        except ValueError as error:
            if "accelerator" not in str(error):
                raise
            print(f"SKIPPED: torch {torch.__version__} binds groups to accelerators only: {error}")
            sys.stdout.flush()
            os._exit(77)
    else:
        dist.init_process_group("barlink", **kwargs)
    run = {"matrix": matrix, "async": async_ops, "groups": groups, "mismatch": mismatch,
           "dies": dies, "relay": relay, "overlap": overlap, "ddp": ddp, "placed": placed, "tcp": over_tcp,
           "cuda": on_cuda, "staged": staged, "batch": batch, "bound": bound}[scenario]
    run(rank, world)
    dist.barrier()
    if failures:
        print(f"rank {rank}: {len(failures)} check(s) failed:", *failures, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    dist.destroy_process_group()
    print(f"rank {rank}: ok", flush=True)
    # The work and the group's teardown are checked above. Skip the
    # interpreter's own teardown: a rank has been seen to abort there
    # ("terminate called without an active exception", in torch's C++
    # destructors) after all of this had succeeded; that is an open issue
    # of its own, not what these scenarios test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
