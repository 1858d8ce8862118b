"""Launcher against a fake engine server: command, readiness, restart with backoff, stop.

A server that never got ready and fails `start_attempts` starts in a row is a crash loop:
given up (the start raises at once, naming the log), its first failure reported at WARNING
with its log's last lines; one that was ready once is restarted whatever its restarts do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import pytest
from ports import free_port

from fabricctl.errors import LaunchError
from fabricctl.supervisor.engine_log import log_tail
from fabricctl.supervisor.launch_spec import LaunchSpec, vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher, ServerProcess, restart_delay

FAKE = str(Path(__file__).with_name("fake_engine_server.py"))



def spec(tmp_path: Path, *extra: str, **kw: object) -> LaunchSpec:
    fields: dict[str, object] = dict(
        command=(sys.executable, FAKE), port_base=free_port(), extra_args=extra,
        ready_timeout_s=20.0, stop_timeout_s=5.0, poll_interval_s=0.05,
        restart_backoff_s=(0.3, 0.6, 5.0))
    fields.update(kw)
    return LaunchSpec(model="tiny-model", served_model_name="tiny",
                      logs_dir=str(tmp_path / "logs"), **fields)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


async def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_command_and_env() -> None:
    s = LaunchSpec(model="/m", served_model_name="tiny", logs_dir="/tmp/x", port_base=9000,
                   extra_args=("--max-num-seqs", "16", "--tag={index}:{port}"),
                   env={"VLLM_CPU_OMP_THREADS_BIND": "{index}", "X": "gpu{gpu}"})
    srv = ServerProcess(s, 3, 1)
    assert srv.argv() == ["vllm", "serve", "/m", "--served-model-name", "tiny",
                          "--host", "127.0.0.1", "--port", "9001", "--max-num-seqs", "16",
                          "--tag=1:9001", "--enable-prompt-tokens-details"]
    env = srv.environ()
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["X"] == "gpu3"
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "60"  # not vLLM's 5 s
    own = msgspec.structs.replace(s, env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "7"})
    assert ServerProcess(own, 3, 1).environ()["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "7"
    assert srv.base_url == "http://127.0.0.1:9001"
    bad = msgspec.structs.replace(s, extra_args=("--disable-log-stats",))
    with pytest.raises(LaunchError, match="disable-log-stats"):
        ServerProcess(bad, 0, 0).argv()


def test_cpu_spec(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "libiomp5.so").write_bytes(b"")
    s = vllm_cpu_spec(venv, "/m", "tiny", tmp_path, port_base=18000,
                      env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    argv = ServerProcess(s, 0, 0).argv()
    assert argv[0] == str(venv.resolve() / "bin" / "python")
    assert argv[argv.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    assert argv[argv.index("--model") + 1] == "/m"
    env = ServerProcess(s, 1, 1).environ()
    assert env["LD_PRELOAD"].endswith("libiomp5.so") and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_restart_backoff_is_a_schedule() -> None:
    schedule = (1.0, 2.0, 5.0, 10.0, 30.0)  # [vllm] restart_backoff_s's default
    assert LaunchSpec(model="m", served_model_name="m", logs_dir="/x").restart_backoff_s == schedule
    assert [restart_delay(schedule, n) for n in range(7)] == [1, 2, 5, 10, 30, 30, 30]
    assert [restart_delay((4.0,), n) for n in range(3)] == [4, 4, 4]
    for bad in ((), (1.0, -1.0)):
        with pytest.raises(LaunchError, match="restart_backoff_s"):
            LaunchSpec(model="m", served_model_name="m", logs_dir="/x", restart_backoff_s=bad)


async def test_restarts_wait_the_schedule_and_start_over_after_a_healthy_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dead run (0 s healthy, or no start at all) takes the next delay; one healthy
    for backoff_reset_s starts the schedule over."""
    s = LaunchSpec(model="m", served_model_name="m", logs_dir="/x",
                   restart_backoff_s=(1.0, 2.0, 5.0), backoff_reset_s=60.0)
    srv = ServerProcess(s, 0, 0)
    runs: list[float | None] = [0.0, None, 0.0, 0.0, 61.0, 0.0, 59.0]
    waits: list[float] = []

    async def run_once() -> float | None:
        if not runs:
            srv._stopping = True
            return None
        return runs.pop(0)

    async def sleep(delay: float) -> None:
        waits.append(delay)

    monkeypatch.setattr(srv, "_run_once", run_once)
    monkeypatch.setattr("fabricctl.supervisor.launcher.asyncio.sleep", sleep)
    await srv._supervise()
    assert waits == [1, 2, 5, 5, 1, 2, 5]
    assert srv.restarts == 7


async def test_ready_when_health_answers(tmp_path: Path) -> None:
    launcher = Launcher(spec(tmp_path, "--ready-delay", "0.5"), [0])
    t0 = time.monotonic()
    async with launcher:
        assert time.monotonic() - t0 >= 0.5
        srv = launcher.servers[0]
        assert srv.ready.is_set() and launcher.pids()["0"] == srv.pid
        async with httpx.AsyncClient() as c:
            seen = (await c.get(srv.base_url + "/env")).json()
        assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert "--enable-prompt-tokens-details" in seen["argv"]
    assert launcher.pids() == {"0": None}
    assert "fabricctl: start" in srv.log_path.read_text()


async def test_restart_with_backoff_after_kill(tmp_path: Path) -> None:
    events: list[tuple[float, str]] = []
    launcher = Launcher(spec(tmp_path), [0],
                        on_event=lambda e, s: events.append((time.monotonic(), e)))
    await launcher.start()
    srv = launcher.servers[0]
    try:
        gaps = []
        for n in (1, 2):
            old = srv.pid
            assert old is not None
            t_kill = time.monotonic()
            os.kill(old, signal.SIGKILL)
            await wait_for(lambda old=old: srv.pid not in (None, old) and srv.ready.is_set())
            spawned = [t for t, e in events if e.startswith("spawned") and t > t_kill]
            gaps.append(spawned[0] - t_kill)
            assert srv.restarts == n
        assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # the schedule: 0.3 s, then 0.6 s
        assert sum("killed by SIGKILL after it was ready" in e for _, e in events) == 2
    finally:
        await launcher.stop()


async def test_stop_sigkills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    events: list[str] = []
    launcher = Launcher(spec(tmp_path, "--ignore-sigterm", "--child-pid-file", str(pid_file),
                             stop_timeout_s=0.5), [0], on_event=lambda e, s: events.append(e))
    await launcher.start()
    pid = launcher.servers[0].pid
    worker = int(pid_file.read_text())
    assert pid is not None and alive(pid) and alive(worker)
    t0 = time.monotonic()
    await launcher.stop()
    assert time.monotonic() - t0 >= 0.5
    assert any("SIGKILL" in e for e in events)
    await wait_for(lambda: not alive(pid) and not alive(worker), timeout=5)
    assert launcher.servers[0].restarts == 0


async def test_start_timeout_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A start not ready in time is killed and given up at once, not restarted: another
    wait as long would multiply the time `ready_timeout_s` bounds."""
    caplog.set_level(logging.INFO, logger="fabricctl.supervisor.launcher")
    events: list[str] = []
    launcher = Launcher(spec(tmp_path, "--ready-delay", "60", ready_timeout_s=1.0), [0],
                        on_event=lambda e, s: events.append(e))
    with pytest.raises(LaunchError, match=r"not ready within \[vllm\] ready_timeout_s \(1 s\): "
                                          r"killed, not restarted; see .*engine-0\.log"):
        await launcher.start()
    assert launcher.pids() == {"0": None}
    assert sum(e.startswith("spawned") for e in events) == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "GET /health" in warned[0], warned  # the log's tail


async def test_bad_command_keeps_retrying_then_stops(tmp_path: Path) -> None:
    s = spec(tmp_path, command=(str(tmp_path / "missing-binary"),), restart_backoff_s=(0.05, 0.1))
    launcher = Launcher(s, [0])
    await launcher.start(wait=False)
    await wait_for(lambda: launcher.servers[0].restarts >= 2, timeout=5)
    await launcher.stop()
    assert not launcher.servers[0].ready.is_set()


async def test_a_server_that_keeps_failing_its_start_is_a_crash_loop_reported_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three exits before ready: given up, not restarted; the first failure is one WARNING
    with the log's last lines (the cause among them), the next ones a line each."""
    caplog.set_level(logging.INFO, logger="fabricctl.supervisor.launcher")
    events: list[str] = []
    launcher = Launcher(spec(tmp_path, "--fail-start", "PackageNotFoundError: vllm",
                             restart_backoff_s=(0.05,), start_attempts=3), [0],
                        on_event=lambda e, s: events.append(e))
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"engine 0 \(gpu 0, model tiny\): crash loop: 3 "
                                          r"starts in a row failed before it was ever ready "
                                          r"\(last: exited with 1\); see .*engine-0\.log"):
        await launcher.start()
    assert time.monotonic() - t0 < 15  # not ready_timeout_s (20 s): the exits decide
    srv = launcher.servers[0]
    assert sum(e.startswith("spawned") for e in events) == 3 and srv.restarts == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "exited with 1 before it was ready (start 1 of 3)" in warnings[0]
    assert f"the last line of {srv.log_path}:\n  | PackageNotFoundError: vllm" in warnings[0]
    assert "(start 2 of 3)" in warnings[1] and "PackageNotFoundError" not in warnings[1]
    view = launcher.views()[0]
    assert (view.state, view.failed_starts, view.last_exit) == ("failed", 3, 1)
    assert view.reason.startswith("crash loop") and view.log == str(srv.log_path)
    assert srv.pid is None


async def test_a_server_that_was_ready_once_is_restarted_however_often_it_fails(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ready, killed, then its restarts fail more often than start_attempts: it keeps being
    restarted (the old backoff), and serves again once it can."""
    caplog.set_level(logging.INFO, logger="fabricctl.supervisor.launcher")
    broken = tmp_path / "broken"
    launcher = Launcher(spec(tmp_path, "--fail-start", "CUDA error: out of memory",
                             "--fail-if", str(broken), restart_backoff_s=(0.05,),
                             start_attempts=2), [0])
    await launcher.start()
    srv = launcher.servers[0]
    try:
        first = srv.pid
        assert first is not None
        broken.touch()
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: srv.restarts >= 4)  # 3 failed restarts > start_attempts
        assert srv.refusal is None and launcher.views()[0].state in ("starting", "restarting")
        broken.unlink()
        await srv.wait_ready(20)
        assert srv.pid not in (None, first)
    finally:
        await launcher.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "killed by SIGKILL after it was ready" in warnings[0], warnings


def test_the_log_tail_is_the_last_start_s_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine-0.log"
    assert log_tail(log) == []
    log.write_text("=== fabricctl: start A\nold\n\n=== fabricctl: start B (restart 1): x\n"
                   + "".join(f"line {i}\n" for i in range(20)) + "\n\n")
    assert log_tail(log) == [f"line {i}" for i in range(5, 20)]
    assert log_tail(log, 2) == ["line 18", "line 19"]


SUPERVISOR = """
import asyncio, sys
from fabricctl.supervisor.launcher import Launcher
from fabricctl.supervisor.launch_spec import LaunchSpec
spec = LaunchSpec(model="tiny-model", served_model_name="tiny", logs_dir=sys.argv[1],
                  command=(sys.executable, sys.argv[2]), port_base=int(sys.argv[3]),
                  extra_args=("--child-pid-file", sys.argv[4]), poll_interval_s=0.05)
async def main():
    launcher = Launcher(spec, [0])
    await launcher.start()
    print(launcher.servers[0].pid, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_a_supervisor_killed_with_sigkill_leaves_no_server_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path / "logs"), FAKE,
                            str(free_port()), str(pid_file)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert sup.stdout is not None
        pids.append(int(sup.stdout.readline()))  # printed once the server answers /health
        pids.append(int(pid_file.read_text()))  # its worker
        assert all(alive(p) for p in pids)
        sup.kill()
        sup.wait(10)
        asyncio.run(wait_for(lambda: not any(alive(p) for p in pids), timeout=10))
    finally:
        sup.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_tether_refuses_a_gone_parent_and_reports_a_missing_command(tmp_path: Path
                                                                       ) -> None:
    tether = [sys.executable, "-m", "fabricctl.supervisor.tether"]
    gone = subprocess.run([*tether, "1", "--", "true"], capture_output=True, text=True)
    assert gone.returncode == 1 and "the supervisor is gone" in gone.stderr
    missing = subprocess.run([*tether, str(os.getpid()), "--", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot run" in missing.stderr, missing.stderr
    ran = subprocess.run([*tether, str(os.getpid()), "--", sys.executable, "-c",
                          "import os; print(os.getpid())"], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip().isdigit()
    usage = subprocess.run([*tether, "x"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


async def test_a_port_some_other_server_holds_fails_the_start_at_once(tmp_path: Path) -> None:
    port = free_port()
    stray = subprocess.Popen([sys.executable, FAKE, "other-model", "--port", str(port)],
                             stderr=subprocess.DEVNULL)
    events: list[str] = []
    try:
        async def answers() -> bool:
            async with httpx.AsyncClient() as c:
                try:
                    return (await c.get(f"http://127.0.0.1:{port}/health")).status_code == 200
                except httpx.TransportError:
                    return False

        deadline = time.monotonic() + 20
        while not await answers():  # the stray server would pass our health probe
            assert time.monotonic() < deadline and stray.poll() is None
            await asyncio.sleep(0.05)
        launcher = Launcher(spec(tmp_path, port_base=port, ready_timeout_s=60.0,
                                 stop_timeout_s=1.0), [0],
                            on_event=lambda e, s: events.append(e))
        t0 = time.monotonic()
        with pytest.raises(LaunchError, match=rf"port {port} on 127.0.0.1 is in use by "
                                              rf"pid {stray.pid} \(.*other-model"):
            await launcher.start()
        assert 1.0 < time.monotonic() - t0 < 10  # its stop timeout, not the start timeout
        assert not any(e.startswith("spawned") for e in events), events
        assert sum(e.startswith("not starting: port") for e in events) >= 2, events
        assert launcher.pids() == {"0": None}
    finally:
        stray.kill()
        stray.wait()


def test_port_holder_names_the_listener() -> None:
    from fabricctl.supervisor.ports import port_holder

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_holder("127.0.0.1", port) == ""  # bound, no listener to name
        s.listen()
        held = port_holder("127.0.0.1", port)
        assert held is not None and f"pid {os.getpid()}" in held, held
    assert port_holder("127.0.0.1", port) is None


async def test_a_port_freed_within_the_stop_timeout_is_started_on(tmp_path: Path) -> None:
    """What a Ray worker's restart sees: its dead predecessor's server still exiting."""
    events: list[str] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        launcher = Launcher(spec(tmp_path, port_base=port, stop_timeout_s=30.0), [0],
                            on_event=lambda e, s: events.append(e))
        await launcher.start(wait=False)
        await wait_for(lambda: any(e.startswith("not starting: port") for e in events))
    try:
        await launcher.servers[0].wait_ready(20)  # the port is free now: it starts there
        assert launcher.servers[0].pid is not None
    finally:
        await launcher.stop()


# ---- servers, not GPUs: groups, tensor parallel, LoRA adapters --------------------------------


def records(path: Path) -> list[dict[str, object]]:
    """What the stand-in `vllm` recorded, one entry per start."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_group_server_command_has_tensor_parallel_and_adapters() -> None:
    s = LaunchSpec(model="/m", served_model_name="base", logs_dir="/tmp/x", port_base=9000,
                   adapters={"ad-a": "/ad/a", "ad-b": "/ad/b"})
    srv = ServerProcess(s, [2, 3], 0)
    argv = srv.argv()
    assert argv[:9] == ["vllm", "serve", "/m", "--served-model-name", "base", "--host",
                        "127.0.0.1", "--port", "9000"]
    assert argv[9:] == ["--tensor-parallel-size", "2", "--enable-lora", "--lora-modules",
                        "ad-a=/ad/a", "ad-b=/ad/b", "--max-loras", "3",
                        "--enable-prompt-tokens-details"]
    assert srv.environ()["CUDA_VISIBLE_DEVICES"] == "2,3" and srv.gpu == "2,3"
    assert s.names == ("base", "ad-a", "ad-b")
    # one GPU: no tensor-parallel flag; max-loras given by the operator is kept
    own = msgspec.structs.replace(s, extra_args=("--max-loras=4",))
    one = ServerProcess(own, 0, 0).argv()
    assert "--tensor-parallel-size" not in one and one.count("--max-loras=4") == 1
    assert "--max-loras" not in one
    # a group of 4 at tensor parallel 2: pipeline parallel 2
    pp = ServerProcess(msgspec.structs.replace(s, adapters={}, tensor_parallel_size=2),
                       [0, 1, 2, 3], 0).argv()
    assert pp[9:] == ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                      "--enable-prompt-tokens-details"]
    with pytest.raises(LaunchError, match="does not divide"):
        ServerProcess(msgspec.structs.replace(s, tensor_parallel_size=3), [0, 1], 0).argv()


async def test_a_server_over_two_gpus_starts_once_with_both_and_tensor_parallel_2(
        tmp_path: Path) -> None:
    rec = tmp_path / "rec-{index}.jsonl"
    launcher = Launcher.of([(spec(tmp_path, f"--record={rec}"), [0, 1])])
    assert len(launcher.servers) == 1
    async with launcher:
        srv = launcher.servers[0]
        async with httpx.AsyncClient() as c:
            seen = (await c.get(srv.base_url + "/env")).json()
        assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
        started = records(tmp_path / "rec-0.jsonl")
        assert len(started) == 1 and started[0]["cuda"] == "0,1"
        argv = started[0]["argv"]
        assert isinstance(argv, list)
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert launcher.pids() == {"0,1": srv.pid}


async def test_one_gpu_replicas_start_one_per_gpu_on_distinct_ports(tmp_path: Path) -> None:
    rec = tmp_path / "rec-{index}.jsonl"
    s = spec(tmp_path, f"--record={rec}")
    launcher = Launcher.of([(s, [0]), (s, [1])])
    async with launcher:
        a, b = launcher.servers
        assert a.port != b.port and (a.port, b.port) == (s.port_base, s.port_base + 1)
        for i, srv in enumerate(launcher.servers):
            started = records(tmp_path / f"rec-{i}.jsonl")
            assert [r["cuda"] for r in started] == [str(i)]
            argv = started[0]["argv"]
            assert isinstance(argv, list)
            assert "--tensor-parallel-size" not in argv
            assert argv[argv.index("--port") + 1] == str(srv.port)


async def test_a_killed_group_server_restarts_whole(tmp_path: Path) -> None:
    """One process again for the group, with the same argv and environment."""
    rec = tmp_path / "rec-0.jsonl"
    launcher = Launcher.of([(spec(tmp_path, f"--record={rec}",
                                  adapters={"ad-a": str(tmp_path / "a")}), [0, 1])])
    await launcher.start()
    srv = launcher.servers[0]
    try:
        old = srv.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await wait_for(lambda: srv.pid not in (None, old) and srv.ready.is_set())
        first, again = records(rec)
        assert (first["pid"], again["pid"]) == (old, srv.pid)
        assert first["argv"] == again["argv"] and first["cuda"] == again["cuda"] == "0,1"
        assert srv.restarts == 1 and len(launcher.servers) == 1
        assert not alive(old)
    finally:
        await launcher.stop()


def test_a_vllm_engine_serves_its_servers_names() -> None:
    from fabricctl.supervisor.vllm_engine import VllmEngine

    limits = {"max_batch_size": 8, "max_batch_tokens": 4096, "max_input_len": 1024}
    s = LaunchSpec(model="/m", served_model_name="base", logs_dir="/tmp/x",
                   adapters={"ad-a": "/a"})
    engine = VllmEngine(ServerProcess(s, [0, 1], 0), **limits)
    assert (engine.model, engine.limits().names, engine.name) == ("base", ("ad-a",),
                                                                  "vllm:gpu0,1")
    # adapters given the old way, in extra_args: learnt from the server's /v1/models
    old = msgspec.structs.replace(s, adapters={}, extra_args=("--lora-modules", "x=/x"))
    assert VllmEngine(ServerProcess(old, 0, 0), **limits)._learn
