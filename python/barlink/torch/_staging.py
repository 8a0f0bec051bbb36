"""CUDA tensors through host memory.

The links move host memory, so a collective or a point-to-point call on
CUDA tensors runs on pinned host stand-ins. When the call is made, an
event is recorded on the caller's current stream: the point in its
program the call stands at. When the call runs (at once, or on the
group's thread after the calls queued before it, which have written their
results back), it waits for that event and copies the tensors it reads to
the host; when it completes, before its Work does, it copies the tensors
it writes back to the device and waits for those copies. So the values
sent are those the program order gives, also for work queued on a side
stream or an asynchronous call's result, and once ``wait()`` returns, or
a future's callbacks run, the device tensors hold the results. Pinned
buffers come from torch's caching host allocator, so repeated calls of
one size allocate nothing.

Each CRC covers the bytes in host memory; the copies between device and
host lie outside it, as on ``barlink.gpu``'s staged route.
"""

import torch
from torch.futures import Future

# Device types the backend takes: host memory as it is, CUDA through host.
DEVICES = ("cpu", "cuda")


def _cuda_devices(tensors) -> list:
    return sorted({t.device for t in tensors if t.is_cuda}, key=lambda d: d.index)


def future_for(tensors) -> Future:
    """A future for a Work whose value is `tensors`: aware of their CUDA
    devices, so that a waiter's stream is ordered after its completion."""
    return Future(devices=_cuda_devices(tensors))


class Staging:
    """The host stand-ins of one call's tensors: which to fill from the
    device before the call runs, and which to copy back after."""

    def __init__(self, what: str):
        self._what = what
        self._read = []
        self._written = []
        # One stand-in per tensor object, as the call's algorithm would
        # find one tensor where it was passed twice.
        self._stand_ins = {}
        # Per CUDA device, the caller's place in its stream at the call.
        self._called = {}
        self.current_device = None

    def host(self, tensor, read: bool = True, written: bool = True):
        """`tensor` itself if it is in host memory, else a pinned host
        tensor of its shape and dtype, filled by `copy_in` if the call
        reads it and copied back by `copy_back` if the call writes it."""
        if not self._staged(tensor):
            return tensor
        cuda = tensor.device.type == "cuda"
        if cuda and tensor.device not in self._called:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))
            self._called[tensor.device] = event
            self.current_device = torch.cuda.current_device()
        stand_in, was_read, was_written = self._stand_ins.get(id(tensor), (None, False, False))
        if stand_in is None:
            stand_in = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=cuda)
        if read and not was_read:
            self._read.append((tensor, stand_in))
        if written and not was_written:
            self._written.append((tensor, stand_in))
        self._stand_ins[id(tensor)] = (stand_in, read or was_read, written or was_written)
        return stand_in

    def _staged(self, tensor) -> bool:
        """Whether `tensor` goes through a host stand-in. (The tests stage
        CPU tensors too, to check the path's ordering without a GPU.)"""
        kind = tensor.device.type
        if kind == "cpu":
            return False
        if kind != "cuda":
            raise ValueError(
                f"{self._what}: the barlink backend takes CPU and CUDA tensors, not {tensor.device}"
            )
        return True

    def hosts(self, tensors, read: bool = True, written: bool = True) -> list:
        return [self.host(t, read=read, written=written) for t in tensors]

    def _after_the_call(self):
        for event in self._called.values():
            event.synchronize()

    def copy_in(self):
        """Fills the stand-ins of the tensors the call reads, once the
        work queued before the call has run."""
        read, self._read = self._read, []
        if read:
            self._after_the_call()
        for device_tensor, stand_in in read:
            # To pinned memory and not asked otherwise: synchronous.
            stand_in.copy_(device_tensor)

    def copy_back(self):
        """Writes each written stand-in into its device tensor, once, and
        waits for the copies: a strided tensor's ends with a kernel."""
        written, self._written = self._written, []
        if not written:
            return
        self._after_the_call()
        for device_tensor, stand_in in written:
            device_tensor.copy_(stand_in)
        for device in _cuda_devices(t for t, _ in written):
            torch.cuda.current_stream(device).synchronize()
