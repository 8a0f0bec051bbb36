"""barlink as a torch.distributed backend.

    import torch.distributed as dist
    import barlink.torch  # registers the backend "barlink"

    dist.init_process_group("barlink", init_method="env://")
    dist.all_reduce(tensor)

Ranks find each other through the torch Store and link every pair over the
path ``barlink.connect`` picks (shared memory between processes of one
host; RDMA or TCP between hosts, authenticated by the pre-shared key in
``BARLINK_PSK_FILE``), so every message of every collective travels in
CRC-checked packets and is retransmitted until intact. Operations take CPU
tensors, and CUDA tensors through pinned host memory (copied to the host
when the call is made, and back when it completes).

Tunables, read when a group is made:

- ``BARLINK_PEER_TIMEOUT`` (seconds, default 10): how long a silent rank
  may stay silent before the others' operations fail with an error naming
  it. A background thread drives every link, so a rank is never taken
  for dead while it computes or while an operation waits on other links.
- ``BARLINK_CHUNK_BYTES`` (default 1M; 256K, 4M, ... or bytes): the pipeline's chunk.
- ``BARLINK_TORCH_TRANSPORT`` (``auto`` or ``tcp``): ``tcp`` links every
  pair over TCP, on one host too.
- ``BARLINK_TORCH_ADDR``: the address ranks on other hosts reach this one
  at (default: the interface that routes to ``MASTER_ADDR``).
- ``BARLINK_TORCH_RING`` (``topology`` or ``rank``): the rings run with
  ranks of one host, NUMA node and PCIe switch next to each other
  (default), or in rank order. ``BARLINK_TORCH_GPU`` names this rank's
  GPU (PCI address or ``barlink topo`` index; default: the current CUDA
  device if initialized, else ``LOCAL_RANK``). See docs/TORCH.md.
"""

import torch.distributed as _dist

from ._group import ProcessGroupBarlink, create
from ._staging import DEVICES

__all__ = ["ProcessGroupBarlink", "create"]

if "barlink" not in _dist.Backend.backend_list:
    # One backend object serves both device types. NCCL stays CUDA's
    # default: only groups made with "barlink" (or "cuda:barlink") use it.
    _dist.Backend.register_backend("barlink", create, devices=list(DEVICES))
