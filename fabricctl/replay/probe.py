"""Probing a live OpenAI-compatible server for the costs `fabricctl calibrate` fits.

Contract: `calibrate(endpoint, ...)` times six probes against one idle OpenAI-compatible
server (vLLM: `ignore_eos`, prompts as token ids, so no tokenizer is needed and every prompt
is unique, never a prefix-cache hit): a warm-up of every probe (the CPU backend compiles
kernels for new sizes on first use); then, each timed `repeat` times and the median kept,
`front` tiny requests of one output token, `batch` at a time (the front end's pace); one
tiny request decoding `decode` tokens; `batch` of them at once; `batch` tiny requests and
`batch` requests of `prefill` uncached tokens (clipped to the server's max_model_len, from
/v1/models), each with one output token; and, shaped like a grouped workload, `cached`
requests of one shared prefix of whole blocks (up to 288 tokens, cached by one untimed
request just before), each with 24 tokens of its own and 4 output tokens, `batch` at a time.
The block size and KV blocks come from `vllm:cache_config_info` on /metrics; `max_num_seqs`
and `max_num_batched_tokens` are the server's settings, given as options (vLLM does not
report them). The fit is `fabricctl.replay.calibrate.fit_costs`; the result is printed (or
written to `out`) as the TOML table `fabricctl replay --costs FILE` reads. A server that
does not answer is a `BackendMissing` (exit 3); an answer that is not a completion, or
/metrics without `vllm:cache_config_info`, an `EngineError` (exit 5).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

from fabricctl.errors import BackendMissing, EngineError
from fabricctl.replay.calibrate import Probes, ServerShape, costs_toml, fit_costs


class Prober:
    """Why: every probe is the same timed burst of unique prompts against one server."""

    def __init__(self, client: Any, model: str, vocab: int = 250) -> None:
        self.client = client
        self.model = model
        self.rng = random.Random()
        self.vocab = vocab

    def prompt(self, n: int) -> list[int]:
        """`n` token ids no earlier prompt began with (ids 3..vocab-1: no special tokens)."""
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    async def one(self, tokens: int, max_tokens: int, head: list[int] | None = None) -> None:
        import httpx

        body = {"model": self.model, "prompt": (head or []) + self.prompt(tokens),
                "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        try:
            resp = await self.client.post("/v1/completions", json=body)
        except httpx.TransportError as e:
            raise BackendMissing(f"{self.client.base_url}: {e!r}") from None
        if resp.status_code != 200:
            raise EngineError(f"{self.client.base_url}: HTTP {resp.status_code}: "
                              f"{resp.text[:300]}")
        usage = (resp.json().get("usage") or {})
        if usage.get("completion_tokens") != max_tokens:
            raise EngineError(f"{self.client.base_url}: asked for {max_tokens} tokens, got "
                              f"{usage.get('completion_tokens')} (does it honour ignore_eos?)")

    async def burst(self, requests: int, at_once: int, tokens: int, max_tokens: int,
                    head: list[int] | None = None) -> float:
        """Seconds for `requests` requests, `at_once` in flight (each `head` + its own
        `tokens`)."""
        todo = iter(range(requests))

        async def worker() -> None:
            for _ in todo:
                await self.one(tokens, max_tokens, head)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(at_once, requests))))
        return time.perf_counter() - t0


async def server_shape(client: Any, max_num_seqs: int, max_num_batched_tokens: int
                       ) -> tuple[ServerShape, str, int]:
    """(the server's shape, its first model's name, its max_model_len)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        models = (await client.get("/v1/models")).json().get("data") or []
        metrics = (await client.get("/metrics")).text
    except httpx.TransportError as e:
        raise BackendMissing(f"{client.base_url}: {e!r}") from None
    if not models:
        raise EngineError(f"{client.base_url}: /v1/models lists no model")
    block = blocks = 0
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "vllm:cache_config_info":
                block = int(s.labels.get("block_size") or 0)
                blocks = int(s.labels.get("num_gpu_blocks") or 0)
    if not block or not blocks:
        raise EngineError(f"{client.base_url}: /metrics has no vllm:cache_config_info with "
                          "block_size and num_gpu_blocks (is it a vLLM server?)")
    shape = ServerShape(block, blocks, max_num_seqs, max_num_batched_tokens)
    return shape, str(models[0]["id"]), int(models[0].get("max_model_len") or 2048)


TINY = 8  # tokens of a tiny prompt
OWN, OUT = 24, 4  # the cached probe's own tokens after the shared prefix, and its output


async def measure(client: Any, model: str, shape: ServerShape, max_model_len: int,
                  front: int = 48, decode: int = 48, prefill: int = 320,
                  cached: int = 48, repeat: int = 3) -> Probes:
    """The probes of the module docstring, after a warm-up."""
    batch = min(16, shape.max_num_seqs)
    kv_tokens = (shape.num_blocks - 1) * shape.block_size
    prefill = max(TINY + 1, min(prefill, max_model_len - 2, kv_tokens // 2))
    decode = max(1, min(decode, max_model_len - TINY - 1))
    p = Prober(client, model)
    shared = p.prompt(max(shape.block_size,
                          min(288, kv_tokens // 4) // shape.block_size * shape.block_size))

    async def grouped() -> float:
        await p.one(OWN, 1, shared)  # untimed: the prefix is computed once, then cached
        return await p.burst(cached, batch, OWN, OUT, shared)

    probes = {
        "front": lambda: p.burst(front, batch, TINY, 1),
        "decode_one": lambda: p.burst(1, 1, TINY, decode),
        "decode_batch": lambda: p.burst(batch, batch, TINY, decode),
        "tiny": lambda: p.burst(batch, batch, TINY, 1),
        "prefill": lambda: p.burst(batch, batch, prefill, 1),
        "cached": grouped,
    }
    for probe in probes.values():  # warm-up
        await probe()
    times: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(max(1, repeat)):  # interleaved: a slow moment touches every probe alike
        for name, probe in probes.items():
            times[name].append(await probe())
    best = {name: statistics.median(ts) for name, ts in times.items()}
    return Probes(best["front"], front, best["decode_one"], best["decode_batch"], decode,
                  best["prefill"], prefill, best["tiny"], TINY, best["cached"], len(shared),
                  OWN, OUT, cached, batch)


async def calibrate(endpoint: str, model: str | None, max_num_seqs: int,
                    max_num_batched_tokens: int = 2048, api_key: str | None = None) -> str:
    """The fitted costs' TOML, with a comment naming the server and the probes."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=endpoint.rstrip("/"), timeout=300.0,
                                 headers=headers) as client:
        shape, first, max_model_len = await server_shape(client, max_num_seqs,
                                                         max_num_batched_tokens)
        probes = await measure(client, model or first, shape, max_model_len)
    costs = fit_costs(probes, shape)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    note = (f"fabricctl calibrate: {endpoint} (model {model or first}), {when}\n"
            f"probes: {probes}\n"
            "use: fabricctl replay WORKLOAD --costs THIS_FILE --gpus N")
    return costs_toml(costs, note)
