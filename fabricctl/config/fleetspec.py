"""The fleet in the configuration: the servers `up` launches, their GPU groups and their names.

Contract:
- `ServerSpec` is one `[[servers]]` entry: `model`, `name` (served name; "" = the model),
  `adapters` (LoRA name -> directory), `gpus` (GPU groups, one replica per group: `[[0, 1]]`
  one server over GPUs 0 and 1, `[[0], [1]]` two replicas), `tensor_parallel_size` (0: the
  group's size; smaller, it divides the group and the quotient is pipeline parallel),
  `extra_args` and `env` (after `[vllm]`'s).
- `parse_servers(value, where, base)` reads the TOML list, keys and types checked, adapter
  directories relative to `base`; `check_servers` refuses with a `UsageError` naming the
  entry: an empty model, a name used twice, an adapter named like a model, an empty group,
  a GPU named twice, a `tensor_parallel_size` that does not divide its group, a server
  without `gpus` beside others, and flags fabricctl derives (`--tensor-parallel-size`,
  `--served-model-name`, `--lora-modules`, `--host`, `--port`) in `extra_args`.
- `within(servers, gpus)`: the groups inside an agent's `--gpus` (a group partly inside, or
  none inside, is a `UsageError`); `with_groups(servers, present)`: one one-GPU group per GPU
  present for a server naming none; `replicas(servers)`: one `Replica` per group, `index`
  counted across servers (port `vllm.port_base + index`, log `engine-<index>.log`).
- `gpu_problems(servers, present)` and `adapter_problems(servers)`: what `doctor` reports and
  `up` refuses before any server starts (a GPU NVML does not find, an adapter directory
  missing or without `adapter_config.json`); `present` None (no NVML) skips the GPU checks.
The fleet as an operator writes it: README.md, "A fleet: LoRA adapters, ...".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabricctl.errors import UsageError

# the flags a server's launch derives from its keys: giving them in extra_args too is refused
DERIVED_FLAGS = ("--tensor-parallel-size", "-tp", "--served-model-name", "--lora-modules",
                 "--host", "--port")
ADAPTER_CONFIG = "adapter_config.json"  # what a PEFT LoRA adapter directory holds


@dataclass(frozen=True)
class ServerSpec:
    """Why: one model served on one or more GPU groups (a replica per group) under its names."""

    model: str
    name: str = ""  # the served name; "": the model
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter name -> directory
    gpus: list[list[int]] = field(default_factory=list)  # groups; []: one per GPU present
    tensor_parallel_size: int = 0  # 0: the group's size
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        """The name items carry in "model" for the base model."""
        return self.name or self.model

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the server answers: its served name, then its adapters'."""
        return (self.served_name, *self.adapters)

    def tp(self, group: Sequence[int]) -> int:
        """The tensor-parallel size of a replica on `group`."""
        return self.tensor_parallel_size or len(group)


@dataclass(frozen=True)
class Replica:
    """Why: the launcher starts one server process per group of each server."""

    server: ServerSpec
    group: tuple[int, ...]
    index: int  # across every server's groups: its port offset and its log's number


_KEYS = {"model", "name", "adapters", "gpus", "tensor_parallel_size", "extra_args", "env"}


def _label(i: int, s: ServerSpec | dict[str, Any]) -> str:
    name = s.served_name if isinstance(s, ServerSpec) else (s.get("name") or s.get("model"))
    return f"servers[{i}] ({name})" if name else f"servers[{i}]"


def _str_map(v: Any, what: str, empty: bool = False) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str)
                                          and (empty or x) for k, x in v.items()):
        kind = "strings" if empty else "non-empty strings"
        raise UsageError(f"{what} must be a table of names to {kind}, not {v!r}")
    return dict(v)


def parse_servers(value: Any, where: str, base: Path | None = None) -> list[ServerSpec]:
    """The `[[servers]]` list read from one source, checked (`check_servers`)."""
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise UsageError(f"{where}: servers must be a list of tables ([[servers]])")
    out = []
    for i, raw in enumerate(value):
        label = f"{where}: {_label(i, raw)}"
        bad = sorted(set(raw) - _KEYS)
        if bad:
            raise UsageError(f"{label}: unknown key {bad[0]!r} (known: {', '.join(sorted(_KEYS))})")
        if not isinstance(raw.get("model"), str) or not raw["model"]:
            raise UsageError(f"{label}: model must be a non-empty string (a path or a model id)")
        name = raw.get("name", "")
        if not isinstance(name, str):
            raise UsageError(f"{label}: name must be a string, not {name!r}")
        adapters = _str_map(raw.get("adapters", {}), f"{label}: adapters")
        adapters = {k: str(_resolve(d, base)) for k, d in adapters.items()}
        gpus = raw.get("gpus", [])
        if not isinstance(gpus, list) or not all(
                isinstance(g, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in g) for g in gpus):
            raise UsageError(f"{label}: gpus must be a list of GPU groups, each a list of GPU "
                             f"indices ([[0, 1]]: one server over GPUs 0 and 1; [[0], [1]]: "
                             f"two replicas), not {gpus!r}")
        tp = raw.get("tensor_parallel_size", 0)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 0:
            raise UsageError(f"{label}: tensor_parallel_size must be an integer >= 0 "
                             f"(0: the group's size), not {tp!r}")
        extra = raw.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise UsageError(f"{label}: extra_args must be a list of strings, not {extra!r}")
        env = _str_map(raw.get("env", {}), f"{label}: env", empty=True)
        out.append(ServerSpec(model=raw["model"], name=name, adapters=adapters,
                              gpus=[list(g) for g in gpus], tensor_parallel_size=tp,
                              extra_args=list(extra), env=env))
    check_servers(out, where)
    return out


def _resolve(directory: str, base: Path | None) -> Path:
    p = Path(directory).expanduser()
    return p if p.is_absolute() or base is None else (base / p).absolute()


def check_servers(servers: Sequence[ServerSpec], where: str = "config") -> None:
    """Refuse what no host could launch (see the module contract), naming the entry."""
    served: dict[str, str] = {}  # name -> the entry serving it
    models: dict[str, str] = {}
    for i, s in enumerate(servers):
        label = _label(i, s)
        if not s.model:
            raise UsageError(f"{where}: {label}: model must be a non-empty string")
        if s.served_name in served:
            raise UsageError(f"{where}: {label} and {served[s.served_name]} both serve the "
                             f"name {s.served_name!r}: give one a different `name`")
        served[s.served_name] = label
        models.setdefault(s.model, label)
    for i, s in enumerate(servers):
        label = _label(i, s)
        for a in s.adapters:
            if a in served:
                raise UsageError(f"{where}: {label}: adapter {a!r} has the name {served[a]} is "
                                 "served under: an adapter's name must differ from every "
                                 "model's")
            if a in models:
                raise UsageError(f"{where}: {label}: adapter {a!r} has the name of the model "
                                 f"of {models[a]}: an adapter's name must differ from every "
                                 "model's")
            served[a] = f"{label} adapter"
        taken = [a for a in s.extra_args if a.split("=")[0] in DERIVED_FLAGS]
        if taken:
            raise UsageError(f"{where}: {label}: extra_args must not give {taken[0]}: fabricctl "
                             "derives it (tensor_parallel_size, name, adapters, the port)")
    seen: dict[int, tuple[str, int, list[int]]] = {}  # GPU -> (entry, group index, group)
    for i, s in enumerate(servers):
        label = _label(i, s)
        if not s.gpus and len(servers) > 1:
            raise UsageError(f"{where}: {label}: gpus is missing: with several servers each "
                             "names its GPU groups (gpus = [[0], [1]] or [[0, 1]])")
        for j, group in enumerate(s.gpus):
            if not group:
                raise UsageError(f"{where}: {label}: gpus has an empty group")
            for g in group:
                if g < 0:
                    raise UsageError(f"{where}: {label}: GPU index {g} is negative")
                if g in seen:
                    other, k, og = seen[g]
                    if (other, k) == (label, j):
                        raise UsageError(f"{where}: {label}: group {group} names GPU {g} twice")
                    raise UsageError(f"{where}: GPU {g} is in two groups: {other} {og} and "
                                     f"{label} {group}")
                seen[g] = (label, j, group)
            tp = s.tp(group)
            if len(group) % tp:
                raise UsageError(f"{where}: {label}: tensor_parallel_size {tp} does not divide "
                                 f"its group {group} of {len(group)} GPU(s)")


def with_groups(servers: Sequence[ServerSpec], present: Sequence[int]) -> list[ServerSpec]:
    """`servers` with a server that names no groups given one one-GPU group per GPU present."""
    return [s if s.gpus else replace(s, gpus=[[g] for g in present]) for s in servers]


def within(servers: Sequence[ServerSpec], gpus: Sequence[int]) -> list[ServerSpec]:
    """The servers an agent given `gpus` runs: each server's groups that lie inside them (a
    server naming none: one one-GPU group per GPU given); a group only partly inside is a
    `UsageError`, and so is none inside at all."""
    mine = set(gpus)
    out: list[ServerSpec] = []
    for s in with_groups(servers, list(gpus)):
        groups = [g for g in s.gpus if set(g) <= mine]
        split = [g for g in s.gpus if set(g) & mine and not set(g) <= mine]
        if split:
            raise UsageError(f"server {s.served_name!r}: its GPU group {split[0]} lies only "
                             f"partly in --gpus {','.join(map(str, gpus))}: give all of it")
        if groups:
            out.append(replace(s, gpus=groups))
    if not out:
        raise UsageError(f"no [[servers]] GPU group lies in --gpus "
                         f"{','.join(map(str, gpus))}")
    return out


def replicas(servers: Sequence[ServerSpec]) -> list[Replica]:
    """One replica per group of each server, in order, numbered across servers."""
    out: list[Replica] = []
    for s in servers:
        for group in s.gpus:
            out.append(Replica(s, tuple(group), len(out)))
    return out


def gpu_problems(servers: Sequence[ServerSpec], present: Sequence[int]) -> list[str]:
    """Each group that names a GPU the host does not have, in words."""
    have = set(present)
    listed = ", ".join(map(str, sorted(have))) or "none"
    out = []
    for i, s in enumerate(servers):
        for group in s.gpus:
            missing = [g for g in group if g not in have]
            if not missing:
                continue
            size = (f"needs {len(group)} GPUs and this host has {len(have)}; "
                    if len(group) > len(have) else "")
            out.append(f"{_label(i, s)}: group {group} {size}names GPU "
                       f"{', '.join(map(str, missing))}, which NVML does not find (GPUs "
                       f"present: {listed})")
    return out


def adapter_problems(servers: Sequence[ServerSpec]) -> list[str]:
    """Each adapter whose directory is missing or holds no adapter_config.json, in words."""
    out = []
    for i, s in enumerate(servers):
        for name, directory in s.adapters.items():
            d = Path(directory)
            if not d.is_dir():
                out.append(f"{_label(i, s)}: adapter {name!r}: directory {d} does not exist")
            elif not (d / ADAPTER_CONFIG).is_file():
                out.append(f"{_label(i, s)}: adapter {name!r}: {d} holds no {ADAPTER_CONFIG} "
                           "(not a LoRA adapter directory)")
    return out
