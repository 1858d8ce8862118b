"""Loopback ports for servers the tests start: drawn below the kernel's ephemeral range, so a
client socket elsewhere in the run (which the kernel numbers from that range) cannot take one
between the draw and the bind; each xdist worker draws from its own slice, so two workers never
draw the same port."""

from __future__ import annotations

import itertools
import os
import random
import socket

LOW, HIGH = 20000, 32000  # below 32768, where Linux starts numbering client sockets
SLICES = 8


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    width = (HIGH - LOW) // SLICES
    return range(LOW + index * width, LOW + (index + 1) * width)


_rng = random.Random()
_used: set[int] = set()


def free_port(n: int = 1) -> int:
    """A port p with p .. p+n-1 free on 127.0.0.1 now and not handed out before in this run."""
    span = _slice()
    for _ in itertools.repeat(None, 500):
        p = _rng.randrange(span.start, span.stop - n)
        block = range(p, p + n)
        if _used.intersection(block):
            continue
        try:
            socks = [socket.socket() for _ in block]
            try:
                for s, q in zip(socks, block, strict=True):
                    s.bind(("127.0.0.1", q))
            finally:
                for s in socks:
                    s.close()
        except OSError:
            continue
        _used.update(block)
        return p
    raise RuntimeError(f"no {n} free loopback port(s) in {span}")


def free_port_pair() -> int:
    """A port p with p and p+1 free (two servers standing in for two GPUs)."""
    return free_port(2)
