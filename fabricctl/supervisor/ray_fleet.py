"""Ray placement for `fabricctl up --ray ADDRESS|auto`: a GPU worker per GPU group, a Ray actor.

Contract: `RayFleet(cfg, kind, address).start(broker, token)` connects to the Ray cluster at
`address` (`ray.init(address=...)`), or with "auto" starts a local Ray whose logical GPUs
are the configured ones (`ray_placement.local_gpus`), and places one `GpuWorker` actor per
`Placement` (`ray_placement.placements`, `num_cpus=1`), restarted by Ray whenever its
process dies. A local vLLM fleet is checked first (`vllm_fleet.preflight`). Each actor is a
process of its own running an asyncio loop with the `Fleet` of its one group (its config
narrowed to it, `ray_placement.group_config`) and one consumer named `ray-<node>-gpu<gpu>`
(`gpu<a>-<b>` for a group) joining the broker over TCP at `broker` with `token`.
After a restart Ray runs the actor's constructor again, so the worker registers again; the
broker has already returned the dead consumer's batches (its connection closed, or its
heartbeat timed out), and a vLLM server the dead actor launched got SIGTERM (tethered to
the actor's loop thread, `supervisor/tether.py`) and frees its GPU and port. `start`
returns once every actor answered a ping (else `BackendMissing`). `describe()` is one
`WorkerView` per actor, refreshed by a ping a second (a changed pid counts as a restart),
for the `ray` extra of `status`. `stop()` asks every actor to stop its fleet (consumers
finish the batch in hand), kills the actors and disconnects from Ray ("auto": stops it).

`ray` is imported here only, and only once `start` runs: without it `start` raises
`BackendMissing` saying to install `fabricctl[ray]`. `with_ray_listener` gives `up` the TCP
listener the actors join (127.0.0.1 on an ephemeral port and a fresh token when none is
configured); `advertised` is the address the actors dial.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from fabricctl.config import AppConfig
from fabricctl.errors import BackendMissing
from fabricctl.supervisor.fleet import Fleet
from fabricctl.supervisor.ray_placement import Placement, group_config, placements

log = logging.getLogger("fabricctl.ray")

ACTOR_CPUS = 1  # the logical CPUs each GPU worker asks Ray for
MAX_RESTARTS = -1  # Ray restarts a dead GPU worker however often it dies
PING_S = 1.0  # how often `up` asks each worker how it is
PING_TIMEOUT_S = 10.0
PLACE_TIMEOUT_S = 120.0  # every worker placed and answering, or `up` gives up
STOP_TIMEOUT_S = 60.0  # a worker's fleet finishing the batches in its hands ([server] drain_s)


class WorkerInfo(msgspec.Struct):
    """Why: what a GPU worker says of itself when pinged, from inside its process."""

    name: str  # its consumer's name
    node: str  # the Ray node id, shortened
    gpu: int
    pid: int
    connected: bool
    batches: int
    items: int
    error: str = ""
    gpus: list[int] = []  # its group: the GPUs Ray gave it


class WorkerView(msgspec.Struct):
    """Why: `status` shows each Ray worker: where it runs, whether it answers, its restarts."""

    actor: str  # the actor's name in Ray
    name: str = ""
    node: str = ""
    gpu: int | None = None
    pid: int | None = None
    alive: bool = False
    restarts: int = 0  # times its pid changed: Ray started a new process for it
    connected: bool = False
    batches: int = 0
    items: int = 0
    error: str = ""
    gpus: list[int] = []  # its group
    num_gpus: int = 1  # what it asked Ray for


def import_ray() -> Any:
    """The `ray` module, or `BackendMissing` saying how to get it."""
    try:
        import ray
    except ImportError as e:
        raise BackendMissing("up --ray needs Ray, which is not installed: install "
                             "fabricctl[ray] (pip install 'fabricctl[ray]')") from e
    return ray


def with_ray_listener(cfg: AppConfig) -> AppConfig:
    """`cfg` with the TCP listener the workers join: the configured one, else 127.0.0.1 on
    an ephemeral port with the configured token or, when there is none, a fresh one."""
    if cfg.server.listen:
        return cfg
    token = cfg.server.token or secrets.token_urlsafe(24)
    return dataclasses.replace(cfg, server=dataclasses.replace(
        cfg.server, listen="127.0.0.1:0", token=token))


def advertised(listen: str, port: int, node_ip: Callable[[], str]) -> str:
    """The address workers dial: the listener's host (this node's IP when it listens on
    every interface) and its bound port."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = node_ip()
    return f"{host}:{port}"


def ray_engine(cfg: AppConfig, address: str, local: tuple[str, str]) -> tuple[str, str]:
    """(engine kind, reason): `local` (what NVML here decided) unless engine is auto on a
    Ray cluster, whose GPUs are real ones: then vLLM."""
    if cfg.engine != "auto" or address == "auto":
        return local
    return "vllm", f"engine auto on the Ray cluster at {address}: vLLM on its GPUs"


class GpuWorker:
    """Why: Ray restarts processes, not consumers; one process is one GPU's whole worker."""

    def __init__(self, cfg: AppConfig, kind: str, index: int, broker: str, token: str,
                 placement: Placement | None = None) -> None:
        import ray

        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        ids = ray.get_gpu_ids()
        self.gpus = sorted(int(i) for i in ids) or [index]  # Ray gives them in any order
        self.gpu = self.gpus[0]
        self.node = str(ray.get_runtime_context().get_node_id())[:8]
        self.name = f"ray-{self.node}-gpu{'-'.join(map(str, self.gpus))}"
        self.error = ""
        self._cfg = group_config(cfg, kind, self.gpus, index, self.name,
                                 placement.server if placement is not None else None)
        self._kind, self._broker, self._token = kind, broker, token
        self._fleet: Fleet | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(30.0)  # the loop exists before `stop` can be asked of it

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:
            self.error = f"{type(e).__name__}: {e}"
            if not self._stopping:  # let Ray start this worker again
                log.exception("GPU worker %s failed; exiting so Ray restarts it", self.name)
                logging.shutdown()
                os._exit(1)
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        fleet = await Fleet.build(self._cfg, self._kind)
        fleet.gpus = [self.gpu] * len(fleet.engines)  # Ray's GPU, not the sim's own count
        self._fleet = fleet
        fleet.start(self._broker, self._token, names=[self.name])
        log.info("GPU worker %s (pid %d, %s engine) joining %s", self.name, os.getpid(),
                 self._kind, self._broker)
        try:
            await self._stop.wait()
        finally:
            await fleet.stop(self._cfg.server.drain_s)

    def ping(self) -> WorkerInfo:
        fleet = self._fleet
        c = fleet.consumers[0] if fleet is not None and fleet.consumers else None
        return WorkerInfo(self.name, self.node, self.gpu, os.getpid(),
                          connected=c is not None and c.connected.is_set(),
                          batches=c.batches if c else 0, items=c.items if c else 0,
                          error=self.error, gpus=list(self.gpus))

    def getpid(self) -> int:
        return os.getpid()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop pulling, finish the batches in hand, stop the engine; True when done."""
        self._stopping = True
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)
        return not self._thread.is_alive()


class RayFleet:
    """Why: on a Ray cluster Ray places and restarts the GPU workers; `up` asks and watches."""

    def __init__(self, cfg: AppConfig, kind: str, address: str) -> None:
        self.cfg = cfg
        self.kind = kind
        self.address = address
        self.local = address == "auto"
        self.actors: list[Any] = []
        self.views: list[WorkerView] = []
        self._ray: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, broker: str, token: str) -> None:
        ray = self._ray = import_ray()
        try:
            placed = await asyncio.to_thread(self._init)
            remote = ray.remote(num_gpus=1, num_cpus=ACTOR_CPUS, max_restarts=MAX_RESTARTS,
                                max_concurrency=4)(GpuWorker)
            for i, p in enumerate(placed):
                actor = f"fabricctl-gpu-worker-{i}"
                self.actors.append(remote.options(name=actor, num_gpus=p.num_gpus).remote(
                    self.cfg, self.kind, i, broker, token, p))
                self.views.append(WorkerView(actor, num_gpus=p.num_gpus))
            await self._place()
        except BaseException:
            await self.stop(timeout=5.0)
            raise
        log.info("Ray placed %d GPU worker(s): %s", len(self.views),
                 ", ".join(v.name for v in self.views))
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    def _init(self) -> list[Placement]:
        """Connect to (or start) Ray; the GPU workers to place."""
        ray = self._ray
        opts: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        if not self.local:
            try:
                ray.init(address=self.address, **opts)
            except (ConnectionError, RuntimeError, ValueError) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise BackendMissing(f"no Ray cluster at {self.address}: {first}") from e
            if self.kind == "openai":
                return placements(self.cfg, self.kind)
            count = int(ray.cluster_resources().get("GPU", 0))
            if count == 0:
                ray.shutdown()
                raise BackendMissing(f"the Ray cluster at {self.address} has no GPUs")
            return placements(self.cfg, self.kind, cluster_gpus=count)
        placed = placements(self.cfg, self.kind)
        if self.kind == "vllm" and self.cfg.servers:
            from fabricctl.supervisor.vllm_fleet import preflight, present_gpus

            preflight(self.cfg.servers, present_gpus()[0])
        gpus = sorted({g for p in placed for g in p.group})
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))  # Ray's GPU ids
        try:
            ray.init(num_cpus=ACTOR_CPUS * len(gpus), num_gpus=len(gpus),
                     include_dashboard=False, **opts)
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
        return placed

    async def _place(self) -> None:
        """Every actor placed and answering its first ping, within PLACE_TIMEOUT_S."""
        try:
            infos = await asyncio.wait_for(
                asyncio.gather(*(a.ping.remote() for a in self.actors)), PLACE_TIMEOUT_S)
        except TimeoutError:
            raise BackendMissing(
                f"Ray did not place {len(self.actors)} GPU worker(s) within "
                f"{PLACE_TIMEOUT_S:.0f} s (cluster: {self._ray.cluster_resources()})") from None
        for view, info in zip(self.views, infos, strict=True):
            self._seen(view, info)

    def _seen(self, view: WorkerView, info: WorkerInfo) -> None:
        if view.pid is not None and info.pid != view.pid:
            view.restarts += 1
            log.warning("Ray restarted GPU worker %s as %s (pid %d -> %d)", view.actor,
                        info.name, view.pid, info.pid)
        if info.error and info.error != view.error:
            log.error("GPU worker %s: %s", info.name, info.error)
        view.name, view.node, view.gpu, view.pid = info.name, info.node, info.gpu, info.pid
        view.gpus = list(info.gpus)
        view.alive, view.connected, view.error = True, info.connected, info.error
        view.batches, view.items = info.batches, info.items

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(PING_S)
            await asyncio.gather(*(self._ping(a, v)
                                   for a, v in zip(self.actors, self.views, strict=True)))

    async def _ping(self, actor: Any, view: WorkerView) -> None:
        try:
            info = await asyncio.wait_for(actor.ping.remote(), PING_TIMEOUT_S)
        except Exception as e:  # dead or being restarted by Ray, or too slow to answer
            if view.alive:
                log.warning("GPU worker %s (%s) does not answer: %s", view.actor, view.name,
                            str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            view.alive = view.connected = False
            return
        self._seen(view, info)

    def describe(self) -> list[WorkerView]:
        return list(self.views)

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every worker's fleet, kill the actors, disconnect from (or stop) Ray."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        ray = self._ray
        if ray is None or not ray.is_initialized():
            return
        if self.actors:
            try:
                await asyncio.wait_for(asyncio.gather(
                    *(a.stop.remote(timeout) for a in self.actors), return_exceptions=True),
                    timeout + 5.0)
            except TimeoutError:
                log.warning("GPU workers did not stop within %.0f s; killing them", timeout)
            for a in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            self.actors.clear()
        for view in self.views:
            view.alive = view.connected = False
        await asyncio.to_thread(ray.shutdown)
        log.info("Ray %s", "stopped" if self.local else f"at {self.address} disconnected")
