"""Pure Rich renderings of one `Snapshot`: the state machine, models, the models nobody
serves, ledger and events.

Contract: each function takes plain snapshot data and returns a `rich.text.Text`; nothing
here reads a clock (ages are measured against the snapshot's own `t`) or imports Textual,
so the live app and the one-shot `top --once` draw the same thing and tests compare text
and styles exactly. Critical events are drawn wholly in `palette.CRITICAL`.
"""

from __future__ import annotations

from rich.text import Text

from fabricctl import fmt
from fabricctl.core.events import Event
from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.jobs import JobRecord, eta_s
from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import ModelView, Snapshot
from fabricctl.core.unserved import unserved, waiting_line
from fabricctl.tui.palette import CRITICAL, MIX, MUTED, OK, STATES, WARN, state_style

ARROW = " ─▶ "


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
    """received / routed / queued items and tokens, and the difference (must be 0 / 0)."""
    lg = snap.ledger
    line = Text("ledger ", style="bold")
    for name, items, tokens in (
        ("received", lg.items_received, lg.tokens_received),
        ("routed", lg.items_routed, lg.tokens_routed),
        ("queued", lg.items_queued, lg.tokens_queued),
    ):
        line.append(f"{name} ", style=MUTED)
        line.append(f"{fmt.si(items)}/{fmt.si(tokens)}  ")
    di, dt = snap.difference
    line.append("difference ", style=MUTED)
    ok = di == 0 and dt == 0
    line.append(f"{di}/{dt}", style=OK if ok else CRITICAL)
    if not ok:
        line.append(" LOST OR DOUBLE-COUNTED", style=CRITICAL)
    return line


def _event_body(e: Event) -> Text:
    shape = shape_name(e.signature, e.label) if e.signature or e.label else ""
    t = Text()
    if e.kind == "transition":
        t.append(f"{e.model} {shape}  {e.src} → ")
        t.append(e.dst, style=state_style(e.dst))
        t.append(f"  ({e.reason}) ep {e.value}", style=MUTED)
    elif e.kind == "prewarm":
        t.append(f"{e.model} {shape}  pre-warm ep {e.value}, {e.reason}")
    elif e.kind == "force_drain":
        if e.count > 1:
            t.append(f"{e.model} {shape}  {e.reason}")
        else:
            t.append(f"{e.model} {shape}  lane {e.value} force-drained ({e.reason})")
    elif e.kind == "thrash":
        t.append(f"{e.model} {shape}  finished after {e.value} batches")
    elif e.kind == "consumer_joined":
        t.append(f"{e.model}  consumer {e.reason} joined")
    elif e.kind == "consumer_lost":
        t.append(f"{e.model}  consumer {e.reason} lost, {e.value} items back to their lanes")
    else:
        t.append(f"{e.model} {shape}  {e.reason}")
    return t


KIND_TAG = {"transition": "transition", "prewarm": "pre-warm", "force_drain": "force-drain",
            "thrash": "THRASH", "consumer_joined": "joined", "consumer_lost": "lost",
            "guard": "GUARD"}


def event_line(e: Event, now: float) -> Text:
    """`  3.2s  transition  m <hex label>  staged → active ...`; critical lines in CRITICAL."""
    line = Text(f"{fmt.age(now - e.t):>6} ago  ", style=MUTED)
    line.append(f"{KIND_TAG.get(e.kind, str(e.kind)):<11} ")
    line.append_text(_event_body(e))
    if e.critical:
        line.stylize(CRITICAL)
    return line


JOBS_SHOWN = 5  # job lines in the overview: the live ones first


def job_line(j: JobRecord, now: float, width: int = 16) -> Text:
    """One job: id, state, a bar of outcomes against its total, counts, its endpoint mix
    (`fmt.endpoint_mix`, in `MIX`; none before any item was counted) and ETA."""
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
    eta = eta_s(j, now)
    if eta is not None:
        t.append(f"  ETA {fmt.age(eta)}", style=MUTED)
    t.append(f"  {j.kind} {fmt.shorten(j.name, 32)}", style=MUTED)
    return t


def place_line(p: JobPlace, now: float, deadline: float | None = None) -> Text:
    """A job's place in the fleet, under its line: `wait 12s  share 50% (2)  finish in 3m12s,
    6m48s before its deadline` (the broker's deadline of the job, else `deadline`); one at
    risk ends in `AT RISK`, the whole line in CRITICAL."""
    t = Text("    ", style=MUTED)
    t.append(f"wait {fmt.age(p.oldest_wait_s)}  share {fmt.pct(p.share, 0)} ({p.holders})"
             f"  {fmt.si(p.queued_items)} queued  finish ", style=MUTED)
    finish_in = None if p.predicted_finish is None else p.predicted_finish - now
    if p.deadline is not None:
        deadline = p.deadline
    deadline_in = None if deadline is None else deadline - now
    t.append(fmt.finish_vs_deadline(finish_in, deadline_in))
    if p.at_risk:
        t.append("  AT RISK")
        t.stylize(CRITICAL)
    return t


def jobs_lines(snap: Snapshot) -> Text:
    """The overview's jobs: the live ones first, at most `JOBS_SHOWN`; empty with none.
    A job with queued items gets its place in the fleet (`place_line`) under its line."""
    jobs = sorted(snap.jobs, key=lambda j: (j.ended, -j.created))[:JOBS_SHOWN]
    placed = {v.job: v for v in snap.job_views}
    lines: list[Text] = []
    for j in jobs:
        lines.append(job_line(j, snap.t))
        p = None if j.ended else placed.get(j.number)
        if p is not None:
            lines.append(place_line(p, snap.t, j.deadline))
    return Text("\n").join(lines)


def jobs_at_risk(snap: Snapshot) -> int:
    """How many jobs are predicted to finish after their deadline."""
    return sum(v.at_risk for v in snap.job_views)
