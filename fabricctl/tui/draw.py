"""Pure Rich renderings of one `Snapshot`: the state machine, models, the models nobody
serves, ledger and events.

Contract: each function takes plain snapshot data and returns a `rich.text.Text`; nothing
here reads a clock (ages are measured against the snapshot's own `t`) or imports Textual,
so the live app and the one-shot `top --once` draw the same thing and tests compare text
and styles exactly. Critical events are drawn wholly in `palette.CRITICAL`.
Lines that must not wrap go through `fit(line, width)`: cut at the right with an ellipsis,
at a word boundary (a space, `/` or `,`) with `words=True`; the most important part of each
line comes first (an id, a job's predicted finish), so what is cut is the least important.
A job's finish is `core.forecast.finish_in` of its place (the one forecast, as `jobs show`
prints it), on the line under the job's.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Span, Text

from fabricctl import fmt
from fabricctl.core.events import Event
from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.forecast import finish_in
from fabricctl.core.jobs import JobRecord
from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import ModelView, Snapshot
from fabricctl.core.unserved import unserved, waiting_line
from fabricctl.tui.palette import CRITICAL, MIX, MUTED, OK, STATES, WARN, state_style

ARROW = " ─▶ "
ELLIPSIS = "…"
BREAKS = " /,"  # where `fit(..., words=True)` may cut a line


def fit(line: Text, width: int | None, *, words: bool = False) -> Text:
    """`line` in at most `width` cells (unchanged when it fits, or `width` is None): cut at
    the right with an ellipsis, carrying the style of the cut end. With `words`, cut after
    the last `/` or before the last space or `,` that leaves room for the ellipsis, unless
    that drops more than half of the width (then cut where the width ends).

    >>> fit(Text("drained 12 lanes after a long wait"), 20, words=True).plain
    'drained 12 lanes…'
    >>> fit(Text("m support-0/fewshot-2/tools-1"), 24, words=True).plain
    'm support-0/fewshot-2/…'
    """
    if width is None or line.cell_len <= width:
        return line
    if width <= 1:
        return Text(ELLIPSIS[:width])
    plain = line.plain
    cut = width - 1
    while cut > 0 and cell_len(plain[:cut]) > width - 1:
        cut -= 1
    if words:
        best = 0  # keep plain[:best]: after a `/`, or before a space or `,`
        for i in range(cut, 0, -1):
            if plain[i - 1] == "/" or (i < len(plain) and plain[i] in " ,"):
                best = i
                break
        kept = len(plain[:best].rstrip(" ,"))
        if best >= (width - 1) // 2 and kept:
            cut = kept
    out = line[:cut]
    if out.plain.endswith(ELLIPSIS):  # a part cut already (`fmt.shorten`): one ellipsis
        return out
    end_spans = [sp for sp in out.spans if sp.end >= cut]
    out.append(ELLIPSIS)
    out.spans[:] = [Span(sp.start, cut + 1, sp.style) if sp in end_spans else sp
                    for sp in out.spans]
    return out


def fit_lines(text: Text, width: int | None, *, words: bool = False) -> Text:
    """Each line of `text` through `fit`."""
    if width is None:
        return text
    return Text("\n").join(fit(ln, width, words=words)
                           for ln in text.split("\n", allow_blank=True))


def state_machine(states: dict[str, int]) -> Text:
    """The five states with their counts and arrows, plus the staged → active bypass.

    >>> str(state_machine({"staged": 2, "active": 1})).splitlines()[0]
    'staged 2 ─▶ warming 0 ─▶ active 1 ─▶ draining 0 ─▶ finished 0'
    """
    top = Text()
    centres: dict[str, int] = {}
    for k, name in enumerate(STATES):
        if k:
            top.append(ARROW, style=MUTED)
        start = top.cell_len
        n = states.get(name, 0)
        top.append(name, style=state_style(name) if n else MUTED)
        top.append(f" {n}", style="bold" if n else MUTED)
        centres[name] = (start + top.cell_len) // 2
    a, b = centres["staged"], centres["active"]
    bypass = Text(" " * a + "└" + "─" * (b - a - 1) + "▲", style=MUTED)
    bypass.append("  (warming is optional)", style=MUTED)
    return Text("\n").join([top, bypass])


def shape_name(signature: int | None, label: str = "") -> str:
    if signature is None:
        return "—"
    return f"{signature_hex(signature)} {label}".rstrip()


def short_name(signature: int | None, label: str = "") -> str:
    """The label when the producer gave one, else the hex signature."""
    if signature is None:
        return "—"
    return label or signature_hex(signature)


def labels(snap: Snapshot) -> dict[tuple[str, int], str]:
    return {(s.model, s.signature): s.label for s in snap.shapes}


def model_line(m: ModelView, names: dict[tuple[str, int], str]) -> Text:
    """`m  active <label or hex>  ep 3  warming <label or hex>  switches 4`."""
    line = Text(f"{m.name}  ", style="bold")
    state = m.current_state or "idle"
    line.append(f"{state} ", style=state_style(state) or MUTED)
    line.append(short_name(m.current, names.get((m.name, m.current or 0), "")))
    line.append(f"  ep {m.epoch}", style=MUTED)
    line.append("  warming ", style=state_style("warming") if m.warming is not None else MUTED)
    line.append(short_name(m.warming, names.get((m.name, m.warming or 0), "")))
    line.append(f"  switches {m.switches}", style=MUTED)
    return line


def models(snap: Snapshot) -> Text:
    names = labels(snap)
    if not snap.models:
        return Text("no model has items or consumers yet", style=MUTED)
    return Text("\n").join(model_line(m, names) for m in snap.models)


def waiting(snap: Snapshot) -> Text:
    """One warning line for the models with queued items and no consumer
    (`core.unserved`): the one with most items, and how many more; empty when none."""
    found = unserved(snap.shapes, snap.consumers)
    if not found:
        return Text()
    line = Text(f"⚠ {waiting_line(found[0])}", style=f"bold {WARN}")
    if len(found) > 1:
        more = len(found) - 1
        line.append(f"  (and {more} more model{'s' if more > 1 else ''} with no consumer: "
                    f"{', '.join(w.model for w in found[1:4])}{', …' if more > 3 else ''})",
                    style=MUTED)
    return line


def ledger_line(snap: Snapshot) -> Text:
    """The difference (must be 0/0, first: it is what the line is for), then received /
    routed / queued items and tokens."""
    lg = snap.ledger
    line = Text("ledger ", style="bold")
    di, dt = snap.difference
    line.append("difference ", style=MUTED)
    ok = di == 0 and dt == 0
    line.append(f"{di}/{dt}", style=OK if ok else CRITICAL)
    if not ok:
        line.append(" LOST OR DOUBLE-COUNTED", style=CRITICAL)
    for name, items, tokens in (
        ("received", lg.items_received, lg.tokens_received),
        ("routed", lg.items_routed, lg.tokens_routed),
        ("queued", lg.items_queued, lg.tokens_queued),
    ):
        line.append(f"  {name} ", style=MUTED)
        line.append(f"{fmt.si(items)}/{fmt.si(tokens)}")
    return line


def _event_body(e: Event, short: bool = False, model: bool = True) -> Text:
    """What happened; `short` names the shape by its label alone (the hex without one) and
    leaves out the model unless `model`."""
    shape = ""
    if e.signature or e.label:
        shape = (short_name if short else shape_name)(e.signature, e.label)
    who = " ".join(p for p in (e.model if model or not short else "", shape) if p)
    t = Text()
    if e.kind == "transition":
        t.append(f"{who}  {e.src} → ")
        t.append(e.dst, style=state_style(e.dst))
        t.append(f"  ({e.reason}) ep {e.value}", style=MUTED)
    elif e.kind == "prewarm":
        t.append(f"{who}  pre-warm ep {e.value}, {e.reason}")
    elif e.kind == "force_drain":
        if e.count > 1:
            t.append(f"{who}  {e.reason}")
        else:
            t.append(f"{who}  lane {e.value} force-drained ({e.reason})")
    elif e.kind == "thrash":
        t.append(f"{who}  finished after {e.value} batches")
    elif e.kind == "consumer_joined":
        t.append(f"{e.model}  consumer {e.reason} joined")
    elif e.kind == "consumer_lost":
        t.append(f"{e.model}  consumer {e.reason} lost, {e.value} items back to their lanes")
    else:
        t.append(f"{who}  {e.reason}")
    return t


KIND_TAG = {"transition": "transition", "prewarm": "pre-warm", "force_drain": "force-drain",
            "thrash": "THRASH", "consumer_joined": "joined", "consumer_lost": "lost",
            "guard": "GUARD"}


def event_line(e: Event, now: float, width: int | None = None, one_model: bool = False,
               short: bool | None = None) -> Text:
    """`  3.2s ago  transition  m <hex label>  staged → active ...`; critical lines in
    CRITICAL. With a `width` the line is at most that long. Its short form (`short`; by
    default, when the long one would not fit) drops " ago", names the shape by its label
    alone (the hex when it has none) and, when the fleet serves `one_model`, not the model;
    what still does not fit is cut at a word boundary (`fit`)."""
    line = _event_line(e, now, short=False)
    if short is None:
        short = width is not None and line.cell_len > width
    if short:
        line = _event_line(e, now, short=True, model=not one_model)
    return fit(line, width, words=True)


EVENTS_SAMPLED = 50  # the newest events whose length picks a list's form (`events_short`)


def events_short(events: Sequence[Event], now: float, width: int) -> bool:
    """Whether a list of `events` is drawn in the short form at `width` (all its lines in
    one form): when one of the newest `EVENTS_SAMPLED` would not fit in the long one."""
    return any(_event_line(e, now, short=False).cell_len > width
               for e in events[-EVENTS_SAMPLED:])


def _event_line(e: Event, now: float, short: bool, model: bool = True) -> Text:
    line = Text(f"{fmt.age(now - e.t):>6}{'' if short else ' ago'}  ", style=MUTED)
    line.append(f"{KIND_TAG.get(e.kind, str(e.kind)):<11} ")
    line.append_text(_event_body(e, short, model))
    if e.critical:
        line.stylize(CRITICAL)
    return line


JOBS_SHOWN = 5  # job lines in the overview: the live ones first


def job_line(j: JobRecord, width: int = 16) -> Text:
    """One job: id, state, a bar of outcomes against its total, counts, its endpoint mix
    (`fmt.endpoint_mix`, in `MIX`; none before any item was counted), kind and input. Its
    finish is on its place line (`place_line`), not here: one forecast."""
    share = j.outcomes / j.total if j.total else 0.0
    filled = round(share * width)
    t = Text(f"{j.id}  ", style="bold")
    t.append(f"{j.state.value:<11} ", style=OK if j.state.value == "completed" else "")
    t.append("█" * filled + "░" * (width - filled), style=OK)
    t.append(f" {j.outcomes:,}/{j.total:,}{'' if j.sealed else '+'} ({fmt.pct(share)})")
    if j.endpoints:
        t.append(f"  {fmt.endpoint_mix(j.endpoints)}", style=MIX)
    if j.failed or j.cancelled:
        t.append(f"  failed {j.failed:,}  cancelled {j.cancelled:,}", style=CRITICAL)
    t.append(f"  {j.kind} {fmt.shorten(j.name, 32)}", style=MUTED)
    return t


def place_line(p: JobPlace, now: float, deadline: float | None = None) -> Text:
    """A job's place in the fleet, under its line, its forecast first (`finish_in`, as `jobs
    show` prints it): `finish in 3m12s, 6m48s before its deadline  wait 12s  share 50% (2)
    800 queued` (the broker's deadline of the job, else `deadline`); one at risk has `AT
    RISK` after its finish, the whole line in CRITICAL."""
    t = Text("    finish ", style=MUTED)
    if p.deadline is not None:
        deadline = p.deadline
    deadline_in = None if deadline is None else deadline - now
    t.append(fmt.finish_vs_deadline(finish_in(p, now), deadline_in))
    if p.at_risk:
        t.append("  AT RISK")
    t.append(f"  wait {fmt.age(p.oldest_wait_s)}  share {fmt.pct(p.share, 0)} ({p.holders})"
             f"  {fmt.si(p.queued_items)} queued", style=MUTED)
    if p.at_risk:
        t.stylize(CRITICAL)
    return t


def jobs_lines(snap: Snapshot, width: int | None = None) -> Text:
    """The overview's jobs: the live ones first, at most `JOBS_SHOWN`; empty with none.
    A job with queued items gets its place in the fleet (`place_line`) under its line. Each
    line `fit` to `width` (the job id, first, is never cut)."""
    jobs = sorted(snap.jobs, key=lambda j: (j.ended, -j.created))[:JOBS_SHOWN]
    placed = {v.job: v for v in snap.job_views}
    lines: list[Text] = []
    for j in jobs:
        lines.append(fit(job_line(j), width))
        p = None if j.ended else placed.get(j.number)
        if p is not None:
            lines.append(fit(place_line(p, snap.t, j.deadline), width))
    return Text("\n").join(lines)


def jobs_at_risk(snap: Snapshot) -> int:
    """How many jobs are predicted to finish after their deadline."""
    return sum(v.at_risk for v in snap.job_views)
