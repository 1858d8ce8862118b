"""`fabricctl up`: the broker, its engines and consumers, and the monitors, in one process.

Contract: the `up` command (`command`) loads the configuration (its flags over the files:
`--listen`, `--metrics-port` and `--api` into their sections by `with_sections`; `--token`,
`--tls-cert` and `--tls-key` over `[server]` token, tls_cert and tls_key by `with_wire`,
FABRICCTL_TOKEN being read by the configuration) and runs `fabricctl.daemon.serve_forever`
on fabricctl's event loop (the daemon's contract says what starts and how it stops); its
exit status is 0, 130 after an interrupt, or an error's (`fabricctl.errors`: 2 a bad
configuration, 3 no engine, 6 no vLLM server of the fleet started: each gave up, a crash
loop of `[vllm] start_attempts` failed starts, its log named; with some started it serves
on them, the others marked failed in `status` and `top`). `--gpus none` starts no local
engine: the agents that join over `--listen` bring the GPUs; `--ray ADDRESS|auto` has Ray
place the GPU workers. With `--api HOST:PORT` a host that is not loopback needs
`server.token` (checked before anything starts, exit 2). The daemon is imported when the
broker starts, not when the CLI builds its commands.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import typer

from fabricctl.cli.optgroup import takes
from fabricctl.cli.support import (
    UNSET,
    ConfigFile,
    DataDir,
    EngineFlags,
    Verbose,
    guarded,
    load,
    run_async,
    setup_logging,
)
from fabricctl.config import AppConfig

log = logging.getLogger("fabricctl")


UP_GPUS = typer.Option(None, "--gpus", metavar="0,1|none",
                       help="The NVML indices of the GPUs to run one vLLM server each on (the "
                       "gpus setting; [[servers]] name their groups instead); none: no local "
                       "engine. With --device cpu, each is one server on the CPU.",
                       show_default=False)


@takes(EngineFlags, gpus=UP_GPUS)
def command(
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
    engines: EngineFlags = UNSET,
    listen: str | None = typer.Option(None, "--listen", help="Also listen on HOST:PORT (TCP, "
                                      "needs server.token) for consumers on other hosts."),
    metrics_port: int | None = typer.Option(None, "--metrics-port",
                                            help="Serve Prometheus metrics on this port."),
    token: str | None = typer.Option(None, "--token",
                                     help="The token TCP clients must give (else "
                                     "FABRICCTL_TOKEN, else server.token)."),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="PEM certificate: the "
                                         "--listen socket speaks TLS (server.tls_cert)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="PEM key of --tls-cert "
                                        "(server.tls_key)."),
    api: str | None = typer.Option(None, "--api", metavar="HOST:PORT",
                                   help="Serve the OpenAI Batch API (/v1/files, /v1/batches) "
                                   "on HOST:PORT; loopback unless server.token is set (then "
                                   "the bearer token)."),
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS|auto",
                                   help="Place one GPU worker per GPU (per GPU group of "
                                   "[[servers]]) as a Ray actor: on the "
                                   "Ray cluster at ADDRESS, or (auto) on a local Ray whose "
                                   "GPUs are the configured ones. Needs fabricctl[ray]."),
    verbose: bool = Verbose,
) -> None:
    """Run the broker with one engine and consumer per GPU, or per GPU group of the
    configured [[servers]] (simulated GPUs when none).

    `--gpus none` runs the broker alone: no local engine or consumer, only the agents
    (`fabricctl consume --gpus ...` on the GPU hosts) that join its --listen socket.
    """
    from fabricctl.daemon.serve import serve_forever
    from fabricctl.server import eventloop

    setup_logging(verbose)
    cfg = with_sections(load(config, data_dir=data_dir, **engines.config(none=True)),
                        listen=listen, metrics_port=metrics_port, api=api)
    cfg = with_wire(cfg, token, tls_cert, tls_key)
    if cfg.server.api:
        from fabricctl.api.address import api_address

        guarded(lambda: api_address(cfg.server.api, cfg.server.token))
    raise typer.Exit(int(run_async(serve_forever(cfg, local_gpus=not engines.no_gpus, ray=ray),
                                   eventloop.run)))


def with_wire(cfg: AppConfig, token: str | None, tls_cert: Path | None,
              tls_key: Path | None) -> AppConfig:
    """`cfg` with `--token`, `--tls-cert` and `--tls-key` in [server] (FABRICCTL_TOKEN is
    already there: the configuration reads it)."""
    s = cfg.server
    server = dataclasses.replace(
        s, token=s.token if token is None else token,
        tls_cert=s.tls_cert if tls_cert is None else str(tls_cert),
        tls_key=s.tls_key if tls_key is None else str(tls_key))
    return cfg if server == s else dataclasses.replace(cfg, server=server)


def with_sections(cfg: AppConfig, listen: str | None = None,
                  metrics_port: int | None = None, api: str | None = None) -> AppConfig:
    """`cfg` with `--listen`, `--metrics-port` and `--api` put into their sections."""
    if listen is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, listen=listen))
    if api is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, api=api))
    if metrics_port is not None:
        cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(
            cfg.metrics, prometheus_port=metrics_port))
    return cfg
