"""What observers see: snapshots with the daemon's extras, one-shot query answers, pushes.

Contract: every answer is msgpack of plain Structs/dicts, so `--json` readers and the
dashboard decode the same bytes. Unknown queries and unknown shapes get an `Error`.
`shapes` lists the live shapes (with arg "all", then the finished shapes' records, newest
first); `shape` is the one shape its arg names (`fabricctl.core.naming`: hex, label or a
unique hex prefix; live first, else a finished record from the store): none is `not_found`,
several `ambiguous` (the message lists them).
`status` is the broker's summary; its `unserved` lists the models with queued items and no
registered consumer (`fabricctl.core.unserved`: model, items, tokens; most items first).
`results` pages the results in storage order as (sequence number, ResultRecord);
`results_by_key` pages them in entry-key (ingest) order as (entry key in 24 hex digits,
ResultRecord), after the key in `arg` ("" from the first): `fabricctl results --ordered`.
`jobs` lists the job records, newest first (`limit` of them); `job` is the `JobView` of the
one job its arg names (an id or a unique prefix: none is `not_found`, several `ambiguous`);
`job_results` the results of that job's lines after `since`, in input order, `limit` at
most; `status` carries a small `jobs` summary (the jobs not ended, with their counts, their
items per endpoint and their place in the fleet) and `mix`, the endpoint mix of every live
job summed (`{"jobs": N, "endpoints": {name: items}}`). A job's place
(`core.forecast.JobView`: oldest wait, holders and share, predicted finish, at risk) rides
on its `job` answer (`place`, None with nothing queued), in every snapshot (`job_views`),
and alone in `job_views` (every job with queued items, by number).
Each consumer in the `engines` extra carries the `host` and the GPU's NVML sample (`nvml`,
or None) its heartbeats reported.
Every read of the store goes through its methods (`results_since`, `results_by_key`,
`result`, `finished_shapes`, `stats`, `persisted_ledger`, `find_jobs`, `job`, `live_jobs`,
`recent_jobs`, `job_results`, `job_in_flight`); the views see the daemon through
its `ServerState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.jobs import JobRecord, JobState, eta_s
from fabricctl.core.naming import describe, match
from fabricctl.core.snapshot import ShapeView, Snapshot, shape_view
from fabricctl.core.unserved import unserved
from fabricctl.server.eventloop import loop_name
from fabricctl.wire.protocol import (
    Answer,
    Error,
    JobShapeView,
    JobView,
    Query,
    StatsPush,
    Subscribe,
    encode_raw,
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
    snap = state.core.snapshot(state.clock(), lanes, events, state.received())
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
    return match(arg, [*state.core.shapes(), *finished])


def _shape_answer(state: ServerState, q: Query) -> Any:
    found = find_shapes(state, q.arg)
    if not found:
        return Error("not_found", f"no shape matches {q.arg!r}", q.rid)
    if len(found) > 1:
        listed = ", ".join(describe(s) for s in found[:20])
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        return Error("ambiguous", f"{q.arg!r} names {len(found)} shapes: {listed}{more}; "
                     "give more hex digits or the label", q.rid)
    s = found[0]
    if isinstance(s, ShapeView):
        return s
    return shape_view(s, state.clock(), state.core.cfg.starve_s, True)


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
    return JobView(rec, in_flight, shapes, round(rate, 3), eta_s(rec, now), place)


def places(state: ServerState, now: float) -> dict[int, JobPlace]:
    """Each job with queued items: its place in the fleet (`core.forecast`), by number."""
    return {v.job: v for v in state.core.job_views(now)}


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


def _job_answer(state: ServerState, q: Query) -> Any:
    found = resolve_job(state, q.arg, q.rid)
    if isinstance(found, Error):
        return found
    rec = state.store.job(found)
    if rec is None:
        return Error("not_found", f"no job matches {q.arg!r}", q.rid)
    if q.what == "job":
        return job_view(state, rec)
    return state.store.job_results(found, q.since, max(0, min(q.limit, 100_000)))


def answer(state: ServerState, q: Query) -> Answer | Error:
    core, now = state.core, state.clock()
    data: Any
    if q.what == "shapes":
        data = [shape_view(s, now, core.cfg.starve_s, False) for s in core.shapes()]
        if q.arg == "all":
            data += state.store.finished_shapes(state.store.store_cfg.finished_shapes_kept)
    elif q.what == "shape":
        data = _shape_answer(state, q)
        if isinstance(data, Error):
            return data
    elif q.what == "consumers":
        data = snapshot(state).consumers
    elif q.what == "ledger":
        data = {"ledger": core.ledger, "difference": core.ledger.difference(),
                "persisted": state.store.persisted_ledger}
    elif q.what == "events":
        data = core.events.since(q.since, q.limit)
    elif q.what == "results":
        data = state.store.results_since(q.since, q.limit)
    elif q.what == "results_by_key":
        if len(q.arg) not in (0, 24) or any(c not in "0123456789abcdef" for c in q.arg):
            return Error("bad_query", f"results_by_key takes an entry key in 24 lower-case "
                         f"hex digits or nothing, not {q.arg!r}", q.rid)
        data = state.store.results_by_key(q.arg, q.limit)
    elif q.what == "result":
        data = state.store.result(q.arg)
    elif q.what == "jobs":
        data = state.store.recent_jobs(max(0, q.limit), max(0, q.since), q.arg)
    elif q.what == "job_views":
        data = core.job_views(now)
    elif q.what in ("job", "job_results"):
        data = _job_answer(state, q)
        if isinstance(data, Error):
            return data
    elif q.what == "snapshot":
        data = snapshot(state, "all" if q.arg == "all" else "none")
    elif q.what == "status":
        snap = snapshot(state)
        data = {"version": state.metrics.version, "ledger": snap.ledger,
                "difference": snap.difference, "states": snap.states,
                "models": snap.models, "consumers": len(snap.consumers),
                "counters": snap.counters, "extra": snap.extra,
                "jobs": jobs_summary(state), "mix": live_mix(state),
                "unserved": unserved(snap.shapes, snap.consumers)}
    else:
        return Error("unknown_query", f"unknown query {q.what!r}", q.rid)
    return Answer(q.rid, encode_raw(data))
