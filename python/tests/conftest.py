import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

PEER = Path(__file__).with_name("peer.py")
_names = itertools.count()


@pytest.fixture
def name() -> str:
    """A link name no other test uses."""
    return f"local:pytest-{os.getpid()}-{next(_names)}"


@pytest.fixture
def spawn():
    """Starts `peer.py MODE PEER ARGS...` and kills what is left at the end."""
    started = []

    def start(*args: str, stdout=None, stdin=None) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(PEER), *map(str, args)], stdout=stdout, stdin=stdin, text=True
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
