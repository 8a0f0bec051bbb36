"""Type stubs of the extension module (see barlink/__init__.py)."""

from os import PathLike
from typing import Optional, Sequence, Union

from collections.abc import Buffer

__version__: str

class SetupError(ConnectionError): ...
class LinkFailed(ConnectionError): ...
class PeerLost(LinkFailed): ...
class LinkClosed(LinkFailed): ...
class Mismatch(ValueError): ...

class Message:
    """A received message read in place (buffer protocol, read-only)."""

    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def tobytes(self) -> bytes: ...

class Request:
    """A posted send: complete when the peer acknowledged the message."""

    def test(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> None: ...

class Link:
    """A link to a peer: messages delivered once, intact and in order."""

    @property
    def path(self) -> str: ...
    @property
    def path_kind(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def send(self, buf: Buffer, timeout: Optional[float] = None) -> None: ...
    def post_send(self, buf: Buffer) -> Request: ...
    def recv(self, timeout: Optional[float] = None, copy: bool = True) -> Union[bytes, Message]: ...
    def recv_into(self, buf: Buffer, timeout: Optional[float] = None) -> int: ...
    def flush(self, timeout: Optional[float] = None) -> None: ...
    def progress(self) -> bool: ...
    def close(self, timeout: float = 5.0) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def __enter__(self) -> "Link": ...
    def __exit__(self, *exc: object) -> bool: ...

def connect(
    peer: str,
    role: str = "connect",
    timeout: float = 10.0,
    *,
    mtu: int = 131072,
    window: Optional[int] = None,
    max_message_bytes: int = 1 << 30,
    peer_timeout: float = 2.0,
    encrypt: bool = False,
    psk_file: Optional[Union[str, PathLike[str]]] = None,
    key_file: Optional[Union[str, PathLike[str]]] = None,
    peer_keys: Optional[Union[str, PathLike[str]]] = None,
    insecure: bool = False,
    allow_uids: Sequence[int] = (),
    allow_gids: Sequence[int] = (),
    allow_any_user: bool = False,
    path: Optional[str] = None,
    sysfs_root: Union[str, PathLike[str]] = "/",
    own_bar: Optional[str] = None,
    peer_bar: Optional[str] = None,
) -> Link: ...
class Exchange:
    """Sends `send_buf` over `send_to` while receiving exactly
    `len(recv_buf)` bytes over `recv_from`, in `chunk`-byte messages;
    with `reduce=(op, dtype)` each received chunk is combined into
    `recv_buf`. Nothing moves until `test` or `wait`."""

    def __init__(
        self,
        send_to: Optional[Link] = None,
        send_buf: Optional[Buffer] = None,
        recv_from: Optional[Link] = None,
        recv_buf: Optional[Buffer] = None,
        *,
        chunk: int = 1 << 20,
        reduce: Optional[tuple[str, str]] = None,
        tag: Optional[bytes] = None,
    ) -> None: ...
    @staticmethod
    def chain(
        send_to: Link,
        recv_from: Link,
        steps: Sequence[tuple[Buffer, Buffer, Union[bool, Buffer]]],
        *,
        chunk: int = 1 << 20,
        reduce: Optional[tuple[str, str]] = None,
        tag: Optional[bytes] = None,
        fill: Optional[Buffer] = None,
    ) -> "Exchange":
        """The steps of a ring as one exchange: each `(send_buf, recv_buf,
        combines)` sends over `send_to` while receiving over `recv_from`,
        and each step after the first sends the buffer the step before it
        received, every chunk as soon as it arrived (and was combined with
        `reduce`, where `combines`). `combines` may be a buffer as long
        as `recv_buf`: the step then combines starting from its values
        (`recv_buf = combines op received`, each chunk copied from it as
        it is combined), and no step may receive into it. With `fill`,
        the first step's bytes are copied from it into its `send_buf` a
        chunk at a time, each just before it goes."""
    def test(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> None: ...
    @property
    def done(self) -> bool: ...

def combine(dst: Buffer, src: Buffer, op: str, dtype: str) -> None:
    """`dst = dst op src` element by element (op: sum, product, min, max,
    band, bor, bxor; dtype: torch's names)."""

def topology_json(sysfs_root: Union[str, PathLike[str]] = "/") -> str: ...
def doctor_json(sysfs_root: Union[str, PathLike[str]] = "/") -> str: ...
def cpu_json() -> str: ...
