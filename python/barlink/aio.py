"""barlink for asyncio: a Link's blocking calls run on worker threads
(they let the GIL go), so an event loop keeps serving while a message is
on its way.

    link = await barlink.connect_async("local:demo", role="accept")
    async with link:
        data = await link.recv()
        await link.send(b"reply")

Sends run in order on one thread and receives in order on another, so a
send and a receive can wait at the same time. Cancelling an awaited call
does not stop it: it runs to its end on its thread, a send reading its
buffer (a long writable one is read in place) and ``recv_into`` writing
its own until then; the next awaited call of the same kind (``flush`` for
sends) returns only after it.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from . import _barlink


class AsyncLink:
    """A :class:`barlink.Link` whose calls are awaitable."""

    def __init__(self, link: "_barlink.Link"):
        self.link = link
        self._sends = ThreadPoolExecutor(1, thread_name_prefix="barlink-send")
        self._recvs = ThreadPoolExecutor(1, thread_name_prefix="barlink-recv")

    @property
    def path(self) -> str:
        return self.link.path

    async def _run(self, pool: ThreadPoolExecutor, call, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, call, *args)

    async def send(self, buf, timeout: Optional[float] = None) -> None:
        """As :meth:`barlink.Link.send`."""
        await self._run(self._sends, self.link.send, buf, timeout)

    async def recv(self, timeout: Optional[float] = None, copy: bool = True):
        """As :meth:`barlink.Link.recv`."""
        return await self._run(self._recvs, self.link.recv, timeout, copy)

    async def recv_into(self, buf, timeout: Optional[float] = None) -> int:
        """As :meth:`barlink.Link.recv_into`."""
        return await self._run(self._recvs, self.link.recv_into, buf, timeout)

    async def flush(self, timeout: Optional[float] = None) -> None:
        """As :meth:`barlink.Link.flush`."""
        await self._run(self._sends, self.link.flush, timeout)

    def stats(self) -> dict:
        return self.link.stats()

    async def close(self, timeout: float = 5.0) -> None:
        """As :meth:`barlink.Link.close`; then the worker threads end."""
        try:
            await self._run(self._sends, self.link.close, timeout)
        finally:
            self._sends.shutdown(wait=False)
            self._recvs.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncLink":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def connect_async(peer: str, role: str = "connect", timeout: float = 10.0, **options) -> AsyncLink:
    """As :func:`barlink.connect`, awaitable; returns an :class:`AsyncLink`."""
    loop = asyncio.get_running_loop()
    link = await loop.run_in_executor(
        None, lambda: _barlink.connect(peer, role, timeout, **options)
    )
    return AsyncLink(link)
