"""The process group: a link between every pair of ranks, and the
collectives built over them from one primitive, ``barlink.Exchange`` (send
one buffer while receiving another, in chunks, combining on arrival).

Collectives called with ``async_op=True`` run on the group's own thread,
one after another in the order they were called (``_queue``): their Works
complete when they have run, so the caller computes meanwhile. Other
collectives, and point-to-point calls, run on the calling thread once the
collectives queued before them have run (every rank's messages enter a
link in call order): a send
completes when the peer acknowledged it (its Work waits for that), and a
receive is taken when its Work is waited on or tested, or when a later
operation needs the same link (so ``irecv`` before ``send`` on both ranks
cannot deadlock).

Each exchange starts with a short descriptor (operation, sequence number,
dtype, element count), so ranks that called different operations, or gave
tensors of different shapes or dtypes, get ``barlink.Mismatch`` instead of
combining garbage. After any failure the group closes its links (the other
ranks' pending operations then fail at once instead of waiting for their
timeout) and every later operation raises why the group failed.
"""

import json
import os
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

import barlink
from barlink._units import parse_size

from . import _algorithms as algo
from . import _placement
from ._queue import OperationQueue, QueuedWork
from ._staging import DEVICES, Staging, future_for

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "sum",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _env_size(name: str, default: str) -> int:
    value = os.environ.get(name, default)
    try:
        return parse_size(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not parsed > 0:
        raise ValueError(f"{name}={value!r} must be > 0")
    return parsed


def _host_id() -> str:
    """Names this host's kernel, so ranks that share memory know it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _free_port() -> int:
    """A port nobody listens on now (the listener binds it just after)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _own_address() -> str:
    """The address peers on other hosts reach this rank at:
    BARLINK_TORCH_ADDR, else the interface that routes to MASTER_ADDR,
    else what this host's name resolves to."""
    chosen = os.environ.get("BARLINK_TORCH_ADDR")
    if chosen:
        return chosen
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, 9))  # no packet is sent
                return probe.getsockname()[0]
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


class _Work(dist._Work):
    """A Work whose completion is `finish(timeout)` (a receive taken or a
    send acknowledged); `poll()` says whether it is complete without
    waiting."""

    def __init__(self, group, finish, poll, result):
        super().__init__()
        self._group = group
        self._finish = finish
        self._poll = poll
        self._result = result
        self._future = future_for(result)
        self._done = False

    def _complete(self):
        if not self._done:
            self._done = True
            self._future.set_result(self._result)

    def wait(self, timeout=None):
        if self._done:
            return True
        seconds = self._group._seconds(timeout)

        def finish():
            # Again under the lock: the group's thread may have taken this
            # receive (a collective drains them first) while we waited.
            if not self._done:
                self._finish(seconds)
                self._complete()

        self._group._guard(finish)
        return True

    def is_completed(self):
        def poll():
            if not self._done and self._poll():
                self._complete()

        if not self._done:
            # A poll, never a wait: while an operation holds the group
            # (a queued collective may run for long), say what is known.
            self._group._guard(poll, wait=False)
        return self._done

    def is_success(self):
        return self._done

    def get_future(self):
        if not self._done:
            # Completion needs this side to drive the link: a future that
            # nobody drives would never be set.
            self.wait()
        return self._future

    def result(self):
        return self._result


def _completed(outputs: list) -> dist._Work:
    future = future_for(outputs)
    future.set_result(outputs)
    return torch._C._distributed_c10d._create_work_from_future(future)


class ProcessGroupBarlink(dist.ProcessGroup):
    """torch.distributed over barlink links; see the module's docstring."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._timeout = timeout.total_seconds() if timeout is not None else 1800.0
        self._peer_timeout = _env_float("BARLINK_PEER_TIMEOUT", 10.0)
        chunk = _env_size("BARLINK_CHUNK_BYTES", "1M")
        if chunk % 64:
            raise ValueError(f"BARLINK_CHUNK_BYTES={chunk} must be a multiple of 64 bytes")
        self._chunk = chunk
        self._seq = 0
        self._p2p_sent = [0] * size
        self._p2p_received = [0] * size
        # Receives posted by irecv and not yet taken, per peer, in order.
        self._pending = [deque() for _ in range(size)]
        self._failed = None
        self._lock = threading.RLock()
        self._place = None
        self._order = list(range(size))
        self._links = self._link_all(store)
        self._position_of = [0] * size
        for position, ranked in enumerate(self._order):
            self._position_of[ranked] = position
        self._position = self._position_of[rank]
        self._stop = threading.Event()
        self._keepalive = threading.Thread(
            target=self._keep_alive, name="barlink-keepalive", daemon=True
        )
        self._keepalive.start()
        self._ops = OperationQueue(f"barlink-ops-{rank}")

    # -- setup ---------------------------------------------------------

    def _link_all(self, store):
        rank, size = self._rank, self._size
        self._place = _placement.own_place(_host_id())
        if size == 1:
            return [None]
        transport = os.environ.get("BARLINK_TORCH_TRANSPORT", "auto")
        if transport not in ("auto", "tcp"):
            raise ValueError(f"BARLINK_TORCH_TRANSPORT={transport!r} is not auto or tcp")
        store.set(f"barlink/place/{rank}", json.dumps(self._place))
        if rank == 0:
            store.set("barlink/job", uuid.uuid4().hex[:16])
            # Rank 0's choice rules: ranks that ordered their rings apart
            # would each wait on a neighbour that sends elsewhere.
            store.set("barlink/ring", os.environ.get("BARLINK_TORCH_RING", _placement.TOPOLOGY))
        job = store.get("barlink/job").decode()
        ring = store.get("barlink/ring").decode()
        places = [json.loads(store.get(f"barlink/place/{r}")) for r in range(size)]
        hosts = [place["host"] for place in places]
        self._order = _placement.ring_order(places, ring)

        def remote(peer: int) -> bool:
            return transport == "tcp" or hosts[peer] != hosts[rank]

        # Every pair's lower rank accepts. For a peer on another host it
        # listens on a free port and publishes where; all of it is
        # published before anyone reads, so no rank waits on another's
        # reading.
        prefix = "tcp://" if transport == "tcp" else ""
        plan = {}
        for peer in range(rank + 1, size):
            if remote(peer):
                port = _free_port()
                host = "127.0.0.1" if hosts[peer] == hosts[rank] else _own_address()
                store.set(f"barlink/addr/{rank}-{peer}", f"{host}:{port}")
                plan[peer] = (f"{prefix}0.0.0.0:{port}", "accept")
            else:
                plan[peer] = (f"local:bltorch-{job}-{rank}-{peer}", "accept")
        for peer in range(rank):
            if remote(peer):
                where = store.get(f"barlink/addr/{peer}-{rank}").decode()
                plan[peer] = (f"{prefix}{where}", "connect")
            else:
                plan[peer] = (f"local:bltorch-{job}-{peer}-{rank}", "connect")
        options = {"peer_timeout": self._peer_timeout}

        def link(peer: int):
            name, role = plan[peer]
            try:
                return barlink.connect(name, role, timeout=min(self._timeout, 300.0), **options)
            except barlink.SetupError as error:
                raise barlink.SetupError(
                    f"rank {rank} linking to rank {peer} ({name}, {role}): {error}"
                ) from error

        peers = sorted(plan)
        links = [None] * size
        with ThreadPoolExecutor(max_workers=len(peers)) as pool:
            for peer, made in zip(peers, pool.map(link, peers)):
                links[peer] = made
        return links

    @property
    def ring_order(self) -> list:
        """The ranks in the order the rings run (see BARLINK_TORCH_RING)."""
        return list(self._order)

    @property
    def place(self) -> dict:
        """Where this rank sits: host, NUMA node, the PCI path down to its
        GPU, and how that GPU was found."""
        return dict(self._place) if self._place else {}

    def link_paths(self) -> dict:
        """The path each peer's link took, and why (`barlink.Link.path`)."""
        return {r: link.path for r, link in enumerate(self._links) if link is not None}

    def _keep_alive(self):
        """Drives every link now and then, so a rank answers each peer
        within its peer timeout also while it computes, or while an
        operation waits on other links. Without the group's lock: a link
        serializes its own use, and a round of progress leaves what
        arrived for the operation that takes it."""
        period = self._peer_timeout / 5
        while not self._stop.wait(period):
            for link in self._links:
                if link is None:
                    continue
                try:
                    link.progress()
                except Exception:
                    pass  # closed or failed: the next operation says why

    # -- torch.distributed plumbing ------------------------------------

    def getBackendName(self):
        return "barlink"

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def __repr__(self):
        return f"ProcessGroupBarlink(rank={self._rank}, size={self._size})"

    # torch registers a backend written as a ProcessGroup as the group
    # itself, with no per-device backend behind it, yet asks the group for
    # one (init_process_group(device_id=...), batch_isend_irecv): this
    # group is its own backend for the devices it takes.
    supports_splitting = False
    supports_coalescing = False
    # Asked by torch.compile's cost model and FSDP2 of the group's backend.
    _supports_time_estimate = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device):
        return False

    # torch keeps a group's name and description in its backends, which a
    # group that is its own backend lacks ("ProcessGroup name not set"
    # when a subgroup is destroyed): this group keeps them itself.
    def _set_group_name(self, name):
        self._barlink_group_name = name

    @property
    def group_name(self):
        return getattr(self, "_barlink_group_name", "")

    def _set_group_desc(self, desc):
        self._barlink_group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_barlink_group_desc", "")

    def _get_backend(self, device):
        kind = torch.device(device).type
        if kind not in DEVICES:
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def _seconds(self, timeout=None) -> float:
        if timeout is None:
            return self._timeout
        if hasattr(timeout, "total_seconds"):
            seconds = timeout.total_seconds()
            return seconds if seconds > 0 else self._timeout
        return float(timeout)

    def _guard(self, body, what: str = "", wait: bool = True):
        """Runs `body` with the group's lock; on failure closes every link
        and remembers why, so later operations raise it at once. Without
        `wait`, a lock held elsewhere (an operation running) skips `body`
        and returns None."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if self._failed is not None:
                raise barlink.LinkFailed(f"the process group failed earlier: {self._failed}")
            try:
                return body()
            except BaseException as error:
                # Bad arguments are refused before anything moves; any
                # other failure leaves the links out of step.
                refused = isinstance(error, (ValueError, TypeError))
                if refused and not isinstance(error, barlink.Mismatch):
                    raise
                self._failed = f"{what}{': ' if what else ''}{type(error).__name__}: {error}"
                self._abort()
                raise
        finally:
            self._lock.release()

    def _close_links(self, timeout: float):
        for link in self._links:
            if link is not None:
                try:
                    link.close(timeout=timeout)
                except Exception:
                    pass  # closing what failed: nothing more to say

    def _abort(self):
        # Briefly: the peers learn it from the close, or from the silence.
        self._close_links(0.1)

    def shutdown(self):
        self._stop.set()
        self._ops.stop()
        with self._lock:
            self._failed = self._failed or "the group was shut down"
            self._close_links(2.0)

    def abort(self):
        # Without the lock, which a stuck collective holds: closing its
        # links is what ends it (a link serializes its own use).
        self._stop.set()
        self._ops.stop()
        self._failed = self._failed or "aborted"
        self._abort()

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def link(self, peer: int):
        peer %= self._size
        return self._links[peer]

    def at(self, offset: int):
        """The link to the rank `offset` places along the ring from this
        one (the ring follows `ring_order`)."""
        return self._links[self._order[(self._position + offset) % self._size]]

    def rank_at(self, offset: int) -> int:
        """The rank `offset` places along the ring from this one."""
        return self._order[(self._position + offset) % self._size]

    def rank_of(self, link) -> int:
        for rank, candidate in enumerate(self._links):
            if candidate is link:
                return rank
        return -1

    def drain(self, peer: int):
        """Takes the receives irecv posted from `peer` before anything else
        reads that link."""
        pending = self._pending[peer % self._size]
        while pending:
            pending[0].wait()

    def tag(self, op: str, tensor=None, extra: str = "") -> bytes:
        """The descriptor every rank of one collective must agree on."""
        if tensor is None:
            return f"{op}#{self._seq}{extra}".encode()
        return f"{op}#{self._seq} {str(tensor.dtype)[6:]}x{tensor.numel()}{extra}".encode()

    def next_seq(self):
        self._seq += 1

    def _collective(self, name, body, outputs=(), opts=None, staging=None):
        """Runs a collective: queued for the group's thread when the
        caller asked for `async_op` (see `_queue`), else on the calling
        thread once the queued ones have run (a handoff to the thread
        and back costs a small collective more than its transfer). Its
        Work's future holds `outputs`, the tensors it wrote: DDP's
        gradient hook reads them there. `staging` holds the host
        stand-ins of CUDA tensors: filled when the collective runs, and
        copied back once `body` ran."""

        def run():
            for peer in range(self._size):
                self.drain(peer)
            try:
                if staging is not None:
                    if staging.current_device is not None and self._ops.is_current():
                        # The caller's device, for what this thread allocates
                        # (a future's callbacks run here).
                        torch.cuda.set_device(staging.current_device)
                    staging.copy_in()
                body()
                if staging is not None:
                    staging.copy_back()
            finally:
                self.next_seq()

        if self._failed is not None:
            raise barlink.LinkFailed(f"the process group failed earlier: {self._failed}")
        # torch sets asyncOp from the caller's async_op (its default, as
        # in the options DDP's gradient hook passes, is true); an older
        # torch has no such option. A collective called from the group's
        # thread (a future's callback, as PowerSGD's hook makes) runs
        # there at once: queued behind what that thread runs, it would
        # wait for itself.
        if getattr(opts, "asyncOp", True) and not self._ops.is_current():
            work = QueuedWork(self, name, list(outputs))
            work.start(self._ops, lambda: self._guard(run, name))
            return work
        self._settle()
        self._guard(run, name)
        return _completed(list(outputs))

    def _settle(self):
        """Lets the queued collectives run before a point-to-point call
        touches the links: every rank's messages enter a link in the
        order its caller made the calls."""
        self._ops.settle(self._timeout)

    @staticmethod
    def _reduce_op(opts) -> str:
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        for known, name in _REDUCE_OPS.items():
            if op == known:
                return name
        raise ValueError(f"the barlink backend cannot reduce with {op}: it takes SUM, AVG, "
                         "PRODUCT, MIN, MAX, BAND, BOR, BXOR")

    @staticmethod
    def _one(tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"{what}: the barlink backend takes one tensor per rank, not {len(tensors)}")
        return tensors[0]

    # -- collectives -----------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "all_reduce")
        op = self._reduce_op(opts)
        average = opts is not None and opts.reduceOp == dist.ReduceOp.AVG
        staging = Staging("all_reduce")
        host = staging.host(tensor)
        return self._collective(
            "all_reduce",
            lambda: algo.all_reduce(self, host, op, average),
            [tensor],
            opts=opts,
            staging=staging,
        )

    def allreduce_coalesced(self, tensors, opts=None):
        op = self._reduce_op(opts)
        average = opts is not None and opts.reduceOp == dist.ReduceOp.AVG
        staging = Staging("all_reduce_coalesced")
        hosts = staging.hosts(tensors)

        def body():
            for host in hosts:
                algo.all_reduce(self, host, op, average)
                self.next_seq()

        return self._collective("all_reduce_coalesced", body, tensors, opts=opts, staging=staging)

    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        root = _root(opts)
        staging = Staging("broadcast")
        # Only the root's values leave; every other rank's are overwritten.
        host = staging.host(tensor, read=self._rank == root, written=self._rank != root)
        return self._collective(
            "broadcast",
            lambda: algo.broadcast(self, host, root),
            [tensor],
            opts=opts,
            staging=staging,
        )

    def reduce(self, tensors, opts=None):
        tensor = self._one(tensors, "reduce")
        op = self._reduce_op(opts)
        average = opts is not None and opts.reduceOp == dist.ReduceOp.AVG
        root = _root(opts)
        staging = Staging("reduce")
        host = staging.host(tensor, written=self._rank == root)
        return self._collective(
            "reduce",
            lambda: algo.reduce(self, host, op, average, root),
            [tensor],
            opts=opts,
            staging=staging,
        )

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise ValueError("all_gather: the barlink backend takes one list of outputs per rank")
        outputs = output_tensors[0]
        staging = Staging("all_gather")
        host = staging.host(tensor, written=False)
        host_outputs = staging.hosts(outputs, read=False)
        return self._collective(
            "all_gather",
            lambda: algo.all_gather(self, host_outputs, host),
            outputs,
            opts=opts,
            staging=staging,
        )

    def all_gather_single(self, output, input, opts=None):
        staging = Staging("all_gather_into_tensor")
        host = staging.host(input, written=False)
        host_output = staging.host(output, read=False)
        return self._collective(
            "all_gather_into_tensor",
            lambda: algo.all_gather_into(self, host_output, host),
            [output],
            opts=opts,
            staging=staging,
        )

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        output = self._one(output_tensors, "reduce_scatter")
        inputs = input_tensors[0]
        op = self._reduce_op(opts)
        average = opts is not None and opts.reduceOp == dist.ReduceOp.AVG
        staging = Staging("reduce_scatter")
        host_output = staging.host(output, read=False)
        host_inputs = staging.hosts(inputs, written=False)
        return self._collective(
            "reduce_scatter",
            lambda: algo.reduce_scatter(self, host_output, host_inputs, op, average),
            [output],
            opts=opts,
            staging=staging,
        )

    def reduce_scatter_single(self, output, input, opts=None):
        op = self._reduce_op(opts)
        average = opts is not None and opts.reduceOp == dist.ReduceOp.AVG
        staging = Staging("reduce_scatter_tensor")
        host_output = staging.host(output, read=False)
        host = staging.host(input, written=False)
        return self._collective(
            "reduce_scatter_tensor",
            lambda: algo.reduce_scatter_into(self, host_output, host, op, average),
            [output],
            opts=opts,
            staging=staging,
        )

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        staging = Staging("all_to_all_single")
        host_output = staging.host(output, read=False)
        host = staging.host(input, written=False)
        return self._collective(
            "all_to_all_single",
            lambda: algo.all_to_all_single(
                self, host_output, host, list(output_split_sizes), list(input_split_sizes)
            ),
            [output],
            opts=opts,
            staging=staging,
        )

    def alltoall(self, output_tensors, input_tensors, opts=None):
        staging = Staging("all_to_all")
        host_outputs = staging.hosts(output_tensors, read=False)
        host_inputs = staging.hosts(input_tensors, written=False)
        return self._collective(
            "all_to_all",
            lambda: algo.all_to_all(self, host_outputs, host_inputs),
            output_tensors,
            opts=opts,
            staging=staging,
        )

    # torch 2.11 and older call these by their former names.
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._collective("barrier", lambda: algo.barrier(self), opts=opts)

    # -- point to point --------------------------------------------------

    def send(self, tensors, dst: int, tag: int):
        tensor = self._one(tensors, "send")
        self._check_peer(dst, "send")
        # A CUDA tensor's values are taken once the queued calls ran; the
        # host copy is sent in place and lives as long as the requests.
        staging = Staging("send")
        host = staging.host(tensor, written=False)
        self._settle()
        staging.copy_in()

        def post():
            n = self._p2p_sent[dst]
            self._p2p_sent[dst] += 1
            return algo.post_send(self, dst, host, f"p2p#{n} tag{tag}")

        requests = self._guard(post)

        def finish(seconds):
            # Acknowledged in order: the last one completes them all.
            last = requests[-1]
            deadline = time.monotonic() + seconds
            # The peer may be waiting, before it takes this message, for a
            # receive posted here: take those while waiting.
            while any(self._pending):
                if last.test():
                    return
                for pending in self._pending:
                    if pending:
                        pending[0].is_completed()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"send to rank {dst}: not acknowledged within {seconds} s")
            last.wait(timeout=max(0.0, deadline - time.monotonic()))

        def poll():
            return requests[-1].test()

        return _Work(self, finish, poll, [tensor])

    def recv(self, tensors, src: int, tag: int):
        tensor = self._one(tensors, "recv")
        self._check_peer(src, "recv")
        staging = Staging("recv")
        host = staging.host(tensor, read=False)
        self._settle()
        n = self._p2p_received[src]
        self._p2p_received[src] += 1
        receive = algo.Receive(self, src, host, f"p2p#{n} tag{tag}")
        pending = self._pending[src]

        def earlier_done(wait: bool) -> bool:
            # Receives from one peer are taken in the order they were posted.
            for earlier in list(pending):
                if earlier is work:
                    return True
                if wait:
                    earlier.wait()
                elif not earlier.is_completed():
                    return False
            return True

        def finish(seconds):
            earlier_done(wait=True)
            receive.wait(seconds)
            pending.remove(work)
            staging.copy_back()

        def poll():
            if earlier_done(wait=False) and receive.test():
                pending.remove(work)
                staging.copy_back()
                return True
            return False

        work = _Work(self, finish, poll, [tensor])
        pending.append(work)
        return work

    def recv_anysource(self, tensors, tag: int):
        raise ValueError(
            "recv from any source is not offered by the barlink backend: name the source rank"
        )

    def _check_peer(self, peer: int, what: str):
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(
                f"{what}: rank {peer} is not another rank of this group of {self._size}"
            )


def _root(opts) -> int:
    return 0 if opts is None else opts.rootRank


def create(store, rank, size, timeout):
    """The backend's constructor, as torch.distributed calls it."""
    return ProcessGroupBarlink(store, rank, size, timeout)
