"""`fabricctl up`: the broker, its engines and consumers, and the monitors, in one process.

Contract: the `up` command (`command`) loads the configuration (its flags over the files)
and runs `serve_forever` on fabricctl's event loop; its exit status is 0, 130 after an
interrupt, or an error's (`fabricctl.errors`: 2 a bad configuration, 3 no engine, 6 vLLM did
not become ready). `Daemon.start()` opens (and recovers) the durable store in the data dir
(with the `[store]` settings), starts the socket server, decides the engine (vLLM when NVML
shows GPUs, else simulated GPUs, and says why on the log), starts one consumer per GPU and
the GPU/process monitors, whose samples go into the stats stream; with `--gpus none`
(`local_gpus=False`) it starts no engine and no consumer, and says "no local GPUs: waiting
for agents" (the snapshot's `engine` extra, kind "none"): the GPUs are those of the agents
that join over `--listen`. `--token`, `--tls-cert` and `--tls-key` override `[server]` token
(which FABRICCTL_TOKEN sets, `config.ENV_VARS`), tls_cert and tls_key; the broker's host
name is the `host` extra, so views can tell its GPUs from the agents'. With `--ray
ADDRESS|auto` Ray places one GPU worker per GPU instead (`supervisor/ray_fleet.py`), each
joining over the TCP listener (127.0.0.1 on an ephemeral port with a fresh token when none
is configured). `Daemon.stop()` stops pulls, lets in-flight batches finish, stops the server
(and the Ray workers, and a local Ray) and closes LMDB. `serve_forever` wires SIGINT/SIGTERM
(and `fabricctl down`) to a graceful stop; a second SIGINT exits at once (LMDB's durable
commits mean nothing acknowledged is lost either way).
The server, the store and the supervisor are imported when the broker starts, not when the
CLI builds its commands.

With `--api HOST:PORT` (or `[server] api`) `serve_forever` also serves the OpenAI Batch API
(`fabricctl.api`) in the same event loop once the broker is up (`start_api`): a producer on
the daemon's own socket, its uploads under `<data dir>/files/`, stopped before the broker.
A host that is not loopback needs `server.token` (checked before anything starts, exit 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fabricctl.cli.support import (
    ConfigFile,
    DataDir,
    Verbose,
    guarded,
    load,
    run_async,
    setup_logging,
)
from fabricctl.config import AppConfig
from fabricctl.errors import ExitCode

if TYPE_CHECKING:
    from fabricctl.api.app import ApiServer
    from fabricctl.api.backend import ClientBackend
    from fabricctl.server.app import BrokerServer
    from fabricctl.server.config import ServerConfig
    from fabricctl.store.durable import DurableBroker
    from fabricctl.store.files import FileStore
    from fabricctl.supervisor.fleet import Fleet
    from fabricctl.supervisor.ray_fleet import RayFleet

log = logging.getLogger("fabricctl")
NO_LOCAL_GPUS = "no local GPUs: waiting for agents"


def _hostname() -> str:
    return socket.gethostname()


def command(
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
    engine: str | None = typer.Option(None, "--engine", "-e",
                                      help="auto, sim, vllm or openai (auto: vllm when NVML "
                                      "finds GPUs, else simulated GPUs)."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices, e.g. 0,1."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model to serve."),
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
                                   help="Place one GPU worker per GPU as a Ray actor: on the "
                                   "Ray cluster at ADDRESS, or (auto) on a local Ray whose "
                                   "GPUs are the configured ones. Needs fabricctl[ray]."),
    verbose: bool = Verbose,
) -> None:
    """Run the broker with one engine and consumer per GPU (simulated GPUs when none).

    `--gpus none` runs the broker alone: no local engine or consumer, only the agents
    (`fabricctl consume --gpus ...` on the GPU hosts) that join its --listen socket.
    """
    from fabricctl.server import eventloop

    setup_logging(verbose)
    flags: dict[str, object] = {"data_dir": data_dir, "engine": engine, "model": model}
    no_gpus = (gpus or "").strip().lower() == "none"
    if gpus and not no_gpus:
        flags["gpus"] = [int(g) for g in gpus.split(",") if g.strip()]
    cfg = with_sections(load(config, **flags), listen=listen, metrics_port=metrics_port,
                        api=api)
    cfg = with_wire(cfg, token, tls_cert, tls_key)
    if cfg.server.api:
        from fabricctl.api.address import api_address

        guarded(lambda: api_address(cfg.server.api, cfg.server.token))
    raise typer.Exit(int(run_async(serve_forever(cfg, local_gpus=not no_gpus, ray=ray),
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


def server_config(cfg: AppConfig) -> ServerConfig:
    """The daemon's settings: `[server]`'s own knobs as they are (the same names), the
    Prometheus port (0: off) and the core's tick; the daemon's other knobs keep theirs."""
    from fabricctl.server.config import ServerConfig

    s = cfg.server
    return ServerConfig(
        cfg.data_dir, listen=s.listen, token=s.token, tls_cert=s.tls_cert, tls_key=s.tls_key,
        heartbeat_s=s.heartbeat_s, heartbeat_timeout_s=s.heartbeat_timeout_s,
        metrics_port=cfg.metrics.prometheus_port or None, tick_s=cfg.broker.tick_s,
    )


class Daemon:
    """Why: `up` and `run` assemble the same pieces; this is the assembly."""

    def __init__(self, cfg: AppConfig, with_fleet: bool = True, local_gpus: bool = True,
                 ray: str | None = None) -> None:
        self.ray = ray  # `up --ray`: the GPU workers are Ray actors (supervisor/ray_fleet.py)
        if ray is not None:
            from fabricctl.supervisor.ray_fleet import import_ray, with_ray_listener

            import_ray()  # without it, say so before the store is opened
            cfg = with_ray_listener(cfg)
        self.cfg = cfg
        self.with_fleet = with_fleet
        self.local_gpus = local_gpus  # False: `--gpus none`, the agents bring the GPUs
        self.store: DurableBroker | None = None
        self.server: BrokerServer | None = None
        self.fleet: Fleet | None = None
        self.ray_fleet: RayFleet | None = None
        self.engine_reason = ""
        self._monitors: list[object] = []

    async def start(self) -> None:
        from fabricctl.server.app import BrokerServer
        from fabricctl.store.durable import DurableBroker
        from fabricctl.supervisor.fleet import Fleet, choose_engine

        cfg = self.cfg
        self.store = DurableBroker(cfg.data_dir, time.time(), cfg.broker, cfg.store)
        self.server = BrokerServer(self.store, server_config(cfg))
        await self.server.start()
        report = self._start_monitors()
        self.server.extra["host"] = _hostname
        if not self.local_gpus:
            host = cfg.server.listen.rpartition(":")[0] or "127.0.0.1"
            reason = NO_LOCAL_GPUS + (f" on {host}:{self.server.tcp_port()}"
                                      if cfg.server.listen else " (none can join: no --listen)")
            log.info("engine: none — %s", reason)
            self.engine_reason = reason
            self.server.extra["engine"] = lambda: {"kind": "none", "reason": reason}
            return
        if not self.with_fleet:
            return
        kind, self.engine_reason = choose_engine(
            cfg, bool(report and report.available), len(report.gpus) if report else 0,
            (report.reason if report else None) or "NVML unavailable")
        if self.ray is not None:
            await self._start_ray(kind)
            return
        log.info("engine: %s — %s", kind, self.engine_reason)
        self.fleet = await Fleet.build(cfg, kind)
        self.fleet.start(self.server.cfg.socket_path, host=_hostname())
        self.server.extra["engine"] = lambda: {"kind": kind, "reason": self.engine_reason}

    async def _start_ray(self, kind: str) -> None:
        """`up --ray`: Ray places the GPU workers; they join this broker over TCP."""
        from fabricctl.supervisor.ray_fleet import RayFleet, advertised, import_ray, ray_engine

        assert self.server is not None and self.ray is not None
        kind, self.engine_reason = ray_engine(self.cfg, self.ray, (kind, self.engine_reason))
        log.info("engine: %s — %s; GPU workers placed by Ray (%s)", kind, self.engine_reason,
                 self.ray)
        port = self.server.tcp_port()
        assert port is not None
        broker = advertised(self.cfg.server.listen, port,
                            lambda: str(import_ray().util.get_node_ip_address()))
        self.ray_fleet = RayFleet(self.cfg, kind, self.ray)
        await self.ray_fleet.start(broker, self.cfg.server.token)
        self.server.extra["engine"] = lambda: {"kind": kind, "reason": self.engine_reason,
                                               "ray": self.ray}
        self.server.extra["ray"] = self.ray_fleet.describe

    def _start_monitors(self):
        """GPU (NVML) and process (psutil) monitors feed the stats stream; never fatal."""
        assert self.server is not None
        report = None
        try:
            from fabricctl.supervisor.gpus import GpuMonitor, detect_gpus

            report = detect_gpus()
            monitor = GpuMonitor()
            monitor.start()
            self._monitors.append(monitor)
            self.server.extra["gpus"] = monitor.latest
        except ImportError:
            pass
        try:
            from fabricctl.supervisor.procs import ProcMonitor

            procs = ProcMonitor()
            procs.watch("broker", os.getpid())
            self._monitors.append(procs)
            self.server.extra["processes"] = procs.sample
        except ImportError:
            pass
        return report

    async def stop(self) -> None:
        if self.fleet is not None:
            await self.fleet.stop()
        if self.ray_fleet is not None:
            await self.ray_fleet.stop()
        for m in self._monitors:
            stop = getattr(m, "stop", None)
            if stop is not None:
                res = stop()
                if asyncio.iscoroutine(res):
                    await res
        if self.server is not None:
            await self.server.stop()
        if self.store is not None:
            self.store.close()
            self.store = None


class ApiService:
    """Why: the Batch API's server, its broker link and its files store stop together."""

    def __init__(self, server: ApiServer, backend: ClientBackend, files: FileStore) -> None:
        self.server, self.backend, self.files = server, backend, files

    async def stop(self) -> None:
        await self.server.stop()
        await self.backend.close()
        self.files.close()


async def start_api(cfg: AppConfig, daemon: Daemon) -> ApiService:
    """The OpenAI Batch API on `server.api`, a producer on the daemon's own socket."""
    from fabricctl.api.address import api_address
    from fabricctl.api.app import ApiServer
    from fabricctl.api.backend import ClientBackend
    from fabricctl.api.service import BatchApi, process_feeder
    from fabricctl.store.files import FileStore

    assert daemon.server is not None
    host, port = api_address(cfg.server.api, cfg.server.token)
    backend = ClientBackend(daemon.server.cfg.socket_path)
    files = FileStore(cfg.data_dir / "files")
    socket_path = daemon.server.cfg.socket_path
    feeder = process_feeder(socket_path, cfg.producer.tokenizer, cfg.model)
    api = BatchApi(backend, files, token=cfg.server.token, feeder=feeder)
    server = ApiServer(api, host, port)
    try:
        await server.start()
    except BaseException:
        await backend.close()
        files.close()
        await daemon.stop()
        raise
    return ApiService(server, backend, files)


async def serve_forever(cfg: AppConfig, local_gpus: bool = True,
                        ray: str | None = None) -> int:
    from fabricctl.server.heap import settle_heap

    daemon = Daemon(cfg, local_gpus=local_gpus, ray=ray)
    await daemon.start()
    assert daemon.server is not None
    api = await start_api(cfg, daemon) if cfg.server.api else None
    settle_heap()  # what recovery and the imports left is never garbage
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    interrupts = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1 and sig == signal.SIGINT:
            log.warning("second interrupt: stopping now")
            os._exit(ExitCode.INTERRUPTED)
        log.info("%s: stopping pulls, finishing in-flight batches (Ctrl-C again to stop now)",
                 sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    waiter = asyncio.ensure_future(stop.wait())
    requested = asyncio.ensure_future(daemon.server.stop_requested.wait())  # fabricctl down
    await asyncio.wait({waiter, requested}, return_when=asyncio.FIRST_COMPLETED)
    if requested.done():
        log.info("stop requested: stopping pulls, finishing in-flight batches")
    waiter.cancel()
    requested.cancel()
    if api is not None:
        await api.stop()
    await daemon.stop()
    log.info("broker stopped; LMDB closed")
    return ExitCode.INTERRUPTED if interrupts else ExitCode.OK
