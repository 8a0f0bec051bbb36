"""The thread a group's asynchronous collectives run on, in the order they
were called, so a caller that asked for ``async_op=True`` computes while
its collective moves (a DDP backward pass overlapping its gradient
buckets' all-reduces).

The links serialize their own use and the collectives' Rust calls release
the GIL, so the caller's thread runs meanwhile. A collective called
without ``async_op`` runs on the caller's thread instead, after the
queued ones (``OperationQueue.settle``): two thread wake-ups would cost a
small one more than its transfer.
"""

import queue
import threading
from concurrent.futures import Future as _Pending
from concurrent.futures import TimeoutError as _NotYet

import torch.distributed as dist
from torch.futures import Future


class OperationQueue:
    """One daemon thread running submitted calls in order. A daemon, so an
    interpreter that exits with a collective stuck on a dead peer does
    not wait for it (the call fails within the peer timeout anyway)."""

    def __init__(self, name: str):
        self._calls = queue.SimpleQueue()
        self._last = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            item = self._calls.get()
            if item is None:
                return
            call, pending = item
            if not pending.set_running_or_notify_cancel():
                continue
            try:
                pending.set_result(call())
            except BaseException as error:  # handed to whoever waits
                pending.set_exception(error)

    def submit(self, call) -> _Pending:
        pending = _Pending()
        self._last = pending
        self._calls.put((call, pending))
        return pending

    def settle(self, seconds: float):
        """Waits until everything submitted so far has run (its errors are
        its own Works' to raise), for at most `seconds`."""
        last = self._last
        if last is None:
            return
        try:
            last.exception(timeout=seconds)
        except _NotYet:
            raise TimeoutError(
                f"earlier collectives still running after {seconds} s"
            ) from None

    def stop(self):
        """Ends the thread once what was submitted has run."""
        self._calls.put(None)


class QueuedWork(dist._Work):
    """The Work of a collective on the queue: complete when it has run."""

    def __init__(self, group, name: str, pending: _Pending, outputs: list):
        super().__init__()
        self._group = group
        self._name = name
        self._pending = pending
        self._outputs = outputs
        self._future = Future()
        pending.add_done_callback(self._settle_future)

    def _settle_future(self, pending: _Pending):
        error = pending.exception()
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)

    def wait(self, timeout=None):
        seconds = self._group._seconds(timeout)
        try:
            self._pending.result(timeout=seconds)
        except _NotYet:
            raise TimeoutError(f"{self._name}: not complete within {seconds} s") from None
        return True

    def is_completed(self):
        return self._pending.done()

    def is_success(self):
        return self._pending.done() and self._pending.exception() is None

    def get_future(self):
        return self._future

    def result(self):
        return self._outputs
