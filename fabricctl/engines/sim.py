"""The embedded simulated engine: the `Engine` protocol over one `SimGPU`. SIMULATED.

Contract: `SimEngine.run(work)` runs the batch on its SimGPU (batch mode, results in the
batch's order, oversized items as "length_exceeded"), then sleeps `sim_seconds * time_scale`
wall seconds so a demo feels like a GPU without taking as long (0 only yields). Each item is
answered on its payload's endpoint as vLLM 0.32 would (completions, chat, embeddings, score,
rerank, responses: `simanswer`, `simendpoints`); an endpoint outside `endpoints` (when given:
those its model serves) or unknown to the simulator is refused with vLLM's 400 as that item's
error result, never an exception. Batches run one at a time (a lock), so simulated time is
a GPU's busy time. `prewarm(signal)` sends the shape's prefix (its sample item's
components, no varying part) as one request with max_tokens 1, registering every full
prefix block, and builds the CUDA graph of each (lane, epoch) in the signal. `stats()`
reports vLLM-named counters with simulated=True. `names` are the LoRA adapters it answers
besides its model: a batch of one runs under it, its blocks hashed apart from the base
model's as vLLM keys them (`blocks`), so sharing a prefix across names hits nothing, as on
a real server. A closed engine raises `EngineError`; a
negative `time_scale` is a `UsageError`.
Re-exports `SimGPU`, `SimCosts` and the block helpers, the module's public face.
"""

from __future__ import annotations

import asyncio

from fabricctl.core.defaults import MAX_BATCH_SIZE, MAX_BATCH_TOKENS, MAX_INPUT_LEN, SIM_TIME_SCALE
from fabricctl.core.payload import Payload
from fabricctl.core.types import ItemResult, Prewarm, Work
from fabricctl.engines.base import EngineCounters, EngineLimits, EngineStats
from fabricctl.engines.blocks import (
    BlockChain,
    achievable_cached_tokens,
    decode_item_payload,
    item_blocks,
    payload_blocks,
)
from fabricctl.engines.costs import DEFAULT_COSTS, SimCosts
from fabricctl.engines.simbatch import run_work
from fabricctl.engines.simgpu import SimGPU
from fabricctl.engines.simrequest import LENGTH_EXCEEDED, SimCounters, SimRequest
from fabricctl.errors import EngineError, UsageError

__all__ = [
    "LENGTH_EXCEEDED",
    "BlockChain",
    "SimCosts",
    "SimCounters",
    "SimEngine",
    "SimGPU",
    "SimRequest",
    "achievable_cached_tokens",
    "item_blocks",
    "payload_blocks",
]


class SimEngine:
    """Why: lets the broker, the demo and the tests run end to end with no GPU at all."""

    simulated = True

    def __init__(
        self,
        *,
        name: str = "sim",
        max_batch_size: int = MAX_BATCH_SIZE,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        max_input_len: int = MAX_INPUT_LEN,
        costs: SimCosts = DEFAULT_COSTS,
        max_model_len: int | None = None,
        time_scale: float = SIM_TIME_SCALE,
        endpoints: frozenset[str] | None = None,
        names: tuple[str, ...] = (),
    ) -> None:
        if time_scale < 0:
            raise UsageError("time_scale must be >= 0")
        self.name = name
        self.time_scale = time_scale
        # `names`: the LoRA adapters it answers besides its model (their blocks are their
        # own); a multi-model fleet rehearsed on simulated GPUs
        self._limits = EngineLimits(max_batch_size, max_batch_tokens, max_input_len, names)
        self.gpu = SimGPU(costs, max_input_len=max_input_len, max_model_len=max_model_len,
                          endpoints=endpoints)
        self._lock = asyncio.Lock()
        self._closed = False

    def limits(self) -> EngineLimits:
        return self._limits

    def _adapter(self, model: str) -> str:
        """The adapter a batch of `model` runs under ("" for the base model)."""
        return model if model in self._limits.names else ""

    async def run(self, work: Work) -> list[ItemResult]:
        if self._closed:
            raise EngineError(f"{self.name}: engine closed")
        async with self._lock:
            results, seconds = run_work(self.gpu, work, self._adapter(work.model))
            await self._sleep(seconds)
        return results

    async def prewarm(self, signal: Prewarm) -> None:
        if self._closed:
            raise EngineError(f"{self.name}: engine closed")
        async with self._lock:
            gpu = self.gpu
            start = gpu.now
            payload = decode_item_payload(signal.sample) if signal.sample is not None else None
            if payload is not None and any(n > 0 for n in payload.component_tokens):
                prefix = Payload(payload.components, "", payload.component_tokens, 0)
                chain = payload_blocks(prefix, gpu.block_size,
                                       adapter=self._adapter(signal.model))
                if chain.tokens <= gpu.max_input_len:
                    rid = f"prewarm:{signal.signature:016x}:{signal.epoch}"
                    gpu.add(rid, chain.hashes, chain.tokens, 1)
                    gpu.drain()
            for lane, _target in signal.lanes:
                gpu.build_graph((lane, signal.epoch))
            gpu.counters.prewarms += 1
            await self._sleep(gpu.now - start)

    async def _sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(sim_seconds * self.time_scale)

    def stats(self) -> EngineStats:
        c = self.gpu.counters
        counters = {name: getattr(c, name) for name in EngineCounters.__struct_fields__}
        return EngineStats(simulated=True, block_size=self.gpu.block_size, **counters)

    async def close(self) -> None:
        self._closed = True
