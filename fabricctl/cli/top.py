"""`fabricctl top`: the live app on a TTY, else one snapshot.

Contract: the `top` command (`command`) exits with `run_top`'s status.
`run_top(data_dir, once=..., json_out=..., interval=...) -> int` (an exit code).
- `json_out`: prints one snapshot as JSON (`msgspec.json` of the `Snapshot`) on stdout;
- `once`, or stdout/stdin not a TTY: prints one snapshot with Rich on stdout;
- otherwise runs the Textual app against the broker's stats stream until `q`.
No broker: one `fabricctl: error: ...` line on stderr and exit 3 (`BackendMissing`, through
`support.report`, the mapping every command uses), for the one-shot forms; the live app
shows its reconnecting banner instead. Textual is imported only on the live path, so
`--once`/`--json` and pipes never load it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TextIO

import msgspec
import typer

from fabricctl.cli.support import ConfigFile, DataDir, guarded, report, settings
from fabricctl.core.snapshot import Snapshot
from fabricctl.errors import ExitCode, FabricError, UsageError

MIN_INTERVAL = 0.1


def command(
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit (no TUI)."),
    json_out: bool = typer.Option(False, "--json", help="Print one snapshot as JSON and exit."),
    interval: float = typer.Option(1.0, "--interval", "-i", min=0.1, metavar="SECONDS",
                                   help="Refresh every SECONDS seconds."),
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """The live dashboard: shape states, lanes, thrash histogram, ledger, GPUs.

    Without a terminal (or with --once) it prints one snapshot instead.
    """
    cfg = settings(data_dir, config)
    raise typer.Exit(guarded(lambda: run_top(cfg.data_dir, once=once, json_out=json_out,
                                             interval=interval)))


async def fetch_snapshot(address: str | Path) -> Snapshot:
    """One snapshot (no lane lists) from the broker at `address`."""
    from fabricctl.wire.client import Client

    client = await Client.connect(address, "observer", "fabricctl-top", timeout=5.0)
    try:
        snap: Snapshot = await client.snapshot()
        return snap
    finally:
        await client.close()


def write_once(snap: Snapshot, json_out: bool, out: TextIO, address: str = "") -> None:
    if json_out:
        out.write(msgspec.json.encode(snap).decode() + "\n")
        out.flush()
        return
    from rich.console import Console

    from fabricctl.tui.render import print_snapshot

    print_snapshot(snap, Console(file=out, soft_wrap=False), address)


def _is_tty() -> bool:
    return sys.stdout.isatty() and sys.stdin.isatty()


def run_top(data_dir: Path, *, once: bool, json_out: bool, interval: float) -> int:
    """Run `fabricctl top` against the broker in `data_dir`; returns the exit code."""
    if not (interval >= MIN_INTERVAL):
        return report(UsageError(f"--interval must be at least {MIN_INTERVAL} s"))
    if json_out or once or not _is_tty():
        try:
            snap = asyncio.run(fetch_snapshot(data_dir))
        except FabricError as e:
            return report(e)
        try:
            write_once(snap, json_out, sys.stdout, str(data_dir))
        except BrokenPipeError:  # `fabricctl top --json | head`: quiet, like the other readers
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return ExitCode.RUNTIME
        return ExitCode.OK
    from fabricctl.tui.app import TopApp
    from fabricctl.tui.sources import BrokerSource

    app = TopApp(BrokerSource(data_dir), interval=interval)
    app.run()
    return int(app.return_code or 0)
