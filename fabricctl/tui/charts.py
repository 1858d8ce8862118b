"""Bar charts as Rich text: the batches-per-shape histogram and the lanes' waste bars.

Contract (pure, no clock, no Textual):
- `batches_histogram(view, width)`: one row per bucket of batches run by finished shapes,
  buckets below the thrash line (100 batches) in `CRITICAL`, and the thrash line drawn as
  a rule between the last thrashing bucket and the first healthy one (the title counts the
  shapes that thrashed, `view.thrashed`);
- `recent_shapes(samples, line, width, rows)`: the most recent finished shapes as bars on a
  log scale with the thrash line as a vertical rule; thrashing shapes in `CRITICAL`;
- `lane_line(lane, threshold, width)`: one lane: id, target, queued items, tokens, oldest
  age, and its waste fraction as a bar against the shape's current pressure threshold
  (a vertical rule at mid-bar); starving lanes carry a `STARVING` mark in `CRITICAL`,
  quiescing lanes are dimmed as a whole.
"""

from __future__ import annotations

import math

from rich.text import Text

from fabricctl import fmt
from fabricctl.core.snapshot import BatchesHistogramView, LaneView, ShapeView
from fabricctl.tui.draw import shape_name
from fabricctl.tui.palette import BAR, CRITICAL, DIM, LINE, MUTED, WARN, state_style

LABEL_W = 10


def bucket_label(lo: int | None, hi: int | None) -> str:
    """Inclusive bounds: `0`, `1`, `2-4`, ..., `5000-9999`, `≥10000`."""
    if lo is None:
        return "0"
    if hi is None:
        return f"≥{lo}"
    return str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}"


def buckets(view: BatchesHistogramView) -> list[tuple[int | None, int | None, int]]:
    """(low, high, count) per bucket: low <= batches < high; None = unbounded."""
    b = view.buckets
    out: list[tuple[int | None, int | None, int]] = []
    for i, count in enumerate(view.counts):
        lo = b[i - 1] if i > 0 else None
        hi = b[i] if i < len(b) else None
        out.append((lo, hi, count))
    return out


def batches_histogram(view: BatchesHistogramView, width: int) -> Text:
    rows = [r for r in buckets(view) if r[0] is not None or r[2]]
    top = max((c for _, _, c in rows), default=0)
    bar_w = max(4, width - LABEL_W - 8)
    thrashing = view.thrashed  # the shapes that thrashed, not every one under the line
    title = Text("batches per finished shape\n", style="bold")
    title.append(f"{sum(c for *_, c in rows)} finished, ")
    title.append(f"{thrashing} thrashing", style=CRITICAL if thrashing else MUTED)
    lines = [title]
    line_drawn = False
    for lo, hi, count in rows:
        critical = (lo or 0) < view.thrash_line
        if not critical and not line_drawn:
            lines.append(_rule(f" {view.thrash_line} batches: thrash line ", width))
            line_drawn = True
        n = round(count / top * bar_w) if top else 0
        row = Text(f"{bucket_label(lo, hi):>{LABEL_W - 1}} ", style=MUTED)
        row.append("█" * n + ("▏" if count and not n else ""), style=CRITICAL if critical else BAR)
        row.append(f" {count}", style=CRITICAL if critical and count else "")
        lines.append(row)
    if not line_drawn:
        lines.append(_rule(f" {view.thrash_line} batches: thrash line ", width))
    return Text("\n").join(lines)


def _rule(label: str, width: int) -> Text:
    side = max(2, (width - len(label)) // 2)
    return Text(("─" * side + label + "─" * side)[: max(width, len(label))], style=LINE)


def _bar_with_rule(row: Text, n: int, at: int, width: int, style: str) -> None:
    """`n` filled cells of `width`, with a vertical rule (│) at column `at` over the bar."""
    left = min(n, at)
    row.append("█" * left, style=style)
    row.append(" " * (at - left))
    row.append("│", style=LINE)
    right = max(0, n - at - 1)
    row.append("█" * right, style=style)
    row.append(" " * max(0, width - at - 1 - right))


def _log_pos(value: float, top: float, width: int) -> int:
    return min(width, round(math.log10(1 + value) / math.log10(1 + top) * width)) if top else 0


def recent_shapes(samples: list[int], line: int, width: int, rows: int) -> Text:
    title = Text("recent shapes, batches run\n(log scale; │ = thrash line)", style="bold")
    shown = samples[-rows:] if rows > 0 else []
    if not shown:
        return Text("\n").join([title, Text("no shape has finished yet", style=MUTED)])
    bar_w = max(8, width - 14)
    top = max(max(shown), line * 10)
    at = _log_pos(line, top, bar_w)
    out = [title]
    first = len(samples) - len(shown) + 1
    for k, b in enumerate(shown):
        critical = b < line
        n = _log_pos(b, top, bar_w)
        row = Text(f"#{first + k:<5}", style=MUTED)
        _bar_with_rule(row, n, at, max(n, at + 1), CRITICAL if critical else BAR)
        row.append(f" {b:,}", style=CRITICAL if critical else "")
        out.append(row)
    return Text("\n").join(out)


MARK_W = 10
LANE_HEAD = f"{'lane':>5} {'target':>6} {'items':>6} {'tokens':>7} {'oldest':>6}  waste"


def lane_line(lane: LaneView, threshold: float, width: int) -> Text:
    head = f"{lane.id:>5} {lane.target:>6} {lane.items:>6} {fmt.si(lane.tokens):>7} "
    row = Text(head)
    row.append(f"{fmt.age(lane.oldest_age) if lane.items else '-':>6}  ",
               style=CRITICAL if lane.starving else "")
    mark = " STARVING" if lane.starving else (" quiescing" if lane.quiescing else "")
    bar_w = max(8, width - len(head) - 8 - 8 - MARK_W)
    scale = 2 * threshold if threshold > 0 else 0.1
    at = bar_w // 2
    n = min(bar_w, round(lane.waste / scale * bar_w))
    over = lane.waste > threshold
    _bar_with_rule(row, n, at, bar_w, WARN if over else BAR)
    row.append("▸" if lane.waste > scale else " ", style=WARN)
    row.append(f"{fmt.pct(lane.waste):>7}", style=WARN if over else "")
    if lane.starving:
        row.append(mark, style=CRITICAL)
    elif lane.quiescing:
        row.append(mark)
        row.stylize(DIM)
    return row


def lanes_header(s: ShapeView) -> Text:
    t = Text(f"{s.model} {shape_name(s.signature, s.label)}  ", style="bold")
    t.append(s.state, style=state_style(s.state))
    t.append(f"  ep {s.epoch}  {s.lanes_in_use} of 2048 lanes  ")
    t.append("pressure threshold ", style=MUTED)
    t.append(fmt.pct(s.threshold, 2), style=LINE)
    t.append(f"  queued {fmt.si(s.tokens)} tok  ")
    t.append(f"{s.starving} starving", style=CRITICAL if s.starving else MUTED)
    return t
