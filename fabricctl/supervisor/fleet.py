"""The engines and consumers of one `fabricctl up`: which engine, how many, started and stopped.

Contract: `choose_engine(cfg, report)` decides sim/vllm/openai (auto: vllm when NVML shows
GPUs, else the simulated engine, with the reason in words). `Fleet.start(address)` starts one
consumer per GPU (or per simulated GPU, or per endpoint) against the broker at `address`,
named `<kind>-gpu<N>` unless `names` gives one name per engine;
`Fleet.stop()` stops pulls first, lets every consumer finish the batch in its hands, then
stops the engines (and their servers, for vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricctl.config import AppConfig
from fabricctl.engines.base import WINDOW_BATCHES, Engine, EngineStats
from fabricctl.errors import BackendMissing, UsageError
from fabricctl.supervisor.consumer import Consumer

log = logging.getLogger("fabricctl.fleet")


def choose_engine(
    cfg: AppConfig, gpus_available: bool, gpu_count: int, why_not: str
) -> tuple[str, str]:
    """(engine kind, reason in words)."""
    if cfg.engine == "auto":
        if gpus_available and gpu_count:
            return "vllm", f"{gpu_count} NVIDIA GPU(s) found through NVML"
        return "sim", (f"no NVIDIA GPU ({why_not}); running {cfg.sim.gpus} simulated GPUs — "
                       "every figure they report is simulated")
    return cfg.engine, f"engine {cfg.engine!r} chosen by configuration"


def build_sim_engines(cfg: AppConfig) -> list[Engine]:
    from fabricctl.engines.sim import SimEngine

    c = cfg.consumer
    return [SimEngine(name=f"sim{i}", max_batch_size=c.max_batch_size,
                      max_batch_tokens=c.max_batch_tokens, max_input_len=c.max_input_len,
                      time_scale=cfg.sim.time_scale) for i in range(cfg.sim.gpus)]


def consumer_window(cfg: AppConfig, kind: str) -> int | None:
    """Items a consumer keeps in its engine: None (one batch at a time) for the simulated
    engine, else `[consumer] window` or, at 0, `WINDOW_BATCHES` times the contract's max batch
    size."""
    if kind == "sim":
        return None
    c = cfg.consumer
    return c.window if c.window > 0 else WINDOW_BATCHES * c.max_batch_size


@dataclass
class Fleet:
    """Why: `up` and `run` start and stop the same set of engines and consumers."""

    cfg: AppConfig
    kind: str
    engines: list[Engine]
    gpus: list[int | None]
    launcher: Any = None
    consumers: list[Consumer] = field(default_factory=list)
    stop_pulls: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def build(cls, cfg: AppConfig, kind: str) -> Fleet:
        if kind == "sim":
            engines = build_sim_engines(cfg)
            return cls(cfg, kind, engines, list(range(len(engines))))
        if kind in ("vllm", "openai"):
            from fabricctl.supervisor.vllm_fleet import build_real_engines

            engines, gpus, launcher = await build_real_engines(cfg, kind)
            return cls(cfg, kind, engines, gpus, launcher)
        raise UsageError(f"unknown engine {kind!r}")

    def start(self, address: str | Path, token: str = "", prefix: str | None = None,
              tls: ssl.SSLContext | None = None, host: str = "",
              gpu_sample: Callable[[int | None], Any] | None = None,
              names: Sequence[str] | None = None) -> None:
        """One consumer per engine against `address`, named `names[i]` when given, else
        `<prefix>-gpu<N>` (prefix: the engine kind); `host`, and `gpu_sample(gpu)` for its
        NVML sample, go with every heartbeat; `tls` wraps a TCP connection."""
        loop = asyncio.get_running_loop()
        for i, (engine, gpu) in enumerate(zip(self.engines, self.gpus, strict=True)):
            name = (names[i] if names
                    else f"{prefix or self.kind}-gpu{gpu if gpu is not None else i}")
            sample = None if gpu_sample is None else functools.partial(gpu_sample, gpu)
            c = Consumer(address, name, self.cfg.model_name, engine, gpu, token,
                         window=consumer_window(self.cfg, self.kind), tls=tls, host=host,
                         gpu_sample=sample)
            self.consumers.append(c)
            self.tasks.append(loop.create_task(c.run(self.stop_pulls)))

    async def wait_connected(self, timeout: float = 30.0) -> None:
        try:
            await asyncio.wait_for(
                asyncio.gather(*(c.connected.wait() for c in self.consumers)), timeout)
        except TimeoutError as e:
            raise BackendMissing("consumers did not connect to the broker") from e

    async def stop_consumers(self, timeout: float = 60.0) -> None:
        """Stop pulling and wait for each consumer to finish what it is doing (a batch, a
        pre-warm): afterwards the engines receive nothing more from this fleet."""
        self.stop_pulls.set()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=timeout)
            for t in pending:
                t.cancel()

    async def settled_stats(self) -> list[EngineStats]:
        """Every engine's counters once nothing more reaches it: consumers stopped, then one
        last metrics scrape where the engine has one (a pre-warm that was still running
        is then counted, as the server counted it)."""
        await self.stop_consumers()
        for engine in self.engines:
            scrape = getattr(engine, "scrape", None)
            if scrape is not None:
                with contextlib.suppress(Exception):
                    await scrape()
        return [e.stats() for e in self.engines]

    async def stop(self, timeout: float = 60.0) -> None:
        await self.stop_consumers(timeout)
        for engine in self.engines:
            with contextlib.suppress(Exception):
                await engine.close()
        if self.launcher is not None:
            await self.launcher.stop()
