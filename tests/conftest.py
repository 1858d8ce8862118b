"""Shared test setup: every test starts with Python's own SIGINT handler in this process.

Some library a real-engine test loads into the pytest process can leave SIGINT ignored, and
an ignored signal is inherited by every child process: a `fabricctl` command started by a
later test (`results --follow`, which stops on Ctrl-C like any Python program) would then
ignore the test's SIGINT and the test would wait out its timeout. A shell does the same to
background jobs; the tests stand for a user at a terminal.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sigint_as_at_a_terminal() -> Iterator[None]:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
