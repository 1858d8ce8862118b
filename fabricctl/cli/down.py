"""`fabricctl down`: stop the running broker and wait until it is gone.

Contract: the `down` command (`command`) asks the broker of the data dir (found as every
client command finds it) to stop: in-flight batches finish, LMDB closes. It then waits, at
most `DOWN_WAIT_S`, until the broker's socket stops answering and its owner lock
(`broker.lock`) is free; still running after that is `FabricTimeout` (exit 4). No broker
is `BackendMissing` (exit 3). Nothing is written on stdout.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fabricctl.cli.support import ConfigFile, DataDir, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.errors import BackendMissing, FabricTimeout
from fabricctl.wire.client import Client

DOWN_WAIT_S = 30.0


def command(data_dir: Path | None = DataDir, config: Path | None = ConfigFile) -> None:
    """Stop the broker: in-flight batches finish, LMDB closes. Exit status 3 if none runs."""
    cfg = settings(data_dir, config)
    guarded(lambda: down(cfg))


async def _down(cfg: AppConfig) -> None:
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-down")
    try:
        await client.shutdown()
    finally:
        await client.close()
    deadline = time.monotonic() + DOWN_WAIT_S
    while time.monotonic() < deadline:
        if not await _answers(cfg) and _lock_free(cfg.data_dir / "broker.lock"):
            return
        await asyncio.sleep(0.1)
    raise FabricTimeout(f"the broker at {cfg.data_dir} is still running {DOWN_WAIT_S:g} s "
                        "after being asked to stop")


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
