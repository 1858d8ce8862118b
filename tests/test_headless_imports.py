"""The broker and the CLI entry must start without the TUI stack (servers run headless), and
a headless command (every command but `top`) imports nothing of `fabricctl.tui` at all: the
formatting they share with the dashboard lives below both (`fabricctl.fmt`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_helpers import clean_env

PROBE = """
import json, sys
import fabricctl.core.broker, fabricctl.core.snapshot, fabricctl.cli.app
print(json.dumps(sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))))
"""

# Every command module but `top` imported, the lazily imported formatting paths called, and
# three commands run through the root app (no broker: each ends with exit 3 after trying).
HEADLESS = """
import importlib, json, pkgutil, sys
import fabricctl.cli
from typer.testing import CliRunner

for m in pkgutil.iter_modules(fabricctl.cli.__path__):
    if m.name != "top":
        importlib.import_module("fabricctl.cli." + m.name)
from fabricctl.cli.app import app
from fabricctl.cli.progress import rate_and_eta
from fabricctl.cli.replay import results_table

rate_and_eta(10, 20, 0.0, 5.0)
results_table({}, "probe")
codes = [CliRunner().invoke(app, [*cmd.split(), "--data-dir", sys.argv[1]]).exit_code
         for cmd in ("status", "shapes list", "jobs list")]
{extra}
tui = sorted(m for m in sys.modules if m == "fabricctl.tui" or m.startswith("fabricctl.tui."))
print(json.dumps({"codes": codes, "tui": tui}))
"""


def probe(code: str, tmp_path: Path, *args: str) -> object:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True, timeout=120, cwd=tmp_path, env=clean_env(tmp_path))
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_core_and_cli_do_not_import_textual(tmp_path: Path) -> None:
    assert probe(PROBE, tmp_path) == []


def test_the_probe_would_see_textual() -> None:
    probe = "import sys, textual; print('textual' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "True"


def test_headless_commands_import_nothing_of_the_tui(tmp_path: Path) -> None:
    doc = probe(HEADLESS.replace("{extra}", ""), tmp_path, str(tmp_path / "no-broker"))
    assert doc == {"codes": [3, 3, 3], "tui": []}


def test_the_headless_probe_would_see_the_tui(tmp_path: Path) -> None:
    code = HEADLESS.replace("{extra}", "import fabricctl.tui.render")  # what `top --once` loads
    doc = probe(code, tmp_path, str(tmp_path / "no-broker"))
    assert isinstance(doc, dict) and "fabricctl.tui.render" in doc["tui"]
