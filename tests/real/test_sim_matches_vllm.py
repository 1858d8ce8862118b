"""The simulated GPU's prefix cache predicts a real vLLM server's cached tokens, request by request.

Single-prompt requests (so `usage.prompt_tokens_details.cached_tokens` is that prompt's own
figure) go to one session server, whose small KV pool (`--num-gpu-blocks-override`, see
conftest) makes shapes evict each other. The sim gets the same requests: the block hashes are
built from the token ids vLLM itself reports for each prompt (`return_token_ids`), with the
server's block size and block count (from `vllm:cache_config_info`) and the same max_tokens.

Why a used server is a fair start: every prompt begins with a fresh nonce, so nothing cached
before can match; the server is idle, so all its blocks are free, and blocks left by earlier
tests stand exactly where the sim's never-used blocks stand, at the head of the free queue.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from realtext import (
    SUBJECTS,
    MultiCopyAPC,
    Shape,
    Tok,
    chain_hashes,
    make_shapes,
    nonce,
    scrape_counters,
    sentence,
)

from fabricctl.engines.costs import SimCosts
from fabricctl.engines.prefix_cache import PrefixCache
from fabricctl.engines.simgpu import SimGPU
from fabricctl.supervisor.launcher import Launcher, ServerProcess

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

REQUESTS = 120
MAX_MODEL_LEN = 512  # conftest's --max-model-len


class SimMismatch(AssertionError):
    """The sim's cached tokens differ from vLLM's."""


class Peer:
    """One session server plus the sim and reference models fed the same requests."""

    def __init__(self, server: ServerProcess, client: httpx.AsyncClient, block_size: int,
                 num_blocks: int) -> None:
        self.server = server
        self.client = client
        self.bs = block_size
        self.sim = SimGPU(SimCosts(block_size=block_size, num_blocks=num_blocks,
                                   max_num_seqs=16, max_num_batched_tokens=2048),
                          max_model_len=MAX_MODEL_LEN, max_input_len=MAX_MODEL_LEN - 1)
        self.reference = PrefixCache(num_blocks, block_size)  # bare cache, same code as sim
        self.multi = MultiCopyAPC(num_blocks, block_size)  # vLLM's hash -> all copies map
        self.unbounded = PrefixCache(1 << 20, block_size)  # what an endless cache would give
        # per request: L, vLLM, sim, multi-copy reference, unbounded
        self.rows: list[tuple[int, int, int, int, int]] = []

    async def send(self, prompt: str | list[int], max_tokens: int) -> list[int]:
        """One request to vLLM and to every model; returns the prompt's token ids."""
        resp = await self.client.post("/v1/completions", json={
            "model": self.server.spec.served_model_name, "prompt": prompt,
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        ids = body["choices"][0]["prompt_token_ids"]
        usage = body["usage"]
        assert usage["completion_tokens"] == max_tokens
        hashes = chain_hashes(ids, self.bs)
        r = self.sim.add(f"r{len(self.rows)}", hashes, len(ids), max_tokens)
        self.sim.drain()
        assert self.reference.run(hashes, len(ids), max_tokens) == r.cached_tokens
        self.rows.append((len(ids), usage["prompt_tokens_details"]["cached_tokens"],
                          r.cached_tokens, self.multi.run(hashes, len(ids), max_tokens),
                          self.unbounded.run(hashes, len(ids), max_tokens)))
        return ids

    def check_sim(self) -> None:
        bad = [(i, *row) for i, row in enumerate(self.rows) if row[1] != row[2]]
        if bad:
            raise SimMismatch(f"{len(bad)} of {len(self.rows)} requests differ "
                              "(i, L, vLLM, sim, multi-copy, unbounded): "
                              + "; ".join(map(str, bad[:8])))


async def peer(vllm_servers: Launcher) -> tuple[Peer, Any]:
    server = vllm_servers.servers[0]
    await server.wait_ready(240)
    before = await scrape_counters(server.base_url)
    assert before.block_size and before.num_blocks, "no block_size/num_gpu_blocks in /metrics"
    client = httpx.AsyncClient(base_url=server.base_url, timeout=60.0)
    return Peer(server, client, before.block_size, before.num_blocks), before


def script(shapes: list[Shape], rng: random.Random, n: int) -> list[tuple[str, int]]:
    """(prompt text, max_tokens) x n: runs on one shape and jumps between shapes; mostly
    items, some bare prefixes (a pre-warm) and some cut after the first component."""
    out = []
    k = 0
    for i in range(n):
        if i == 0 or rng.random() < 0.5:
            k = rng.randrange(len(shapes))
        s = shapes[k]
        max_tokens = rng.choice((1, 8, 40))
        kind = rng.random()
        if kind < 0.1:
            out.append((s.prefix, 1))
        elif kind < 0.2:
            out.append((s.components[0] + f" {rng.choice(SUBJECTS)} asks {1000 + i}?",
                        max_tokens))
        else:
            tail = "".join(sentence(rng) for _ in range(rng.randrange(0, 14)))
            out.append((s.prefix + f" {1000 + i}: what now?{tail}", max_tokens))
    return out


async def test_sim_cached_tokens_equal_vllm(vllm_servers: Launcher, tiny_model: Path) -> None:
    p, before = await peer(vllm_servers)
    bs = p.bs
    tok = Tok(tiny_model)
    rng = random.Random(3)
    # no prefix is a whole number of blocks: see test_sim_keeps_duplicate_blocks for that case
    shapes = make_shapes(tok, 6, nonce(), rng, (20, 26, 32, 38, 44, 50),
                         lambda n: 0 < n % bs <= bs - 8)
    t0 = time.monotonic()
    async with p.client:
        for i, (text, max_tokens) in enumerate(script(shapes, rng, REQUESTS)):
            ids = tok.ids(text)
            got = await p.send(text, min(max_tokens, MAX_MODEL_LEN - len(ids)))
            assert got == ids, f"request {i}: vLLM tokenized the prompt differently"
    wall = time.monotonic() - t0
    after = await scrape_counters(p.server.base_url)

    hits, queries = after.hits - before.hits, after.queries - before.queries
    evicted = sum(1 for row in p.rows if row[1] < row[4])
    print(f"\nvLLM vs sim: {len(p.rows)} requests, {len(shapes)} shapes, {wall:.1f} s "
          f"(B={bs}, {before.num_blocks} blocks): vLLM hit {int(hits)}/{int(queries)} tokens; "
          f"{evicted} requests lost hits to eviction; sim evictions {p.sim.cache.evictions}")
    p.check_sim()
    assert [row[1] for row in p.rows] == [row[3] for row in p.rows]  # multi-copy reference
    assert p.sim.counters.prefix_cache_queries == queries
    assert p.sim.counters.prefix_cache_hits == hits
    # the script exercised what matters: many hits, and many hits lost to eviction
    assert sum(1 for row in p.rows if row[1]) >= REQUESTS // 3
    assert evicted >= 10  # 14 with this seed (the script is deterministic)


async def test_sim_keeps_duplicate_blocks(vllm_servers: Launcher, tiny_model: Path) -> None:
    """A pre-warm of a warm shape whose prefix is a whole number of blocks recomputes the last
    prefix block (its hit stops at L-1): vLLM then holds two copies of that block's hash.
    Evicting the older copy leaves the newer one cached, so the next item still hits the
    whole prefix. Scripted: item, pre-warm, unique token-id prompts that evict exactly the
    older blocks and the original copy, item."""
    p, _ = await peer(vllm_servers)
    bs, blocks = p.bs, p.sim.cache.num_blocks
    tok = Tok(tiny_model)
    rng = random.Random(5)
    [d] = make_shapes(tok, 1, nonce(), rng, (40,), lambda n: n % bs == 0)
    k = d.prefix_tokens // bs
    async with p.client:
        await p.send(d.prefix + " 1001: what now?", 1)
        await p.send(d.prefix, 1)
        left = (blocks - 1) - (k + 1)  # blocks queued before the original copy (the head)
        left += 1  # and the original copy itself
        while left:
            m = min(left, (MAX_MODEL_LEN - 1) // bs)
            left -= m
            await p.send([rng.randrange(4, 400) for _ in range(m * bs)], 1)
        await p.send(d.prefix + " 1002: and then?", 1)
    print(f"\nvLLM vs sim, duplicate block: (L, vLLM, sim, multi-copy, unbounded) {p.rows}")
    assert p.rows[-1][1] == k * bs, "vLLM did not keep the duplicate copy"
    assert [row[1] for row in p.rows] == [row[3] for row in p.rows]  # reference == vLLM
    p.check_sim()
