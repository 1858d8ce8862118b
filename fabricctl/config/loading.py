"""Loading the configuration: defaults, files, environment and flags, merged and checked.

Contract: `load_config` builds one `AppConfig` with precedence flag > environment
(FABRICCTL_*, `ENV_VARS`) > project `fabric.toml` (in the working directory) > user file
(`user_config_path`: `$FABRICCTL_CONFIG`, else `$XDG_CONFIG_HOME/fabricctl/config.toml`) >
defaults. Unknown keys are a `UsageError` naming the file and the key, so a typo never
silently falls back to a default; a value of the wrong type or out of range is one too.
`[broker]` keys are `CoreConfig` field names, `[store]` keys `StoreConfig` field names.
`[[servers]]` entries are checked as they are read (`fleetspec.parse_servers`); a later
source's list replaces an earlier one's. A source setting the single-model keys beside a
`[[servers]]` list is a `UsageError`, and with the list `model`/`served_model_name` are its
first server's. While loading, `AppConfig.set_by` records for each key a file, the
environment or a flag set (`name`, or `section.name`) the last source that set it, for
`config show`. `to_toml` prints a configuration back (`config show|default`).
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fabricctl.config.fleetspec import parse_servers
from fabricctl.config.settings import (
    ENGINES,
    ENV_VARS,
    VLLM_DEVICES,
    AppConfig,
    ConsumerSettings,
    MetricsSettings,
    ProducerSettings,
    ServerSettings,
    SimSettings,
    VllmSettings,
)
from fabricctl.core.config import PREWARM_MODES, SHAPE_SCOPES, CoreConfig
from fabricctl.core.defaults import SHAPE_MODES, StoreConfig
from fabricctl.errors import UsageError

SHORTHAND = ("model", "served_model_name", "gpus")  # the single-model form's keys


_META = ("sources", "set_by")  # what loading records; no file sets them
_SECTIONS = {f.name: f.type for f in dataclasses.fields(AppConfig) if f.name not in _META}
_NESTED = {"vllm": VllmSettings, "consumer": ConsumerSettings, "sim": SimSettings,
           "producer": ProducerSettings, "server": ServerSettings, "metrics": MetricsSettings,
           "broker": CoreConfig, "store": StoreConfig}


def user_config_path(env: Mapping[str, str] | None = None) -> Path:
    """The user file: `$FABRICCTL_CONFIG`, else `$XDG_CONFIG_HOME/fabricctl/config.toml`
    (`env`: the environment to read, this process's by default)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    if p := environ.get("FABRICCTL_CONFIG"):
        return Path(p)
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "fabricctl" / "config.toml"


def _kind(default: Any) -> type | None:
    """The TOML type a setting takes, read from its current value (None: not checked)."""
    for t in (bool, int, float, str):
        if isinstance(default, t):
            return t
    return None


def _is(v: Any, want: type) -> bool:
    """Whether `v` is a value of a setting of type `want` (an int is a number; no bool is)."""
    if isinstance(v, bool):
        return want is bool
    return isinstance(v, int | float) if want is float else isinstance(v, want)


def _merge(cfg: AppConfig, data: dict[str, Any], where: str,
           base: Path | None = None) -> AppConfig:
    """`cfg` with `data` (a file's tables, the environment's or the flags' values) over it,
    checked, and each key it set recorded in `set_by` as set by `where` (`base`: the file's
    directory, against which adapter directories are read)."""
    top: dict[str, Any] = {}
    keys: list[str] = []
    for key, value in data.items():
        if key == "servers":
            top[key] = parse_servers(value, where, base)
            keys.append(key)
        elif key in _NESTED:
            if not isinstance(value, dict):
                raise UsageError(f"{where}: [{key}] must be a table")
            cls = _NESTED[key]
            names = {f.name for f in dataclasses.fields(cls)}
            bad = sorted(set(value) - names)
            if bad:
                raise UsageError(f"{where}: unknown key {key}.{bad[0]} "
                                 f"(known: {', '.join(sorted(names))})")
            current = getattr(cfg, key)
            for name, v in value.items():
                want = _kind(getattr(current, name))
                if want is not None and not _is(v, want):
                    what = "a number" if want is float else want.__name__
                    raise UsageError(f"{where}: {key}.{name} must be {what}, not {v!r}")
            top[key] = dataclasses.replace(current, **value)
            keys += [f"{key}.{name}" for name in value]
        elif key in _SECTIONS:
            top[key] = Path(value).expanduser() if key == "data_dir" else value
            keys.append(key)
        else:
            known = [*sorted(set(_SECTIONS) - {*_NESTED, "servers"}),
                     *(f"[{s}]" for s in sorted(_NESTED)), "[[servers]]"]
            raise UsageError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
    broker = top.get("broker")
    if broker is not None and broker.shape_scope not in SHAPE_SCOPES:
        raise UsageError(f"{where}: broker.shape_scope must be one of {', '.join(SHAPE_SCOPES)}")
    if broker is not None and (broker.amortise_batches < 1 or broker.wait_bound_s < 0
                               or broker.bound_batches <= 0 or broker.bound_min_s < 0):
        raise UsageError(f"{where}: broker.amortise_batches must be >= 1, broker.wait_bound_s "
                         ">= 0 (0: derived), broker.bound_batches > 0, broker.bound_min_s >= 0")
    if broker is not None and broker.prewarm not in PREWARM_MODES:
        raise UsageError(f"{where}: broker.prewarm must be one of {', '.join(PREWARM_MODES)}")
    producer = top.get("producer")
    if producer is not None and producer.shapes not in SHAPE_MODES:
        raise UsageError(f"{where}: producer.shapes must be one of {', '.join(SHAPE_MODES)}")
    if producer is not None and producer.block_size < 1:
        raise UsageError(f"{where}: producer.block_size must be >= 1")
    vllm = top.get("vllm")
    if vllm is not None and (
            not isinstance(vllm.restart_backoff_s, list) or not vllm.restart_backoff_s
            or not all(_is(v, float) and v >= 0 for v in vllm.restart_backoff_s)):
        raise UsageError(f"{where}: vllm.restart_backoff_s must be a list of one or more "
                         f"seconds >= 0, not {vllm.restart_backoff_s!r}")
    if vllm is not None and vllm.device not in VLLM_DEVICES:
        raise UsageError(f"{where}: vllm.device must be one of {', '.join(VLLM_DEVICES)}, "
                         f"not {vllm.device!r}")
    if vllm is not None and (not _is(vllm.start_attempts, int) or vllm.start_attempts < 1):
        raise UsageError(f"{where}: vllm.start_attempts must be an integer >= 1, "
                         f"not {vllm.start_attempts!r}")
    if vllm is not None and (vllm.live_ttft_target_s < 0 or vllm.shared_capacity < 1):
        raise UsageError(f"{where}: vllm.live_ttft_target_s must be seconds >= 0 (0: none) and "
                         f"vllm.shared_capacity >= 1, not {vllm.live_ttft_target_s!r}, "
                         f"{vllm.shared_capacity!r}")
    server = top.get("server")
    if server is not None and server.drain_s < 0:
        raise UsageError(f"{where}: server.drain_s must be >= 0, not {server.drain_s!r}")
    store = top.get("store")
    if store is not None:
        _check_store(store, where)
    if "engine" in top and top["engine"] not in ENGINES:
        raise UsageError(f"{where}: engine must be one of {', '.join(ENGINES)}")
    return dataclasses.replace(cfg, **top, sources=(*cfg.sources, where),
                               set_by={**cfg.set_by, **dict.fromkeys(keys, where)})


def _check_store(store: StoreConfig, where: str) -> None:
    """Every `[store]` count and size is positive (the disk reserve and the finished shapes
    kept may be 0)."""
    for f in dataclasses.fields(store):
        v, zero = getattr(store, f.name), f.name in ("disk_reserve", "finished_shapes_kept")
        if v < 0 or (v == 0 and not zero):
            raise UsageError(f"{where}: store.{f.name} must be {'>= 0' if zero else '> 0'}, "
                             f"not {v}")


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fp:
            return tomllib.load(fp)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from e


def load_config(
    config_file: Path | None = None, overrides: dict[str, Any] | None = None,
    cwd: Path | None = None, env: dict[str, str] | None = None,
) -> AppConfig:
    """Build the configuration; `overrides` are the flags given (None values are ignored)."""
    env = dict(os.environ) if env is None else env
    cfg = AppConfig()
    user = user_config_path(env)
    if user.is_file():
        cfg = _merge(cfg, _read(user), str(user), user.parent)
    project = (cwd or Path.cwd()) / "fabric.toml"
    if project.is_file():
        cfg = _merge(cfg, _read(project), str(project), project.parent)
    if config_file is not None:
        if not config_file.is_file():
            raise UsageError(f"config file {config_file} does not exist")
        cfg = _merge(cfg, _read(config_file), str(config_file), config_file.parent)
    from_env: dict[str, Any] = {}
    for var in ENV_VARS:
        if var.key and (v := env.get(var.name)):
            section, _, name = var.key.rpartition(".")
            (from_env.setdefault(section, {}) if section else from_env)[name] = v
    if from_env:
        cfg = _merge(cfg, from_env, "environment")
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        cfg = _merge(cfg, flags, "flags")
    return _with_fleet(cfg)


def _with_fleet(cfg: AppConfig) -> AppConfig:
    """With `[[servers]]`, the single-model keys set anywhere are refused (which would
    win?), and `model`/`served_model_name` become the first server's: the name `run` and
    `submit` give items by default."""
    if not cfg.servers:
        return cfg
    for key in SHORTHAND:
        if key in cfg.set_by:
            what = f"--{key.replace('_', '-')}" if cfg.set_by[key] == "flags" else key
            raise UsageError(f"{cfg.set_by[key]}: {what} is the single-model form, and "
                             f"{cfg.set_by['servers']} lists [[servers]]: give each server's "
                             "model, name and gpus in its [[servers]] entry instead")
    first = cfg.servers[0]
    return dataclasses.replace(cfg, model=first.model, served_model_name=first.name)


def to_toml(cfg: AppConfig) -> str:
    """The configuration as TOML (what `fabricctl config show|default` prints)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{value(k)} = {value(x)}" for k, x in v.items()) + "}"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = []
    for f in dataclasses.fields(AppConfig):
        if f.name in _NESTED or f.name in _META or f.name == "servers":
            continue
        if cfg.servers and f.name in SHORTHAND:  # the fleet names them per server
            continue
        lines.append(f"{f.name} = {value(getattr(cfg, f.name))}")
    for name in _NESTED:
        lines.append(f"\n[{name}]")
        section = getattr(cfg, name)
        for f in dataclasses.fields(section):
            if "doc" in f.metadata:
                lines += [f"# {line}" for line in textwrap.wrap(f.metadata["doc"], 88)]
            lines.append(f"{f.name} = {value(getattr(section, f.name))}")
    if not cfg.servers:
        lines.append("\n# the fleet: [[servers]] entries (model, name, adapters, gpus, "
                     "tensor_parallel_size, extra_args, env) replace model, served_model_name "
                     "and gpus above")
    for server in cfg.servers:
        lines.append("\n[[servers]]")
        for f in dataclasses.fields(server):
            lines.append(f"{f.name} = {value(getattr(server, f.name))}")
    return "\n".join(lines) + "\n"
