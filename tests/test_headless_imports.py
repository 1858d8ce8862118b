"""The broker and the CLI entry must start without the TUI stack (servers run headless)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import fabricctl.core.broker, fabricctl.core.snapshot, fabricctl.cli.app
print(json.dumps(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))))
"""


def test_core_and_cli_do_not_import_textual() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_the_probe_would_see_textual() -> None:
    probe = "import sys, textual; print('textual' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "True"
