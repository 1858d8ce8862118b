"""Where Ray places `up --ray`'s GPU workers, and the configuration each one runs.

Contract:
- `placements(cfg, kind, cluster_gpus)`: one `Placement` per group of each `[[servers]]`
  entry (`num_gpus` the group's size); else (the single-model form, or a lone entry naming
  no groups) one per GPU: `local_gpus`, or the `cluster_gpus` of a Ray cluster; for engine
  openai one per endpoint.
- `local_gpus(cfg, kind)`: the logical GPUs of a local Ray ("auto"): one per endpoint
  (openai), the configured `gpus`, else `sim.gpus` simulated ones, else what NVML finds.
- `group_config(cfg, kind, group, index, name, server)`: one worker's configuration, its
  group only (its `[[servers]]` entry narrowed to that group), its own vLLM port (two
  workers on one node never share one) and its own logs under `data_dir/ray/<name>`.
Pure planning over the configuration: it never imports `ray` (`supervisor.ray_fleet` does).
"""

from __future__ import annotations

import dataclasses

import msgspec

from fabricctl.config import AppConfig
from fabricctl.errors import BackendMissing, UsageError


class Placement(msgspec.Struct, frozen=True):
    """Why: what one GPU worker asks Ray for: its server and its group (size = num_gpus)."""

    group: tuple[int, ...]  # the configured GPUs: a local Ray's logical ids; a cluster: a size
    server: int | None = None  # its entry in `[[servers]]`; None: the single-model form

    @property
    def num_gpus(self) -> int:
        return len(self.group)



def local_gpus(cfg: AppConfig, kind: str) -> list[int]:
    """The logical GPUs of a local Ray ("auto"): one per endpoint (openai), the configured
    `gpus`, else `sim.gpus` simulated ones, else what NVML finds (vllm)."""
    if kind == "openai":
        if not cfg.vllm.endpoints:
            raise UsageError("engine openai needs vllm.endpoints = [\"http://host:port\", ...]")
        return list(range(len(cfg.vllm.endpoints)))
    if cfg.gpus:
        return list(cfg.gpus)
    if kind == "sim":
        return list(range(cfg.sim.gpus))
    from fabricctl.supervisor.gpus import detect_gpus

    report = detect_gpus()
    if not report.gpus:
        raise BackendMissing(f"engine vllm needs GPUs: {report.reason or 'none found'} "
                             "(set gpus = [...] or use --engine sim)")
    return [g.index for g in report.gpus]


def placements(cfg: AppConfig, kind: str, cluster_gpus: int | None = None) -> list[Placement]:
    """The GPU workers to place: one per group of each `[[servers]]` entry; else (the
    single-model form, or a lone entry naming no groups) one per GPU: `local_gpus`, or the
    `cluster_gpus` of a Ray cluster; for engine openai one per endpoint."""
    if kind == "openai":
        return [Placement((g,)) for g in local_gpus(cfg, kind)]
    if cfg.servers and all(s.gpus for s in cfg.servers):
        return [Placement(tuple(g), i) for i, s in enumerate(cfg.servers) for g in s.gpus]
    server = 0 if cfg.servers else None
    gpus = (range(cluster_gpus) if cluster_gpus is not None
            else local_gpus(dataclasses.replace(cfg, servers=[]), kind))
    return [Placement((g,), server) for g in gpus]


def one_gpu_config(cfg: AppConfig, kind: str, gpu: int, index: int, name: str) -> AppConfig:
    """The configuration of one GPU worker of the single-model form (`group_config`)."""
    return group_config(cfg, kind, [gpu], index, name)


def group_config(cfg: AppConfig, kind: str, group: list[int], index: int, name: str,
                 server: int | None = None) -> AppConfig:
    """The configuration of one GPU worker: its group only (`server`: its `[[servers]]`
    entry, narrowed to that one group), its own vLLM port (two workers on one node never
    share one) and its own logs."""
    gpu = group[0]
    cfg = dataclasses.replace(cfg, data_dir=cfg.data_dir / "ray" / name)
    if server is not None:
        cfg = dataclasses.replace(cfg, servers=[dataclasses.replace(
            cfg.servers[server], gpus=[list(group)])])
    else:
        cfg = dataclasses.replace(cfg, gpus=[gpu])
    if kind == "sim":
        return dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, gpus=1))
    if kind == "vllm":
        return dataclasses.replace(cfg, vllm=dataclasses.replace(
            cfg.vllm, port_base=cfg.vllm.port_base + gpu))
    endpoints = cfg.vllm.endpoints
    return dataclasses.replace(cfg, vllm=dataclasses.replace(
        cfg.vllm, endpoints=[endpoints[index % len(endpoints)]] if endpoints else []))
