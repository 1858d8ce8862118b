"""The man pages: generated from the Typer app, committed, deterministic, lint-clean.

Promises checked: `scripts/gen_man.py` regenerates man/ byte for byte; every command and
subcommand has a page naming each of its options; every page has the hand-written
sections; `groff -man -ww -z` prints no warning (skipped only where groff is absent:
Debian package `groff-base`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ROOT

MAN = ROOT / "man"
GEN = ROOT / "scripts" / "gen_man.py"
SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT",
            "FILES", "SEE ALSO"]
REGENERATE = "run `python scripts/gen_man.py` and commit man/"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man")
    subprocess.run([sys.executable, str(GEN), "--out", str(out)], check=True, timeout=120)
    return out


def test_committed_pages_are_current(generated: Path) -> None:
    fresh = sorted(p.name for p in generated.glob("*.1"))
    committed = sorted(p.name for p in MAN.glob("*.1"))
    assert fresh == committed, REGENERATE
    for name in fresh:
        assert (generated / name).read_bytes() == (MAN / name).read_bytes(), \
            f"man/{name} is stale: {REGENERATE}"


def test_generation_is_deterministic(generated: Path, tmp_path: Path) -> None:
    env_date = {"SOURCE_DATE_EPOCH": "0", "COLUMNS": "37", "TERMINAL_WIDTH": "37"}
    import os

    subprocess.run([sys.executable, str(GEN), "--out", str(tmp_path)], check=True, timeout=120,
                   env={**os.environ, **env_date})
    for page in generated.glob("*.1"):
        assert (tmp_path / page.name).read_bytes() == page.read_bytes()


def test_every_command_has_a_page_with_its_options() -> None:
    sys.path.insert(0, str(GEN.parent))
    import gen_man

    for path, cmd, ctx in gen_man.commands():
        page = (MAN / (gen_man.page_name(path) + ".1")).read_text()
        for section in SECTIONS:
            assert f".SH {section}\n" in page, (path, section)
        for param in cmd.get_params(ctx):
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert gen_man.esc(opt) in page, (path, opt)
    names = {p.name for p in MAN.glob("*.1")}
    for expected in ("fabricctl.1", "fabricctl-submit.1", "fabricctl-shapes-list.1",
                     "fabricctl-shapes-inspect.1", "fabricctl-config-show.1", "fabricctl-top.1",
                     "fabricctl-down.1", "fabricctl-doctor.1", "fabricctl-results.1"):
        assert expected in names


def test_the_exit_codes_are_in_every_page() -> None:
    for page in MAN.glob("*.1"):
        text = page.read_text()
        for code in ("0", "1", "2", "3", "4", "5", "6", "130"):
            assert f"\\fB{code}\\fR\n" in text, (page.name, code)


@pytest.mark.skipif(shutil.which("groff") is None,
                    reason="groff is not installed (Debian/Ubuntu package: groff-base)")
def test_groff_lint_is_clean() -> None:
    pages = sorted(str(p) for p in MAN.glob("*.1"))
    out = subprocess.run(["groff", "-man", "-ww", "-z", *pages], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    assert out.stderr == ""
