"""What observers see: snapshots with the daemon's extras, the questions' answers, pushes.

Contract: every answer is msgpack of plain Structs/dicts, so `--json` readers and the
dashboard decode the same bytes. Each question (`wire.queries`) has one handler in
`HANDLERS`, keyed by its request type (`answer` looks it up); an unknown shape or job gets
an `Error`: none is `not_found`, several `ambiguous` (the message lists them). `ShapesQuery`
lists the live shapes (with `all`, then the finished shapes' records, newest first);
`ShapeQuery` the one shape its `ref` names (`fabricctl.core.naming`: live first, else a
finished record). `StatusQuery` is the broker's summary: `unserved` lists the models with
queued items and no registered consumer (`core.unserved`), `jobs` the jobs not ended with
their counts, endpoints and place in the fleet, `mix` the endpoint mix of every live job
summed (`{"jobs": N, "endpoints": {name: items}}`). `ResultsQuery` pages the results in
storage order as (sequence number, ResultRecord); `ResultsByKeyQuery` in entry-key order as
(24 hex digits, ResultRecord) after `after` (`results --ordered`). `JobsQuery` lists job
records newest first; `JobQuery` is the `JobView` of the one job its `ref` names;
`JobResultsQuery` that job's results after `after_line`, in input order. A job's place
(`core.forecast.JobView`) rides on its `JobView`, in every snapshot and alone in
`JobViewsQuery`. Each consumer in the `engines` extra carries the `host` and the GPU's
NVML sample (`nvml`, or None) its heartbeats reported.
Every read of the store goes through its methods; the views see the daemon through its
`ServerState`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.forecast import finish_in
from fabricctl.core.jobs import JobRecord, JobState
from fabricctl.core.naming import describe, match
from fabricctl.core.snapshot import ShapeView, Snapshot, shape_view
from fabricctl.core.unserved import unserved
from fabricctl.server.eventloop import loop_name
from fabricctl.wire.protocol import (
    Answer,
    Error,
    JobShapeView,
    JobView,
    StatsPush,
    Subscribe,
    encode_raw,
)
from fabricctl.wire.queries import (
    ConsumersQuery,
    EventsQuery,
    JobQuery,
    JobResultsQuery,
    JobsQuery,
    JobViewsQuery,
    LedgerQuery,
    Query,
    ResultQuery,
    ResultsByKeyQuery,
    ResultsQuery,
    ShapeQuery,
    ShapesQuery,
    SnapshotQuery,
    StatusQuery,
)

if TYPE_CHECKING:
    from fabricctl.server.state import ServerState


def extras(state: ServerState) -> dict[str, Any]:
    """The daemon's additions to a core snapshot: engines, GPUs, processes, storage."""
    out: dict[str, Any] = {}
    for key, fn in state.extra.items():
        try:
            out[key] = msgspec.to_builtins(fn())
        except Exception as e:  # a monitor's failure must not break the stream
            out[key] = {"error": str(e)}
    out["engines"] = {
        p.consumer: {"gpu": p.gpu, "engine": p.engine, "simulated": p.simulated,
                     "last_seen": p.last_seen, "stats": p.engine_stats,
                     "host": p.engine_stats.get("host") or "", "nvml": p.engine_stats.get("nvml"),
                     "gpus": p.engine_stats.get("gpus"),  # a server's group, when it spans one
                     "nvml_group": p.engine_stats.get("nvml_group")}  # its other GPUs' samples
        for p in state.consumers.values() if p.consumer
    }
    out["store"] = state.store.stats()
    out["uptime_s"] = round(state.clock() - state.started, 1)
    out["loop"] = loop_name()
    return out


def snapshot(state: ServerState, lanes: Any = "none", events: int = 100) -> Snapshot:
    snap = state.view.snapshot(state.clock(), lanes, events, state.received())
    snap.simulated = any(p.simulated for p in state.consumers.values())
    snap.extra = extras(state)
    snap.jobs = dashboard_jobs(state)
    return snap


DASHBOARD_JOBS = 5  # the jobs a snapshot carries for `top`: the live ones, then the newest


def dashboard_jobs(state: ServerState) -> list[JobRecord]:
    """The live jobs (from memory), topped up with the newest ended ones, at most
    `DASHBOARD_JOBS` in all."""
    live = state.store.live_jobs()[:DASHBOARD_JOBS]
    if len(live) >= DASHBOARD_JOBS:
        return live
    seen = {j.number for j in live}
    recent = [j for j in state.store.recent_jobs(DASHBOARD_JOBS) if j.number not in seen]
    return live + recent[:DASHBOARD_JOBS - len(live)]


def stats_push(state: ServerState, sub: Subscribe) -> StatsPush:
    lanes: Any = "all" if sub.all_lanes else {tuple(k) for k in sub.lanes}
    return StatsPush(encode_raw(snapshot(state, lanes)))


def find_shapes(state: ServerState, arg: str) -> list[Any]:
    """The shapes `arg` names (`fabricctl.core.naming`): live ones (core `Shape`s) first,
    then finished records (`ShapeView`s) newest first, one per key."""
    finished = state.store.finished_shapes(state.store.store_cfg.finished_shapes_kept)
    return match(arg, [*state.view.shapes(), *finished])


def _shape(state: ServerState, q: ShapeQuery) -> Any:
    found = find_shapes(state, q.ref)
    if not found:
        return Error("not_found", f"no shape matches {q.ref!r}", q.rid)
    if len(found) > 1:
        listed = ", ".join(describe(s) for s in found[:20])
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        return Error("ambiguous", f"{q.ref!r} names {len(found)} shapes: {listed}{more}; "
                     "give more hex digits or the label", q.rid)
    s = found[0]
    if isinstance(s, ShapeView):
        return s
    return shape_view(s, state.clock(), state.view.cfg.starve_s, True)


def resolve_job(state: ServerState, ref: str, rid: int) -> int | Error:
    """The one job an id or unique id prefix names, or the `Error` to answer: none is
    `not_found`, several `ambiguous` (the message lists them)."""
    found = state.store.find_jobs(ref.strip())
    if not found:
        return Error("not_found", f"no job matches {ref!r}", rid)
    if len(found) > 1:
        ids = [rec.id for n in found[:20] if (rec := state.store.job(n)) is not None]
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        return Error("ambiguous", f"{ref!r} names {len(found)} jobs: {', '.join(ids)}{more}; "
                     "give more of the id", rid)
    return found[0]


def job_view(state: ServerState, rec: JobRecord) -> JobView:
    """A job's record with what only the live broker knows: in flight, rate, time to go."""
    now = state.clock()
    in_flight = 0 if rec.ended else state.store.job_in_flight().get(rec.number, 0)
    began = rec.times.get(JobState.IN_PROGRESS.value, rec.created)
    end = now
    if rec.ended:
        end = max(rec.times.values(), default=now)
    elapsed = end - began
    rate = rec.outcomes / elapsed if elapsed > 0 and rec.outcomes else 0.0
    shapes = [JobShapeView(s.model, f"{s.signature:016x}", s.label) for s in rec.shapes]
    place = None if rec.ended else places(state, now).get(rec.number)
    return JobView(rec, in_flight, shapes, round(rate, 3), finish_in(place, now), place)


def places(state: ServerState, now: float) -> dict[int, JobPlace]:
    """Each job with queued items: its place in the fleet (`core.forecast`), by number."""
    return {v.job: v for v in state.view.job_views(now)}


def jobs_summary(state: ServerState, limit: int = 20) -> list[dict[str, Any]]:
    """The jobs not ended, newest first, with their counts and their place in the fleet:
    oldest wait, holders and share, deadline, predicted finish, at risk (for `status`)."""
    live = state.store.live_jobs()
    placed = places(state, state.clock())
    out = []
    for r in live[:limit]:
        p = placed.get(r.number)
        out.append({"id": r.id, "kind": r.kind, "name": r.name, "state": r.state.value,
                    "total": r.total, "queued": r.queued, "completed": r.completed,
                    "failed": r.failed, "cancelled": r.cancelled, "deadline": r.deadline,
                    "oldest_wait_s": p.oldest_wait_s if p else 0.0,
                    "holders": p.holders if p else 0, "share": p.share if p else 0.0,
                    "predicted_finish": p.predicted_finish if p else None,
                    "at_risk": p.at_risk if p else False, "endpoints": r.endpoints})
    return out


def live_mix(state: ServerState) -> dict[str, Any]:
    """The endpoint mix of every live job (`core.mix`): items per endpoint, summed, and how
    many jobs (for `status`)."""
    live = state.store.live_jobs()
    counts: dict[str, int] = {}
    for r in live:
        for name, k in r.endpoints.items():
            counts[name] = counts.get(name, 0) + k
    return {"jobs": len(live), "endpoints": counts}


def _job(state: ServerState, ref: str, rid: int) -> JobRecord | Error:
    found = resolve_job(state, ref, rid)
    if isinstance(found, Error):
        return found
    rec = state.store.job(found)
    return Error("not_found", f"no job matches {ref!r}", rid) if rec is None else rec


def _job_view(state: ServerState, q: JobQuery) -> Any:
    rec = _job(state, q.ref, q.rid)
    return rec if isinstance(rec, Error) else job_view(state, rec)


def _job_results(state: ServerState, q: JobResultsQuery) -> Any:
    rec = _job(state, q.ref, q.rid)
    if isinstance(rec, Error):
        return rec
    return state.store.job_results(rec.number, q.after_line, max(0, min(q.limit, 100_000)))


def _shapes(state: ServerState, q: ShapesQuery) -> Any:
    core, now = state.view, state.clock()
    data: list[Any] = [shape_view(s, now, core.cfg.starve_s, False) for s in core.shapes()]
    if q.all:
        data += state.store.finished_shapes(state.store.store_cfg.finished_shapes_kept)
    return data


def _ledger(state: ServerState, q: LedgerQuery) -> Any:
    core = state.view
    return {"ledger": core.ledger, "difference": core.ledger.difference(),
            "persisted": state.store.persisted_ledger}


def _results_by_key(state: ServerState, q: ResultsByKeyQuery) -> Any:
    if len(q.after) not in (0, 24) or any(c not in "0123456789abcdef" for c in q.after):
        return Error("bad_query", f"results_by_key takes an entry key in 24 lower-case "
                     f"hex digits or nothing, not {q.after!r}", q.rid)
    return state.store.results_by_key(q.after, q.limit)


def _status(state: ServerState, q: StatusQuery) -> Any:
    snap = snapshot(state)
    return {"version": state.metrics.version, "ledger": snap.ledger,
            "difference": snap.difference, "states": snap.states,
            "models": snap.models, "consumers": len(snap.consumers),
            "counters": snap.counters, "extra": snap.extra,
            "jobs": jobs_summary(state), "mix": live_mix(state),
            "unserved": unserved(snap.shapes, snap.consumers)}


# One handler per question, keyed by its request type: its answer's data, or an `Error`.
HANDLERS: dict[type[Any], Callable[[ServerState, Any], Any]] = {
    ShapesQuery: _shapes,
    ShapeQuery: _shape,
    ConsumersQuery: lambda state, q: snapshot(state).consumers,
    LedgerQuery: _ledger,
    EventsQuery: lambda state, q: state.view.events.since(q.since, q.limit),
    ResultsQuery: lambda state, q: state.store.results_since(q.since, q.limit),
    ResultsByKeyQuery: _results_by_key,
    ResultQuery: lambda state, q: state.store.result(q.id, q.job),
    JobsQuery: lambda state, q: state.store.recent_jobs(max(0, q.limit), max(0, q.before),
                                                        q.kind),
    JobViewsQuery: lambda state, q: state.view.job_views(state.clock()),
    JobQuery: _job_view,
    JobResultsQuery: _job_results,
    SnapshotQuery: lambda state, q: snapshot(state, "all" if q.all_lanes else "none"),
    StatusQuery: _status,
}


def answer(state: ServerState, q: Query) -> Answer | Error:
    """The answer to one question, by the handler its type names."""
    data = HANDLERS[type(q)](state, q)
    return data if isinstance(data, Error) else Answer(q.rid, encode_raw(data))
