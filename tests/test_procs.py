"""psutil process sampling: our own pid, exited and zombie children, unknown pids."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec

from fabricctl.supervisor.procs import ProcMonitor, ProcSample, sample_process


def test_own_pid_is_alive_with_rss() -> None:
    monitor = ProcMonitor(clock=lambda: 42.0)
    monitor.watch("broker", os.getpid())
    sum(i * i for i in range(200_000))  # burn a little CPU between prime and sample
    (s,) = monitor.sample()
    assert s.name == "broker" and s.pid == os.getpid() and s.alive
    assert s.rss_bytes is not None and s.rss_bytes > 0
    assert s.num_threads is not None and s.num_threads >= 1
    assert s.cpu_percent is not None and s.cpu_percent >= 0.0
    assert s.sampled_at == 42.0
    assert monitor.latest() == [s]
    assert msgspec.json.decode(msgspec.json.encode(s), type=ProcSample) == s


def test_exited_child_reports_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    monitor = ProcMonitor(clock=lambda: 1.0)
    monitor.watch("engine-0", child.pid)
    (running,) = monitor.sample()
    assert running.alive and running.rss_bytes
    child.kill()
    child.wait()
    (gone,) = monitor.sample()
    assert gone == ProcSample(name="engine-0", pid=child.pid, alive=False, sampled_at=1.0)


def test_zombie_child_reports_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    monitor = ProcMonitor()
    monitor.watch("engine-1", child.pid)
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        (zombie,) = monitor.sample()
        assert not zombie.alive and zombie.rss_bytes is None
    finally:
        child.wait()


def test_unknown_pid_and_unwatch() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    monitor = ProcMonitor()
    monitor.watch("ghost", child.pid)
    monitor.watch("me", os.getpid())
    assert monitor.watched() == {"ghost": child.pid, "me": os.getpid()}
    assert [(s.name, s.alive) for s in monitor.sample()] == [("ghost", False), ("me", True)]
    monitor.unwatch("ghost")
    monitor.unwatch("never-watched")
    assert [s.name for s in monitor.sample()] == ["me"]


def test_rewatch_after_restart_follows_the_new_pid() -> None:
    monitor = ProcMonitor()
    old = subprocess.Popen([sys.executable, "-c", "pass"])
    old.wait()
    monitor.watch("engine-0", old.pid)
    assert not monitor.sample()[0].alive
    monitor.watch("engine-0", os.getpid())
    assert monitor.sample()[0].alive


def test_sample_process_one_shot() -> None:
    s = sample_process("me", os.getpid(), now=3.0)
    assert s.alive and s.cpu_percent is None and s.rss_bytes and s.sampled_at == 3.0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not sample_process("gone", child.pid).alive
