"""`fabricctl top --once`: one snapshot printed with Rich, for pipes and quick looks.

Contract: `print_snapshot(snap, console, address)` prints the same pieces the live overview
shows (state machine, models, the line of models with queued items and no consumer when
there are any, shapes table, GPU panel, ledger, the jobs with each one's place in the fleet
when there are any, the latest critical events) built from the
same pure renderers, so the two never disagree. Never imports Textual.
"""

from __future__ import annotations

from rich.console import Console, ConsoleRenderable, Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from fabricctl.core.snapshot import Snapshot
from fabricctl.tui import draw, table
from fabricctl.tui.gpu import RateTracker, gpu_panel
from fabricctl.tui.palette import MUTED

CRITICAL_SHOWN = 5


def shapes_table(snap: Snapshot) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for col in table.COLUMNS:
        t.add_column(col.label, justify="right" if col.numeric else "left", no_wrap=True)
    for _, cells in table.rows(snap.shapes):
        t.add_row(*(Text(c.text, style=c.style) for c in cells))
    return t


def critical_events(snap: Snapshot, n: int = CRITICAL_SHOWN) -> Text:
    crit = [e for e in snap.events if e.critical][-n:]
    if not crit:
        return Text("no critical events", style=MUTED)
    return Text("\n").join(draw.event_line(e, snap.t) for e in reversed(crit))


def jobs_section(snap: Snapshot) -> list[ConsoleRenderable]:
    return [Rule(f"jobs ({len(snap.jobs)})", style=MUTED), draw.jobs_lines(snap)]


def snapshot_renderable(snap: Snapshot, address: str = "") -> Group:
    title = Text("fabricctl top", style="bold")
    if address:
        title.append(f"  {address}", style=MUTED)
    if snap.simulated:
        title.append("  simulated engines", style=MUTED)
    waiting = draw.waiting(snap)
    return Group(
        title,
        draw.state_machine(snap.states),
        draw.models(snap),
        *([waiting] if waiting else []),
        Rule(f"shapes ({len(snap.shapes)})", style=MUTED),
        shapes_table(snap) if snap.shapes else Text("no live shapes", style=MUTED),
        Rule("GPUs", style=MUTED),
        gpu_panel(snap, RateTracker()),
        draw.ledger_line(snap),
        *(jobs_section(snap) if snap.jobs else []),
        Rule("critical events", style=MUTED),
        critical_events(snap),
    )


def print_snapshot(snap: Snapshot, console: Console, address: str = "") -> None:
    console.print(snapshot_renderable(snap, address))
