"""The engines and consumers of one `fabricctl up`: which engine, how many, started and stopped.

Contract: `choose_engine(cfg, report)` decides sim/vllm/openai (auto: vllm when NVML shows
GPUs, else the simulated engine, with the reason in words). `Fleet.build` makes one engine
per GPU group of the fleet's servers (`AppConfig.fleet`; the single-model shorthand: one per
GPU; vLLM: per group whose server started, `vllm_fleet.build_real_engines`, whose launcher
goes to `on_launch` before the start is waited for), per simulated GPU (`[[servers]]` with
engine sim: one per group, serving its server's names) or per endpoint.
`Fleet.start(address)` starts one consumer per engine against the broker at `address`,
registering its server's served name as its model (`models`) and the engine's other names,
named `<kind>-gpu<N>` (`gpu<N>-<M>` for a group) unless `names` gives one name per engine;
its GPU (heartbeats, the NVML sample) is its group's first; `Fleet.stop()` stops pulls
first, lets every consumer finish the batch in its hands, then stops the engines (and their
servers, for vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabricctl.config import ENV_VARS, AppConfig
from fabricctl.config.fleetspec import ServerSpec, replicas, with_groups
from fabricctl.engines.base import Engine, EngineStats, request_window
from fabricctl.errors import BackendMissing, UsageError
from fabricctl.supervisor.consumer import Consumer

if TYPE_CHECKING:
    from fabricctl.supervisor.launcher import Launcher

log = logging.getLogger("fabricctl.fleet")


def choose_engine(
    cfg: AppConfig, gpus_available: bool, gpu_count: int, why_not: str
) -> tuple[str, str]:
    """(engine kind, reason in words)."""
    if cfg.engine == "auto":
        if cfg.vllm.device == "cpu":
            return "vllm", f"vllm.device = cpu ({setter(cfg, 'vllm.device')}): vLLM's CPU build"
        if gpus_available and gpu_count:
            return "vllm", f"{gpu_count} NVIDIA GPU(s) found through NVML"
        return "sim", (f"no NVIDIA GPU ({why_not}); running {cfg.sim.gpus} simulated GPUs — "
                       "every figure they report is simulated")
    return cfg.engine, f"engine {cfg.engine!r} chosen by {setter(cfg, 'engine')}"


def setter(cfg: AppConfig, key: str) -> str:
    """Who set `key`, in words: the flag, the environment variable or the file."""
    source = cfg.set_by.get(key, "")
    if source == "flags":
        return "--" + key.rpartition(".")[2].replace("_", "-")
    if source == "environment":
        return next((f"${v.name}" for v in ENV_VARS if v.key == key), "the environment")
    return source or "default"


def sim_groups(cfg: AppConfig) -> list[tuple[ServerSpec, list[int]]]:
    """The simulated fleet: with `[[servers]]` one simulated GPU per group of each server (a
    server naming none: `sim.gpus` one-GPU groups), else `sim.gpus` of the one model."""
    servers = with_groups(cfg.fleet, range(cfg.sim.gpus))
    if not cfg.servers:
        servers = [dataclasses.replace(servers[0], gpus=[[g] for g in range(cfg.sim.gpus)])]
    return [(r.server, list(r.group)) for r in replicas(servers)]


def build_sim_engines(cfg: AppConfig) -> list[Engine]:
    from fabricctl.engines.sim import SimEngine

    c = cfg.consumer
    return [SimEngine(name=f"sim{i}", max_batch_size=c.max_batch_size,
                      max_batch_tokens=c.max_batch_tokens, max_input_len=c.max_input_len,
                      time_scale=cfg.sim.time_scale, names=server.names[1:])
            for i, (server, _) in enumerate(sim_groups(cfg))]


def consumer_window(cfg: AppConfig, kind: str) -> int | None:
    """Items a consumer keeps in its engine: None (one batch at a time) for the simulated
    engine, else `[consumer] window` or, at 0, its default (`engines.base.request_window`)."""
    if kind == "sim":
        return None
    c = cfg.consumer
    return request_window(c.window, c.max_batch_size)


def _samples(gpu_sample: Callable[[int | None], Any], gpus: list[int]) -> list[Any]:
    """The latest NVML sample of each of `gpus` (a group's GPUs after its first)."""
    return [gpu_sample(g) for g in gpus]


@dataclass
class Fleet:
    """Why: `up` and `run` start and stop the same set of engines and consumers."""

    cfg: AppConfig
    kind: str
    engines: list[Engine]
    gpus: list[int | None]  # each engine's GPU: its group's first
    launcher: Any = None
    models: list[str] = field(default_factory=list)  # each consumer's model; []: model_name
    groups: list[list[int] | None] = field(default_factory=list)  # each engine's GPU group
    consumers: list[Consumer] = field(default_factory=list)
    stop_pulls: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def build(cls, cfg: AppConfig, kind: str,
                    on_launch: Callable[[Launcher], None] | None = None) -> Fleet:
        if kind == "sim":
            engines = build_sim_engines(cfg)
            placed = sim_groups(cfg)
            groups: list[list[int] | None] = [g for _, g in placed]
            return cls(cfg, kind, engines, [g[0] for _, g in placed], None,
                       [s.served_name for s, _ in placed], groups)
        if kind in ("vllm", "openai"):
            from fabricctl.supervisor.vllm_fleet import build_real_engines

            engines, groups, launcher = await build_real_engines(cfg, kind, on_launch)
            models = [getattr(e, "model", cfg.model_name) for e in engines]
            return cls(cfg, kind, engines, [g[0] if g else None for g in groups], launcher,
                       models, groups)
        raise UsageError(f"unknown engine {kind!r}")

    def model_of(self, i: int) -> str:
        """The model engine i's consumer registers: its server's served name."""
        return self.models[i] if i < len(self.models) else self.cfg.model_name

    def gpu_label(self, i: int) -> str:
        """Engine i's GPUs in a consumer name: `3`, or `0-1` for a group."""
        group = self.groups[i] if i < len(self.groups) else None
        gpu = self.gpus[i]
        if group and len(group) > 1 and group[0] == gpu:
            return "-".join(map(str, group))
        return str(gpu if gpu is not None else i)

    def start(self, address: str | Path, token: str = "", prefix: str | None = None,
              tls: ssl.SSLContext | None = None, host: str = "",
              gpu_sample: Callable[[int | None], Any] | None = None,
              names: Sequence[str] | None = None) -> None:
        """One consumer per engine against `address`, named `names[i]` when given, else
        `<prefix>-gpu<N>` (prefix: the engine kind); `host`, and `gpu_sample(gpu)` for its
        NVML sample, go with every heartbeat; `tls` wraps a TCP connection."""
        loop = asyncio.get_running_loop()
        for i, (engine, gpu) in enumerate(zip(self.engines, self.gpus, strict=True)):
            name = names[i] if names else f"{prefix or self.kind}-gpu{self.gpu_label(i)}"
            sample = None if gpu_sample is None else functools.partial(gpu_sample, gpu)
            group = self.groups[i] if i < len(self.groups) else None
            rest = (group or [])[1:]
            more = (None if gpu_sample is None or not rest else
                    functools.partial(_samples, gpu_sample, rest))
            c = Consumer(address, name, self.model_of(i), engine, gpu, token,
                         window=consumer_window(self.cfg, self.kind), tls=tls, host=host,
                         gpu_sample=sample, group=group or (), group_sample=more)
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
