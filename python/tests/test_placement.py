"""The ring order of the torch backend: ranks placed by host, NUMA node and
PCI path, read from fixture sysfs trees."""

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/python-test.sh installs it)")

from barlink.torch import _placement  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sysfs"
SERVER = str(FIXTURES / "server-8gpu-2socket")


def place(host, numa, *path):
    return {"host": host, "numa": numa, "path": list(path)}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("BARLINK_TORCH_GPU", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "BARLINK_SYSFS_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_ranks_of_one_socket_and_one_switch_sit_together():
    places = [
        place("a", 0, "pci0000:17", "sw0", "gpu0"),
        place("a", 1, "pci0000:85", "sw2", "gpu4"),
        place("a", 0, "pci0000:3a", "sw1", "gpu2"),
        place("a", 1, "pci0000:85", "sw2", "gpu5"),
        place("a", 0, "pci0000:17", "sw0", "gpu1"),
    ]
    assert _placement.ring_order(places) == [0, 4, 2, 1, 3]


def test_ranks_of_one_host_sit_together_hosts_in_order_of_their_first_rank():
    places = [place("b", 0), place("a", 0), place("b", 0), place("a", 0)]
    assert _placement.ring_order(places) == [0, 2, 1, 3]


def test_the_rank_order_can_be_asked_for_and_anything_else_is_refused():
    places = [place("b", 1), place("a", 0)]
    assert _placement.ring_order(places, "rank") == [0, 1]
    with pytest.raises(ValueError, match="BARLINK_TORCH_RING='numa'"):
        _placement.ring_order(places, "numa")


def test_a_gpu_named_by_index_or_address_gives_its_numa_node_and_path(clean_env):
    clean_env.setenv("BARLINK_SYSFS_ROOT", SERVER)
    clean_env.setenv("BARLINK_TORCH_GPU", "4")
    by_index = _placement.own_place("h")
    assert by_index["gpu"] == "0000:88:00.0" and by_index["numa"] == 1
    assert by_index["path"] == ["pci0000:85", "0000:85:00.0", "0000:86:00.0", "0000:87:08.0",
                                "0000:88:00.0"]
    clean_env.setenv("BARLINK_TORCH_GPU", "1b:00.0")
    by_address = _placement.own_place("h")
    assert by_address["gpu"] == "0000:1b:00.0" and by_address["numa"] == 0
    assert "BARLINK_TORCH_GPU" in by_address["why"]


def test_a_gpu_not_on_this_host_is_refused_with_what_to_check(clean_env):
    clean_env.setenv("BARLINK_SYSFS_ROOT", SERVER)
    clean_env.setenv("BARLINK_TORCH_GPU", "8")
    with pytest.raises(ValueError, match="has 8 GPUs"):
        _placement.own_place("h")
    clean_env.setenv("BARLINK_TORCH_GPU", "0000:99:00.0")
    with pytest.raises(ValueError, match="no GPU at 0000:99:00.0"):
        _placement.own_place("h")


def test_local_rank_picks_a_gpu_through_cuda_visible_devices(clean_env):
    clean_env.setenv("BARLINK_SYSFS_ROOT", SERVER)
    clean_env.setenv("LOCAL_RANK", "1")
    assert _placement.own_place("h")["gpu"] == "0000:1b:00.0"
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert _placement.own_place("h")["gpu"] == "0000:b2:00.0"
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-5c1d,GPU-77aa")
    unplaced = _placement.own_place("h")
    assert unplaced["gpu"] is None and "CUDA_VISIBLE_DEVICES" in unplaced["why"]


def test_local_rank_counts_only_the_gpus_cuda_numbers(clean_env):
    # A server's BMC VGA is a display controller too, first in PCI order;
    # CUDA does not number it, so LOCAL_RANK 0 is the first NVIDIA GPU.
    import barlink

    real = barlink.topology(SERVER)
    bmc = dict(real["gpus"][0], bdf="0000:03:00.0", vendor="0x1a03", name="BMC VGA")
    faked = dict(real, gpus=[bmc, *real["gpus"]])
    clean_env.setattr(_placement.barlink, "topology", lambda root: faked)
    clean_env.setenv("LOCAL_RANK", "0")
    assert _placement.own_place("h")["gpu"] == "0000:1a:00.0"
    clean_env.setenv("LOCAL_RANK", "7")
    assert _placement.own_place("h")["gpu"] == "0000:b2:00.0"
    # An index into barlink topo's list still counts every display device.
    clean_env.setenv("BARLINK_TORCH_GPU", "0")
    assert _placement.own_place("h")["gpu"] == "0000:03:00.0"


def test_a_rank_without_a_gpu_is_placed_by_its_cpus_numa_node(clean_env, tmp_path):
    nodes = tmp_path / "sys" / "devices" / "system" / "node"
    # This process may run on CPUs 0 and up: node 1 holds them.
    for node, cpus in ((0, "4000-4095"), (1, "0-3999")):
        (nodes / f"node{node}").mkdir(parents=True)
        (nodes / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    clean_env.setenv("BARLINK_SYSFS_ROOT", str(tmp_path))
    unplaced = _placement.own_place("h")
    assert unplaced["gpu"] is None and unplaced["path"] == []
    assert unplaced["numa"] == 1


def test_an_unreadable_topology_places_by_cpus_and_says_why(clean_env, tmp_path):
    clean_env.setenv("BARLINK_SYSFS_ROOT", str(tmp_path / "absent"))
    unplaced = _placement.own_place("h")
    assert unplaced["gpu"] is None and unplaced["numa"] == -1
    assert "topology not readable" in unplaced["why"]
    clean_env.setenv("BARLINK_TORCH_GPU", "0")
    with pytest.raises(ValueError, match="has 0 GPUs.*topology not readable"):
        _placement.own_place("h")


def test_a_real_gpu_is_placed_as_the_current_cuda_device_and_by_local_rank(clean_env):
    # Only a machine with an NVIDIA GPU (scripts/gpu-check.sh on a lent one)
    # checks that torch's PCI address of a device is the one barlink topo lists.
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    clean_env.setenv("LOCAL_RANK", "0")
    by_local_rank = _placement.own_place("h")
    assert by_local_rank["gpu"] is not None, by_local_rank["why"]
    assert by_local_rank["why"] == "LOCAL_RANK=0"
    torch.cuda.init()
    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    expected = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    current = _placement.own_place("h")
    assert current["why"] == "the current CUDA device", current
    assert current["gpu"] == expected == by_local_rank["gpu"]
    assert current["path"] and current["path"][-1] == expected
