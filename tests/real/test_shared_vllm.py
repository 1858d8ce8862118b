"""A shared vLLM server, the real CPU build: live requests hold slots, the batch takes the rest.

One server started with `--scheduling-policy priority`: five live streaming requests (priority
0, long generations) hold five of its 16 slots; the server's own gauges say so, and a shared
engine's readings grow the batch window (2, 4, 8) up to 16 - 5 - 1 = 10; `fabricctl run` with
`[vllm] shared = true` (engine `openai`) answers every batch line, the batch's `priority`
accepted, and the live requests stream to their end beside it. The session's fcfs servers
are asked the same `priority` field, to pin down what vLLM 0.32 does with it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import serve_pooling

from fabricctl.engines.metrics import parse_metrics
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.supervisor.launcher import Launcher

pytestmark = pytest.mark.real_vllm

FABRICCTL = [sys.executable, "-m", "fabricctl"]
LIVE = 5
CAPACITY = 16  # the session's --max-num-seqs


async def live_client(url: str, i: int, started: asyncio.Event, stop: asyncio.Event) -> int:
    """One live user sending streamed requests back to back until `stop` (one request of the
    tiny model is over in seconds): how many it finished, each answered 200."""
    # Lengths differ (200..360 tokens) so the clients' requests do not all end, and leave the
    # server empty for a moment, at once.
    body = {"model": "tiny", "prompt": f"live request {i}:", "max_tokens": 200 + 40 * i,
            "ignore_eos": True, "stream": True, "priority": 0}
    done = 0
    async with httpx.AsyncClient(timeout=120) as c:
        while not stop.is_set():
            async with c.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                async for _ in resp.aiter_lines():
                    started.set()
            done += 1
    return done


def live_states(live: list[asyncio.Task[int]]) -> str:
    """How the live clients stand, for a failure's message."""
    return ", ".join("running" if not t.done() else repr(t.exception()) if not t.cancelled()
                     else "cancelled" for t in live)


async def running(url: str) -> int:
    async with httpx.AsyncClient(timeout=30) as c:
        sample = parse_metrics((await c.get(url + "/metrics")).text)
    assert sample.running is not None and sample.waiting is not None
    return sample.running + sample.waiting


@pytest.mark.asyncio(loop_scope="session")
async def test_batch_takes_the_slots_live_requests_leave(tiny_model: Path,
                                                         tmp_path: Path) -> None:
    launcher: Launcher = await serve_pooling(tiny_model, ("--scheduling-policy", "priority"),
                                             tmp_path / "logs")
    url = launcher.servers[0].base_url
    live: list[asyncio.Task[int]] = []
    stop = asyncio.Event()
    try:
        events = [asyncio.Event() for _ in range(LIVE)]
        live = [asyncio.ensure_future(live_client(url, i, e, stop))
                for i, e in enumerate(events)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
        deadline = time.monotonic() + 60
        while (seen := await running(url)) < 3:  # the server's gauges lag its first streams:
            if time.monotonic() > deadline:  # polled, bounded
                pytest.skip(f"this server's /metrics showed {seen} running requests beside "
                            f"{LIVE} live streams for 60 s ({live_states(live)})")
            await asyncio.sleep(0.25)
        engine = OpenAIEngine(url, "tiny", max_batch_size=8, max_batch_tokens=4096,
                              max_input_len=512, shared_capacity=CAPACITY, batch_priority=10)
        assert engine.follower is not None
        top = engine.follower.colocation.max_window
        readings: list[tuple[int | None, int]] = []
        deadline = time.monotonic() + 60
        # The pace doubles (2, 4, 8, 16, ...) up to `top`; the slots live requests hold bound it
        # too. Read until one reading has both the pace past the free slots and live ones held
        # (a reading can fall between one live request's end and the next one's start).
        while not any(w == CAPACITY - n - 1 and n >= 3 for w, n in readings):
            assert time.monotonic() < deadline, (readings, live_states(live))
            k = len(readings)
            readings.append((await engine.follower.step(), engine.follower.colocation.live))
            window, n = readings[-1]
            assert window == min(2 ** (k + 1), top, CAPACITY - n - 1), readings
            if k >= 4:
                await asyncio.sleep(0.25)
        await engine.close()

        lines = [{"id": f"b{i}", "model": "tiny", "prefix": ["Batch work: "],
                  "prompt": f"item {i}", "max_tokens": 4, "params": {"temperature": 0}}
                 for i in range(24)]
        src = tmp_path / "batch.jsonl"
        src.write_text("".join(json.dumps(x) + "\n" for x in lines))
        cfg = tmp_path / "shared.toml"
        cfg.write_text(f'engine = "openai"\nmodel = "tiny"\n\n[vllm]\nendpoints = ["{url}"]\n'
                       f"shared = true\nshared_capacity = {CAPACITY}\n")
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"),
               "FABRICCTL_DATA_DIR": str(tmp_path / "data")}
        proc = await asyncio.create_subprocess_exec(
            *FABRICCTL, "run", str(src), "--config", str(cfg), "-o", str(tmp_path / "out.jsonl"),
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, err.decode()[-3000:]
        rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert sorted(r["id"] for r in rows) == sorted(x["id"] for x in lines)
        assert all(r.get("error") is None for r in rows), rows[:3]
        stop.set()
        for t in live:  # the live requests, beside the batch, streamed to their end
            assert await asyncio.wait_for(t, 120) >= 1
    finally:
        stop.set()
        for t in live:
            t.cancel()
        for t in live:
            with contextlib.suppress(BaseException):
                await t
        await launcher.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_fcfs_server_takes_a_priority_field_and_ignores_it(
        vllm_servers: Launcher) -> None:
    url = vllm_servers.servers[0].base_url
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.post(url + "/v1/completions", json={
            "model": "tiny", "prompt": "hello", "max_tokens": 2, "priority": 10})
    assert resp.status_code == 200, resp.text
