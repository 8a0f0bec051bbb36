"""Where a rank sits in the machine, and the ring order that follows it.

A ring moves every byte over every hop, so it runs at the pace of its
slowest hop, and each boundary it crosses (between hosts, NUMA nodes, host
bridges, PCIe switches) it crosses at least twice. Ordering the ring so
that ranks of one host, then of one NUMA node, then whose GPUs share a
host bridge and a switch sit next to each other makes it cross each
boundary only that twice, as NCCL orders its rings by PCI distance.

A rank's GPU is the one named by ``BARLINK_TORCH_GPU`` (a PCI address, or
an index in ``barlink topo``'s GPU list), else the current CUDA device
when this process already initialized CUDA, else GPU ``LOCAL_RANK`` of
the host (through ``CUDA_VISIBLE_DEVICES`` when that lists indices)
among its NVIDIA GPUs in PCI bus order: CUDA's order under
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and its default one on hosts of
identical GPUs. (CUDA does not count other display controllers, such as
a server's BMC VGA, which ``barlink topo`` lists.) A rank without a GPU is placed by the NUMA node its CPUs
are on. ``BARLINK_SYSFS_ROOT`` reads another machine's sysfs (a fixture,
or a copy), as ``barlink topo`` does.
"""

import os

import barlink

# BARLINK_TORCH_RING values.
TOPOLOGY, RANK = "topology", "rank"
# The PCI vendor of the GPUs CUDA numbers.
NVIDIA = "0x10de"


def _sysfs_root() -> str:
    return os.environ.get("BARLINK_SYSFS_ROOT") or "/"


def _cpus(cpulist: str) -> set:
    """The CPUs of a kernel cpulist ("0-3,8,10-11")."""
    cpus = set()
    for part in cpulist.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _cpu_numa_node(root: str) -> int:
    """The NUMA node holding most of the CPUs this process may run on, or
    -1 when the nodes are not readable."""
    nodes = os.path.join(root, "sys/devices/system/node")
    try:
        names = [n for n in os.listdir(nodes) if n.startswith("node") and n[4:].isdigit()]
        mine = os.sched_getaffinity(0)
        best, best_count = -1, 0
        for name in sorted(names, key=lambda n: int(n[4:])):
            with open(os.path.join(nodes, name, "cpulist")) as f:
                count = len(_cpus(f.read()) & mine)
            if count > best_count:
                best, best_count = int(name[4:]), count
        return best
    except (OSError, ValueError):
        return -1


def _pci_address(text: str) -> str:
    """A PCI address with its domain ("1a:00.0" -> "0000:1a:00.0")."""
    text = text.strip().lower()
    return text if text.count(":") == 2 else "0000:" + text


def _cuda_gpu_address():
    """The PCI address of the current CUDA device, if this process already
    initialized CUDA (never initializes it: the backend runs on CPU)."""
    import torch

    try:
        if not torch.cuda.is_initialized():
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        domain, bus, device = props.pci_domain_id, props.pci_bus_id, props.pci_device_id
    except (AttributeError, RuntimeError, AssertionError):
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def _own_gpu(gpus: list, unread: str = ""):
    """This rank's GPU among `gpus` (``barlink topo``'s list) and how it
    was found, or (None, why not). `unread` says why the list may be
    empty."""
    named = os.environ.get("BARLINK_TORCH_GPU")
    if named:
        also = f"; {unread}" if unread else ""
        if named.isdigit():
            index = int(named)
            if index < len(gpus):
                return gpus[index], f"BARLINK_TORCH_GPU={named}"
            raise ValueError(
                f"BARLINK_TORCH_GPU={named}: this host has {len(gpus)} GPUs "
                f"(see `barlink topo`{also})"
            )
        address = _pci_address(named)
        for gpu in gpus:
            if gpu["bdf"] == address:
                return gpu, f"BARLINK_TORCH_GPU={named}"
        raise ValueError(
            f"BARLINK_TORCH_GPU={named}: no GPU at {address} (see `barlink topo`{also})"
        )
    address = _cuda_gpu_address()
    if address is not None:
        for gpu in gpus:
            if gpu["bdf"] == address:
                return gpu, "the current CUDA device"
    local = os.environ.get("LOCAL_RANK")
    cuda_gpus = [gpu for gpu in gpus if gpu.get("vendor") == NVIDIA]
    if local is not None and local.isdigit() and cuda_gpus:
        index = int(local)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            listed = [v.strip() for v in visible.split(",") if v.strip()]
            if not all(v.isdigit() for v in listed) or index >= len(listed):
                return None, "CUDA_VISIBLE_DEVICES does not list GPU indices"
            index = int(listed[index])
        if index < len(cuda_gpus):
            return cuda_gpus[index], f"LOCAL_RANK={local}"
    if local is not None and gpus and not cuda_gpus:
        return None, (
            f"LOCAL_RANK={local} counts NVIDIA GPUs (CUDA's numbering) and this host has "
            "none: name the GPU with BARLINK_TORCH_GPU"
        )
    return None, "no GPU named (BARLINK_TORCH_GPU, CUDA, LOCAL_RANK)"


def own_place(host: str) -> dict:
    """This rank's place: its host, NUMA node, the PCI path from its host
    bridge down to its GPU (empty without one), and how the GPU was found."""
    root = _sysfs_root()
    place = {"host": host, "numa": -1, "path": [], "gpu": None, "why": ""}
    gpus = []
    try:
        gpus = [g for g in barlink.topology(root).get("gpus", []) if g.get("bdf")]
    except Exception as error:  # noqa: BLE001 - the order only costs speed
        place["why"] = f"topology not readable: {error}"
    gpu, why = _own_gpu(sorted(gpus, key=lambda g: g["bdf"]), place["why"])
    if gpu is not None:
        place["gpu"] = gpu["bdf"]
        place["numa"] = gpu.get("numa_node") if gpu.get("numa_node") is not None else -1
        bridges = gpu.get("upstream_bridges") or []
        place["path"] = [gpu.get("host_bridge") or "", *bridges, gpu["bdf"]]
    else:
        place["numa"] = _cpu_numa_node(root)
    place["why"] = place["why"] or why
    return place


def ring_order(places: list, how: str = TOPOLOGY) -> list:
    """The ranks in ring order: by host (hosts in the order of their first
    rank), then NUMA node, then PCI path, then rank; or by rank."""
    if how == RANK:
        return list(range(len(places)))
    if how != TOPOLOGY:
        raise ValueError(f"BARLINK_TORCH_RING={how!r} is not {TOPOLOGY!r} or {RANK!r}")
    first_rank = {}
    for rank, place in enumerate(places):
        first_rank.setdefault(place["host"], rank)

    def key(rank):
        place = places[rank]
        return (first_rank[place["host"]], place["numa"], place["path"], rank)

    return sorted(range(len(places)), key=key)
