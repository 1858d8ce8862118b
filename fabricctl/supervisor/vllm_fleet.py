"""Real engines for `fabricctl up`: a launched vLLM server per GPU group, or others' endpoints.

Contract: `build_real_engines(cfg, "vllm")` launches the fleet (`cfg.fleet`: `[[servers]]`,
else the single-model shorthand; a server naming no GPU groups gets one one-GPU group per
GPU NVML finds) through the `Launcher`, one server per group with its server's launch spec
(`launch_spec`: `[vllm]`'s knobs, then the server's own extra args and env; logs under the
data dir), waits for every /health, and returns a `VllmEngine` per server, serving its
server's names (served name and adapters), with the groups and the launcher. Before any
server starts `preflight` refuses (`UsageError`, exit 2) an adapter directory that is
missing or holds no adapter_config.json and a group naming a GPU NVML does not find (that
check is skipped without NVML: vLLM's CPU build). `"openai"` returns one `OpenAIEngine` per
configured endpoint, no launch (groups None). Either way the consumers' contracts come from
`[consumer]`. No GPU is a `BackendMissing` (exit 3); a server that does not become ready a
`LaunchError` (exit 6).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fabricctl.config import AppConfig
from fabricctl.engines.base import Engine
from fabricctl.engines.pooled import served_counter
from fabricctl.errors import BackendMissing, LaunchError, UsageError
from fabricctl.fleetspec import (
    ServerSpec,
    adapter_problems,
    gpu_problems,
    replicas,
    with_groups,
)
from fabricctl.supervisor.launcher import Launcher, LaunchSpec

log = logging.getLogger("fabricctl.fleet")


def launch_spec(cfg: AppConfig, server: ServerSpec | None = None) -> LaunchSpec:
    """The launcher's spec for `server` (the fleet's first by default): `[vllm]`'s knobs under
    the same names, then the server's model, names, extra args and env, and the logs."""
    v = cfg.vllm
    s = server if server is not None else cfg.fleet[0]
    return LaunchSpec(
        model=s.model, served_model_name=s.served_name,
        logs_dir=str(cfg.data_dir / "logs"), host=v.host, port_base=v.port_base,
        command=tuple(v.command), model_flag=v.model_flag,
        extra_args=(*v.extra_args, *s.extra_args), env={**v.env, **s.env},
        ready_timeout_s=v.ready_timeout_s,
        restart_backoff_s=tuple(float(x) for x in v.restart_backoff_s),
        tensor_parallel_size=s.tensor_parallel_size, adapters=dict(s.adapters),
    )


def present_gpus() -> tuple[list[int] | None, str]:
    """The GPU indices NVML finds (None: NVML unavailable) and why there are none."""
    from fabricctl.supervisor.gpus import detect_gpus

    report = detect_gpus()
    if not report.available:
        return None, report.reason or "NVML unavailable"
    return [g.index for g in report.gpus], report.reason or "NVML found no GPUs"


def fleet_servers(cfg: AppConfig) -> list[ServerSpec]:
    """The fleet with every server's groups, checked against this host (`preflight`)."""
    servers = cfg.fleet
    present, why = present_gpus()
    if any(not s.gpus for s in servers):
        if not present:
            raise BackendMissing(f"engine vllm needs GPUs: {why} "
                                 "(set gpus = [...] or use --engine sim)")
        servers = with_groups(servers, present)
    preflight(servers, present)
    return servers


def preflight(servers: Sequence[ServerSpec], present: Sequence[int] | None) -> None:
    """`UsageError` listing every adapter directory and GPU group this host cannot serve
    (GPUs unchecked when `present` is None: no NVML)."""
    problems = adapter_problems(servers)
    if present is not None:
        problems += gpu_problems(servers, present)
    else:
        log.info("no NVML: the fleet's GPU groups are not checked against the host")
    if problems:
        raise UsageError("the fleet cannot start on this host: " + "; ".join(problems))


async def build_real_engines(cfg: AppConfig, kind: str
                             ) -> tuple[list[Engine], list[list[int] | None], Any]:
    c = cfg.consumer
    limits: dict[str, Any] = {"max_batch_size": c.max_batch_size,
                              "max_batch_tokens": c.max_batch_tokens,
                              "max_input_len": c.max_input_len, "window": c.window,
                              "group_pooling": c.group_pooling}
    if kind == "openai":
        from fabricctl.engines.openai import OpenAIEngine

        if not cfg.vllm.endpoints:
            raise UsageError("engine openai needs vllm.endpoints = [\"http://host:port\", ...]")
        if c.group_pooling:
            limits["counter"] = served_counter(cfg.producer.tokenizer, cfg.model)
        names = cfg.vllm.names_of_endpoints()
        engines: list[Engine] = [OpenAIEngine(url, cfg.model_name, name=f"openai{i}",
                                              names=names, **limits)
                                 for i, url in enumerate(cfg.vllm.endpoints)]
        return engines, [None] * len(engines), None
    from fabricctl.supervisor.vllm_engine import VllmEngine

    servers = fleet_servers(cfg)
    groups = replicas(servers)
    specs = {id(s): launch_spec(cfg, s) for s in servers}
    launcher = Launcher.of([(specs[id(r.server)], r.group) for r in groups])
    try:
        await launcher.start(wait=True)
    except LaunchError as e:
        await launcher.stop()
        raise LaunchError(f"vLLM did not start: {e} (logs in {cfg.data_dir / 'logs'})") from e
    counters: dict[str, Any] = {}
    engines = []
    for r, server in zip(groups, launcher.servers, strict=True):
        extra = dict(limits)
        if c.group_pooling:
            model = r.server.model
            if model not in counters:
                counters[model] = served_counter(cfg.producer.tokenizer, model)
            extra["counter"] = counters[model]
        engines.append(VllmEngine(server, **extra))
    return engines, [list(r.group) for r in groups], launcher
