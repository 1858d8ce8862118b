"""`fabricctl run` end to end on simulated GPUs, and `fabricctl up` choosing them without NVML."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

import fabricctl.cli.run as batchjob
from fabricctl.config import load_config
from fabricctl.core.signature import signature_hex
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.formats.workload import generate

SHAPES, PER_SHAPE = 20, 800


class RecordingDaemon(batchjob.Daemon):
    """The real Daemon, remembering the broker's and engines' counters before it stops."""

    seen: dict[str, Any] = {}

    async def stop(self) -> None:
        core = self.server.state.view
        RecordingDaemon.seen = {
            "engines": [e.stats() for e in self.fleet.engines],
            "switches": sum(m.switches for m in core.models.values()),
            "midstream": sum(m.midstream_switches for m in core.models.values()),
            "waste": core.waste(),
            "thrash": core.batches_hist.thrashed,
            "ledger": msgspec.structs.replace(core.ledger),
        }
        await super().stop()


def test_run_gives_every_item_one_result_and_counters_agree(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    enc = msgspec.json.Encoder()
    lines = [enc.encode(d) for d in generate(SHAPES * PER_SHAPE, SHAPES, seed=5, zipf_s=0.0,
                                            median_tokens=48, max_tokens=4)]
    workload = tmp_path / "w.jsonl"
    workload.write_bytes(b"\n".join(lines) + b"\n")
    items = {p.item.id: p.item for p in parse_lines(lines) if isinstance(p, Parsed)}
    assert len(items) == SHAPES * PER_SHAPE
    assert len({(i.model, i.signature) for i in items.values()}) == SHAPES
    monkeypatch.setattr(batchjob, "Daemon", RecordingDaemon)
    cfg = load_config(cwd=tmp_path, env={})
    cfg = dataclasses.replace(cfg, data_dir=tmp_path / "data", engine="sim",
                              sim=dataclasses.replace(cfg.sim, time_scale=0.0))
    out = io.BytesIO()
    summary = asyncio.run(batchjob.run_job(cfg, workload, out, errors=lambda m: None))
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)) == len(items)  # every item exactly one result
    for r in results:
        it = items[r["id"]]
        assert r["shape"] == signature_hex(it.signature)  # with its shape
        assert r["usage"]["prompt_tokens"] == it.input_tokens
        assert r["error"] is None
    seen = RecordingDaemon.seen
    stats = seen["engines"]
    queries = sum(s.prefix_cache_queries for s in stats)
    hits = sum(s.prefix_cache_hits for s in stats)
    assert summary.items == len(items)
    assert summary.tokens_in == sum(i.input_tokens for i in items.values())
    assert summary.tokens_out == sum(r["usage"]["completion_tokens"] for r in results)
    assert summary.shapes == SHAPES
    assert summary.kv_hit_rate == round(hits / queries, 4)
    assert 0 < summary.kv_hit_rate <= summary.kv_hit_achievable + 0.02
    # every shape runs somewhere; a GPU's first shape is a load, not a switch
    assert summary.shape_switches == seen["switches"] >= SHAPES - summary.gpus
    assert summary.midstream_switches == seen["midstream"] == 0
    assert summary.padding_waste == round(seen["waste"], 4)
    assert summary.thrash_events == seen["thrash"]
    assert summary.ledger_difference == (0, 0)
    assert seen["ledger"].items_completed == len(items)
    assert summary.simulated is True
    assert summary.gpus == 2


def test_up_without_nvml_starts_simulated_gpus_and_says_why(tmp_path: Path) -> None:
    env = {**os.environ, "FABRICCTL_CONFIG": str(tmp_path / "none.toml"), "COLUMNS": "200"}
    env.pop("FABRICCTL_ENGINE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricctl", "up", "--data-dir", str(tmp_path / "d")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:  # waits on the daemon's own log lines, no sleeps
            lines.append(line)
            if "joined" in line and sum("joined" in x for x in lines) == 2:
                break
        log = "".join(lines)
        assert "engine: sim" in log
        assert "NVML unavailable" in log
        assert "simulated" in log
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130
    assert "LMDB closed" in rest
