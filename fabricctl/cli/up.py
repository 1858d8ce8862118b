"""`fabricctl up`: the broker, its engines and consumers, and the monitors, in one process.

Contract: the `up` command (`command`) loads the configuration (its flags over the files)
and runs `serve_forever` on fabricctl's event loop; its exit status is 0, or 130 after an
interrupt. `Daemon.start()` opens (and recovers) the durable store in the data dir, starts the
socket server, decides the engine (vLLM when NVML shows GPUs, else simulated GPUs, and says
why on the log), starts one consumer per GPU and the GPU/process monitors, whose samples go
into the stats stream; with `--ray ADDRESS|auto` Ray places one GPU worker per GPU instead
(`supervisor/ray_fleet.py`), each joining over the TCP listener (127.0.0.1 on an ephemeral
port with a fresh token when none is configured). `Daemon.stop()` stops pulls, lets
in-flight batches finish, stops the server (and the Ray workers, and a local Ray) and closes
LMDB. `serve_forever` wires SIGINT/SIGTERM to a graceful stop; a second
SIGINT exits at once (LMDB's durable commits mean nothing acknowledged is lost either way).
The server, the store and the supervisor are imported when the broker starts, not when the
CLI builds its commands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fabricctl.cli.support import ConfigFile, DataDir, Verbose, load, run_async, setup_logging
from fabricctl.config import AppConfig
from fabricctl.errors import ExitCode

if TYPE_CHECKING:
    from fabricctl.server.app import BrokerServer
    from fabricctl.server.config import ServerConfig
    from fabricctl.store.durable import DurableBroker, StoreConfig
    from fabricctl.supervisor.fleet import Fleet
    from fabricctl.supervisor.ray_fleet import RayFleet

log = logging.getLogger("fabricctl")


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
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS|auto",
                                   help="Place one GPU worker per GPU as a Ray actor: on the "
                                   "Ray cluster at ADDRESS, or (auto) on a local Ray whose "
                                   "GPUs are the configured ones. Needs fabricctl[ray]."),
    verbose: bool = Verbose,
) -> None:
    """Run the broker with one engine and consumer per GPU (simulated GPUs when none)."""
    from fabricctl.server import eventloop

    setup_logging(verbose)
    flags: dict[str, object] = {"data_dir": data_dir, "engine": engine, "model": model}
    if gpus:
        flags["gpus"] = [int(g) for g in gpus.split(",") if g.strip()]
    cfg = with_sections(load(config, **flags), listen=listen, metrics_port=metrics_port)
    raise typer.Exit(int(run_async(serve_forever(cfg, ray=ray), eventloop.run)))


def with_sections(cfg: AppConfig, listen: str | None = None,
                  metrics_port: int | None = None) -> AppConfig:
    """`cfg` with `--listen` and `--metrics-port` put into their sections."""
    if listen is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, listen=listen))
    if metrics_port is not None:
        cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(
            cfg.metrics, prometheus_port=metrics_port))
    return cfg


def server_config(cfg: AppConfig) -> ServerConfig:
    from fabricctl.server.config import ServerConfig

    return ServerConfig(
        cfg.data_dir, listen=cfg.server.listen or None, token=cfg.server.token,
        heartbeat_s=cfg.server.heartbeat_s, heartbeat_timeout_s=cfg.server.heartbeat_timeout_s,
        metrics_port=cfg.metrics.prometheus_port or None, tick_s=cfg.broker.tick_s,
    )


class Daemon:
    """Why: `up` and `run` assemble the same pieces; this is the assembly."""

    def __init__(self, cfg: AppConfig, with_fleet: bool = True,
                 store: StoreConfig | None = None, ray: str | None = None) -> None:
        self.ray = ray  # `up --ray`: the GPU workers are Ray actors (supervisor/ray_fleet.py)
        if ray is not None:
            from fabricctl.supervisor.ray_fleet import import_ray, with_ray_listener

            import_ray()  # without it, say so before the store is opened
            cfg = with_ray_listener(cfg)
        self.cfg = cfg
        self.with_fleet = with_fleet
        self.store_cfg = store  # None: the store's defaults
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
        self.store = DurableBroker(cfg.data_dir, time.time(), cfg.broker, self.store_cfg)
        self.server = BrokerServer(self.store, server_config(cfg))
        await self.server.start()
        report = self._start_monitors()
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
        self.fleet.start(self.server.cfg.socket_path)
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


async def serve_forever(cfg: AppConfig, ray: str | None = None) -> int:
    from fabricctl.server.heap import settle_heap

    daemon = Daemon(cfg, ray=ray)
    await daemon.start()
    assert daemon.server is not None
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
    stopped = asyncio.ensure_future(daemon.server.stopped.wait())
    await asyncio.wait({waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    stopped.cancel()
    await daemon.stop()
    log.info("broker stopped; LMDB closed")
    return ExitCode.INTERRUPTED if interrupts else ExitCode.OK
