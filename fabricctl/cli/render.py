"""Rich renderings shared by commands: summaries and tables for people, never for pipes."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fabricctl.cli.run import RunSummary


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def print_run_summary(s: RunSummary, console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    label = " (simulated)" if s.simulated else ""
    t = Table(title=f"fabricctl run — {s.engine}{label}, {s.gpus} GPU(s)", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("items", f"{s.items:,}" + (f" ({s.rejected:,} rejected)" if s.rejected else "")),
        ("tokens in / out", f"{s.tokens_in:,} / {s.tokens_out:,}"),
        ("wall time", f"{s.wall_s:.2f} s"),
        ("shapes", f"{s.shapes}"),
        ("shape switches (mid-stream)", f"{s.shape_switches} ({s.midstream_switches})"),
        (f"KV hit rate{label}", f"{pct(s.kv_hit_rate)} of {pct(s.kv_hit_achievable)} achievable"),
        ("padding waste", pct(s.padding_waste)),
        ("thrash events", f"{s.thrash_events}"),
        ("ledger difference", f"{s.ledger_difference[0]} items, {s.ledger_difference[1]} tokens"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
