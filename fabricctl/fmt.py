"""fabricctl's one set of formatters for numbers, percentages, ages and bytes, shared by the
CLI (`status`, `shapes`, `jobs`, `doctor`, `run`, `replay`) and the dashboard (`top`).

Contract: pure functions (no Rich, no Textual, no clock; they import nothing of fabricctl),
each returning a short str of predictable width; `None` means "not available" and renders
as `NA` ("n/a": NVML fields, rates before a second sample, a store figure the broker did not
report). `CRITICAL` is the one style (a Rich style string) of everything that means "look
here", in a CLI table as on the dashboard (`fabricctl.tui.palette` re-exports it). Shape
signatures are `fabricctl.core.signature.signature_hex` (16 hex digits), never formatted
here.

Why here: a leaf below both the CLI and the TUI (like `errors` and `config`), so a headless
command formats a figure exactly as `top` shows it without importing anything of
`fabricctl.tui`; core stays free of presentation and never imports it (import-linter
contracts in pyproject.toml). The store formats the sizes in its own error messages: it
may import core only.
"""

from __future__ import annotations

from collections.abc import Sequence

NA = "n/a"
CRITICAL = "bold #ff5f00"
"""Thrashing, starving, a broken ledger, a job at risk: the one colour that means "look here"."""
SPARK = "▁▂▃▄▅▆▇█"


def si(n: float | None) -> str:
    """12, 1.2k, 34.5k, 1.2M: counts and token figures in at most 6 characters."""
    if n is None:
        return NA
    a = abs(n)
    if a < 1000:
        return f"{n:.0f}"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            v = n / div
            return f"{v:.1f}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}"  # pragma: no cover


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction 0..1 as a percentage."""
    return NA if x is None else f"{x * 100:.{digits}f}%"


def age(s: float | None) -> str:
    """Seconds as 4.2s, 12m3s, 2h05m."""
    if s is None:
        return NA
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60)}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def relative(s: float | None) -> str:
    """Seconds from now as `in 3m12s`, `45s ago`, or `now` within half a second."""
    if s is None:
        return NA
    if abs(s) < 0.5:
        return "now"
    return f"in {age(s)}" if s > 0 else f"{age(-s)} ago"


def finish_vs_deadline(finish_in: float | None, deadline_in: float | None) -> str:
    """A predicted finish against a deadline, both in seconds from now: `in 3m12s`,
    `in 3m12s, 6m48s before its deadline`, `in 12m0s, 2m0s after its deadline`;
    `n/a` while there is no prediction."""
    if finish_in is None:
        return NA
    out = relative(finish_in)
    if deadline_in is None:
        return out
    slack = deadline_in - finish_in
    return out + (f", {age(slack)} before its deadline" if slack >= 0
                  else f", {age(-slack)} after its deadline")


def human_bytes(n: float | None) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 3.2 GiB (TiB at most)."""
    if n is None:
        return NA
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def gib(n: int | None) -> str:
    return NA if n is None else f"{n / 2**30:.1f}"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last `width` values as block characters scaled to their maximum; blank padded."""
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    if top <= 0:
        return (SPARK[0] * len(vals)).rjust(width)
    chars = [SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in vals]
    return "".join(chars).rjust(width)


def shorten(s: str, width: int) -> str:
    """`s` cut to `width` cells with an ellipsis."""
    return s if len(s) <= width else s[: max(0, width - 1)] + "…"


# The endpoints' short names in compact cells (`jobs` list, `top`); `jobs show` names them whole.
ENDPOINT_SHORT = {"embeddings": "embed"}


def endpoint_mix(counts: dict[str, int], *, most: int = 2, short: bool = True) -> str:
    """A job's endpoint mix in one cell: `chat 80% · embed 20%` (most items first, at most
    `most` parts, then `+N` more endpoints), the endpoint alone when it is the only one, `-`
    for none counted. Shares are whole percents (`<1%`, `>99%` at the edges)."""
    parts = sorted(((k, n) for n, k in counts.items() if k > 0), key=lambda kn: -kn[0])
    if not parts:
        return "-"
    total = sum(k for k, _ in parts)

    def name(n: str) -> str:
        return ENDPOINT_SHORT.get(n, n) if short else n

    if len(parts) == 1:
        return name(parts[0][1])
    cells = []
    for k, n in parts[:most]:
        share = k / total
        text = "<1%" if share < 0.01 else ">99%" if share > 0.99 else f"{round(share * 100)}%"
        cells.append(f"{name(n)} {text}")
    if len(parts) > most:
        cells.append(f"+{len(parts) - most}")
    return " · ".join(cells)
