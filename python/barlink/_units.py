"""Sizes as people write them: 64, 4K, 1M, 1.5G (K = 1024), with an
optional B or iB."""

import argparse
from decimal import Decimal, InvalidOperation

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
        size = Decimal(number) * UNITS[unit]
    except InvalidOperation:
        raise SizeError(f"{text!r} is not a size like 64, 4K, 1M") from None
    if not size.is_finite() or size < 1 or size != size.to_integral_value():
        raise SizeError(f"{text!r} is not a whole positive number of bytes")
    if size >= 1 << 63:
        raise SizeError(f"{text!r} is too large a size")
    return int(size)
