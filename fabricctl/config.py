"""fabricctl's configuration: one frozen object built from defaults, files, env and flags.

Contract: precedence is flag > environment (FABRICCTL_*) > project `fabric.toml` (in the
working directory) > user file (`$FABRICCTL_CONFIG`, else
`$XDG_CONFIG_HOME/fabricctl/config.toml`) > defaults. Unknown keys are a `UsageError` naming
the file and the key, so a typo never silently falls back to a default. `[broker]` keys are
`CoreConfig` field names, `[store]` keys `StoreConfig` field names (the lower layers' own
settings objects are the sections as they stand).

One settings model: every knob has its default once, here or, for a knob a layer below the
configuration owns, in core (`CoreConfig`; `core.defaults` for `[store]`, the consumer
contract, the sim's time scale and the line limit), which this module reads. The daemon's
`ServerConfig` and the launcher's `LaunchSpec` take the defaults of the knobs they share with
`[server]` and `[vllm]` from the sections here, under the same names.

`ENV_VARS` is the one list of fabricctl's environment variables: the loader reads those that
name a setting, and `config show`, the man page and the README's table are made from it.
The fleet is `[[servers]]` (`fabricctl.fleetspec.ServerSpec`, each entry checked as it is
read; a later source's list replaces an earlier one's), or, when none is given, the
single-model keys `model`, `served_model_name` and `gpus` (`AppConfig.fleet` is the list
either way); a source setting those keys beside a `[[servers]]` list is a `UsageError`, and
with the list `model`/`served_model_name` are its first server's.
While loading, `AppConfig.set_by` records for each key a file, the environment or a flag set
(`name`, or `section.name`) the last source that set it, for `config show`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricctl.core.config import PREWARM_MODES, SHAPE_SCOPES, CoreConfig
from fabricctl.core.defaults import (
    BLOCK_TOKENS,
    MAX_BATCH_SIZE,
    MAX_BATCH_TOKENS,
    MAX_INPUT_LEN,
    MAX_LINE_BYTES,
    SHAPE_MODES,
    SHAPES,
    SIM_TIME_SCALE,
    StoreConfig,
)
from fabricctl.errors import UsageError
from fabricctl.fleetspec import ServerSpec, parse_servers

ENGINES = ("auto", "sim", "vllm", "openai")


@dataclass(frozen=True)
class EnvVar:
    """Why: the loader, `config show`, the man page and the README name the same variables."""

    name: str
    key: str  # the setting it overrides (`section.name` in a section); "": none
    doc: str  # what it is for, in a sentence or two; `code` spans for flags, keys and paths


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("FABRICCTL_DATA_DIR", "data_dir", "The broker's data dir when `--data-dir` is not "
           "given: LMDB, the Unix socket, logs. Each data dir holds one broker, so several "
           "can run side by side."),
    EnvVar("FABRICCTL_ENGINE", "engine", "Overrides `engine` of the configuration files."),
    EnvVar("FABRICCTL_MODEL", "model", "Overrides `model` of the configuration files."),
    EnvVar("FABRICCTL_TOKEN", "server.token", "Overrides `server.token`: the token a broker "
           "listening on TCP asks of its clients (`up`) and remote consumers present "
           "(`consume`); `--token` overrides it."),
    EnvVar("FABRICCTL_CONFIG", "", "The user configuration file, instead of "
           "`$XDG_CONFIG_HOME/fabricctl/config.toml`."),
)


@dataclass(frozen=True)
class VllmSettings:
    """Why: how to launch the OpenAI-compatible vLLM servers, one per GPU group (`[vllm]`)."""

    command: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    model_flag: str = ""  # "" = the model is positional (vllm serve); "--model" for api_server
    host: str = "127.0.0.1"
    port_base: int = 8001  # the i-th server (GPU group) listens on port_base + i
    ready_timeout_s: float = 600.0  # a start not answering /health by then is a failure
    # the waits before restarts of a dead server, in turn: the n-th restart in a row waits
    # the n-th, every later one the last; a server healthy for a minute starts it over
    restart_backoff_s: list[float] = field(default_factory=lambda: [1, 2, 5, 10, 30])
    extra_args: list[str] = field(default_factory=list)  # every server's; then its own
    env: dict[str, str] = field(default_factory=dict)  # every server's; then its own
    endpoints: list[str] = field(default_factory=list)  # engine "openai": servers run by others
    # engine "openai": the names those servers answer besides the model's (LoRA adapters);
    # []: each consumer asks its endpoint's /v1/models
    endpoint_names: list[str] = field(default_factory=list)

    def names_of_endpoints(self) -> tuple[str, ...] | None:
        """The names an `openai` engine is told its endpoint answers, or None: ask it."""
        return tuple(self.endpoint_names) if self.endpoint_names else None


@dataclass(frozen=True)
class ConsumerSettings:
    """Why: the contract each GPU's consumer registers (`[consumer]`)."""

    max_batch_size: int = MAX_BATCH_SIZE
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_input_len: int = MAX_INPUT_LEN
    window: int = 0  # requests a consumer keeps in a real engine at once; 0: WINDOW_BATCHES
    # (fabricctl.engines.base) x max_batch_size
    # embeddings items whose bodies differ only in their input go as one request with an
    # input list (fabricctl.engines.pooled), texts counted by the served model's tokenizer
    group_pooling: bool = True


@dataclass(frozen=True)
class SimSettings:
    """Why: the simulated GPUs used when there is no NVIDIA driver (`[sim]`)."""

    gpus: int = 2
    time_scale: float = SIM_TIME_SCALE


@dataclass(frozen=True)
class ProducerSettings:
    """Why: how producers (`submit`, `run`, the Batch API) read their input (`[producer]`)."""

    max_line_bytes: int = MAX_LINE_BYTES
    tokenizer: str = ""
    # "auto": a plain prompt that declares no shape gets the prefix it shares with earlier
    # lines of its job, cut at block_size tokens (formats/autoshape.py); "declared": none
    shapes: str = SHAPES
    block_size: int = BLOCK_TOKENS  # vLLM's default block size on GPUs (its CPU build: 32)


@dataclass(frozen=True)
class ServerSettings:
    """Why: the daemon's sockets and heartbeats as an operator sets them (`[server]`)."""

    listen: str = ""  # HOST:PORT of the TCP listener for consumers on other hosts; "": off
    token: str = ""  # what TCP clients must present (FABRICCTL_TOKEN, `--token`)
    tls_cert: str = ""  # PEM certificate of the TCP listener: TLS on (`up`)
    tls_key: str = ""  # its PEM key ("" when tls_cert holds it)
    tls_ca: str = ""  # what a consumer on another host trusts: a CA file or the pinned cert
    api: str = ""  # HOST:PORT of the OpenAI Batch API (`up --api`); "": off
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 10.0


@dataclass(frozen=True)
class MetricsSettings:
    """Why: where the broker serves its Prometheus metrics (`[metrics]`)."""

    prometheus_port: int = 0  # 0: off


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "fabricctl"


@dataclass(frozen=True)
class AppConfig:
    """Why: every command reads the same settings the same way."""

    data_dir: Path = field(default_factory=default_data_dir)
    engine: str = "auto"
    model: str = "fabric-demo"
    served_model_name: str = ""
    gpus: list[int] = field(default_factory=list)
    # the fleet ([[servers]], fabricctl.fleetspec); []: the single-model shorthand above
    servers: list[ServerSpec] = field(default_factory=list)
    vllm: VllmSettings = field(default_factory=VllmSettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    sim: SimSettings = field(default_factory=SimSettings)
    producer: ProducerSettings = field(default_factory=ProducerSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    broker: CoreConfig = field(default_factory=CoreConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    sources: tuple[str, ...] = ()  # what was read, lowest precedence first: files,
    # "environment", "flags" (for `config show`)
    set_by: dict[str, str] = field(default_factory=dict)  # key -> the last source setting it

    @property
    def model_name(self) -> str:
        """The name items carry in "model"."""
        return self.served_model_name or self.model

    @property
    def fleet(self) -> list[ServerSpec]:
        """The servers `up` launches: `[[servers]]`, else the single-model shorthand (one
        server of `model` named `served_model_name`, one one-GPU group per GPU of `gpus`)."""
        if self.servers:
            return list(self.servers)
        return [ServerSpec(model=self.model, name=self.served_model_name,
                           gpus=[[g] for g in self.gpus])]


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
            raise UsageError(f"{where}: unknown key {key!r}")
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
