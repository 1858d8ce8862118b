"""The daemon's assembly: the durable store, the broker server, the fleet and the monitors.

Contract: `await Daemon.start(cfg)` is the one composition root `fabricctl up`, `fabricctl run`
and the tests start a broker with; it builds every part in one phase and returns a daemon
whose parts are all there (`store`, `server`, `fleet`): a failure part-way stops what it had
started and raises. It opens (and recovers) the durable store in the data dir (with the
`[store]` settings), starts the socket server (`server_config(cfg)`: its settings from the
configuration), decides the engine (vLLM when NVML shows GPUs, else simulated GPUs, and says
why on the log), starts one consumer per GPU and the GPU/process monitors, whose samples go
into the stats stream (the server's typed `Extras`); the `engine` extra (kind and reason) is
set before the fleet starts, and with vLLM the `servers` extra (`Launcher.views`: each
launched server's state, exit, failure and log) as soon as its launcher exists, so `status`
and `top` show servers that are starting, restarting or that gave up. `fleet` is the local
engines' `Fleet`, empty (kind "none", no engine) where none runs here: with
`local_gpus=False` (`up --gpus none`) it says "no local GPUs: waiting for agents" (the
snapshot's `engine` extra, kind "none"): the GPUs are those of the agents that join over
`--listen`; with `ray` (`up --ray ADDRESS|auto`) Ray places one GPU worker per GPU instead
(`supervisor/ray_fleet.py`), each joining over the TCP listener (127.0.0.1 on an ephemeral
port with a fresh token when none is configured); with `with_fleet=False` no engine starts.
The broker's host name is the `host` extra, so views can tell its GPUs from the agents'.
`stop()` stops pulls, lets every consumer's in-flight batches finish (remote agents' too) for
up to `[server] drain_s` (`server.drain`), stops the server (and the Ray workers, and a local
Ray) and closes LMDB. The server, the store and the supervisor are imported when
the daemon starts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from fabricctl.config import AppConfig

if TYPE_CHECKING:
    from fabricctl.server.app import BrokerServer
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.state import Extras
    from fabricctl.store.durable import DurableBroker
    from fabricctl.supervisor.fleet import Fleet
    from fabricctl.supervisor.gpus import GpuReport
    from fabricctl.supervisor.launcher import Launcher
    from fabricctl.supervisor.ray_fleet import RayFleet

log = logging.getLogger("fabricctl")
NO_LOCAL_GPUS = "no local GPUs: waiting for agents"


def _hostname() -> str:
    return socket.gethostname()


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

    def __init__(self, cfg: AppConfig, store: DurableBroker, server: BrokerServer,
                 fleet: Fleet, engine_reason: str, monitors: list[object],
                 ray_fleet: RayFleet | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.server = server
        self.fleet = fleet  # the local engines (none: kind "none")
        self.engine_reason = engine_reason
        self._monitors = monitors
        self._ray_fleet = ray_fleet  # `up --ray`: the GPU workers are Ray actors
        self._stopped = False

    @classmethod
    async def start(cls, cfg: AppConfig, with_fleet: bool = True, local_gpus: bool = True,
                    ray: str | None = None) -> Daemon:
        """Every part built and started; `local_gpus=False`: `--gpus none`, the agents bring
        the GPUs; `ray`: `up --ray`'s address."""
        from fabricctl.server.app import BrokerServer
        from fabricctl.store.durable import DurableBroker
        from fabricctl.supervisor.fleet import Fleet

        if ray is not None:
            from fabricctl.supervisor.ray_fleet import import_ray, with_ray_listener

            import_ray()  # without it, say so before the store is opened
            cfg = with_ray_listener(cfg)
        store = DurableBroker(cfg.data_dir, time.time(), cfg.broker, cfg.store)
        try:
            server = BrokerServer(store, server_config(cfg))
        except BaseException:
            store.close()
            raise
        parts = cls(cfg, store, server, Fleet(cfg, "none", [], []), "", [])
        try:
            await parts.server.start()
            await parts._engines(with_fleet, local_gpus, ray)
        except BaseException:
            await parts.stop()
            raise
        return parts

    async def _engines(self, with_fleet: bool, local_gpus: bool, ray: str | None) -> None:
        """The monitors, the `host` and `engine` extras, and the engines (local or Ray)."""
        from fabricctl.server.state import EngineNote
        from fabricctl.supervisor.fleet import Fleet, choose_engine

        cfg, extra = self.cfg, self.server.state.extra
        report = self._start_monitors(extra)
        extra.host = _hostname
        if not local_gpus:
            host = cfg.server.listen.rpartition(":")[0] or "127.0.0.1"
            reason = NO_LOCAL_GPUS + (f" on {host}:{self.server.tcp_port()}"
                                      if cfg.server.listen else " (none can join: no --listen)")
            log.info("engine: none — %s", reason)
            self.engine_reason = reason
            extra.engine = functools.partial(EngineNote, "none", reason)
            return
        if not with_fleet:
            return
        kind, self.engine_reason = choose_engine(
            cfg, bool(report and report.available), len(report.gpus) if report else 0,
            (report.reason if report else None) or "NVML unavailable")
        if ray is not None:
            await self._start_ray(kind, ray, extra)
            return
        log.info("engine: %s — %s", kind, self.engine_reason)
        extra.engine = functools.partial(EngineNote, kind, self.engine_reason)

        def on_launch(launcher: Launcher) -> None:
            extra.servers = launcher.views

        self.fleet = await Fleet.build(cfg, kind, on_launch=on_launch)
        self.fleet.start(self.server.state.cfg.socket_path, host=_hostname())

    async def _start_ray(self, kind: str, ray: str, extra: Extras) -> None:
        """`up --ray`: Ray places the GPU workers; they join this broker over TCP."""
        from fabricctl.server.state import EngineNote
        from fabricctl.supervisor.ray_fleet import RayFleet, advertised, import_ray, ray_engine

        kind, self.engine_reason = ray_engine(self.cfg, ray, (kind, self.engine_reason))
        log.info("engine: %s — %s; GPU workers placed by Ray (%s)", kind, self.engine_reason,
                 ray)
        port = self.server.tcp_port()
        assert port is not None  # with_ray_listener gave it one
        broker = advertised(self.cfg.server.listen, port,
                            lambda: str(import_ray().util.get_node_ip_address()))
        self._ray_fleet = RayFleet(self.cfg, kind, ray)
        await self._ray_fleet.start(broker, self.cfg.server.token)
        extra.engine = functools.partial(EngineNote, kind, self.engine_reason, ray)
        extra.ray = self._ray_fleet.describe

    def _start_monitors(self, extra: Extras) -> GpuReport | None:
        """GPU (NVML) and process (psutil) monitors feed the stats stream; never fatal."""
        report = None
        try:
            from fabricctl.supervisor.gpus import GpuMonitor, detect_gpus

            report = detect_gpus()
            monitor = GpuMonitor()
            monitor.start()
            self._monitors.append(monitor)
            extra.gpus = monitor.latest
        except ImportError:
            pass
        try:
            from fabricctl.supervisor.procs import ProcMonitor

            procs = ProcMonitor()
            procs.watch("broker", os.getpid())
            self._monitors.append(procs)
            extra.processes = procs.sample
        except ImportError:
            pass
        return report

    async def stop(self) -> None:
        """Stop the engines (every consumer, local or remote, finishing its work for up to
        `[server] drain_s`), the monitors and the server, then close LMDB (once)."""
        if self._stopped:
            return
        self._stopped = True
        from fabricctl.server.drain import drain

        drain_s = self.cfg.server.drain_s
        drained = asyncio.ensure_future(drain(self.server.state, self.server.drop, drain_s))
        await self.fleet.stop(drain_s)
        if self._ray_fleet is not None:
            await self._ray_fleet.stop(drain_s)
        await drained
        for m in self._monitors:
            stop = getattr(m, "stop", None)
            if stop is not None:
                res = stop()
                if asyncio.iscoroutine(res):
                    await res
        await self.server.stop()
        self.store.close()
