"""The reliability suite (issue 10): faults in the broker, consumers, engines and disk.

Every scenario records a client-side history and checks it against the result sink
(tests/reliability/rel_history.py); the session ends with one line of totals: kills, faults
injected, items, lost, duplicated, unexpected (all three must be 0) and recovered.
FABRICCTL_RELIABILITY_KILLS raises the number of broker kills (default: the CI count).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent):  # rel_* helpers here; server_helpers & co. one level up
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from rel_history import TOTALS  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TOTALS.scenarios or TOTALS.kills:
        terminalreporter.write_line(TOTALS.line())
