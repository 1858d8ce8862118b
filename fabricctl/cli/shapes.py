"""`fabricctl shapes list|inspect`: the broker's shapes, for people and for scripts.

Contract: `group` is the `shapes` Typer group with its two commands, `list` and `inspect`.
- `list`: one row per live shape (open shapes and a draining current one); `--all` adds the
  finished shapes the broker keeps (their records, in LMDB: the last 1000, across restarts),
  newest first. On a terminal a Rich table fitted to its width (`common.fitted_table`: signature,
  state and queued items never cut, label and model cut first, other figures hidden, the caption
  says which); piped, plain TSV with a header line; `--json` one document `{"shapes":
  [ShapeView...]}` with `shape` (16 hex digits) next to each integer `signature`. Human output
  always names a shape in hex.
- `inspect SIG|LABEL|PREFIX`: one shape by signature (hex, with or without 0x, leading zeros
  optional), label, or a unique prefix of its 16 hex digits (`fabricctl.core.naming`): state and
  its history, epoch, tokens, lanes (a table), length percentiles from its 512-bin histogram,
  batches, items and tokens served, waste, KV hits, consumers and GPUs, thrash status. A finished
  shape is described from its record (the same fields, no lanes), else from the broker's event log
  (history, and whether it thrashed) while the log holds its events. Neither: `NotFound` (exit 1);
  a prefix or label naming several shapes → `Ambiguous` (exit 1): the error says to give one by
  its signature, with an example (or that no name tells apart one signature's shapes under several
  models), and lists the shapes it names, one line each: signature, label, model, state and the
  jobs whose items joined it (`candidates`); nothing on stdout. `--json`: the `ShapeView` (lanes
  included) plus `live`, `thrash_line`, `thrash` and `events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from fabricctl.cli.support import ConfigFile, DataDir, JsonOut, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.core.events import Event
from fabricctl.core.jobs import JobRecord
from fabricctl.core.naming import match
from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import ShapeView, Snapshot
from fabricctl.errors import Ambiguous, BrokerError, NotFound
from fabricctl.fmt import age, pct
from fabricctl.wire.client import Client

from .common import Col, call, console, fitted_table, stdout_is_tty, write_json, write_tsv
from .helpfmt import HelpCommand, HelpGroup

EVENTS_LIMIT = 10_000

group = typer.Typer(cls=HelpGroup, help="List and inspect the broker's shapes.",
                    no_args_is_help=True)


@group.command("list", cls=HelpCommand)
def list_command(
    all_shapes: bool = typer.Option(False, "--all", "-a", help="Also the finished shapes the "
                                    "broker keeps (the last 1000, across restarts)."),
    json_out: bool = JsonOut, data_dir: Path | None = DataDir, config: Path | None = ConfigFile,
) -> None:
    """List live shapes: state, epoch, queued items and tokens, lanes, batches, waste.

    A table on a terminal, tab-separated values with a header line when piped.
    """
    cfg = settings(data_dir, config)
    guarded(lambda: show_list(cfg, json_out, all_shapes))


@group.command("inspect", cls=HelpCommand)
def inspect_command(
    shape: str = typer.Argument(..., metavar="SIG|LABEL|PREFIX", help="Shape signature (16 "
                                "hex digits, 0x and leading zeros optional), label, or a "
                                "unique prefix of the 16 hex digits."),
    json_out: bool = JsonOut, data_dir: Path | None = DataDir, config: Path | None = ConfigFile,
) -> None:
    """Show one shape: state history, epoch, lanes, length percentiles, batches, waste, thrash.

    Live or finished (finished shapes are kept across restarts). Exit status 1 when no
    shape matches, or when a prefix or label names several: they are listed with their
    state and jobs, to inspect one by its signature.
    """
    cfg = settings(data_dir, config)
    guarded(lambda: show_inspect(cfg, shape, json_out))


def list_shapes(cfg: AppConfig, all_shapes: bool = False) -> list[ShapeView]:
    """Live shapes by model and queued tokens; with `all_shapes`, then the finished ones,
    newest first."""
    async def fetch(c: Client) -> list[ShapeView]:
        return await c.shapes(all_shapes)

    shapes = call(cfg, "observer", fetch)
    live = [s for s in shapes if s.finished_at is None]
    done = [s for s in shapes if s.finished_at is not None]
    return sorted(live, key=lambda s: (s.model, -s.tokens, s.signature)) + done


LIST_COLUMNS = ["shape", "label", "model", "state", "epoch", "items", "tokens",
                "inflight_items", "lanes", "batches", "waste", "age_s", "starving"]


# The table on a terminal: the signature, state and queued items are never cut nor hidden;
# the label and model are cut first, then the other figures hidden from STARVING up.
TABLE_COLUMNS = [
    Col("SHAPE"), Col("LABEL", shrink=12), Col("MODEL", shrink=16, drop=5), Col("STATE"),
    Col("EPOCH", True, drop=9), Col("ITEMS", True), Col("TOKENS", True, drop=3),
    Col("IN FLIGHT", True, drop=6), Col("LANES", True, drop=8), Col("BATCHES", True, drop=2),
    Col("WASTE", True, drop=7), Col("AGE", True, drop=4), Col("STARVING", True, drop=10)]


def _row(s: ShapeView) -> list[Any]:
    return [signature_hex(s.signature), s.label, s.model, s.state, s.epoch, s.items, s.tokens,
            s.inflight_items, s.lanes_in_use, s.batches, s.waste, s.age, s.starving]


def show_list(cfg: AppConfig, as_json: bool, all_shapes: bool = False) -> None:
    shapes = list_shapes(cfg, all_shapes)
    if as_json:
        write_json({"shapes": shapes})
        return
    if not stdout_is_tty():
        write_tsv(LIST_COLUMNS, [_row(s) for s in shapes])
        return
    from rich.text import Text

    what = "shape(s), live and finished" if all_shapes else "live shape(s)"
    con = console()
    rows = [[signature_hex(s.signature), s.label or "-", s.model, s.state, str(s.epoch),
             f"{s.items:,}", f"{s.tokens:,}", f"{s.inflight_items:,}", str(s.lanes_in_use),
             f"{s.batches:,}", pct(s.waste), age(s.age), str(s.starving) if s.starving else "-"]
            for s in shapes]
    con.print(fitted_table(TABLE_COLUMNS, rows, con.width, " (see shapes inspect SIG)",
                           title=Text(f"{len(shapes)} {what} — {cfg.data_dir}"),
                           title_justify="left"))


# ---- inspect ------------------------------------------------------------------------------


def _matches(e: Event, arg: str) -> bool:
    want = arg.lower().removeprefix("0x")
    return (e.kind != "consumer_joined" and e.kind != "consumer_lost") and (
        (bool(want) and all(c in "0123456789abcdef" for c in want) and len(want) <= 16
         and signature_hex(e.signature) == want.rjust(16, "0"))
        or (bool(e.label) and e.label == arg))


def fetch_shape(cfg: AppConfig, arg: str) -> tuple[ShapeView | None, list[Event], Snapshot]:
    """The shape (live, or a finished record; None when neither), its events still in the
    log, and a snapshot for context."""
    async def fetch(c: Client) -> tuple[ShapeView | None, list[Event], Snapshot]:
        try:
            view = await c.shape(arg)
        except BrokerError as e:
            if e.code == "ambiguous":
                shapes = await c.shapes(True)
                found = candidates(arg, shapes, await c.jobs())
                raise Ambiguous(ambiguous_text(arg, found) if found else e.message) from None
            if e.code != "not_found":
                raise
            view = None
        events = await c.events(0, EVENTS_LIMIT)
        snap = await c.snapshot()
        return view, events, snap

    view, events, snap = call(cfg, "observer", fetch)
    if view is not None:
        mine = [e for e in events if e.signature == view.signature and e.model == view.model
                and e.kind not in ("consumer_joined", "consumer_lost")]
    else:
        mine = [e for e in events if _matches(e, arg)]
    if view is None and not mine:
        raise NotFound(f"no shape matches {arg!r} (not live, and not in the broker's event log); "
                       "see `fabricctl shapes list`")
    return view, mine, snap


@dataclass(frozen=True)
class Candidate:
    """Why: an ambiguous name lists each shape it names with what tells them apart."""

    shape: str  # 16 hex digits: what to give `shapes inspect` instead
    label: str
    model: str
    state: str
    jobs: list[str]  # the ids of the jobs whose items joined it, newest first


def candidates(arg: str, shapes: list[ShapeView], jobs: list[JobRecord]) -> list[Candidate]:
    """The shapes `arg` names (`core.naming.match`, as the broker matches), each with the
    jobs (given newest first) whose records name it."""
    out = []
    for s in match(arg, shapes):
        ids = [j.id for j in jobs
               if any(k.model == s.model and k.signature == s.signature for k in j.shapes)]
        out.append(Candidate(signature_hex(s.signature), s.label, s.model, s.state, ids))
    return out


JOBS_LISTED = 3  # the job ids a candidate line names; "+N" for the rest


def ambiguous_text(arg: str, found: list[Candidate]) -> str:
    """The error of an ambiguous name: how to pick one (by a signature only one of them
    has; shapes of one signature under several models cannot be named apart), then one
    aligned line per shape."""
    rows = [["SHAPE", "LABEL", "MODEL", "STATE", "JOBS"]] + [
        [c.shape, c.label or "-", c.model, c.state,
         (", ".join(c.jobs[:JOBS_LISTED]) or "-")
         + (f" +{len(c.jobs) - JOBS_LISTED}" if len(c.jobs) > JOBS_LISTED else "")]
        for c in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  " + "  ".join([*(v.ljust(w) for v, w in zip(r, widths, strict=False)),
                               r[-1]]) for r in rows]
    unique = [c.shape for c in found if sum(d.shape == c.shape for d in found) == 1]
    how = (f"inspect one by its signature, e.g. fabricctl shapes inspect {unique[0]}" if unique
           else "they share one signature under several models, which no name tells apart: "
           "fabricctl shapes list --all --json shows each")
    return f"{arg!r} names {len(found)} shapes; {how}\n" + "\n".join(lines)


def thrash_status(view: ShapeView | None, events: list[Event], line: int) -> str:
    thrash = [e for e in events if e.kind == "thrash"]
    if thrash:
        return f"thrashed: {thrash[-1].reason or f'{thrash[-1].value} batches'}"
    finished = any(e.kind == "transition" and e.dst == "finished" for e in events)
    if view is not None and view.finished_at is not None:
        if view.thrashed:
            return f"thrashed: {view.thrash or f'finished after {view.batches} batches'}"
        return (f"no: finished after {view.batches} batches, at or above {line}"
                if view.batches >= line else f"no: finished after {view.batches} batches "
                "with nothing of its prefix waiting (short, not thrashing)")
    if view is None:
        return "no: finished without thrashing" if finished else "unknown"
    if view.state in ("staged", "warming"):
        return f"not dispatched yet (the thrash line is {line} batches)"
    if view.batches >= line:
        return f"no: {view.batches} batches, at or above the line of {line}"
    return (f"at risk: {view.batches} batches so far; finishing below {line} with its "
            "prefix staged again counts as thrashing")


def inspect_doc(view: ShapeView | None, events: list[Event], snap: Snapshot) -> dict[str, Any]:
    line = snap.batches_histogram.thrash_line
    if view is not None:
        import msgspec

        doc: dict[str, Any] = msgspec.to_builtins(view)
        doc["live"] = view.finished_at is None
    else:
        last = events[-1]
        states = [e.dst for e in events if e.kind == "transition"]
        doc = {"model": last.model, "signature": last.signature, "label": last.label,
               "state": states[-1] if states else "unknown", "live": False,
               "history": [[e.t, e.dst] for e in events if e.kind == "transition"]}
    doc["thrash_line"] = line
    doc["thrash"] = thrash_status(view, events, line)
    doc["events"] = events
    doc["now"] = snap.t
    return doc


def show_inspect(cfg: AppConfig, arg: str, as_json: bool) -> None:
    view, events, snap = fetch_shape(cfg, arg)
    doc = inspect_doc(view, events, snap)
    if as_json:
        write_json(doc)
        return
    from .inspect_view import render_inspect

    render_inspect(console(), doc, view)
