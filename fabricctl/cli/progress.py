"""The progress line of `fabricctl submit`: for a person watching stderr, never for pipes.

Contract: `ProgressView(total)` is a context manager and a callable; the submitter calls it
with itself after every chunk and ack. It draws (Rich, on stderr) from the first call on,
at most ten times a second: bytes read against the input's size when known, lines accepted
(and skipped: stored by an earlier run of the job), refused (when any) and, with --wait,
results written, their rate since the first one and the ETA of the rest at that rate. One
line at any width: the counts are cut with an ellipsis before the line wraps.
`input_size(fp)` is that size for a regular file and None for pipes.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from rich.console import Console


class Submitting(Protocol):
    """What the view reads of `submit.Submitter` (a protocol: submit imports this module)."""

    lines: int
    accepted: int
    rejected: int
    written: int
    bytes_read: int
    wait: bool
    skipped: int
    first_result: float | None  # time.monotonic() of the first result written


    def done(self) -> bool: ...


def input_size(fp: BinaryIO) -> int | None:
    """The size of a regular file, for a progress bar with a total; None for pipes."""
    try:
        st = os.fstat(fp.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


class ProgressView:
    """Why: people watching a long submit see it move; pipes and logs get nothing."""

    def __init__(self, total: int | None, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        self.p = Progress(BarColumn(bar_width=16), DownloadColumn(),
                          TimeElapsedColumn(),
                          TextColumn("{task.description}", table_column=Column(
                              ratio=1, no_wrap=True, overflow="ellipsis")),
                          console=console or Console(stderr=True), transient=False, expand=True)
        self.task = self.p.add_task("", total=total)
        self._last = 0.0
        self._started = False

    def __enter__(self) -> ProgressView:
        return self  # drawn from the first tick on, so a failed connect leaves no bar

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self.p.stop()

    def __call__(self, s: Submitting) -> None:
        if not self._started:
            self._started = True
            self.p.start()
        now = time.monotonic()
        if now - self._last < 0.1 and not s.done():
            return
        self._last = now
        desc = f"{s.accepted:,} in"
        if s.rejected:
            desc += f", {s.rejected:,} refused"
        if s.skipped:
            desc += f", {s.skipped:,} stored before"
        if s.wait:
            desc += f", {s.written:,} results"
            desc += rate_and_eta(s.written, s.accepted + s.skipped, s.first_result, now)
        self.p.update(self.task, completed=s.bytes_read, description=desc)


def rate_and_eta(written: int, expected: int, first: float | None, now: float) -> str:
    """`, R/s, ETA T` once results flow (the rate since the first result), else ""."""
    if first is None or written < 2 or now <= first:
        return ""
    from fabricctl.fmt import age

    rate = (written - 1) / (now - first)
    left = max(0, expected - written)
    eta = f", ETA {age(left / rate)}" if rate > 0 and left else ""
    return f", {rate:,.0f}/s{eta}" if rate >= 100 else f", {rate:,.1f}/s{eta}"


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
