"""asyncio, and the platform documents every face reports."""

import asyncio
import os

import pytest

import barlink


def test_asyncio_sends_and_receives_while_the_loop_runs(name, spawn):
    spawn("echo", name)

    async def main():
        link = await barlink.connect_async(name, "accept", 10.0, peer_timeout=10.0)
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        async with link:
            assert link.path.startswith("host-bounce")
            messages = [os.urandom(n) for n in (1, 1000, 1 << 20)]
            for message in messages:
                await link.send(message)
            got = [await link.recv(timeout=10) for _ in messages]
            assert got == messages
            buf = bytearray(100)
            await link.send(b"into")
            assert await link.recv_into(buf, timeout=10) == 4
            with pytest.raises(TimeoutError):
                await link.recv(timeout=0.2)
            assert link.stats()["messages_delivered"] == 4
        ticker.cancel()
        assert ticks > 20

    asyncio.run(main())


def test_topology_is_the_topo_document():
    topology = barlink.topology()
    assert isinstance(topology, dict)
    assert {"gpus", "nics"} <= set(topology)


def test_doctor_is_the_doctor_document():
    report = barlink.doctor()
    names = [check["id"] for check in report["checks"]]
    assert "remote-auth" in names
    for check in report["checks"]:
        assert check["status"] in {"PASS", "WARN", "FAIL", "SKIP"}


def test_a_missing_sysfs_root_is_an_os_error():
    with pytest.raises(OSError, match="topology"):
        barlink.topology("/nonexistent-sysfs-root")


def test_cpu_names_the_kernels():
    cpu = barlink.cpu()
    assert cpu["model"]
    assert cpu["copy_crc_kernel"]
