"""The human rendering of `fabricctl shapes inspect`: a summary, the state history, length
percentiles, the lanes table (a live shape's) and the shape's recent events.

Contract: pure rendering of the document `shapes.inspect_doc` builds (the same one `--json`
prints) onto a Rich console given by the caller; no colour is forced, so pipes and
`NO_COLOR` get plain text. Nothing is cut with "…": on a narrow terminal the summary's
values and the events' details wrap (a word too long folds); on a pipe the caller's
console (`common.console`) lays every table out at its natural width. Ages and
percentages are `fabricctl.fmt`'s, as `top` shows them.
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import ShapeView
from fabricctl.fmt import age, pct

RECENT_EVENTS = 10


def _when(t: float, now: float) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if t > 1e9 else f"t={t:.1f}"
    return f"{stamp} ({age(max(0.0, now - t))} ago)"


def _summary(doc: dict[str, Any], view: ShapeView | None) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("shape", signature_hex(doc["signature"])),
        ("label", doc.get("label") or "-"),
        ("model", doc["model"]),
        ("state", doc["state"] + ("" if doc["live"] else " (no longer live)")),
    ]
    if view is not None:
        rows += [
            ("epoch", str(view.epoch)),
            ("age", age(view.age)),
            ("queued", f"{view.items:,} items, {view.tokens:,} tokens"),
            ("in flight", f"{view.inflight_items:,} items, {view.inflight_tokens:,} tokens"),
            ("lanes in use", f"{view.lanes_in_use} (new-lane threshold {pct(view.threshold)})"),
            ("batches", f"{view.batches:,}"),
            ("served", f"{view.served_items:,} items, {view.served_tokens:,} tokens"),
            ("padding waste", pct(view.waste)),
            ("starving lanes", str(view.starving)),
            ("KV hits (engines)", f"{pct(view.cache_hit_rate)} of {pct(view.cache_achievable)} "
             "achievable" + ("  FLAGGED: the declared prefix is not what the engines see"
                             if view.cache_flagged else "")),
            ("consumers", ", ".join(view.consumers) or "-"),
            ("GPUs", ", ".join(str(g) for g in view.gpus) or "-"),
        ]
        if view.finished_at is not None:
            rows.append(("finished", _when(view.finished_at, doc["now"])))
    rows.append(("thrash", doc["thrash"]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def _history(doc: dict[str, Any]) -> Table:
    t = Table(title="state history", title_justify="left")
    t.add_column("when")
    t.add_column("state")
    for when, state in doc["history"]:
        t.add_row(_when(when, doc["now"]), state)
    return t


def _percentiles(view: ShapeView) -> Table:
    t = Table(title="input length percentiles (tokens, 512-bin histogram)", title_justify="left",
              min_width=56)
    for k in view.percentiles:
        t.add_column(k, justify="right")
    t.add_row(*(f"{v:,.0f}" for v in view.percentiles.values()))
    return t


def _lanes(view: ShapeView) -> Table:
    t = Table(title=f"lanes ({len(view.lanes or [])})", title_justify="left")
    for name in ("LANE", "TARGET", "ITEMS", "TOKENS", "WASTE", "OLDEST", "IN FLIGHT", "MARK"):
        t.add_column(name, justify="left" if name == "MARK" else "right", no_wrap=True)
    for la in view.lanes or []:
        mark = ", ".join(m for m, on in (("starving", la.starving),
                                         ("quiescing", la.quiescing)) if on) or "-"
        t.add_row(str(la.id), f"{la.target:,}", f"{la.items:,}", f"{la.tokens:,}",
                  pct(la.waste), age(la.oldest_age), str(la.inflight), mark)
    return t


def _events(doc: dict[str, Any]) -> Table:
    t = Table(title="recent events", title_justify="left")
    t.add_column("when", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for e in doc["events"][-RECENT_EVENTS:]:
        if e.kind == "transition":
            detail = f"{e.src} → {e.dst}" + (f" ({e.reason})" if e.reason else "")
        else:
            detail = e.reason or (str(e.value) if e.value else "")
        kind = f"{e.kind}{' (critical)' if e.critical else ''}"
        t.add_row(_when(e.t, doc["now"]), kind, detail)
    return t


def render_inspect(con: Any, doc: dict[str, Any], view: ShapeView | None) -> None:
    con.print(_summary(doc, view))
    con.print(_history(doc))
    if view is not None:
        con.print(_percentiles(view))
        if view.lanes is not None:
            con.print(_lanes(view))
    if doc["events"]:
        con.print(_events(doc))
