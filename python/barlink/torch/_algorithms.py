"""The collectives' algorithms over a group's links, each step one
``barlink.Exchange``.

Large reductions run as a ring (reduce-scatter, then all-gather: each rank
sends and receives 2(n-1)/n of the tensor, the bandwidth optimum); small
ones on a power-of-two group by recursive doubling (log2 n steps, the
latency optimum). Broadcast walks a binomial tree; all-to-all pairs ranks
off step by step. Rings, doubling pairs and the broadcast tree follow the
group's ``ring_order`` (ranks near each other in the machine adjacent),
not rank numbers. Within a step the tensor moves in chunks, so the peer
writes the next chunk while this rank combines the last; a ring's steps
run as one ``Exchange.chain``, each chunk going on to the next step as
soon as it arrived. Combining is
done in Rust (``barlink._barlink.combine``), never element by element in
Python. Every result is computed once and copied, so all ranks hold
bitwise the same values.
"""

import time

import numpy as np
import torch

import barlink

# At or below this many bytes, a power-of-two group reduces by recursive
# doubling rather than around the ring.
SMALL = 64 << 10

_REDUCIBLE = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def reducible(tensor) -> str:
    name = _REDUCIBLE.get(tensor.dtype)
    if name is None:
        raise ValueError(
            f"the barlink backend cannot reduce {tensor.dtype} tensors: it reduces "
            + ", ".join(sorted(_REDUCIBLE.values()))
        )
    return name


# Dtypes numpy takes as they are: their tensors become byte views through
# numpy, which costs half of going through torch's views.
_NUMPY_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool,
})


def raw(tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, as a numpy view of its memory."""
    if tensor.dtype in _NUMPY_DTYPES and not tensor.requires_grad:
        return tensor.numpy().reshape(-1).view(np.uint8)
    flat = tensor.detach().reshape(-1)
    if flat.numel() <= 1:
        # Contiguous whatever its stride, which torch's byte view refuses.
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8).numpy()


class Out:
    """A tensor a collective writes, worked on in contiguous memory and
    copied back at the end if it was not contiguous."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.work = tensor if tensor.is_contiguous() else tensor.contiguous()
        self.bytes = raw(self.work)

    def done(self):
        if self.work is not self.tensor:
            self.tensor.copy_(self.work)


def _wait(pg, exchange, send_to, recv_from):
    try:
        exchange.wait(timeout=pg._timeout)
    except (barlink.LinkFailed, barlink.Mismatch, TimeoutError) as error:
        # Say which ranks: the link's own text knows only its name.
        ranks = []
        if send_to is not None:
            ranks.append(f"sending to rank {pg.rank_of(send_to)}")
        if recv_from is not None:
            ranks.append(f"receiving from rank {pg.rank_of(recv_from)}")
        raise type(error)(f"rank {pg._rank}, {' and '.join(ranks)}: {error}") from error


def _run(pg, send_to=None, send_buf=None, recv_from=None, recv_buf=None, **kw):
    exchange = barlink.Exchange(send_to, send_buf, recv_from, recv_buf, chunk=pg._chunk, **kw)
    _wait(pg, exchange, send_to, recv_from)


def _ring(pg, steps, **kw):
    """The steps of a ring (send_buf, recv_buf, combines) as one chain:
    each step sends on what the step before received, chunk by chunk as
    it arrives, so the steps overlap instead of waiting for each other.
    A group of one has no steps, and no links to name."""
    if not steps:
        return
    right, left = pg.at(1), pg.at(-1)
    exchange = barlink.Exchange.chain(right, left, steps, chunk=pg._chunk, **kw)
    _wait(pg, exchange, right, left)


def _average(tensor, n: int):
    if tensor.is_floating_point():
        tensor.div_(n)
    else:
        tensor.div_(n, rounding_mode="trunc")


def _check(condition: bool, what: str):
    if not condition:
        raise ValueError(what)


def _segments(nbytes: int, esize: int, n: int):
    count = nbytes // esize
    return [count * i // n * esize for i in range(n + 1)]


def ring_all_reduce(pg, buf, esize: int, op: str, dtype: str, tag: bytes):
    # Segments are numbered by place in the ring, not by rank.
    n, r = pg._size, pg._position
    bounds = _segments(buf.nbytes, esize, n)

    def seg(i):
        i %= n
        return buf[bounds[i] : bounds[i + 1]]

    reduce_scatter = [(seg(r - s), seg(r - s - 1), True) for s in range(n - 1)]
    all_gather = [(seg(r + 1 - s), seg(r - s), False) for s in range(n - 1)]
    _ring(pg, reduce_scatter + all_gather, reduce=(op, dtype), tag=tag + b" ring")


def doubling_all_reduce(pg, buf, op: str, dtype: str, tag: bytes):
    # Partners by place in the ring: the first, most frequent pairs are
    # ring neighbours, the nearest in the machine.
    n, p = pg._size, pg._position
    k = 1
    while k < n:
        link = pg.at((p ^ k) - p)
        # The peer's values are combined into buf while buf is on its way
        # out: send a snapshot.
        _run(pg, link, buf.copy(), link, buf, reduce=(op, dtype), tag=tag + b" rd%d" % k)
        k <<= 1


def all_reduce(pg, tensor, op: str, average: bool):
    dtype = reducible(tensor)
    _check(not average or tensor.dtype != torch.bool, "AVG of bool tensors is not defined")
    n = pg._size
    if n > 1:
        out = Out(tensor)
        tag = pg.tag("all_reduce", tensor, " " + op)
        if out.bytes.nbytes <= SMALL and n & (n - 1) == 0:
            doubling_all_reduce(pg, out.bytes, op, dtype, tag)
        else:
            ring_all_reduce(pg, out.bytes, tensor.element_size(), op, dtype, tag)
        out.done()
    if average:
        _average(tensor, n)


def broadcast(pg, tensor, root: int):
    n = pg._size
    _check(0 <= root < n, f"broadcast: root {root} is not a rank of this group of {n}")
    if n == 1:
        return
    out = Out(tensor)
    tag = pg.tag("broadcast", tensor, f" root{root}")
    # A binomial tree over places in the ring: a subtree's ranks sit
    # together, so the last, most numerous hops are between neighbours.
    relative = (pg._position - pg._position_of[root]) % n
    mask = 1
    while mask < n:
        if relative & mask:
            _run(pg, recv_from=pg.at(-mask), recv_buf=out.bytes, tag=tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if relative + mask < n:
            _run(pg, pg.at(mask), out.bytes, tag=tag)
        mask >>= 1
    out.done()


def reduce(pg, tensor, op: str, average: bool, root: int):
    _check(0 <= root < pg._size, f"reduce: root {root} is not a rank of this group")
    # Every rank but the root keeps its input as it was.
    all_reduce(pg, tensor if pg._rank == root else tensor.clone(), op, average)


def _same(tensors, like, what: str):
    for t in tensors:
        _check(
            t.dtype == like.dtype and t.numel() == like.numel(),
            f"{what}: every tensor must have the input's dtype {like.dtype} and "
            f"{like.numel()} elements, not {t.dtype} with {t.numel()}",
        )


def _ring_gather(pg, seg, tag: bytes, own=None):
    """Each rank's own segment (`seg(rank)`) goes around the ring until
    all hold all. `own`, where given, are the bytes of this rank's segment,
    copied into it as they are sent (see `Exchange.chain`'s `fill`)."""
    n = pg._size
    if own is not None and n == 1:
        seg(pg._rank)[:] = own
        return
    kw = {} if own is None else {"fill": own}
    _ring(pg, [(seg(pg.rank_at(-s)), seg(pg.rank_at(-s - 1)), False) for s in range(n - 1)],
          tag=tag, **kw)


def _own_part(slot: np.ndarray, tensor, outputs) -> np.ndarray | None:
    """The bytes of `tensor` that an all-gather copies into this rank's
    `slot` of `outputs`: None where it needs no copy (an in-place gather)
    or was copied here already (`tensor` shares memory with the outputs,
    which the exchange writes)."""
    if holds_already(slot, tensor):
        return None
    # Resolved as copy_ would: a conjugate or negative view's bytes are
    # not its values.
    own = raw(tensor.resolve_conj().resolve_neg().contiguous())
    if any(np.may_share_memory(own, out) for out in outputs):
        slot[:] = own
        return None
    return own


def holds_already(slot: np.ndarray, tensor) -> bool:
    """Whether `tensor` is the memory of the byte view `slot`, start and
    length (an in-place gather, as FSDP's): then nothing is to be copied."""
    if not tensor.is_contiguous() or slot.nbytes != tensor.numel() * tensor.element_size():
        return False
    return slot.nbytes == 0 or _address(slot) == tensor.data_ptr()


def _address(view: np.ndarray) -> int:
    return view.__array_interface__["data"][0]


def all_gather(pg, outputs, tensor):
    n, r = pg._size, pg._rank
    _check(len(outputs) == n, f"all_gather: {len(outputs)} output tensors for {n} ranks")
    _same(outputs, tensor, "all_gather")
    outs = [Out(t) for t in outputs]
    own = _own_part(outs[r].bytes, tensor, [out.bytes for out in outs])
    _ring_gather(pg, lambda i: outs[i].bytes, pg.tag("all_gather", tensor), own)
    for out in outs:
        out.done()


def all_gather_into(pg, output, tensor):
    n, r = pg._size, pg._rank
    _check(
        output.dtype == tensor.dtype and output.numel() == n * tensor.numel(),
        f"all_gather_into_tensor: the output must hold {n} x {tensor.numel()} elements of "
        f"{tensor.dtype}, not {output.numel()} of {output.dtype}",
    )
    out = Out(output)
    size = tensor.numel() * tensor.element_size()

    def seg(i):
        return out.bytes[i * size : (i + 1) * size]

    own = _own_part(seg(r), tensor, [out.bytes])
    _ring_gather(pg, seg, pg.tag("all_gather_into_tensor", tensor), own)
    out.done()


def _ring_reduce_scatter(pg, part, out, op: str, dtype: str, tag: bytes):
    """Leaves in `out` (bytes, writable) the reduction over all ranks of
    their `part(rank)`, where `part(i)` are the bytes of this rank's input
    meant for rank i. The input is only read: each partial sum is combined
    into memory of its own (this rank's own in `out`, the others' in
    scratch), starting from this rank's part for it as each chunk
    arrives."""
    n, r = pg._size, pg._rank
    own = part(r)
    if n == 1:
        out[:] = own  # numpy copies overlapping memory as if through a buffer
        return
    if any(np.may_share_memory(out, part(i)) for i in range(n) if i != r):
        # `out` is memory another rank's part is read from: work apart.
        final = np.empty_like(out)
        _ring_reduce_scatter(pg, part, final, op, dtype, tag)
        out[:] = final
        return
    if out.nbytes == own.nbytes and (own.nbytes == 0 or _address(out) == _address(own)):
        start = True  # In place: `out` holds this rank's part already.
    elif np.may_share_memory(out, own):
        out[:] = own
        start = True
    else:
        start = own
    # The sums passed on combine in scratch, starting from this rank's part
    # for the rank each is for.
    targets = [(np.empty_like(out), part(pg.rank_at(-s - 2))) for s in range(n - 2)]
    targets.append((out, start))
    sends = [part(pg.rank_at(-1))] + [scratch for scratch, _ in targets[:-1]]
    _ring(pg, [(send, target, base) for send, (target, base) in zip(sends, targets)],
          reduce=(op, dtype), tag=tag)


def _reduce_scatter_parts(pg, output, part, op: str, what: str):
    """`output` = the reduction over the ranks of their `part(rank)`."""
    out = Out(output)
    _ring_reduce_scatter(pg, part, out.bytes, op, reducible(output), pg.tag(what, output, " " + op))
    out.done()


def _readable(tensor) -> np.ndarray:
    """The bytes of `tensor`'s values in order (a copy only where it is
    not contiguous or its bytes are not its values)."""
    return raw(tensor.resolve_conj().resolve_neg().contiguous())


def reduce_scatter(pg, output, inputs, op: str, average: bool):
    n = pg._size
    reducible(output)
    _check(not average or output.dtype != torch.bool, "AVG of bool tensors is not defined")
    _check(len(inputs) == n, f"reduce_scatter: {len(inputs)} input tensors for {n} ranks")
    _same(inputs, output, "reduce_scatter")
    parts = [_readable(t) for t in inputs]
    _reduce_scatter_parts(pg, output, lambda i: parts[i], op, "reduce_scatter")
    if average:
        _average(output, n)


def reduce_scatter_into(pg, output, tensor, op: str, average: bool):
    n = pg._size
    reducible(output)
    _check(not average or output.dtype != torch.bool, "AVG of bool tensors is not defined")
    _check(
        output.dtype == tensor.dtype and tensor.numel() == n * output.numel(),
        f"reduce_scatter_tensor: the input must hold {n} x {output.numel()} elements of "
        f"{output.dtype}, not {tensor.numel()} of {tensor.dtype}",
    )
    whole = _readable(tensor)
    size = whole.nbytes // n
    _reduce_scatter_parts(
        pg, output, lambda i: whole[i * size : (i + 1) * size], op, "reduce_scatter_tensor"
    )
    if average:
        _average(output, n)


def _splits(sizes, tensor, n: int, what: str):
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        _check(rows % n == 0, f"{what}: {rows} rows do not split evenly over {n} ranks")
        sizes = [rows // n] * n
    _check(len(sizes) == n and all(s >= 0 for s in sizes) and sum(sizes) == rows,
           f"{what}: split sizes {sizes} do not cover the {rows} rows over {n} ranks")
    row_bytes = (tensor.numel() // rows if rows else 0) * tensor.element_size()
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s * row_bytes)
    return offsets


def all_to_all_single(pg, output, tensor, output_splits, input_splits):
    n, r = pg._size, pg._rank
    _check(output.dtype == tensor.dtype, "all_to_all_single: input and output differ in dtype")
    send_at = _splits(input_splits, tensor, n, "all_to_all_single input")
    recv_at = _splits(output_splits, output, n, "all_to_all_single output")
    source = raw(tensor.contiguous())
    out = Out(output)

    def sent(i):
        return source[send_at[i] : send_at[i + 1]]

    def received(i):
        return out.bytes[recv_at[i] : recv_at[i + 1]]

    _check(sent(r).nbytes == received(r).nbytes,
           f"all_to_all_single: rank {r} sends itself {sent(r).nbytes} bytes but expects "
           f"{received(r).nbytes}")
    if np.may_share_memory(source, out.bytes):
        # In place: a part received must not overwrite one still to go.
        source = source.copy()
    received(r)[:] = sent(r)
    tag = pg.tag("all_to_all", None, " " + str(tensor.dtype)[6:])
    for k in range(1, n):
        to, frm = (r + k) % n, (r - k) % n
        _run(pg, pg.link(to), sent(to), pg.link(frm), received(frm), tag=tag + b" %d" % k)
    out.done()


def all_to_all(pg, outputs, inputs):
    n, r = pg._size, pg._rank
    _check(len(outputs) == n and len(inputs) == n,
           f"all_to_all: {len(inputs)} inputs and {len(outputs)} outputs for {n} ranks")
    outs = [Out(t) for t in outputs]
    sources = [raw(t.contiguous()) for t in inputs]
    _check(outs[r].bytes.nbytes == sources[r].nbytes,
           "all_to_all: this rank's own input and output differ in size")
    if any(np.may_share_memory(source, out.bytes) for source in sources for out in outs):
        sources = [source.copy() for source in sources]
    outs[r].bytes[:] = sources[r]
    tag = pg.tag("all_to_all", None)
    for k in range(1, n):
        to, frm = (r + k) % n, (r - k) % n
        _run(pg, pg.link(to), sources[to], pg.link(frm), outs[frm].bytes, tag=tag + b" %d" % k)
    for out in outs:
        out.done()


def barrier(pg):
    """A dissemination barrier: log2 n rounds of empty messages."""
    n, r = pg._size, pg._rank
    tag = pg.tag("barrier")
    k = 1
    while k < n:
        _run(pg, pg.link(r + k), np.empty(0, np.uint8), pg.link(r - k), np.empty(0, np.uint8),
             tag=tag + b" %d" % k)
        k <<= 1


def _post(pg, link, buf):
    deadline = time.monotonic() + pg._timeout
    while True:
        try:
            return link.post_send(buf)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"send: no room on the link for {pg._timeout} s") from None
            link.progress()


def _p2p_tag(label: str, tensor) -> bytes:
    return f"{label} {str(tensor.dtype)[6:]}x{tensor.numel()}".encode()


def post_send(pg, peer: int, tensor, label: str):
    """Queues the tensor to `peer` (read in place until acknowledged);
    the requests whose completion completes the send."""
    link = pg.link(peer)
    buf = raw(tensor.contiguous())
    requests = [_post(pg, link, _p2p_tag(label, tensor))]
    # In the chunks the receiving Exchange expects: each is copied out
    # while it is cache-hot, and the copy overlaps the next one's arrival.
    for start in range(0, buf.nbytes, pg._chunk):
        requests.append(_post(pg, link, buf[start : start + pg._chunk]))
    return requests


class Receive:
    """A receive posted by recv or irecv: taken when waited on or tested."""

    def __init__(self, pg, peer: int, tensor, label: str):
        self.pg, self.peer = pg, peer
        self.out = Out(tensor)
        self.exchange = barlink.Exchange(
            recv_from=pg.link(peer), recv_buf=self.out.bytes, chunk=pg._chunk,
            tag=_p2p_tag(label, tensor),
        )

    def _named(self, error):
        return type(error)(f"rank {self.pg._rank}, receiving from rank {self.peer}: {error}")

    def wait(self, seconds: float):
        try:
            self.exchange.wait(timeout=seconds)
        except (barlink.LinkFailed, barlink.Mismatch, TimeoutError) as error:
            raise self._named(error) from error
        self.out.done()

    def test(self) -> bool:
        try:
            done = self.exchange.test()
        except (barlink.LinkFailed, barlink.Mismatch) as error:
            raise self._named(error) from error
        if done:
            self.out.done()
        return done
