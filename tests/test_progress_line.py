"""`submit`'s progress line: one line at any width, the counts that matter first."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console

from fabricctl.cli.progress import ProgressView, rate_and_eta


@dataclass
class Sub:
    """Why: what the view reads of a submitter, set by hand."""

    lines: int = 10_000
    accepted: int = 10_000
    rejected: int = 0
    written: int = 10_000
    bytes_read: int = 43_200_000
    wait: bool = True
    skipped: int = 0
    first_result: float | None = None

    def done(self) -> bool:
        return True


def drawn(sub: Sub, width: int) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    with ProgressView(None, console=console) as view:
        view(sub)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def test_the_line_fits_80_columns_and_cuts_the_counts_last() -> None:
    for width in (80, 120, 60):
        lines = drawn(Sub(rejected=12, skipped=5), width)
        assert len(lines) == 1, lines
        assert len(lines[0]) <= width
        assert "43.2/? MB" in lines[0] and "10,000 in" in lines[0]
    wide = drawn(Sub(rejected=12, skipped=5), 120)[0]
    assert "10,000 in, 12 refused, 5 stored before, 10,000 results" in wide
    assert "…" in drawn(Sub(rejected=12, skipped=5), 60)[0]


def test_no_refused_count_when_none_was() -> None:
    line = drawn(Sub(), 120)[0]
    assert "refused" not in line and "10,000 in, 10,000 results" in line


def test_rate_and_eta() -> None:
    assert rate_and_eta(1, 10, 0.0, 1.0) == ""  # one result: no rate yet
    assert rate_and_eta(11, 20, 0.0, 2.0) == ", 5.0/s, ETA 1.8s"
    assert rate_and_eta(2_001, 2_001, 0.0, 2.0) == ", 1,000/s"  # done: no ETA
