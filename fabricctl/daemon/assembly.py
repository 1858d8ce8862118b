"""The daemon's assembly: the durable store, the broker server, the fleet and the monitors.

Contract: `Daemon(cfg)` is the one composition root `fabricctl up`, `fabricctl run` and the
tests start a broker with. `start()` opens (and recovers) the durable store in the data dir
(with the `[store]` settings), starts the socket server (`server_config(cfg)`: its settings
from the configuration), decides the engine (vLLM when NVML shows GPUs, else simulated
GPUs, and says why on the log), starts one consumer per GPU and the GPU/process monitors,
whose samples go into the stats stream; with `local_gpus=False` (`up --gpus none`) it starts
no engine and no consumer, and says "no local GPUs: waiting for agents" (the snapshot's
`engine` extra, kind "none"): the GPUs are those of the agents that join over `--listen`.
With `ray` (`up --ray ADDRESS|auto`) Ray places one GPU worker per GPU instead
(`supervisor/ray_fleet.py`), each joining over the TCP listener (127.0.0.1 on an ephemeral
port with a fresh token when none is configured). The broker's host name is the `host`
extra, so views can tell its GPUs from the agents'. `stop()` stops pulls, lets in-flight
batches finish, stops the server (and the Ray workers, and a local Ray) and closes LMDB.
The server, the store and the supervisor are imported when the daemon starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from fabricctl.config import AppConfig

if TYPE_CHECKING:
    from fabricctl.server.app import BrokerServer
    from fabricctl.server.config import ServerConfig
    from fabricctl.store.durable import DurableBroker
    from fabricctl.supervisor.fleet import Fleet
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
        self.server.state.extra["host"] = _hostname
        if not self.local_gpus:
            host = cfg.server.listen.rpartition(":")[0] or "127.0.0.1"
            reason = NO_LOCAL_GPUS + (f" on {host}:{self.server.tcp_port()}"
                                      if cfg.server.listen else " (none can join: no --listen)")
            log.info("engine: none — %s", reason)
            self.engine_reason = reason
            self.server.state.extra["engine"] = lambda: {"kind": "none", "reason": reason}
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
        self.fleet.start(self.server.state.cfg.socket_path, host=_hostname())
        self.server.state.extra["engine"] = lambda: {"kind": kind, "reason": self.engine_reason}

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
        self.server.state.extra["engine"] = lambda: {"kind": kind, "reason": self.engine_reason,
                                               "ray": self.ray}
        self.server.state.extra["ray"] = self.ray_fleet.describe

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
            self.server.state.extra["gpus"] = monitor.latest
        except ImportError:
            pass
        try:
            from fabricctl.supervisor.procs import ProcMonitor

            procs = ProcMonitor()
            procs.watch("broker", os.getpid())
            self._monitors.append(procs)
            self.server.state.extra["processes"] = procs.sample
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
