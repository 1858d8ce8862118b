"""Real engines for `fabricctl up`: one launched vLLM server per GPU, or endpoints run by others.

Contract: `build_real_engines(cfg, "vllm")` launches one server per configured (or detected)
GPU through the `Launcher` (logs under the data dir), waits for every /health, and returns a
`VllmEngine` per server; `"openai"` returns one `OpenAIEngine` per configured endpoint, no
launch. Either way the consumers' contracts come from `[consumer]`. No GPU is a
`BackendMissing` (exit 3); a server that does not become ready a `LaunchError` (exit 6).
"""

from __future__ import annotations

from typing import Any

from fabricctl.config import AppConfig
from fabricctl.engines.base import Engine
from fabricctl.engines.pooled import served_counter
from fabricctl.errors import BackendMissing, LaunchError, UsageError
from fabricctl.supervisor.launcher import Launcher, LaunchSpec


def launch_spec(cfg: AppConfig) -> LaunchSpec:
    """The launcher's spec: `[vllm]`'s knobs under the same names, the model and the logs."""
    v = cfg.vllm
    return LaunchSpec(
        model=cfg.model, served_model_name=cfg.model_name,
        logs_dir=str(cfg.data_dir / "logs"), host=v.host, port_base=v.port_base,
        command=tuple(v.command), model_flag=v.model_flag, extra_args=tuple(v.extra_args),
        env=dict(v.env), ready_timeout_s=v.ready_timeout_s,
        restart_backoff_s=tuple(float(s) for s in v.restart_backoff_s),
    )


async def build_real_engines(cfg: AppConfig, kind: str) -> tuple[list[Engine], list[Any], Any]:
    c = cfg.consumer
    limits: dict[str, Any] = {"max_batch_size": c.max_batch_size,
                              "max_batch_tokens": c.max_batch_tokens,
                              "max_input_len": c.max_input_len, "window": c.window,
                              "group_pooling": c.group_pooling}
    if c.group_pooling:
        limits["counter"] = served_counter(cfg.producer.tokenizer, cfg.model)
    if kind == "openai":
        from fabricctl.engines.openai import OpenAIEngine

        if not cfg.vllm.endpoints:
            raise UsageError("engine openai needs vllm.endpoints = [\"http://host:port\", ...]")
        engines: list[Engine] = [OpenAIEngine(url, cfg.model_name, name=f"openai{i}", **limits)
                                 for i, url in enumerate(cfg.vllm.endpoints)]
        return engines, [None] * len(engines), None
    from fabricctl.supervisor.vllm_engine import VllmEngine

    gpus = list(cfg.gpus)
    if not gpus:
        from fabricctl.supervisor.gpus import detect_gpus

        report = detect_gpus()
        gpus = [g.index for g in report.gpus]
        if not gpus:
            raise BackendMissing(f"engine vllm needs GPUs: {report.reason or 'none found'} "
                                 "(set gpus = [...] or use --engine sim)")
    launcher = Launcher(launch_spec(cfg), gpus)
    try:
        await launcher.start(wait=True)
    except LaunchError as e:
        await launcher.stop()
        raise LaunchError(f"vLLM did not start: {e} (logs in {cfg.data_dir / 'logs'})") from e
    engines = [VllmEngine(server, **limits) for server in launcher.servers]
    return engines, gpus, launcher
