"""barlink: messages between processes and nodes, cut into packets with a
CRC-32C on each, retransmitted until they are through, and delivered once,
intact and in order -- or an exception that says why not.

    import barlink
    with barlink.connect("local:demo", role="accept") as link:
        print(link.path)            # which path, and why
        data = link.recv(timeout=5)

Peers are named as on every face of barlink: ``local:NAME`` (a process on
this host, over shared memory), ``rdma://HOST:PORT``, ``tcp://HOST:PORT``,
or ``HOST:PORT`` (RDMA where this host has it, else TCP).
"""

import json as _json
import sys as _sys

from . import _barlink
from ._barlink import (
    Exchange,
    LinkClosed,
    LinkFailed,
    Link,
    Message,
    Mismatch,
    PeerLost,
    Request,
    SetupError,
    __version__,
    combine,
    connect,
)
from .aio import AsyncLink, connect_async

__all__ = [
    "AsyncLink",
    "Exchange",
    "Link",
    "LinkClosed",
    "LinkFailed",
    "Message",
    "Mismatch",
    "PeerLost",
    "Request",
    "SetupError",
    "__version__",
    "combine",
    "connect",
    "connect_async",
    "cpu",
    "doctor",
    "topology",
]


def topology(sysfs_root: str = "/") -> dict:
    """The PCI topology as ``barlink topo --json`` prints it: GPUs, NICs,
    the links between them and the path barlink would take per pair."""
    return _json.loads(_barlink.topology_json(sysfs_root))


def doctor(sysfs_root: str = "/") -> dict:
    """The platform checks of ``barlink doctor --json`` (ACS, IOMMU, BAR
    sizes, peer-to-peer paths, authentication of remote links)."""
    return _json.loads(_barlink.doctor_json(sysfs_root))


def cpu() -> dict:
    """This CPU's model and vector features, the copy and CRC kernels
    barlink chose on it, and ``build``: how this package's extension was
    built, ``"release"`` (what ``pip install`` gives) or ``"debug"`` (a
    development build, whose figures are not barlink's speed). Benchmark
    reports name them."""
    return _json.loads(_barlink.cpu_json())


def _warn_unless_release(program: str) -> str:
    """Says on stderr, for a benchmark, that a development build's figures
    are not barlink's speed; returns the build ``cpu()`` names."""
    build = cpu().get("build", "unknown")
    if build != "release":
        print(f"{program}: this barlink is a {build} build: its figures are not barlink's "
              "speed (pip install ./python builds a release one)", file=_sys.stderr)
    return build
