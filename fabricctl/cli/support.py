"""Typer pieces every fabricctl command shares: the common options and error handling.

Contract: `fail(msg, code)` writes one `fabricctl: error: msg` line on stderr and returns
the `typer.Exit` to raise; `guarded(fn)` runs a command body and turns fabricctl's own
errors (`FabricError`) into that line and their exit code, Ctrl-C into exit 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from fabricctl.errors import ExitCode, FabricError

if TYPE_CHECKING:
    from fabricctl.config import AppConfig

T = TypeVar("T")

DataDir = typer.Option(None, "--data-dir", "-d", help="Broker data dir (LMDB, socket, logs); "
                       "default: $FABRICCTL_DATA_DIR, else the config's data_dir.",
                       show_default=False)
ConfigFile = typer.Option(None, "--config", "-c", help="A fabric.toml to read (overrides the "
                          "project and user files).", show_default=False)


def fail(message: str, code: int = ExitCode.RUNTIME) -> typer.Exit:
    sys.stderr.write(f"fabricctl: error: {message}\n")
    return typer.Exit(code)


JsonOut = typer.Option(False, "--json", help="Print one JSON document instead of a table.")


def guarded(fn: Callable[[], T]) -> T:
    """Run a command's body: fabricctl's errors become one stderr line and their exit code."""
    try:
        return fn()
    except FabricError as e:
        raise fail(str(e), e.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None


def settings(data_dir: Path | None, config: Path | None) -> AppConfig:
    from fabricctl.cli.common import settings as load_settings

    return guarded(lambda: load_settings(data_dir, config))
