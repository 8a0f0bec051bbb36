"""asyncio, BAR windows named in text, and the platform documents every
face reports."""

import asyncio
import json
import os
import subprocess
import sys
import threading

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
    # And how the extension was built: scripts/python-test.sh says which
    # profile it built (dev: "debug").
    assert cpu["build"] in {"release", "debug"}
    assert cpu["build"] == os.environ.get("BARLINK_TEST_BUILD", cpu["build"])


def cpu_in_a_process_with(isa):
    """barlink.cpu() in a fresh interpreter with BARLINK_CPU_ISA=isa (the
    limit is read once per process): the report and what went to stderr."""
    env = dict(os.environ, BARLINK_CPU_ISA=isa)
    done = subprocess.run(
        [sys.executable, "-c", "import barlink, json; print(json.dumps(barlink.cpu()))"],
        env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout), done.stderr


def test_a_cpu_isa_limit_reaches_the_kernels():
    cpu, _ = cpu_in_a_process_with("portable")
    assert cpu["isa_limit"] == "portable"
    assert cpu["copy_crc_kernel"] == "copy, then crc-fast"


def test_a_cpu_isa_limit_that_names_none_is_ignored_with_a_warning():
    # A program with no logger of its own still hears of the typo.
    cpu, stderr = cpu_in_a_process_with("avx-512")
    assert cpu["isa_limit"] is None
    assert "BARLINK_CPU_ISA" in stderr and "avx2" in stderr, stderr


def bar_tree(root):
    """A sysfs tree of two devices whose BAR 2 files are ordinary files
    (mapped as BARs are); returns the window text of each."""
    windows = []
    for slot in range(2):
        bdf = f"0000:00:1{slot}.0"
        dev = root / "sys/bus/pci/devices" / bdf
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x1af4\n")
        (dev / "device").write_text("0x1110\n")
        (dev / "class").write_text("0x050000\n")
        empty = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
        start = 0xF000_0000 + slot * (16 << 20)
        lines = [empty] * 13
        lines[2] = f"{start:#018x} {start + (16 << 20) - 1:#018x} 0x000000000014220c"
        (dev / "resource").write_text("\n".join(lines) + "\n")
        with open(dev / "resource2", "wb") as f:
            f.truncate(16 << 20)
        windows.append(f"{bdf}/2@0+8M")
    return windows


def test_bar_windows_carry_a_link_between_two_threads(name, tmp_path):
    own, peer = bar_tree(tmp_path)
    got = {}

    def accept():
        try:
            with barlink.connect(
                name, "accept", 10.0, own_bar=peer, peer_bar=own, sysfs_root=tmp_path
            ) as link:
                got["path"] = link.path
                got["messages"] = [link.recv(timeout=10) for _ in range(3)]
                link.send(b"done")
                link.recv(timeout=10)
        except Exception as error:  # reported by the main thread
            got["error"] = error

    thread = threading.Thread(target=accept)
    thread.start()
    messages = [os.urandom(n) for n in (1, 100_000, 3 << 20)]
    with barlink.connect(
        name, "connect", 10.0, own_bar=own, peer_bar=peer, sysfs_root=tmp_path
    ) as link:
        assert link.path.startswith("bar-p2p: "), link.path
        for message in messages:
            link.send(message)
        assert link.recv(timeout=10) == b"done"
        link.send(b"bye")
        assert link.stats()["crc_failures"] == 0
    thread.join(timeout=20)
    assert "error" not in got, got.get("error")
    assert got["messages"] == messages
    assert got["path"].startswith("bar-p2p: ")


@pytest.mark.parametrize(
    "peer, bars, match",
    [
        ("local:x", dict(own_bar="0000:00:10.0/2+8M"), "peer_bar is not"),
        ("local:x", dict(peer_bar="0000:00:10.0/2+8M"), "own_bar is not"),
        (
            "local:x",
            dict(own_bar="0000:00:10.0", peer_bar="0000:00:11.0/2+8M"),
            "DEVICE/BAR@OFFSET",
        ),
        (
            "tcp://127.0.0.1:1",
            dict(own_bar="0000:00:10.0/2+8M", peer_bar="0000:00:11.0/2+8M"),
            "another node",
        ),
    ],
)
def test_bad_bar_windows_are_value_errors(peer, bars, match):
    with pytest.raises(ValueError, match=match):
        barlink.connect(peer, "connect", 1.0, **bars)


def test_a_bad_rdma_setting_in_the_environment_is_a_value_error(monkeypatch):
    monkeypatch.setenv("BARLINK_GID_INDEX", "x")
    with pytest.raises(ValueError, match='BARLINK_GID_INDEX="x"'):
        barlink.connect("local:x", "connect", 1.0)
