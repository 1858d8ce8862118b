"""What observers see: snapshots with the daemon's extras, one-shot query answers, pushes.

Contract: every answer is msgpack of plain Structs/dicts, so `--json` readers and the
dashboard decode the same bytes. Unknown queries and unknown shapes get an `Error`.
`results` pages the results in storage order as (sequence number, ResultRecord);
`results_by_key` pages them in entry-key (ingest) order as (entry key in 24 hex digits,
ResultRecord), after the key in `arg` ("" from the first): `fabricctl results --ordered`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import Snapshot, shape_view
from fabricctl.core.types import Item, Prewarm
from fabricctl.server.eventloop import loop_name
from fabricctl.store.keys import entry_decoder, entry_key_of
from fabricctl.wire.protocol import (
    Answer,
    Error,
    PrewarmPush,
    Query,
    StatsPush,
    Subscribe,
    encode_raw,
)

if TYPE_CHECKING:
    from fabricctl.server.app import BrokerServer
    from fabricctl.store.durable import DurableBroker


def sample_item(store: DurableBroker, model: str, signature: int) -> Item | None:
    """One queued item of a shape, read from the store, for the engine to prefill its prefix."""
    ms = store.core.models.get(model)
    shape = ms.open.get(signature) if ms else None
    if shape is None:
        return None
    for lane in shape.lanes.lanes.values():
        if lane.queue:
            with store.env.read() as txn:
                raw = txn.get(entry_key_of(lane.queue[0].key), db=store.env.dbs["data"])
            if raw is None:
                return None
            s = entry_decoder.decode(raw)
            return Item(s.id, model, signature, s.tokens, s.max_tokens, s.payload, shape.label,
                        s.source)
    return None


def results_by_key(store: DurableBroker, after: str, limit: int) -> list[tuple[str, Any]]:
    """Up to `limit` stored results in entry-key order, after the entry key `after` (24 hex
    digits; "" from the first). The `results` table is keyed by entry key, so this is one
    cursor walk; the records go out as stored (msgpack `ResultRecord`), not re-encoded."""
    start = bytes.fromhex(after) if after else b""
    out: list[tuple[str, Any]] = []
    with store.env.read() as txn:
        cur = txn.cursor(db=store.env.dbs["results"])
        at = cur.set_range(start) if start else cur.first()
        if at and start and cur.key() == start:
            at = cur.next()
        while at and len(out) < limit:
            out.append((cur.key().hex(), msgspec.Raw(cur.value())))
            at = cur.next()
    return out


def prewarm_push(signal: Prewarm) -> PrewarmPush:
    return PrewarmPush(signal)


def extras(server: BrokerServer) -> dict[str, Any]:
    """The daemon's additions to a core snapshot: engines, GPUs, processes, storage."""
    out: dict[str, Any] = {}
    for key, fn in server.extra.items():
        try:
            out[key] = msgspec.to_builtins(fn())
        except Exception as e:  # a monitor's failure must not break the stream
            out[key] = {"error": str(e)}
    out["engines"] = {
        p.consumer: {"gpu": p.gpu, "engine": p.engine, "simulated": p.simulated,
                     "last_seen": p.last_seen, "stats": p.engine_stats}
        for p in server.consumers.values() if p.consumer
    }
    env = server.store.env
    out["store"] = {"data_dir": str(env.data_dir), "used_bytes": env.used_bytes(),
                    "map_size": env.map_size, "free_disk": env.free_disk(),
                    "results": server.store.meta.rseq,
                    "recovery": msgspec.to_builtins(server.store.recovery)}
    out["uptime_s"] = round(server.clock() - server.started, 1)
    out["loop"] = loop_name()
    return out


def snapshot(server: BrokerServer, lanes: Any = "none", events: int = 100) -> Snapshot:
    snap = server.core.snapshot(server.clock(), lanes, events)
    snap.simulated = any(p.simulated for p in server.consumers.values())
    snap.extra = extras(server)
    return snap


def stats_push(server: BrokerServer, sub: Subscribe) -> StatsPush:
    lanes: Any = "all" if sub.all_lanes else {tuple(k) for k in sub.lanes}
    return StatsPush(encode_raw(snapshot(server, lanes)))


def find_shape(server: BrokerServer, arg: str) -> Any:
    """A live shape by signature (hex, with or without 0x) or by label."""
    want = arg.lower().removeprefix("0x")
    for s in server.core.shapes():
        if signature_hex(s.signature) == want.rjust(16, "0") or (s.label and s.label == arg):
            return s
    return None


def answer(server: BrokerServer, q: Query) -> Answer | Error:
    core, now = server.core, server.clock()
    data: Any
    if q.what == "shapes":
        data = [shape_view(s, now, core.cfg.starve_s, False) for s in core.shapes()]
    elif q.what == "shape":
        s = find_shape(server, q.arg)
        if s is None:
            return Error("not_found", f"no live shape matches {q.arg!r}", q.rid)
        data = shape_view(s, now, core.cfg.starve_s, True)
    elif q.what == "consumers":
        data = snapshot(server).consumers
    elif q.what == "ledger":
        data = {"ledger": core.ledger, "difference": core.ledger.difference(),
                "persisted": server.store.meta.ledger}
    elif q.what == "events":
        data = core.events.since(q.since, q.limit)
    elif q.what == "results":
        data = server.store.results_since(q.since, q.limit)
    elif q.what == "results_by_key":
        if len(q.arg) not in (0, 24) or any(c not in "0123456789abcdef" for c in q.arg):
            return Error("bad_query", f"results_by_key takes an entry key in 24 lower-case "
                         f"hex digits or nothing, not {q.arg!r}", q.rid)
        data = results_by_key(server.store, q.arg, q.limit)
    elif q.what == "result":
        data = server.store.result(q.arg)
    elif q.what == "snapshot":
        data = snapshot(server, "all" if q.arg == "all" else "none")
    elif q.what == "status":
        snap = snapshot(server)
        data = {"version": server.metrics.version, "ledger": snap.ledger,
                "difference": snap.difference, "states": snap.states,
                "models": snap.models, "consumers": len(snap.consumers),
                "counters": snap.counters, "extra": snap.extra}
    else:
        return Error("unknown_query", f"unknown query {q.what!r}", q.rid)
    return Answer(q.rid, encode_raw(data))
