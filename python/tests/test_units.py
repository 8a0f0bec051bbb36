"""Sizes as the benches and BARLINK_CHUNK_BYTES take them."""

import argparse

import pytest

from barlink._units import parse_size


@pytest.mark.parametrize(
    "text,size",
    [("64", 64), ("4K", 4096), ("4k", 4096), ("1M", 1 << 20), ("256KiB", 256 << 10),
     ("1.5K", 1536), ("2G", 2 << 30), (" 8MB ", 8 << 20),
     ("9007199254740993", 9007199254740993)],
)
def test_sizes_people_write_are_read(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "-5", "1.3", "", "x", "4X", "K", "inf", "1e400", "nanK"])
def test_anything_else_is_refused_for_argparse_and_for_other_callers(text):
    with pytest.raises(ValueError, match="size like|whole positive|too large"):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_the_chunk_size_of_the_torch_backend_takes_units(monkeypatch):
    pytest.importorskip("torch", reason="torch is not installed (scripts/python-test.sh installs it)")
    from barlink.torch import _group

    monkeypatch.setenv("BARLINK_CHUNK_BYTES", "256K")
    assert _group._env_size("BARLINK_CHUNK_BYTES", "1M") == 256 << 10
    monkeypatch.setenv("BARLINK_CHUNK_BYTES", "lots")
    with pytest.raises(ValueError, match="BARLINK_CHUNK_BYTES: 'lots' is not a size"):
        _group._env_size("BARLINK_CHUNK_BYTES", "1M")
