"""`fabricctl run`'s achievable KV hit rate bounds the engines' own hit rate (simulated GPUs).

The engines count every request they ran, pre-warms included. The achievable figure once
charged each shape one prefill of its prefix per GPU on top of that: where a pre-warm had
already paid it (its prefix tokens are queries that never hit), or where shapes sharing a
leading component hit each other's blocks, the run reported a hit rate above the achievable
one (0.50 against 0.19 with ~12,500 shapes of about one item each)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import zlib
from pathlib import Path

import msgspec
import pytest

import fabricctl.cli.run as batchjob
from fabricctl.cli.run_summary import AchievableHits
from fabricctl.config import load_config
from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.records import make_record
from fabricctl.core.types import Item, ItemResult, Prewarm

WORD = "abcd"  # 4 bytes: one estimated token


def _text(tag: str, tokens: int) -> str:
    return (tag + WORD * tokens)[: tokens * 4]


def _workload(path: Path, shapes: int, shared_system: bool, each: int = 1) -> Path:
    """`each` items per shape: a 256-token system prompt (one for all, or one per shape)
    and a 48-token few-shot block of its own, then a 40-token prompt."""
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for k in range(shapes):
            system = _text("sys:" if shared_system else f"sys{k}:", 256)
            prefix = [system, _text(f"few{k}:", 48)]
            for j in range(each):
                f.write(enc.encode({"id": f"q{k}-{j}", "model": "fabric-demo",
                                    "prefix": prefix, "prompt": _text(f"[{k}.{j}]", 40),
                                    "max_tokens": 2}) + b"\n")
    return path


@pytest.mark.parametrize(("shared_system", "prewarm"), [(False, "auto"), (True, "off")])
def test_run_hit_rate_never_exceeds_the_achievable(tmp_path: Path, shared_system: bool,
                                                   prewarm: str) -> None:
    cfg = load_config(cwd=tmp_path, env={})
    cfg = dataclasses.replace(cfg, data_dir=tmp_path / "data", engine="sim",
                              sim=dataclasses.replace(cfg.sim, time_scale=0.0),
                              # every shape eligible at once: the next one is pre-warmed
                              # (where pre-warms are on) while one runs
                              broker=dataclasses.replace(cfg.broker, prewarm=prewarm,
                                                         activate_multiple=0.01))
    # two items a shape where pre-warms are on: a shape of one item gets none (its batch
    # computes the same prefix: `server.signals.lone_item`)
    each = 1 if shared_system else 2
    workload = _workload(tmp_path / "w.jsonl", 60, shared_system, each)
    summary = asyncio.run(batchjob.run_job(cfg, workload, io.BytesIO(),
                                           errors=lambda m: None))
    assert summary.items == 60 * each and summary.shapes == 60
    assert summary.kv_hit_rate > 0.3  # the pre-warms', or the shared system prompt's, hits
    assert summary.kv_hit_rate <= summary.kv_hit_achievable
    if not shared_system:  # nothing evicted, nothing shared: the bound is (nearly) met
        assert summary.kv_hit_achievable - summary.kv_hit_rate < 0.03


def _item(ident: str, components: list[str], tokens: list[int], prompt: int, n: int = 1
          ) -> Item:
    body = msgspec.json.encode({"n": n}) if n > 1 else b""
    payload = Payload(components, "p-" + ident, tokens, prompt, body=body)
    return Item(ident, "m", zlib.crc32("\x00".join(components).encode()),
                sum(tokens) + prompt, 4, encode_payload(payload))


def _ran(shapes: AchievableHits, item: Item, gpu: int) -> None:
    shapes.completed(make_record(item, ItemResult(item.id, tokens_out=1), gpu=gpu))


def test_achievable_counts_each_prefix_block_once_per_gpu() -> None:
    shapes = AchievableHits()
    a1 = _item("a1", ["S", "A"], [40, 24], 30)  # prefix 64 tokens: 4 blocks of 16
    a2 = _item("a2", ["S", "A"], [40, 24], 30)
    b1 = _item("b1", ["S", "B"], [40, 24], 30)  # shares S's first 2 blocks (32 of 40 tokens)
    c1 = _item("c1", ["C"], [64], 30, n=3)  # 3 requests: the siblings hit the whole prompt
    for it in (a1, a2, b1, c1):
        shapes.add(it)
    for it in (a1, a2, b1):
        _ran(shapes, it, gpu=0)
    _ran(shapes, a1, gpu=1)  # the same shape on another GPU computes its blocks again
    _ran(shapes, c1, gpu=1)
    # gpu 0: 3 requests x 4 blocks, minus the 4 + 2 distinct blocks S/A and S/B compute
    # gpu 1: a1 computes its 4 blocks; c1's first request its 4, its 2 siblings hit
    #        floor(93 / 16) = 5 blocks each
    assert shapes.achievable(16) == (12 - 6) * 16 + 0 + 2 * 5 * 16
    # a pre-warm of shape A on gpu 1 pays A's prefill: a1 there can hit all 4 blocks, the
    # pre-warm itself 3 (its last token is computed) of which it hits none
    shapes.prewarmed(1, Prewarm("m", a1.signature, "A", 1, [], sample=a1))
    assert shapes.achievable(16) == (12 - 6) * 16 + 4 * 16 + 2 * 5 * 16
