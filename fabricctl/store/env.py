"""The one LMDB environment under a data dir: opening, the owner lock, map growth, full disk.

Contract: `StoreEnv.write(fn)` runs `fn(txn)` in one durable write transaction (LMDB's default
full sync, no writemap) and returns its result; when the map fills it grows the map (doubling,
up to `map_ceiling`) and runs `fn` again, so `fn` must only write through `txn`. Past the
ceiling, or on an I/O error such as ENOSPC, it raises `StoreFullError` naming the data dir and
its free space; the failed transaction wrote nothing. A write that drains the store
(`drain=True`: completions, recovery) may grow the map past the ceiling by `headroom`, so a
store that ingest filled can always complete, delete segments and so make room again.
Only one process may own a data dir.

A write can also be split in two: `stage(fn)` begins the transaction and runs `fn` (growing
the map as `write` does), and `finish(txn)` commits it, possibly on another thread (LMDB lets
go of the GIL for the whole commit: its page writes and syncs). The owner lock above makes
this process the only one using the environment, so LMDB's own lock table is off
(`lock=False`): nothing ties a write transaction to its thread, and the caller keeps single
writer discipline. That needs one rule, kept by every caller: a read transaction never stays
open across an `await` (or any point where the next write may begin); a reader then only ever
sees the newest snapshot, whose pages no writer reuses.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lmdb

from fabricctl.errors import StoreFullError, StoreLockedError
from fabricctl.store.config import MiB
from fabricctl.store.faults import fault_point
from fabricctl.store.keys import DB_NAMES
from fabricctl.store.steps import Steps, run_steps

T = TypeVar("T")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _what(drain: bool) -> str:
    return "write refused" if drain else "ingest refused"


class Staged:
    """Why: a write transaction whose puts are done and whose commit may run elsewhere."""

    __slots__ = ("result", "txn")

    def __init__(self, txn: lmdb.Transaction, result: object) -> None:
        self.txn = txn
        self.result = result


class StoreEnv:
    """Why: every LMDB pitfall (map growth, ENOSPC, double open) handled in one place."""

    def __init__(
        self, data_dir: Path, map_size: int, map_ceiling: int
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data_dir / "broker.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreLockedError(f"another broker owns {self.data_dir}") from None
        self.map_ceiling = max(map_ceiling, map_size)
        self.headroom = max(self.map_ceiling // 8, 4 * MiB)  # drains only, past the ceiling
        self.env = lmdb.open(
            str(self.data_dir / "fabric.lmdb"), map_size=map_size, max_dbs=len(DB_NAMES) + 1,
            subdir=True, sync=True, metasync=True, writemap=False, readahead=True, lock=False,
        )
        self.dbs = {name.decode(): self.env.open_db(name) for name in DB_NAMES}
        self.grows = 0

    @property
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def used_bytes(self) -> int:
        return int((self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"])

    def free_disk(self) -> int:
        return shutil.disk_usage(self.data_dir).free

    def full_message(self, why: str, what: str = "ingest refused") -> str:
        return (f"{what}: {why}; data dir {self.data_dir} has "
                f"{human_bytes(self.free_disk())} free (map {human_bytes(self.map_size)}, "
                f"ceiling {human_bytes(self.map_ceiling)})")

    def grow(self, drain: bool = False) -> None:
        size = self.map_size
        limit = self.map_ceiling + (self.headroom if drain else 0)
        if size >= limit:
            what = "write refused" if drain else "ingest refused"
            raise StoreFullError(self.full_message("the LMDB map reached its ceiling", what))
        fault_point("map_grow")
        self.env.set_mapsize(min(size * 2, limit))
        self.grows += 1

    def write(self, fn: Callable[[lmdb.Transaction], T], drain: bool = False) -> T:
        while True:
            staged = self.stage(fn, drain)
            if self.finish(staged, drain):
                return staged.result  # type: ignore[return-value]
            self.grow(drain)

    def stage(self, fn: Callable[[lmdb.Transaction], T], drain: bool = False) -> Staged:
        """Begin a write transaction and run `fn` in it (not committed yet); the result of
        `fn` is on `.result`. A full map grows it and runs `fn` again."""
        return run_steps(self.stage_steps(lambda txn: _at_once(fn, txn), drain))

    def stage_steps(self, fn: Callable[[lmdb.Transaction], Steps[T]],
                    drain: bool = False) -> Steps[Staged]:
        """`stage`, pausing where `fn` pauses: the transaction stays open across the pauses
        (the writer's own; reads meanwhile see the last commit). Closing the steps early
        aborts it."""
        while True:
            txn = self.env.begin(write=True)
            try:
                result = yield from fn(txn)
                return Staged(txn, result)
            except lmdb.MapFullError:
                txn.abort()
                self.grow(drain)
            except lmdb.Error as e:
                txn.abort()
                raise StoreFullError(self.full_message(f"LMDB write failed ({e})",
                                                       _what(drain))) from e
            except BaseException:
                txn.abort()
                raise

    def finish(self, staged: Staged, drain: bool = False) -> bool:
        """Commit a staged transaction (any thread); False: the map filled while committing:
        `grow` it (on the thread that stages) and stage again."""
        try:
            staged.txn.commit()
        except lmdb.MapFullError:
            return False
        except lmdb.Error as e:
            raise StoreFullError(self.full_message(f"LMDB write failed ({e})",
                                                   _what(drain))) from e
        return True

    def drop_mapped_pages(self) -> bool:
        """Unmap every page of the map from this process (Linux); returns whether it did.

        Why: reading through LMDB's read-only map makes the kernel map the neighbours of each
        page touched too (fault-around), so a scan such as recovery leaves the process
        holding tens of MB of clean page cache in its RSS. MADV_DONTNEED on a read-only
        shared file mapping only drops those mappings: the pages stay cached and the next
        read faults them back in, so this is safe at any time, even inside a read txn.
        """
        if not sys.platform.startswith("linux"):
            return False
        path = os.path.realpath(self.data_dir / "fabric.lmdb" / "data.mdb")
        spans = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].rstrip("\n") == path:
                        lo, hi = (int(x, 16) for x in fields[0].split("-"))
                        spans.append((lo, hi - lo))
        except OSError:
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return bool(spans) and all(libc.madvise(lo, n, 4) == 0 for lo, n in spans)  # DONTNEED

    def read(self, buffers: bool = False) -> lmdb.Transaction:
        """A fresh, short read transaction (never hold one: it pins pages); with `buffers`
        its reads are zero-copy memoryviews, valid only until the cursor moves."""
        if buffers:
            return self.env.begin(write=False, buffers=True)
        return self.env.begin(write=False)

    def close(self) -> None:
        """Close the environment and let go of the data dir (a second call does nothing)."""
        if self._lock_fd < 0:
            return
        self.env.close()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = -1


def _at_once(fn: Callable[[lmdb.Transaction], T], txn: lmdb.Transaction) -> Steps[T]:
    result = fn(txn)
    yield from ()  # a generator with no pause
    return result
