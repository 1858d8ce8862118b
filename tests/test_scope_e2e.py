"""`fabricctl run` in the default shape scope ("consumer") on two simulated GPUs, end to end.

Several shapes through the real daemon: every item gets exactly one result; each consumer is
shape-pure between the switches the lifecycle gave it (its batches change shape no more often
than it took a shape); every pre-warm push reaches only the consumer the shape warms for, and
none with `[broker] prewarm = "off"`; the thrash histogram and the events agree with what
the engines saw. Also: the pre-warm mode's one decision, and `status` showing each
consumer's current and next shape in hex.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fabricctl.cli.run as batchjob
from fabricctl.cli.status import render_status, shapes_hex
from fabricctl.config import load_config
from fabricctl.core.config import prewarm_enabled
from fabricctl.core.events import EventKind
from fabricctl.core.types import Prewarm, Work
from fabricctl.engines.sim import SimEngine
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.formats.workload import generate

SHAPES, PER_SHAPE = 8, 1500


class ScopeDaemon(batchjob.Daemon):
    """Why: the real Daemon, remembering the core's per-consumer state before it stops."""

    seen: dict[str, Any] = {}

    async def stop(self) -> None:
        core = self.server.state.view
        ScopeDaemon.seen = {
            "scope": core.cfg.shape_scope,
            "runs": {c: s.runs for ms in core.models.values() for c, s in ms.slots.items()},
            "hist": (core.batches_hist.total, core.batches_hist.thrashed,
                     list(core.batches_hist.samples)),
            "batches": core.batches_total,
            "events": dict(core.events.counts),
        }
        await super().stop()


@pytest.mark.parametrize("prewarm", ["auto", "off"])
def test_run_in_consumer_scope_is_shape_pure_and_prewarms_one_consumer(
        tmp_path: Path, monkeypatch: Any, prewarm: str) -> None:
    enc = msgspec.json.Encoder()
    lines = [enc.encode(d) for d in generate(SHAPES * PER_SHAPE, SHAPES, seed=11, zipf_s=1.0,
                                            median_tokens=48, max_tokens=4)]
    workload = tmp_path / "w.jsonl"
    workload.write_bytes(b"\n".join(lines) + b"\n")
    items = {p.item.id: p.item for p in parse_lines(lines) if isinstance(p, Parsed)}
    runs: dict[str, list[int]] = {}
    pushes: list[tuple[str, int, int, str | None]] = []
    real_run, real_prewarm = SimEngine.run, SimEngine.prewarm

    async def run(self: SimEngine, work: Work) -> list[Any]:
        runs.setdefault(self.name, []).append(work.signature)
        return await real_run(self, work)

    async def record_prewarm(self: SimEngine, signal: Prewarm) -> None:
        pushes.append((self.name, signal.signature, signal.epoch, signal.consumer))
        await real_prewarm(self, signal)

    monkeypatch.setattr(SimEngine, "run", run)
    monkeypatch.setattr(SimEngine, "prewarm", record_prewarm)
    monkeypatch.setattr(batchjob, "Daemon", ScopeDaemon)
    cfg = load_config(cwd=tmp_path, env={})
    cfg = dataclasses.replace(cfg, data_dir=tmp_path / "data", engine="sim",
                              sim=dataclasses.replace(cfg.sim, time_scale=0.0),
                              broker=dataclasses.replace(cfg.broker, prewarm=prewarm))
    out = io.BytesIO()
    summary = asyncio.run(batchjob.run_job(cfg, workload, out, errors=lambda m: None))
    ids = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert len(ids) == len(set(ids)) == len(items)  # every item exactly one result
    seen = ScopeDaemon.seen
    assert seen["scope"] == "consumer"  # the default
    assert summary.gpus == 2 and len(runs) == 2
    consumer_of = {f"sim{i}": f"sim-gpu{i}" for i in range(2)}
    for engine, sigs in runs.items():
        changes = sum(a != b for a, b in itertools.pairwise(sigs))
        assert changes <= seen["runs"][consumer_of[engine]] - 1  # shape-pure between switches
    assert {s for sigs in runs.values() for s in sigs} == {i.signature for i in items.values()}
    if prewarm == "off":
        assert not pushes and seen["events"].get(EventKind.PREWARM.value, 0) > 0
    else:  # "auto" pre-warms simulated engines
        assert pushes, "no pre-warm was pushed"
    for engine, _sig, _epoch, target in pushes:
        assert target == consumer_of[engine]  # only the consumer the shape warms for
    signals = [(sig, epoch) for _, sig, epoch, _ in pushes]
    assert len(signals) == len(set(signals))  # each signal reached one consumer
    assert len(signals) <= seen["events"].get(EventKind.PREWARM.value, 0)
    total, thrashed, samples = seen["hist"]
    assert total == len(samples) and thrashed <= sum(b < 100 for b in samples)
    assert thrashed == seen["events"].get(EventKind.THRASH.value, 0)
    assert sum(samples) <= seen["batches"]
    assert summary.thrash_events == thrashed
    assert summary.ledger_difference == (0, 0)


def test_prewarm_auto_warms_simulated_engines_only() -> None:
    assert prewarm_enabled("auto", simulated=True) and not prewarm_enabled("auto", False)
    assert prewarm_enabled("on", False) and not prewarm_enabled("off", True)
    with pytest.raises(ValueError):
        prewarm_enabled("sometimes", True)


def test_status_shows_each_consumers_current_and_next_shape_in_hex() -> None:
    view = shapes_hex({"name": "sim-gpu0", "model": "m", "max_batch_size": 8,
                       "max_batch_tokens": 4096, "batches_inflight": 1, "batches_done": 2,
                       "items_done": 9, "current": 0xA11CE, "next": None})
    assert (view["current"], view["next"]) == ("00000000000a11ce", None)
    st = {"version": "x", "ledger": dict.fromkeys(
        ("items_received", "tokens_received", "items_queued", "tokens_queued",
         "items_inflight", "tokens_inflight", "items_completed", "tokens_completed"), 0),
          "difference": [0, 0], "states": {}, "consumers": [view]}
    from rich.console import Console

    con = Console(width=200, record=True)
    for t in render_status(st, "/d"):
        con.print(t)
    assert "00000000000a11ce" in con.export_text()
