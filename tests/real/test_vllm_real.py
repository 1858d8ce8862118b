"""The real vLLM CPU build as a peer: batches, prefix-cache counters, bad items, restarts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import psutil
import pytest

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, Prewarm, Work
from fabricctl.supervisor.launcher import Launcher, ServerProcess
from fabricctl.supervisor.vllm_engine import VllmEngine

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]
BLOCK_SIZE = 32  # what conftest passes as --block-size; the engine must read the same



def make_items(prefix: list[str], n: int, tokens: int = 100, tag: str = "") -> list[Item]:
    out = []
    for i in range(n):
        p = Payload(components=prefix, prompt=f" question {tag}{i}: what does lane {i} do?",
                    component_tokens=[0] * len(prefix), prompt_tokens=0,
                    body=json.dumps({"max_tokens": 8, "ignore_eos": True}).encode())
        out.append(Item(id=f"{tag}q{i}", model="tiny", signature=1, input_tokens=tokens,
                        max_tokens=8, payload=encode_payload(p)))
    return out


def work(items: list[Item], max_tokens: int = 8, max_input_len: int = 400) -> Work:
    return Work(id=1, model="tiny", signature=1, lane=0, epoch=1, pad_to=104,
                max_tokens=max_tokens, max_input_len=max_input_len, items=items)


def fresh_prefix() -> list[str]:
    """A prefix no earlier test has cached (~200 tokens with the tiny tokenizer)."""
    nonce = uuid.uuid4().hex
    return [f"system {nonce}: the broker routes the items and the engine keeps its blocks. ",
            "example: a lane packs the queue; the cache evicts its blocks. " * 3,
            "tools: the supervisor reads the segment and sends the results. "]


def engine(server: ServerProcess, **kw: object) -> VllmEngine:
    return VllmEngine(server, max_batch_size=16, max_batch_tokens=8192, max_input_len=400,
                      ready_timeout_s=240.0, timeout_s=60.0, **kw)  # type: ignore[arg-type]


async def test_batch_returns_one_result_per_item(vllm_servers: Launcher) -> None:
    eng = engine(vllm_servers.servers[0])
    items = make_items(fresh_prefix(), 6, tag="b")
    res = await eng.run(work(items))
    assert [r.id for r in res] == [i.id for i in items]
    assert all(r.finish_reason == "length" and r.tokens_out == 8 and r.text for r in res)
    # one request per item: vLLM's own per-request counts
    assert all(r.error is None and r.cached_tokens is not None for r in res)
    assert all(r.prompt_tokens is not None and r.prompt_tokens > 50 for r in res)
    st = eng.stats()
    assert st.block_size == BLOCK_SIZE and st.batches == 1 and st.items == 6
    await eng.close()


async def test_prefix_cache_counters_show_hits(vllm_servers: Launcher) -> None:
    eng = engine(vllm_servers.servers[1])
    prefix = fresh_prefix()
    items = make_items(prefix, 8, tag="p")
    await eng.prewarm(Prewarm(model="tiny", signature=1, label="p", epoch=1, lanes=[(0, 104)],
                              sample=items[0]))
    before = eng.stats()
    res = await eng.run(work(items))
    assert len(res) == 8
    after = eng.stats()
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    assert hits == sum(r.cached_tokens or 0 for r in res)  # counters agree with each answer
    print(f"\nvLLM: batch of 8 after prewarm: {hits} of {queries} prompt tokens hit")
    assert queries > 0
    # every prompt shares the warmed prefix: at least its first full blocks hit, per prompt
    assert hits >= 8 * 2 * BLOCK_SIZE, (queries, hits)
    assert hits % BLOCK_SIZE == 0
    # a single-prompt request reports a trustworthy per-item cached_tokens
    [one] = await eng.run(work(make_items(prefix, 1, tag="s")))
    assert one.cached_tokens is not None and one.cached_tokens >= 2 * BLOCK_SIZE
    assert eng.stats().prefix_cache_hits >= hits
    await eng.close()


async def test_too_long_items(vllm_servers: Launcher) -> None:
    eng = engine(vllm_servers.servers[0])
    items = make_items(fresh_prefix(), 3, tag="t")
    huge = Payload(components=["x " * 2000], prompt="?",
                   component_tokens=[0], prompt_tokens=0)
    # declared short, so it is sent; the server rejects it with a 400
    items.insert(1, Item(id="huge", model="tiny", signature=1, input_tokens=50,
                         max_tokens=8, payload=encode_payload(huge)))
    # declared longer than the contract: never sent
    items.append(Item(id="declared", model="tiny", signature=1, input_tokens=1000,
                      max_tokens=8, payload=encode_payload(huge)))
    res = await eng.run(work(items))
    by_id = {r.id: r for r in res}
    assert [r.id for r in res] == [i.id for i in items]
    assert by_id["huge"].finish_reason == "error"
    assert "maximum context length" in (by_id["huge"].error or "")
    assert by_id["declared"].finish_reason == "length_exceeded"
    assert all(by_id[f"tq{i}"].finish_reason == "length" for i in range(3))
    await eng.close()


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


async def test_killed_server_is_restarted(vllm_servers: Launcher) -> None:
    server = vllm_servers.servers[1]
    eng = engine(server)
    old = server.pid
    assert old is not None
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    deadline = t0 + 240
    while not (server.pid not in (None, old) and server.ready.is_set()):
        assert time.monotonic() < deadline, f"not restarted; see {server.log_path}"
        await asyncio.sleep(0.5)
    print(f"\nvLLM: killed server back in {time.monotonic() - t0:.1f} s")
    assert server.restarts >= 1
    assert group_members(old) == []  # its EngineCore/worker children went with it
    res = await eng.run(work(make_items(fresh_prefix(), 4, tag="r")))
    assert [r.finish_reason for r in res] == ["length"] * 4
    await eng.close()
