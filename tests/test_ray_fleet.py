"""`fabricctl up --ray auto`: GPU workers as Ray actors on a local Ray, over real sockets.

Promises checked: `up --ray auto` with 2 logical GPUs (the sim engine) places two GPU
workers, each a Ray actor whose consumer (`ray-<node>-gpu<N>`) joins the broker over TCP,
and a workload runs to completion (every item exactly one result); a worker's process
SIGKILLed while it holds a batch is restarted by Ray (a new pid, the same consumer name
registered again), the batch it held goes back and every item still ends with exactly one
result; `down` stops the actors and the local Ray. Without ray installed `--ray` says to
install fabricctl[ray]; the listener and address helpers give the workers a TCP address.

One `up --ray auto` (one Ray start) serves the whole module; the tests run in file order,
the last one stops it. Every wait is bounded polling of the broker's status.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cli_helpers import FABRICCTL, clean_env
from server_helpers import all_results, results_by_id

from fabricctl.config import AppConfig, ServerSettings
from fabricctl.core.types import Item
from fabricctl.errors import BackendMissing
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.formats.workload import generate
from fabricctl.supervisor import ray_fleet, ray_placement
from fabricctl.wire.client import Client

pytest.importorskip("ray")

START_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 60.0
CONFIG = """\
engine = "sim"
[sim]
gpus = 2
time_scale = 0.2
[server]
heartbeat_s = 0.25
heartbeat_timeout_s = 2.0
"""


def make_items(n: int, id_prefix: str) -> list[Item]:
    lines = [json.dumps(d).encode() for d in generate(n, 4, seed=7, id_prefix=id_prefix,
                                                      max_tokens=32)]
    items = [p.item for p in parse_lines(lines) if isinstance(p, Parsed)]
    assert len(items) == n
    return items


async def until(predicate: Any, timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll an async predicate until it returns something truthy, within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = await predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        await asyncio.sleep(every)


class RayUp:
    """A `fabricctl up --ray auto` subprocess (by default the sim engine, 2 logical GPUs)."""

    def __init__(self, home: Path, config: str = CONFIG, gpus: int = 2) -> None:
        self.home = home
        self.data_dir = home / "broker"
        self.gpus = gpus
        (home / "fabric.conf.toml").write_text(config)
        self.env = clean_env(home)
        self.log_path = home / "up.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*FABRICCTL, "up", "--data-dir", str(self.data_dir), "--config",
             str(home / "fabric.conf.toml"), "--ray", "auto"],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=home)
        self.started_s = 0.0

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    async def client(self, role: str = "observer") -> Client:
        return await Client.connect(self.data_dir, role, "test", timeout=2.0)  # type: ignore[arg-type]

    async def status(self) -> dict[str, Any]:
        c = await self.client()
        try:
            st: dict[str, Any] = await c.status()
            st["consumer_views"] = msgspec.to_builtins(await c.consumers())
            st["events"] = msgspec.to_builtins(await c.events(0, 10_000))
            return st
        finally:
            await c.close()

    async def wait_ready(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        t0 = time.monotonic()

        async def ready() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"up --ray exited {self.proc.returncode}: {self.logs()}")
            try:
                st = await self.status()
            except Exception:  # not listening yet
                return None
            workers = st["extra"].get("ray") or []
            up = (st["consumers"] == self.gpus and len(workers) == self.gpus
                  and all(w["alive"] and w["connected"] for w in workers))
            return st if up else None

        st = await until(ready, timeout, f"up --ray auto ready ({self.logs()})")
        self.started_s = time.monotonic() - t0
        return st  # type: ignore[no-any-return]

    def stop(self) -> int:
        down = subprocess.run([*FABRICCTL, "down", "--data-dir", str(self.data_dir)],
                              capture_output=True, env=self.env, cwd=self.home, timeout=60)
        assert down.returncode == 0, down.stderr
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def ray_up(tmp_path_factory: pytest.TempPathFactory):
    up = RayUp(tmp_path_factory.mktemp("ray-up"))
    try:
        asyncio.run(up.wait_ready())
        yield up
    finally:
        up.close()


async def submit(up: RayUp, items: list[Item]) -> None:
    producer = await up.client("producer")
    try:
        for k in range(0, len(items), 50):
            ack = await producer.submit(items[k:k + 50])
            assert ack.accepted == len(items[k:k + 50]), ack
    finally:
        await producer.close()


async def results_of(up: RayUp, ids: list[str]) -> dict[str, list[Any]]:
    c = await up.client()
    try:
        by_id = results_by_id(await all_results(c))
    finally:
        await c.close()
    wanted = set(ids)
    return {k: v for k, v in by_id.items() if k in wanted}


async def wait_all_results(up: RayUp, ids: list[str]) -> dict[str, list[Any]]:
    async def complete() -> dict[str, list[Any]] | None:
        got = await results_of(up, ids)
        return got if len(got) == len(ids) else None

    return await until(complete, RUN_TIMEOUT_S, f"results of {len(ids)} items",  # type: ignore[no-any-return]
                       every=0.1)


def joins(st: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in st["events"] if e["kind"] == "consumer_joined" and e["reason"] == name]


def assert_exactly_one_each(by_id: dict[str, list[Any]], ids: list[str]) -> None:
    assert sorted(by_id) == sorted(ids)
    doubled = {k: len(v) for k, v in by_id.items() if len(v) != 1}
    assert doubled == {}
    assert all(recs[0].error is None for recs in by_id.values())


# ---- the module's one Ray ---------------------------------------------------------------


async def test_two_logical_gpus_become_two_ray_workers_that_join_over_tcp(
        ray_up: RayUp) -> None:
    st = await ray_up.status()
    workers = st["extra"]["ray"]
    assert sorted(w["gpu"] for w in workers) == [0, 1]
    names = sorted(c["name"] for c in st["consumer_views"])
    assert names == sorted(w["name"] for w in workers)
    node = workers[0]["node"]
    assert names == [f"ray-{node}-gpu0", f"ray-{node}-gpu1"]
    pids = {w["pid"] for w in workers}
    assert len(pids) == 2 and os.getpid() not in pids and ray_up.proc.pid not in pids
    assert all(w["restarts"] == 0 for w in workers)
    assert st["extra"]["engine"]["kind"] == "sim"
    assert st["extra"]["engine"]["ray"] == "auto"


async def test_a_workload_runs_to_completion_on_the_ray_workers(ray_up: RayUp) -> None:
    items = make_items(100, "w")
    ids = [it.id for it in items]
    await submit(ray_up, items)
    by_id = await wait_all_results(ray_up, ids)
    assert_exactly_one_each(by_id, ids)
    assert {recs[0].gpu for recs in by_id.values()} <= {0, 1}
    st = await ray_up.status()
    assert st["difference"] == [0, 0]
    assert sum(c["items_done"] for c in st["consumer_views"]) >= len(ids)


async def test_a_killed_ray_worker_is_restarted_and_its_batch_finishes(ray_up: RayUp) -> None:
    items = make_items(200, "k")
    ids = [it.id for it in items]
    before = await ray_up.status()
    victim = before["extra"]["ray"][0]
    joined_before = len(joins(before, victim["name"]))
    await submit(ray_up, items)

    async def victim_holds_a_batch() -> bool:
        st = await ray_up.status()
        views = {c["name"]: c for c in st["consumer_views"]}
        done = st["ledger"]["items_completed"] - before["ledger"]["items_completed"]
        return views[victim["name"]]["batches_inflight"] >= 1 and 0 < done < len(ids)

    await until(victim_holds_a_batch, RUN_TIMEOUT_S, "the victim holding a batch mid-run",
                every=0.02)
    os.kill(victim["pid"], signal.SIGKILL)

    by_id = await wait_all_results(ray_up, ids)
    assert_exactly_one_each(by_id, ids)

    async def restarted() -> dict[str, Any] | None:
        st = await ray_up.status()
        w = next(w for w in st["extra"]["ray"] if w["actor"] == victim["actor"])
        back = victim["name"] in {c["name"] for c in st["consumer_views"]}
        ok = w["alive"] and w["connected"] and w["pid"] != victim["pid"] and back
        return st if ok else None

    st = await until(restarted, RUN_TIMEOUT_S, "Ray restarting the killed worker")
    w = next(w for w in st["extra"]["ray"] if w["actor"] == victim["actor"])
    assert w["restarts"] == 1
    assert w["name"] == victim["name"]  # same node, same GPU: the same consumer again
    lost = [e for e in st["events"] if e["kind"] == "consumer_lost"
            and e["reason"].startswith(victim["name"])]
    assert len(lost) == 1 and lost[0].get("value", 0) > 0  # the batch it held went back
    assert len(joins(st, victim["name"])) == joined_before + 1  # registered again
    assert st["difference"] == [0, 0]
    assert all(other["restarts"] == 0 for other in st["extra"]["ray"]
               if other["actor"] != victim["actor"])


async def test_down_stops_the_ray_workers_and_the_local_ray(ray_up: RayUp) -> None:
    import psutil

    st = await ray_up.status()
    pids = [w["pid"] for w in st["extra"]["ray"]]
    assert all(psutil.pid_exists(p) for p in pids)
    ray_children = [p for p in psutil.Process(ray_up.proc.pid).children(recursive=True)
                    if "raylet" in " ".join(p.cmdline()) or "gcs_server" in p.name()]
    assert ray_children, "auto started no local Ray under up"
    assert await asyncio.to_thread(ray_up.stop) == 0
    gone = [p for p in [*pids, *(c.pid for c in ray_children)] if not _gone(p)]
    assert gone == []
    assert "Ray stopped" in ray_up.logs()


def _gone(pid: int, timeout: float = 15.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


# ---- a GPU group: one worker asking Ray for the whole group ------------------------------

GROUP_CONFIG = """\
engine = "sim"
[sim]
time_scale = 0.2
[server]
heartbeat_s = 0.25
heartbeat_timeout_s = 2.0

[[servers]]
model = "fabric-demo"
adapters = { ad-a = "/adapters/a" }
gpus = [[0, 1]]
"""


async def test_a_two_gpu_group_is_one_ray_worker_with_num_gpus_2(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two logical GPUs, one group over both: one actor, given both GPUs by Ray; its consumer
    registers the server's names and a workload runs to completion on it."""
    up = RayUp(tmp_path_factory.mktemp("ray-group"), GROUP_CONFIG, gpus=1)
    try:
        st = await up.wait_ready()
        (worker,) = st["extra"]["ray"]
        assert (worker["num_gpus"], worker["gpus"], worker["gpu"]) == (2, [0, 1], 0)
        assert worker["name"].endswith("-gpu0-1")
        (consumer,) = st["consumer_views"]
        assert consumer["name"] == worker["name"]
        items = make_items(40, "grp")
        await submit(up, items)
        assert_exactly_one_each(await wait_all_results(up, [i.id for i in items]),
                                [i.id for i in items])
        assert await asyncio.to_thread(up.stop) == 0
    finally:
        up.close()


# ---- without a Ray start ----------------------------------------------------------------


def test_without_ray_the_error_says_to_install_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(BackendMissing, match=r"install fabricctl\[ray\]"):
        ray_fleet.import_ray()


def test_up_ray_without_ray_installed_exits_3_with_the_hint(tmp_path: Path) -> None:
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = clean_env(tmp_path)
    env["PYTHONPATH"] = f"{blocker}{os.pathsep}{env['PYTHONPATH']}"
    out = subprocess.run([*FABRICCTL, "up", "--data-dir", str(tmp_path / "d"), "--engine",
                          "sim", "--ray", "auto"], capture_output=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 3, out.stderr
    assert "install fabricctl[ray]" in out.stderr.decode()


def test_the_listener_defaults_to_an_ephemeral_local_port_and_a_fresh_token() -> None:
    cfg = ray_fleet.with_ray_listener(AppConfig())
    assert cfg.server.listen == "127.0.0.1:0"
    assert len(cfg.server.token) >= 24
    assert ray_fleet.with_ray_listener(AppConfig()).server.token != cfg.server.token
    kept = AppConfig(server=ServerSettings(token="s3cret"))
    assert ray_fleet.with_ray_listener(kept).server.token == "s3cret"
    configured = AppConfig(server=ServerSettings(listen="0.0.0.0:7000", token="t"))
    assert ray_fleet.with_ray_listener(configured) is configured


def test_workers_dial_the_node_ip_when_the_broker_listens_everywhere() -> None:
    def node_ip() -> str:
        return "10.1.2.3"

    assert ray_fleet.advertised("127.0.0.1:0", 4242, node_ip) == "127.0.0.1:4242"
    assert ray_fleet.advertised("0.0.0.0:7000", 7000, node_ip) == "10.1.2.3:7000"
    assert ray_fleet.advertised(":7000", 7000, node_ip) == "10.1.2.3:7000"
    assert ray_fleet.advertised("broker.lan:7000", 7000, node_ip) == "broker.lan:7000"


def test_one_gpu_config_narrows_to_its_gpu_port_and_logs() -> None:
    from fabricctl.config import SimSettings, VllmSettings

    cfg = AppConfig(gpus=[0, 1, 2], sim=SimSettings(gpus=3),
                    vllm=VllmSettings(port_base=8001, endpoints=["http://a", "http://b"]))
    sim = ray_placement.one_gpu_config(cfg, "sim", 2, 2, "w2")
    assert (sim.gpus, sim.sim.gpus) == ([2], 1)
    assert sim.data_dir == cfg.data_dir / "ray" / "w2"
    vllm = ray_placement.one_gpu_config(cfg, "vllm", 2, 0, "w")
    assert (vllm.gpus, vllm.vllm.port_base) == ([2], 8003)
    assert ray_placement.one_gpu_config(cfg, "openai", 1, 1, "w").vllm.endpoints == ["http://b"]
