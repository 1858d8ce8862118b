"""`fabricctl down`: stop the running broker and wait until it is gone.

Contract: the `down` command (`command`) asks the broker of the data dir (found as every
client command finds it) to stop: it hands out no more batches, every consumer, its own and
remote agents alike, finishes the batches it holds, LMDB closes. `down` waits as long as
the broker drains (`[server] drain_s`, the one setting both read) plus `CLOSE_S` for the
engines to stop and LMDB to close, until the broker's socket stops answering and its owner
lock (`broker.lock`) is free; still running after that is `FabricTimeout` (exit 4). No
broker is `BackendMissing` (exit 3). When the stop sent work back to the lanes (a consumer
that left holding batches: unreachable, or not done within drain_s), `down` says on stderr,
per consumer, how many batches and items went back and why, from the broker's report
(`server.departures.read_report`); the exit status is 0 all the same: the broker stopped, and
the work runs again when a broker serves the data dir. Nothing is written on stdout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from fabricctl.cli.support import ConfigFile, DataDir, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.errors import BackendMissing, FabricTimeout
from fabricctl.server.departures import Departure, read_report
from fabricctl.wire.client import Client

CLOSE_S = 30.0  # after the drain: engines stop (a vLLM server has 30 s after SIGTERM), LMDB


def command(data_dir: Path | None = DataDir, config: Path | None = ConfigFile) -> None:
    """Stop the broker: in-flight batches finish, LMDB closes. Exit status 3 if none runs."""
    cfg = settings(data_dir, config)
    guarded(lambda: down(cfg))


def departure_note(d: Departure) -> str:
    """One line of what the stop sent back for a consumer, and why."""
    heard = "" if d.last_heard_s is None else f"; last heard from {d.last_heard_s:g} s before"
    batches = f"{d.batches} batch{'es' if d.batches != 1 else ''}"
    return (f"fabricctl: note: {d.consumer} left holding work: {batches} "
            f"({d.items} items) sent back to their lanes ({d.why}{heard}); they run again "
            "when a broker serves this data dir")


async def _down(cfg: AppConfig) -> None:
    asked = time.time()
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-down")
    try:
        await client.shutdown()
    finally:
        await client.close()
    wait_s = cfg.server.drain_s + CLOSE_S
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not await _answers(cfg) and _lock_free(cfg.data_dir / "broker.lock"):
            report = read_report(cfg.data_dir, asked)
            for d in [] if report is None else report.departures:
                print(departure_note(d), file=sys.stderr)
            return
        await asyncio.sleep(0.1)
    raise FabricTimeout(f"the broker at {cfg.data_dir} is still running {wait_s:g} s "
                        f"after being asked to stop (server.drain_s {cfg.server.drain_s:g} "
                        f"s + {CLOSE_S:g} s)")


async def _answers(cfg: AppConfig) -> bool:
    try:
        probe = await Client.connect(cfg.data_dir, "observer", "fabricctl-down", timeout=2.0)
    except BackendMissing:
        return False
    except Exception:  # a broker on its way down may answer oddly: still there
        return True
    await probe.close()
    return True


def _lock_free(path: Path) -> bool:
    """Whether no process holds the data dir's owner lock (the broker holds it until exit)."""
    import fcntl
    import os

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops a lock we took
    return True


def down(cfg: AppConfig) -> None:
    asyncio.run(_down(cfg))
