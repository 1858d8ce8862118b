"""Real engines for `fabricctl up`: a launched vLLM server per GPU group, or others' endpoints.

Contract: `build_real_engines(cfg, "vllm")` launches the fleet (`cfg.fleet`: `[[servers]]`,
else the single-model shorthand; a server naming no GPU groups gets one one-GPU group per
GPU NVML finds) through the `Launcher`, one server per group with its server's launch spec
(`launch_spec`: `[vllm]`'s knobs, then the server's own extra args and env; logs under the
data dir), hands the launcher to `on_launch` before it waits (the daemon shows its servers'
states while they start), waits until each server is ready or has given up (a crash loop:
`[vllm] start_attempts` exits before it was ever ready; a start not ready by `[vllm]
ready_timeout_s`; a port held by another), and
returns a `VllmEngine` per ready server, serving its server's names (served name and
adapters), with the groups and the launcher. When no server is ready that is a
`LaunchError` (exit 6) naming each one's failure and log; when some are, the fleet serves
on the ready ones and says at WARNING which servers it serves without and why (they stay in
the launcher, failed, for `status` and `top`; they are not retried: fix and restart). Before any
server starts `preflight` refuses (`UsageError`, exit 2) an adapter directory that is
missing or holds no adapter_config.json and a group naming a GPU NVML does not find (that
check is skipped without NVML). The servers' command, model flag and device env are
`vllm_install.launch_command`'s (`[vllm] python`, `device`, `command`); a command whose
program is not found is a `BackendMissing` before anything starts. With `vllm.device =
"cpu"` no NVML is asked: each group is one server on the CPU (a server naming none: group
[0]). `"openai"` returns one `OpenAIEngine` per configured endpoint, no launch (groups
None). Either way the consumers' contracts come from `[consumer]`. No GPU is a
`BackendMissing` (exit 3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fabricctl.config import AppConfig
from fabricctl.config.fleetspec import (
    ServerSpec,
    adapter_problems,
    gpu_problems,
    replicas,
    with_groups,
)
from fabricctl.engines.base import Engine
from fabricctl.engines.pooled import served_counter
from fabricctl.errors import BackendMissing, LaunchError, UsageError
from fabricctl.supervisor.launch_spec import LaunchSpec
from fabricctl.supervisor.launcher import Launcher
from fabricctl.supervisor.vllm_install import launch_command, missing

CPU_GPUS = (0,)  # the groups of vLLM's CPU build when `gpus` names none: one server

log = logging.getLogger("fabricctl.fleet")


def launch_spec(cfg: AppConfig, server: ServerSpec | None = None) -> LaunchSpec:
    """The launcher's spec for `server` (the fleet's first by default): `[vllm]`'s knobs under
    the same names, then the server's model, names, extra args and env, and the logs."""
    v = cfg.vllm
    s = server if server is not None else cfg.fleet[0]
    run = launch_command(v)
    return LaunchSpec(
        model=s.model, served_model_name=s.served_name,
        logs_dir=str(cfg.data_dir / "logs"), host=v.host, port_base=v.port_base,
        command=run.command, model_flag=run.model_flag,
        extra_args=(*v.extra_args, *s.extra_args), env={**run.env, **v.env, **s.env},
        ready_timeout_s=v.ready_timeout_s,
        restart_backoff_s=tuple(float(x) for x in v.restart_backoff_s),
        start_attempts=v.start_attempts,
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
    if why := missing(cfg.vllm):
        raise BackendMissing(why)
    if cfg.vllm.device == "cpu":  # vLLM's CPU build: no NVML; each group is one CPU server
        servers = with_groups(servers, CPU_GPUS)
        preflight(servers, None)
        return servers
    present, why = present_gpus()
    if any(not s.gpus for s in servers):
        if not present:
            raise BackendMissing(f"engine vllm needs GPUs: {why} (name them with --gpus 0,1 "
                                 "or gpus = [...]; without a GPU: --device cpu runs vLLM's "
                                 "CPU build, --engine sim the simulator)")
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


async def build_real_engines(cfg: AppConfig, kind: str,
                             on_launch: Callable[[Launcher], None] | None = None,
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
        v = cfg.vllm
        engines: list[Engine] = [
            OpenAIEngine(url, cfg.model_name, name=f"openai{i}", names=names,
                         shared_capacity=v.shared_capacity if v.shared else None,
                         live_target_s=v.live_ttft_target_s or None,
                         batch_priority=v.batch_priority if v.shared else None, **limits)
            for i, url in enumerate(v.endpoints)]
        return engines, [None] * len(engines), None
    from fabricctl.supervisor.vllm_engine import VllmEngine

    servers = fleet_servers(cfg)
    groups = replicas(servers)
    specs = {id(s): launch_spec(cfg, s) for s in servers}
    launcher = Launcher.of([(specs[id(r.server)], r.group) for r in groups])
    if on_launch is not None:
        on_launch(launcher)
    try:
        await launcher.start(wait=False)
        failed = await launcher.settle()
    except BaseException:
        await launcher.stop()
        raise
    why = "; ".join(f"{s.label}: {s.refusal}" for s in failed)
    if len(failed) == len(launcher.servers):
        await launcher.stop()
        raise LaunchError(f"vLLM did not start: {why}")
    if failed:
        log.warning("serving without %d of %d servers, which did not start: %s",
                    len(failed), len(launcher.servers), why)
    counters: dict[str, Any] = {}
    engines = []
    kept = [(r, s) for r, s in zip(groups, launcher.servers, strict=True) if s not in failed]
    groups = [r for r, _ in kept]
    for r, server in kept:
        extra = dict(limits)
        if c.group_pooling:
            model = r.server.model
            if model not in counters:
                counters[model] = served_counter(cfg.producer.tokenizer, model)
            extra["counter"] = counters[model]
        engines.append(VllmEngine(server, **extra))
    return engines, [list(r.group) for r in groups], launcher
