"""`fabricctl consume`: consumers on this host against a broker elsewhere (TCP + token, TLS).

Contract: the `consume` command (`command`) has two forms.
- Without `--gpus`: one `Consumer` with its engine (simulated, or an OpenAI-compatible
  endpoint) named `--name` (default `<host>-gpu<gpu>`).
- With `--gpus 0,1` it is the GPU-host agent: the supervisor `fabricctl up` runs
  (`Fleet.build` + `Fleet.start`), one engine per GPU (engine vllm: one vLLM server per GPU
  from this host's config, started, health-checked, restarted and logged under this host's
  data dir; sim: one simulated GPU per index; openai: one endpoint per GPU, `--endpoint`
  a comma-separated list or `vllm.endpoints`; with `[[servers]]`, one server per group of
  the fleet that lies in `--gpus`: `fleetspec.within`), each with its consumer joining the remote
  broker as `<name>-gpu<N>` (`--name` defaults to the host name). The host name, and for
  vllm each GPU's NVML sample, go with every heartbeat, so the broker's `status` and `top`
  show this host's GPUs under its name.
Either way SIGINT/SIGTERM finishes the batches in hand, stops the engines and exits 0. The
token is `--token`, else the config's `server.token` (which `FABRICCTL_TOKEN` overrides);
`--tls-ca` (else `server.tls_ca`) makes the TCP connection TLS, verified against that CA
file or pinned certificate (`fabricctl.wire.tls`). A refusal no retry can change (a wrong
token: "broker refused the token"; a certificate that does not verify; a TLS/plain mismatch)
ends the command with that error (exit 1); a lost broker is retried with backoff, and the
consumers register again when it is back. A bad `--engine` or `--gpus` is exit 2. The
supervisor and the engines are imported when the consumers start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fabricctl.cli.optgroup import takes
from fabricctl.cli.support import (
    UNSET,
    ConfigFile,
    DataDir,
    EngineFlags,
    Verbose,
    load,
    parse_gpus,
    run_async,
    setup_logging,
)
from fabricctl.config import AppConfig
from fabricctl.config.fleetspec import within
from fabricctl.errors import UsageError

if TYPE_CHECKING:
    from fabricctl.engines.base import Engine
    from fabricctl.supervisor.fleet import Fleet

AGENT_ENGINES = ("sim", "vllm", "openai")


@takes(EngineFlags, omit=("engine", "model", "gpus"))
def command(
    broker: str = typer.Option(..., "--broker", "-b", help="HOST:PORT of a broker's --listen, "
                               "or its data dir / socket path."),
    engine: str = typer.Option("sim", "--engine", "-e", help="sim or openai; with --gpus "
                               "also vllm."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="OpenAI-compatible base URL "
                                        "(engine openai; with --gpus, one per GPU, "
                                        "comma-separated)."),
    model: str | None = typer.Option(None, "--model", "-m", help="The model the consumers "
                                     "serve, as items name it (the config's model)."),
    name: str | None = typer.Option(None, "--name", help="Consumer name (default: host-gpu); "
                                    "with --gpus the prefix of each GPU's consumer "
                                    "(default: the host name)."),
    gpu: int | None = typer.Option(None, "--gpu", help="Without --gpus: the GPU index this "
                                   "consumer reports to the broker (and in its default name)."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices, e.g. 0,1: run the "
                                    "agent, one engine and consumer per GPU."),
    token: str | None = typer.Option(None, "--token", help="The token the broker asks for "
                                     "(else FABRICCTL_TOKEN, else server.token)."),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Connect with TLS, trusting "
                                       "this CA file or pinned certificate "
                                       "(server.tls_ca)."),
    engines: EngineFlags = UNSET,
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
    verbose: bool = Verbose,
) -> None:
    """Run consumers against a broker (for example on another GPU host)."""
    setup_logging(verbose)
    cfg = load(config, model=model, data_dir=data_dir, **engines.config())
    tok = token if token is not None else cfg.server.token
    ca = str(tls_ca) if tls_ca is not None else cfg.server.tls_ca
    if gpus is None:
        run_async(run_consumer(cfg, broker, engine, endpoint, name, gpu, tok, ca))
        return
    run_async(run_agent(cfg, broker, engine, endpoint, name, gpus, tok, ca))


def tls_context(ca: str) -> ssl.SSLContext | None:
    if not ca:
        return None
    from fabricctl.wire.tls import client_context

    return client_context(ca)


def build_engine(cfg: AppConfig, engine: str, endpoint: str | None) -> Engine:
    from fabricctl.supervisor.fleet import build_sim_engines, consumer_window

    if engine == "sim":
        return build_sim_engines(cfg)[0]
    if engine == "openai":
        if not endpoint:
            raise UsageError("--engine openai needs --endpoint URL")
        from fabricctl.engines.openai import OpenAIEngine
        from fabricctl.engines.pooled import served_counter

        c = cfg.consumer
        counter = served_counter(cfg.producer.tokenizer, cfg.model) if c.group_pooling else None
        return OpenAIEngine(endpoint, cfg.model_name, max_batch_size=c.max_batch_size,
                            max_batch_tokens=c.max_batch_tokens, max_input_len=c.max_input_len,
                            window=consumer_window(cfg, "openai") or 0,
                            group_pooling=c.group_pooling, counter=counter,
                            names=cfg.vllm.names_of_endpoints(),
                            shared_capacity=cfg.vllm.shared_capacity if cfg.vllm.shared else None,
                            batch_priority=cfg.vllm.batch_priority if cfg.vllm.shared else None,
                            live_target_s=cfg.vllm.live_ttft_target_s or None)
    raise UsageError(f"--engine must be sim or openai, not {engine!r}")


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_consumer(cfg: AppConfig, broker: str, engine: str, endpoint: str | None,
                       name: str | None, gpu: int | None, token: str, ca: str = "") -> None:
    from fabricctl.supervisor.consumer import Consumer
    from fabricctl.supervisor.fleet import consumer_window

    tls = tls_context(ca)
    eng = build_engine(cfg, engine, endpoint)
    stop = _stop_on_signals()
    host = socket.gethostname()
    consumer = Consumer(broker, name or f"{host}-gpu{gpu or 0}",
                        cfg.model_name, eng, gpu, token,
                        window=consumer_window(cfg, engine), tls=tls, host=host)
    try:
        await consumer.run(stop)
    finally:
        await eng.close()


def agent_config(cfg: AppConfig, engine: str, gpus: list[int],
                 endpoint: str | None) -> AppConfig:
    """This host's configuration with one engine per GPU of `gpus` (with `[[servers]]`: one
    per group of the fleet that lies in `gpus`)."""
    if engine not in AGENT_ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(AGENT_ENGINES)}, not {engine!r}")
    if cfg.servers and engine != "openai":
        servers = within(cfg.servers, gpus)
        cfg = dataclasses.replace(cfg, engine=engine, servers=servers)
        if engine == "sim":  # a simulated GPU per index up to the highest one named
            top = max(g for s in servers for group in s.gpus for g in group)
            return dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, gpus=top + 1))
        return cfg
    cfg = dataclasses.replace(cfg, engine=engine, gpus=gpus)
    if engine == "sim":
        return dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, gpus=len(gpus)))
    if engine == "openai":
        urls = [u.strip() for u in endpoint.split(",") if u.strip()] if endpoint else []
        urls = urls or list(cfg.vllm.endpoints)
        if len(urls) != len(gpus):
            raise UsageError(f"--engine openai with --gpus needs one endpoint per GPU "
                             f"({len(gpus)}), got {len(urls)} (--endpoint URL,URL or "
                             "vllm.endpoints)")
        return dataclasses.replace(cfg, vllm=dataclasses.replace(cfg.vllm, endpoints=urls))
    return cfg


def _gpu_sampler(monitor: Any) -> Any:
    """gpu index -> that GPU's latest NVML sample (None when NVML has none)."""
    def sample(gpu: int | None) -> Any:
        report = monitor.latest()
        if report is None or gpu is None:
            return None
        return next((g for g in report.gpus if g.index == gpu), None)

    return sample


async def run_agent(cfg: AppConfig, broker: str, engine: str, endpoint: str | None,
                    name: str | None, gpus: str, token: str, ca: str = "") -> None:
    """The GPU-host agent (see the module contract)."""
    from fabricctl.supervisor.fleet import Fleet

    indices = parse_gpus(gpus)
    cfg = agent_config(cfg, engine, indices, endpoint)
    tls = tls_context(ca)
    stop = _stop_on_signals()
    fleet = await Fleet.build(cfg, engine)
    if engine != "vllm":  # the simulated GPUs and the endpoints take the indices given
        fleet.gpus = list(indices)
    monitor = None
    if engine == "vllm":
        from fabricctl.supervisor.gpus import GpuMonitor

        monitor = GpuMonitor()
        monitor.start()
    host = socket.gethostname()
    try:
        fleet.start(broker, token, prefix=name or host, tls=tls, host=host,
                    gpu_sample=_gpu_sampler(monitor) if monitor is not None else None)
        await _until_stopped(fleet, stop)
    finally:
        await fleet.stop(cfg.server.drain_s)  # as long as a broker drains
        if monitor is not None:
            await monitor.stop()
    errors = [e for t in fleet.tasks if t.done() and not t.cancelled()
              and (e := t.exception()) is not None]  # every one retrieved, the first raised
    if errors:  # a refusal that ended a consumer ends the agent with it
        raise errors[0]


async def _until_stopped(fleet: Fleet, stop: asyncio.Event) -> None:
    """Until a signal, or until a consumer's run ended by itself (a refusal)."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, *fleet.tasks}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
