"""Launches and keeps alive OpenAI-compatible inference servers, one per GPU group.

Contract:
- `Launcher(spec, gpus)` owns one `ServerProcess` per entry of `gpus`, a GPU or a group;
  `Launcher.of([(spec, group), ...])` one per group with its own spec (the fleet's
  servers). Server i listens on `spec.port_base + i` and sees only its group; its command
  line and environment are `launch_spec`'s, its log `engine_log`'s.
- Each child runs in its own session (process group), tethered to this process
  (`supervisor/tether.py`: SIGTERM when the supervisor dies, even by SIGKILL). It is ready
  when `GET /health` answers 200; a start not ready within `ready_timeout_s` is killed.
- A server never ready yet whose start fails says so at once at WARNING: the first time
  with its exit status, its log's tail and a hint (`engine_log.tail_note`), then one line
  each. It gives up after `spec.start_attempts` exits in a row (a crash loop), or at once
  when a start was not ready in time: `refusal` says why and names the log, and
  `wait_ready` raises `LaunchError` at once. One ready once is never given up. A port
  another process listens on is never spawned on: a server never ready yet fails with who
  holds it once it stayed taken for `stop_timeout_s`.
- A supervisor task per server restarts it whole after an unexpected exit, waiting
  `restart_delay(spec.restart_backoff_s, n)` (the schedule's n-th value, then its last; the
  count starts over once it ran healthy for `backoff_reset_s`); leftovers of a dead
  server's process group are SIGKILLed first.
- `start(wait=True)` returns once every server is ready (`LaunchError`, all stopped, when
  one gave up); `settle()` returns those that gave up; `views()`: each as a `ServerView`.
- `stop()`: the caller stops routing work first; SIGTERM, SIGKILL after `stop_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import msgspec

from fabricctl.errors import LaunchError
from fabricctl.supervisor.engine_log import START_MARK, exit_words, log_tail, tail_note
from fabricctl.supervisor.launch_spec import LaunchSpec, server_argv, server_environ
from fabricctl.supervisor.ports import port_holder
from fabricctl.supervisor.tether import tethered
from fabricctl.supervisor.vllm_install import start_hint

log = logging.getLogger(__name__)


class ServerView(msgspec.Struct, frozen=True):
    """Why: `status` and `top` show each launched server's state, a crash loop above all,
    from the daemon's snapshot, without reaching into its process."""

    index: int
    gpus: str  # its GPU group, comma-joined
    model: str  # its served name
    state: str  # starting | ready | restarting | failed | stopped
    restarts: int
    failed_starts: int  # starts in a row that ended before it was ready
    last_exit: int | None  # the exit status of its last run (negative: the signal)
    reason: str  # why it gave up (failed), else how its last start failed ("": none did)
    log: str  # its log's path


def restart_delay(schedule: Sequence[float], failures: int) -> float:
    """The wait before a restart that follows `failures` restarts in a row (0: the first):
    the schedule's entry at that index, its last entry once past its end."""
    return float(schedule[min(failures, len(schedule) - 1)])


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ServerProcess:
    """One engine server bound to one GPU group: its process, readiness and restart history."""

    def __init__(self, spec: LaunchSpec, gpu: int | str | Sequence[int | str], index: int,
                 on_event: Callable[[str, ServerProcess], None] | None = None) -> None:
        self.spec = spec
        group = [gpu] if isinstance(gpu, int | str) else list(gpu)
        self.gpus = tuple(str(g) for g in group)  # the group
        self.gpu = ",".join(self.gpus)  # CUDA_VISIBLE_DEVICES
        self.index = index
        self.port = spec.port_base + index
        self.base_url = f"http://{spec.host}:{self.port}"
        # absolute: messages, `status` and `top` name it for readers in other directories
        self.log_path = (Path(spec.logs_dir) / f"engine-{index}.log").absolute()
        self.restarts = 0
        self.last_exit: int | None = None
        self.ready = asyncio.Event()
        self.ready_once = False  # it was ready once: a taken port now is a restart's to wait out
        # why a server never ready gave up: a port held by another, or a crash loop
        self.refusal: str | None = None
        self.failed_starts = 0  # starts in a row that ended before it was ever ready
        self.last_failure = ""  # how its last failed start ended, in words
        self.timed_out = False  # its last start was killed for not being ready in time
        self._refused = asyncio.Event()
        self._since = 0.0  # when supervision began, for the taken port's grace
        self._on_event = on_event
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (its process group id too), else None."""
        p = self._proc
        return p.pid if p is not None and p.returncode is None else None

    def argv(self) -> list[str]:
        """The full command line for this server (`launch_spec.server_argv`)."""
        return server_argv(self.spec, self.gpus, self.index, self.port)

    def environ(self) -> dict[str, str]:
        """The child's environment (`launch_spec.server_environ`)."""
        return server_environ(self.spec, self.gpu, self.index, self.port)

    @property
    def label(self) -> str:
        """`engine 0 (gpu 0, model tiny)`: which server, in messages."""
        return f"engine {self.index} (gpu {self.gpu}, model {self.spec.served_model_name})"

    def view(self) -> ServerView:
        """Its state now, for `status` and `top`."""
        if self.refusal is not None:
            state, reason = "failed", self.refusal
        else:
            reason = self.last_failure
            state = ("ready" if self.ready.is_set() else "stopped" if self._stopping
                     else "restarting" if self.restarts or self.failed_starts else "starting")
        return ServerView(index=self.index, gpus=self.gpu, model=self.spec.served_model_name,
                          state=state, restarts=self.restarts,
                          failed_starts=self.failed_starts, last_exit=self.last_exit,
                          reason=reason, log=str(self.log_path))

    def _emit(self, event: str, level: int = logging.INFO) -> None:
        log.log(level, "%s: %s", self.label, event)
        if self._on_event is not None:
            try:
                self._on_event(event, self)
            except Exception:  # a monitoring hook must not kill supervision
                log.exception("on_event hook failed")

    def start(self) -> None:
        """Start supervising (spawn now, restart on unexpected exits)."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._since = time.monotonic()
            self.refusal, self.failed_starts = None, 0  # a fresh start: a fresh count
            self._refused.clear()
            self._task = asyncio.create_task(self._supervise(), name=f"engine-{self.index}")

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until /health answers 200; raise LaunchError after `timeout` seconds, or as
        soon as a server never ready gives up: a port held by another (see `_run_once`), or
        a crash loop (`_supervise`)."""
        waits = [asyncio.ensure_future(self.ready.wait()),
                 asyncio.ensure_future(self._refused.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.ready.is_set():
            return
        if self.refusal is not None:
            raise LaunchError(f"{self.label}: {self.refusal}")
        raise LaunchError(f"engine {self.index} not ready after {timeout} s; "
                          f"see {self.log_path}")

    async def _spawn(self) -> asyncio.subprocess.Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n{START_MARK}{time.ctime()} (restart {self.restarts}): "
                       f"{' '.join(argv)}\n".encode())
            logf.flush()
            return await asyncio.create_subprocess_exec(
                *tethered(argv), stdin=asyncio.subprocess.DEVNULL, stdout=logf,
                stderr=asyncio.subprocess.STDOUT, env=self.environ(), start_new_session=True)

    async def _probe_until_ready(self, proc: asyncio.subprocess.Process,
                                 exited: asyncio.Task[int]) -> bool:
        """Probe /health every poll interval until it answers 200 (True), or the server
        exits (`exited` done: said at once, not a poll later) or runs out of time (False)."""
        url = self.base_url + self.spec.health_path
        deadline = time.monotonic() + self.spec.ready_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while proc.returncode is None and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return True
                await asyncio.wait({exited}, timeout=self.spec.poll_interval_s)
        return False

    async def _run_once(self) -> float | None:
        """Spawn, wait for readiness and then for exit; return how long it was healthy
        (None: nothing was spawned).
        A port another process listens on is not spawned on: that process would answer
        the health probe and every request in our server's place."""
        holder = await asyncio.to_thread(port_holder, self.spec.host, self.port)  # reads /proc
        if holder is not None:
            why = (f"port {self.port} on {self.spec.host} is in use{holder}, by a server "
                   "fabricctl did not start (a leftover vLLM?): stop it, or move "
                   "vllm.port_base")
            self._emit(f"not starting: {why}")
            # a server of ours that just died (a Ray worker's, told to stop by the kernel)
            # frees the port within its stop timeout; a stranger's holds it
            if not self.ready_once and time.monotonic() - self._since > self.spec.stop_timeout_s:
                self.refusal = why
                self._refused.set()
            return None
        self.timed_out = False
        try:
            proc = self._proc = await self._spawn()
        except OSError as e:
            self._emit(f"spawn failed: {e}")
            if not self.ready_once:
                self.failed_starts += 1
                self.last_failure = f"could not be spawned: {e}"
            return None
        self._emit(f"spawned pid {proc.pid} on port {self.port}")
        waiter = asyncio.create_task(proc.wait())
        ready_at: float | None = None
        try:
            if await self._probe_until_ready(proc, waiter):
                ready_at = time.monotonic()
                self.ready_once = True
                self.last_failure = ""
                self.ready.set()
                self._emit("ready")
            elif proc.returncode is None and not self._stopping:
                self._emit(f"not ready after {self.spec.ready_timeout_s} s: killing")
                self.timed_out = True
                _signal_group(proc.pid, signal.SIGKILL)
            self.last_exit = await asyncio.shield(waiter)
            if ready_at is None and not self._stopping:
                self.last_failure = (f"not ready after {self.spec.ready_timeout_s:g} s (killed)"
                                     if self.timed_out else exit_words(self.last_exit))
                if not self.ready_once:
                    self.failed_starts += 1
        finally:
            self.ready.clear()
            if proc.returncode is None:  # cancelled: never leave a child behind
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            else:
                _signal_group(proc.pid, signal.SIGKILL)  # orphaned workers of a dead server
        return 0.0 if ready_at is None else time.monotonic() - ready_at

    def _report_failed_start(self, delay: float, first: bool) -> bool:
        """Say at WARNING how the start that just ended failed (`first`: with its log's
        tail); True when it gives up: a crash loop, or a start not ready in time (`refusal`
        set: no restart, and the one who waits for it says so)."""
        n, limit = self.failed_starts, self.spec.start_attempts
        if self.timed_out:
            self.refusal = (f"not ready within [vllm] ready_timeout_s "
                            f"({self.spec.ready_timeout_s:g} s): killed, not restarted; "
                            f"see {self.log_path}")
        elif n >= limit:
            hint = start_hint(log_tail(self.log_path))
            self.refusal = (f"crash loop: {n} start{'s' if n > 1 else ''} in a row failed "
                            f"before it was ever ready (last: {self.last_failure}); "
                            f"see {self.log_path}" + (f"; hint: {hint}" if hint else ""))
        if self.refusal is not None:
            if first or self.timed_out:  # a crash loop's last exit: the error will say it
                self._emit(self.refusal + tail_note(self.log_path), logging.WARNING)
            return True
        self._emit(f"{self.last_failure} before it was ready (start {n} of {limit}); "
                   f"restarting in {delay:g} s" + (tail_note(self.log_path) if first else ""),
                   logging.WARNING)
        return False

    async def _supervise(self) -> None:
        failures = 0  # restarts in a row since the server last ran healthy long enough
        while not self._stopping:
            failed_before = self.failed_starts
            healthy_s = await self._run_once()
            if self._stopping or self.refusal is not None:  # stopped, or a port not ours
                break
            if healthy_s is not None and healthy_s >= self.spec.backoff_reset_s:
                failures = 0
            delay = restart_delay(self.spec.restart_backoff_s, failures)
            if self.failed_starts > failed_before:  # ended before it was ever ready
                if self._report_failed_start(delay, first=failed_before == 0):
                    self._refused.set()
                    break
            elif healthy_s is None:
                self._emit(f"not started; retrying in {delay:.1f} s")
            elif healthy_s > 0.0:  # it was ready in this run: why it died matters
                self._emit(f"{exit_words(self.last_exit)} after it was ready; restarting in "
                           f"{delay:g} s" + tail_note(self.log_path), logging.WARNING)
            else:
                self._emit(f"exited with {self.last_exit}; restarting in {delay:.1f} s")
            await asyncio.sleep(delay)
            failures += 1
            self.restarts += 1
        self._emit(f"{'given up' if self.refusal else 'stopped'} (exit {self.last_exit})")

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL to the process group after stop_timeout_s; no restart."""
        self._stopping = True
        self.ready.clear()
        proc, task = self._proc, self._task
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), self.spec.stop_timeout_s)
            except TimeoutError:
                self._emit(f"no exit {self.spec.stop_timeout_s} s after SIGTERM: SIGKILL")
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            _signal_group(proc.pid, signal.SIGKILL)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._proc is not None and self._proc is not proc:  # spawned while we stopped
            _signal_group(self._proc.pid, signal.SIGKILL)


class Launcher:
    """Runs one ServerProcess per GPU group and exposes their endpoints and pids."""

    def __init__(self, spec: LaunchSpec, gpus: Sequence[int | str | Sequence[int | str]],
                 on_event: Callable[[str, ServerProcess], None] | None = None) -> None:
        self.spec = spec
        self.servers = [ServerProcess(spec, g, i, on_event) for i, g in enumerate(gpus)]

    @classmethod
    def of(cls, groups: Sequence[tuple[LaunchSpec, Sequence[int | str]]],
           on_event: Callable[[str, ServerProcess], None] | None = None) -> Launcher:
        """One server per (spec, group), numbered in order (ports `port_base + i`)."""
        if not groups:
            raise LaunchError("no server to launch: the fleet names no GPU group")
        launcher = cls(groups[0][0], [], on_event)
        launcher.servers = [ServerProcess(spec, g, i, on_event)
                            for i, (spec, g) in enumerate(groups)]
        return launcher

    async def start(self, wait: bool = True) -> None:
        """Start every server; with `wait`, return when all are ready (LaunchError, every
        server stopped, when one gave up)."""
        for s in self.servers:
            s.start()
        if wait:
            failed = await self.settle()
            if failed:
                await self.stop()
                raise LaunchError("; ".join(f"{s.label}: {s.refusal}" for s in failed))

    async def settle(self) -> list[ServerProcess]:
        """Wait until every started server is ready or has given up; those that gave up."""
        outcomes = await asyncio.gather(*(s.wait_ready(None) for s in self.servers),
                                        return_exceptions=True)
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, LaunchError):
                raise o
        return [s for s, o in zip(self.servers, outcomes, strict=True)
                if isinstance(o, LaunchError)]

    def views(self) -> list[ServerView]:
        """Every server's state now (`ServerProcess.view`)."""
        return [s.view() for s in self.servers]

    async def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after the spec's timeout)."""
        await asyncio.gather(*(s.stop() for s in self.servers))

    def pids(self) -> dict[str, int | None]:
        """GPU group ("0" or "0,1") -> pid of its server (None while it is down)."""
        return {s.gpu: s.pid for s in self.servers}

    async def __aenter__(self) -> Launcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
