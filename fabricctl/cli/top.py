"""The `fabricctl top` entry point the CLI calls: live app on a TTY, else one snapshot.

Contract: `run_top(data_dir, once=..., json_out=..., interval=...) -> int` (an exit code).
- `json_out`: prints one snapshot as JSON (`msgspec.json` of the `Snapshot`) on stdout;
- `once`, or stdout/stdin not a TTY: prints one snapshot with Rich on stdout;
- otherwise runs the Textual app against the broker's stats stream until `q`.
No broker: one `fabricctl: error: ...` line on stderr and exit 3 (`BackendMissing`), for
the one-shot forms; the live app shows its reconnecting banner instead. Textual is
imported only on the live path, so `--once`/`--json` and pipes never load it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TextIO

import msgspec

from fabricctl.core.snapshot import Snapshot
from fabricctl.errors import ExitCode, FabricError

MIN_INTERVAL = 0.1


async def fetch_snapshot(address: str | Path) -> Snapshot:
    """One snapshot (no lane lists) from the broker at `address`."""
    from fabricctl.wire.client import Client

    client = await Client.connect(address, "observer", "fabricctl-top", timeout=5.0)
    try:
        snap: Snapshot = await client.query("snapshot", type=Snapshot)
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
        sys.stderr.write(f"fabricctl: error: --interval must be at least {MIN_INTERVAL} s\n")
        return ExitCode.USAGE
    if json_out or once or not _is_tty():
        try:
            snap = asyncio.run(fetch_snapshot(data_dir))
        except FabricError as e:
            sys.stderr.write(f"fabricctl: error: {e}\n")
            return int(e.exit_code)
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
