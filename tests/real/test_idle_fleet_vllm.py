"""No GPU idles while work waits, on the real engine: two real vLLM CPU servers (the
session's), the daemon in its default policy (per-consumer scope, lifecycle staging, pre-warm
off). Six shapes handed at once to the idle fleet: the first batch leaves within one broker
tick of the submit's acknowledgement, and while items are queued neither server goes a tick
with nothing of ours in it, across every shape switch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the daemon timeline helper

from idle_fleet import timeline

from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings
from fabricctl.core.config import CoreConfig
from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

TICK_S = 1.0  # the broker's maintenance tick


async def test_an_idle_real_fleet_starts_at_once_and_never_idles_while_items_wait(
        vllm_servers: Launcher, tmp_path: Path, monkeypatch: Any) -> None:
    enc = msgspec.json.Encoder()
    lines = [enc.encode({"id": f"s{s}-{k}", "model": "tiny",
                         "prefix": [f"Shape {s}: answer about the passage. " * 6],
                         "prompt": f"Question {k}?", "max_tokens": 4,
                         "params": {"ignore_eos": True, "temperature": 0}})
             for k in range(16) for s in range(6)]
    cfg = AppConfig(data_dir=tmp_path / "data", engine="openai", model="tiny",
                    broker=CoreConfig(),
                    vllm=VllmSettings(endpoints=[s.base_url for s in vllm_servers.servers]),
                    consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=4096,
                                              max_input_len=400))
    tl = await timeline(cfg, lines, monkeypatch)
    print(f"\nidle fleet on real vLLM: first batch {tl.first_wait() * 1000:.0f} ms after the "
          f"ack, longest idle while items waited {tl.longest_idle() * 1000:.0f} ms, all "
          f"{len(lines)} done in {tl.finished - tl.acked:.2f} s; batches per engine "
          f"{ {k: len(v) for k, v in tl.spans.items()} }")
    assert sum(n for spans in tl.spans.values() for _, _, n in spans) == len(lines)
    assert len(tl.spans) == 2
    assert tl.first_wait() < TICK_S
    assert tl.longest_idle() < TICK_S
