"""A broker under test as a child process, and the kill -9 campaign that drives it.

`BrokerProc` starts `fabricctl up --engine sim --data-dir D --config C` (or the light child,
tests/reliability/rel_child.py: the same Daemon with a small LMDB map), pumps its stderr into
a log file and says it is ready when the line "broker listening on" appears; it may die
before that (a fault point during recovery). `Campaign` runs broker lives back to back on
one data dir: in each life the child runs with one fault point armed (FABRICCTL_FAULTS, a
new seed per life) or none, and is SIGKILLed by the harness after a random delay if no fault
got it first. Clients in the test process keep working across lives: a producer submits
chunks with retries (an unacknowledged chunk is sent again in the next life, where its
stored ids come back as duplicates: stored once, acknowledged now) and recording consumers
pull, run a SimEngine and complete. Everything they see goes into a `History`. After every
restart the ledger must read a difference of 0, through a Client ("ledger" and "status").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rel_history import MODEL, TOTALS, History, make_item

from fabricctl.core.types import Contract, Item
from fabricctl.engines.sim import SimEngine
from fabricctl.errors import BackendMissing, BrokerError
from fabricctl.formats.results import ResultRecord
from fabricctl.wire.client import Client

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHILD = HERE / "rel_child.py"
READY = "broker listening on"
CLIENT_ERRORS = (BackendMissing, BrokerError, ConnectionError, OSError, asyncio.IncompleteReadError)

CONFIG = """\
model = "m"
[sim]
gpus = 1
time_scale = 0.0002
[consumer]
max_batch_size = 24
max_batch_tokens = 6144
max_input_len = 4096
[server]
heartbeat_s = 0.5
heartbeat_timeout_s = 5.0
"""


def fabricctl_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "fabricctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fabricctl"]


def child_env(tmp: Path, faults: str | None = None, seed: int = 0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICCTL_")}
    env.update(COLUMNS="400", XDG_CONFIG_HOME=str(tmp / "xdg"), PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO))
    if faults:
        env["FABRICCTL_FAULTS"] = faults
        env["FABRICCTL_FAULT_SEED"] = str(seed)
    return env


def write_config(tmp: Path, text: str = CONFIG) -> Path:
    path = tmp / "fabric-test.toml"
    path.write_text(text)
    return path


class BrokerProc:
    """Why: the broker must die for real (SIGKILL), so it runs in a process of its own.

    Also runs `fabricctl consume` (`ChildProc.consume`): any child whose stderr lines a
    test waits on (`wait_line`)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
                 ready: str = READY) -> None:
        self.argv, self.env, self.cwd, self.log_path = argv, env, cwd, log
        self.ready_marker = ready
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.new_line = asyncio.Condition()
        self.lines: list[str] = []
        self.eof = False
        self.killed_by_us = False
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    def up(cls, data: Path, config: Path, tmp: Path, log: Path, faults: str | None = None,
           seed: int = 0) -> BrokerProc:
        argv = [*fabricctl_cmd(), "up", "--engine", "sim", "--data-dir", str(data),
                "--config", str(config)]
        return cls(argv, child_env(tmp, faults, seed), tmp, log)

    @classmethod
    def light(cls, data: Path, config: Path, tmp: Path, log: Path, faults: str | None = None,
              seed: int = 0, map_size: int = 64 << 10, segment_entries: int = 48) -> BrokerProc:
        argv = [sys.executable, str(CHILD), str(data), str(config), str(map_size),
                str(segment_entries)]
        return cls(argv, child_env(tmp, faults, seed), tmp, log)

    @classmethod
    def consume(cls, data: Path, config: Path, tmp: Path, name: str, gpu: int) -> BrokerProc:
        argv = [*fabricctl_cmd(), "consume", "--broker", str(data), "--engine", "sim",
                "--name", name, "--gpu", str(gpu), "--config", str(config)]
        return cls(argv, child_env(tmp), tmp, tmp / f"consume-{name}.log")

    async def wait_line(self, pattern: str, timeout: float = 20.0, start: int = 0) -> str:
        """The first line (from index `start`) that contains `pattern`; waits for it."""
        def found() -> str | None:
            return next((ln for ln in self.lines[start:] if pattern in ln), None)

        async with self.new_line:
            await asyncio.wait_for(self.new_line.wait_for(
                lambda: found() is not None or self.eof), timeout)
        line = found()
        assert line is not None, f"{pattern!r} never came:\n{self.tail()}"
        return line

    async def spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        self._pump = asyncio.get_running_loop().create_task(self._read())

    async def start(self, timeout: float = 30.0) -> bool:
        """Start it; True once it listens, False if it died first (killed by a fault)."""
        await self.spawn()
        assert self.proc is not None
        waiter = asyncio.ensure_future(self.ready.wait())
        died = asyncio.ensure_future(self.proc.wait())
        done, _ = await asyncio.wait({waiter, died}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not done:
            self.kill()
            await self.proc.wait()
            raise TimeoutError(f"broker not ready in {timeout} s:\n{self.tail()}")
        if waiter in done or self.ready.is_set():
            died.cancel()
            return True
        return False

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.log_path, "a") as log:
            while True:
                raw = await self.proc.stderr.readline()
                if not raw:
                    self.eof = True
                    async with self.new_line:
                        self.new_line.notify_all()
                    return
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                log.write(line + "\n")
                if self.ready_marker in line:
                    self.ready.set()
                async with self.new_line:
                    self.new_line.notify_all()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
                self.killed_by_us = True

    async def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None if it still runs after `timeout` seconds."""
        assert self.proc is not None
        try:
            rc = await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout)
        except TimeoutError:
            return None
        if self._pump is not None:
            await self._pump
        return rc

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])


@dataclass
class Life:
    """One broker life of a campaign: which child, which fault point, when the harness kills."""

    kind: str  # "up" (fabricctl up) or "light" (rel_child.py, small map)
    point: str | None  # the armed fault point, or None: plain SIGKILL after `delay`
    prob: float = 0.0
    delay: float = 0.3  # plain: SIGKILL this long after ready; armed: the longest wait


PROBS = {
    "ingest_before_commit": 0.3, "ingest_after_commit": 0.3, "dispatch_step1": 0.15,
    "dispatch_step2": 0.15, "dispatch_step3": 0.15, "complete_results": 0.2,
    "complete_after_commit": 0.2, "segment_delete": 0.4, "map_grow": 1.0,
}


@dataclass
class Campaign:
    """Why: kill the broker many times on one data dir while clients keep working."""

    tmp: Path
    rng: random.Random
    chunk: int = 20
    chunks_per_life: int = 6
    backlog: int = 80
    consumers: int = 1
    hist: History = field(default_factory=History)
    gen: int = 0
    kills: int = 0
    faults: int = 0
    starts: int = 0
    ledger_checks: int = 0
    points: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    items_made: int = 0
    max_items: int = 10**9

    def __post_init__(self) -> None:
        self.data = self.tmp / "data"
        self.config = write_config(self.tmp)
        self.changed = asyncio.Condition()
        self.retry: list[Item] | None = None
        self.quota = 0  # chunks the producer may still send in this life
        self.proc: BrokerProc | None = None
        self.seed_base = self.rng.randrange(1 << 30)

    # -- broker lives ----------

    def _proc(self, life: Life, n: int) -> BrokerProc:
        faults = f"{life.point}:{life.prob}" if life.point else None
        log = self.tmp / f"life{n:03d}-{life.kind}-{life.point or 'plain'}.log"
        seed = self.seed_base + n
        if life.kind == "up":
            return BrokerProc.up(self.data, self.config, self.tmp, log, faults, seed)
        return BrokerProc.light(self.data, self.config, self.tmp, log, faults, seed)

    async def _bump(self) -> None:
        async with self.changed:
            self.gen += 1
            self.quota = self.chunks_per_life
            self.changed.notify_all()

    async def _next_life(self, after: int) -> int | None:
        """Wait for a live broker newer than generation `after` (None once finished)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.finished or self.gen > after)
            return None if self.finished else self.gen

    async def run_life(self, life: Life, n: int) -> None:
        bp = self.proc = self._proc(life, n)
        ready = await bp.start()
        if ready:
            self.starts += 1
            await self._bump()
            with contextlib.suppress(*CLIENT_ERRORS, TimeoutError):
                await asyncio.wait_for(self._check_ledger(), 5.0)
            rc = await bp.wait(life.delay)
            if rc is None:
                bp.kill()
                rc = await bp.wait()
        else:
            rc = await bp.wait()
        assert rc == -signal.SIGKILL, f"life {n} ({life}) exited {rc}:\n{bp.tail()}"
        assert not any("LEDGER DIFFERENCE" in ln for ln in bp.lines), bp.tail()
        assert not any("Traceback" in ln for ln in bp.lines), bp.tail()
        self.kills += 1
        TOTALS.kills += 1
        if not bp.killed_by_us:
            assert life.point is not None, f"life {n} died on its own:\n{bp.tail()}"
            self.faults += 1
            TOTALS.faults += 1
            self.points[life.point] = self.points.get(life.point, 0) + 1
            TOTALS.points[life.point] += 1
        self.hist.crash(f"life {n}: {life.point or 'plain'}")
        async with self.changed:  # the clients of this life see the end of their socket
            self.changed.notify_all()

    async def _check_ledger(self) -> None:
        """After a restart: the recovery report and the live ledger both balance."""
        c = await Client.connect(self.data, "observer", "reliability-ledger", timeout=5.0)
        try:
            led = await c.ledger()
            assert led["difference"] == [0, 0], led
            status = await c.status()
            rec = status["extra"]["store"]["recovery"]
            assert rec["ledger_ok"] is True and rec["ledger_difference"] == [0, 0], rec
            self.ledger_checks += 1
        finally:
            await c.close()

    # -- clients ----------

    def _new_chunk(self) -> list[Item] | None:
        if self.items_made >= self.max_items:
            return None
        n0 = self.items_made
        self.items_made = min(n0 + self.chunk, self.max_items)
        return [make_item(n) for n in range(n0, self.items_made)]

    async def producer(self) -> None:
        """Submit chunks with retries: up to `quota` new chunks per life, each sent only while
        the broker holds fewer than `backlog` unfinished items (bounded polling of "ledger"),
        so every life has ingest, dispatch and completion going on."""
        last = 0
        while (g := await self._next_life(last)) is not None:
            last = g
            try:
                c = await Client.connect(self.data, "producer", "reliability-producer")
            except CLIENT_ERRORS:
                continue
            try:
                while self.quota > 0 or self.retry is not None:
                    chunk = self.retry
                    if chunk is None:
                        await self._below_backlog(c)
                        chunk = self._new_chunk()
                        if chunk is None:
                            break
                        self.quota -= 1
                    self.retry = chunk
                    ids = [it.id for it in chunk]
                    self.hist.invoke(ids)
                    try:
                        ack = await c.submit(chunk)
                    except CLIENT_ERRORS:
                        self.hist.info(ids)
                        break
                    self.retry = None
                    refused = {}
                    for r in ack.rejects:
                        if not r.reason.startswith("duplicate id"):
                            refused[r.index] = r.reason
                    for i, reason in refused.items():
                        self.hist.refused(ids[i], reason)
                    self.hist.ok(x for i, x in enumerate(ids) if i not in refused)
            except CLIENT_ERRORS:
                pass
            finally:
                await c.close()

    async def _below_backlog(self, c: Client) -> None:
        while True:
            lg = (await c.ledger())["ledger"]
            if lg["items_queued"] + lg["items_inflight"] < self.backlog:
                return
            await asyncio.sleep(0.02)

    async def consumer(self, name: str) -> None:
        engine = SimEngine(name=name, max_batch_size=16, max_batch_tokens=4096,
                           max_input_len=4096, time_scale=0.0002)
        contract = Contract(MODEL, 16, 4096, 4096)
        last = 0
        while (g := await self._next_life(last)) is not None:
            last = g
            try:
                c = await Client.connect(self.data, "consumer", name)
            except CLIENT_ERRORS:
                continue
            try:
                await c.register(name, contract)
                while not self.finished:
                    work = await c.pull(0.3)
                    if work is None:
                        continue
                    self.hist.dispatch(name, work.id, [it.id for it in work.items])
                    results = await engine.run(work)
                    try:
                        stored = await c.complete(work.id, results)
                    except CLIENT_ERRORS:
                        self.hist.complete(name, work.id, None)
                        raise
                    self.hist.complete(name, work.id, stored)
            except CLIENT_ERRORS:
                pass
            finally:
                await c.close()

    # -- the end ----------

    async def drain(self, kind: str = "up", timeout: float = 90.0) -> list[tuple[int, Any]]:
        """A last life without faults: every chunk acknowledged, everything completed.

        Returns the whole result sequence, read through a Client, and stops the broker
        with Shutdown (a clean exit)."""
        bp = self.proc = self._proc(Life(kind, None), 999)
        assert await bp.start(), bp.tail()
        self.max_items = self.items_made  # no new items: the unacknowledged chunk only
        await self._bump()
        await self._check_ledger()
        c = await Client.connect(self.data, "observer", "reliability-drain")
        deadline = time.monotonic() + timeout
        try:
            while True:  # bounded polling of the ledger: there is no "all done" push
                led = await c.ledger()
                lg, persisted = led["ledger"], led["persisted"]
                if (self.items_made >= self.max_items and self.retry is None
                        and lg["items_queued"] == 0 and lg["items_inflight"] == 0
                        and persisted["items_completed"] == persisted["items_received"]
                        and not self.hist.unacked):
                    break
                assert time.monotonic() < deadline, (led, bp.tail())
                await asyncio.sleep(0.05)
            results: list[tuple[int, ResultRecord]] = []
            while True:
                page = await c.results(results[-1][0] if results else 0, 5000)
                results.extend(page)
                if len(page) < 5000:
                    break
            assert persisted["items_received"] == len(self.hist.acked), (persisted,
                                                                         len(self.hist.acked))
            async with self.changed:
                self.finished = True
                self.changed.notify_all()
            await c.shutdown()
        finally:
            await c.close()
        rc = await bp.wait(30.0)
        assert rc == 0, f"graceful stop exited {rc}:\n{bp.tail()}"
        return results
