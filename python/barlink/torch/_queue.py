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

from ._staging import future_for


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

    def is_current(self) -> bool:
        """Whether the caller is this queue's thread."""
        return threading.current_thread() is self._thread

    def settle(self, seconds: float):
        """Waits until everything submitted so far has run (its errors are
        its own Works' to raise), for at most `seconds`. On the queue's own
        thread there is nothing to wait for: what it runs came first."""
        last = self._last
        if last is None or self.is_current():
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

    def __init__(self, group, name: str, outputs: list):
        super().__init__()
        self._group = group
        self._name = name
        self._outputs = outputs
        self._future = future_for(outputs)
        self._pending = None

    def start(self, queue: OperationQueue, call):
        """Queues `call`; its torch future is settled on the queue's thread
        before the Work counts as complete, so a caller that waited can
        read the future's value at once."""

        def run():
            try:
                call()
            except BaseException as error:
                self._future.set_exception(error)
                raise
            self._future.set_result(self._outputs)

        self._pending = queue.submit(run)

    def wait(self, timeout=None):
        seconds = self._group._seconds(timeout)
        try:
            self._pending.result(timeout=seconds)
        except _NotYet:
            raise TimeoutError(f"{self._name}: not complete within {seconds} s") from None
        return True

    def is_completed(self):
        # The torch future is settled first (see `start`): once it is, the
        # collective has run and its outputs are there to read.
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - the collective's own error
            return False
        return True

    def get_future(self):
        return self._future

    def result(self):
        return self._outputs
