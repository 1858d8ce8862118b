"""Process telemetry through psutil for the broker itself and its engine children.

Contract:
- `ProcMonitor` holds named pids (`watch(name, pid)`, `unwatch(name)`); `sample()` returns
  one `ProcSample` per name, in watch order, and never raises: a process that exited, was
  reaped, is a zombie, or whose pid was reused by another process reads `alive=False` with
  its stats None; one we may not inspect (AccessDenied) reads alive with the unknown stats None.
- `cpu_percent` is the CPU use since the previous sample of that name (or since `watch`,
  which primes psutil's counter), as psutil reports it: 100.0 = one core busy.
- `sample_process(name, pid)` is the one-shot form (its cpu_percent is None: no interval).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import psutil


class ProcSample(msgspec.Struct, frozen=True, kw_only=True):
    """One watched process at one instant; stats are None when it is gone or unreadable."""

    name: str
    pid: int
    alive: bool
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    num_threads: int | None = None
    sampled_at: float = 0.0


def _open(pid: int) -> psutil.Process | None:
    """A psutil handle with its CPU counter primed, or None if the pid does not exist."""
    try:
        proc = psutil.Process(pid)
        proc.cpu_percent(interval=None)  # the first call only primes the counter
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _read(name: str, pid: int, proc: psutil.Process | None, now: float,
          with_cpu: bool) -> ProcSample:
    dead = ProcSample(name=name, pid=pid, alive=False, sampled_at=now)
    if proc is None:
        return dead
    try:
        # is_running() also compares create time, so a reused pid reads as not running
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return dead
        with proc.oneshot():
            cpu = proc.cpu_percent(interval=None) if with_cpu else None
            rss = proc.memory_info().rss
            threads = proc.num_threads()
        return ProcSample(name=name, pid=pid, alive=True, cpu_percent=cpu,
                          rss_bytes=int(rss), num_threads=int(threads), sampled_at=now)
    except psutil.NoSuchProcess:  # includes ZombieProcess
        return dead
    except psutil.AccessDenied:
        return ProcSample(name=name, pid=pid, alive=True, sampled_at=now)


def sample_process(name: str, pid: int, now: float | None = None) -> ProcSample:
    """One-shot reading of a pid (no CPU interval, so cpu_percent is None)."""
    at = time.time() if now is None else now
    try:
        proc: psutil.Process | None = psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        proc = None
    return _read(name, pid, proc, at, with_cpu=False)


class ProcMonitor:
    """Named pids (broker, engine children) sampled with CPU deltas; tolerant of exits."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._pids: dict[str, int] = {}
        self._procs: dict[str, psutil.Process | None] = {}
        self._latest: list[ProcSample] = []

    def watch(self, name: str, pid: int) -> None:
        """Watch `pid` under `name` (replacing what the name watched, e.g. after a restart)."""
        if self._pids.get(name) == pid and self._procs.get(name) is not None:
            return
        self._pids[name] = pid
        self._procs[name] = _open(pid)

    def unwatch(self, name: str) -> None:
        """Stop watching `name`; unknown names are ignored."""
        self._pids.pop(name, None)
        self._procs.pop(name, None)

    def watched(self) -> dict[str, int]:
        """Name -> pid of everything watched."""
        return dict(self._pids)

    def sample(self) -> list[ProcSample]:
        """One reading per watched name; never raises."""
        now = self.clock()
        out = [_read(name, pid, self._procs[name], now, with_cpu=True)
               for name, pid in self._pids.items()]
        self._latest = out
        return out

    def latest(self) -> list[ProcSample]:
        """The readings of the last `sample()` (empty before the first)."""
        return list(self._latest)
