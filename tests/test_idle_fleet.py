"""No GPU idles while work waits (issue 18), through the real daemon and HTTP path on FakeVllm:
items handed to an idle fleet leave in their first batch within one broker tick, and while
items are queued no engine sits with nothing in its server for a tick, across shape
switches (several shapes arrive at once; the lifecycle stages them)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from fake_vllm import FakeVllm
from idle_fleet import timeline

from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings
from fabricctl.core.config import CoreConfig

TICK_S = 1.0  # the broker's maintenance tick


def lines(shapes: int, per_shape: int) -> list[bytes]:
    enc = msgspec.json.Encoder()
    return [enc.encode({"id": f"s{s}-{k}", "model": "m", "prefix": [f"shape {s} " * 30],
                        "prompt": f"question {k}", "max_tokens": 4})
            for k in range(per_shape) for s in range(shapes)]


def test_an_idle_fleet_starts_at_once_and_never_idles_while_items_wait(
        tmp_path: Path, monkeypatch: Any) -> None:
    fakes = [FakeVllm(delay_s=0.05, max_running=8) for _ in range(2)]
    try:
        cfg = AppConfig(data_dir=tmp_path / "data", engine="openai", model="m",
                        broker=CoreConfig(),  # the defaults: lifecycle on, staging
                        vllm=VllmSettings(endpoints=[f.url for f in fakes]),
                        consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=8000,
                                                  max_input_len=1000))
        tl = asyncio.run(timeline(cfg, lines(6, 24), monkeypatch))
    finally:
        for f in fakes:
            f.close()
    assert sum(n for spans in tl.spans.values() for _, _, n in spans) == 144
    assert len(tl.spans) == 2  # both engines worked
    assert tl.first_wait() < TICK_S, tl.first_wait()
    assert tl.longest_idle() < TICK_S, tl.longest_idle()
