"""The event loop the broker daemon runs on.

Contract: `run(coro)` runs a coroutine to completion, as `asyncio.run` does, on uvloop when it
is installed (a dependency everywhere but Windows), else on asyncio's own loop; `loop_name()`
says which loop is running. Only the daemon's process uses it: clients, the dashboard and the
tests keep asyncio's loop, and the server code uses nothing that differs between the two.

Why: the broker is one event loop serving every socket, and at saturation the loop's own work
(polling, transports, callbacks) is a tenth of its time; uvloop does it in C.
`bench/e2e_bench.py --loop asyncio` measures the difference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], prefer_uvloop: bool = True) -> T:
    """Run `coro` on a new event loop (uvloop when installed and preferred)."""
    if prefer_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def loop_name() -> str:
    """The running loop's implementation: "uvloop" or "asyncio"."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
