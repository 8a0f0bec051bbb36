"""Sizes as people write them: 64, 4K, 1M, 1.5G (K = 1024), with an
optional B or iB."""

import argparse

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class SizeError(argparse.ArgumentTypeError, ValueError):
    """Not a size: argparse shows the message as it is, other callers
    catch a ValueError."""


def parse_size(text: str) -> int:
    """Bytes of `text`, a whole positive number of them."""
    cleaned = str(text).strip().upper().removesuffix("B").removesuffix("I")
    unit = cleaned[-1] if cleaned and cleaned[-1] in UNITS else ""
    number = cleaned[: len(cleaned) - len(unit)]
    try:
        size = float(number) * UNITS[unit]
    except ValueError:
        raise SizeError(f"{text!r} is not a size like 64, 4K, 1M") from None
    if not size >= 1 or size != int(size):
        raise SizeError(f"{text!r} is not a whole positive number of bytes")
    return int(size)
