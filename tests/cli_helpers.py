"""Helpers for the CLI tests: run `fabricctl` as a subprocess (its stdout a pipe, or a
pseudo-terminal of a given size: `fabricctl_tty`), start and stop a real broker.

Every run gets a clean environment: no user config (XDG_CONFIG_HOME in a tmp dir), no
FABRICCTL_* variables unless given, no colour, the working directory a tmp dir (so no
project fabric.toml is read), and `python -m fabricctl` from this interpreter.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FABRICCTL = [sys.executable, "-m", "fabricctl"]
START_TIMEOUT_S = 60.0


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_", "XDG_"))}
    env.pop("FORCE_COLOR", None)
    env.update(XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               NO_COLOR="1", COLUMNS="120", TERM="dumb", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def fabricctl(*args: str, env: dict[str, str], cwd: Path, input: bytes | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*FABRICCTL, *args], input=input, capture_output=True, env=env,
                          cwd=cwd, timeout=timeout)


JOB_LINE = "fabricctl: job "  # submit's job announcement: not a diagnostic


def error_lines(stderr: bytes) -> list[str]:
    """The diagnostics on stderr: every non-blank line but submit's `fabricctl: job ID`."""
    return [ln for ln in stderr.decode().splitlines()
            if ln.strip() and not ln.startswith(JOB_LINE)]


class Broker:
    """A `fabricctl up --engine sim` subprocess in its own data dir (another `engine` with
    its `consumers`: `openai` has one per `[vllm] endpoints` entry of the config)."""

    def __init__(self, data_dir: Path, home: Path, env: dict[str, str] | None = None,
                 engine: str = "sim", consumers: int = 2) -> None:
        self.data_dir, self.home, self.consumers = data_dir, home, consumers
        self.env = clean_env(home, **(env or {}))
        self.log = open(home / f"broker-{data_dir.name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*FABRICCTL, "up", "--data-dir", str(data_dir), "--engine", engine],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=home)
        self.wait_ready()

    def run(self, *args: str, input: bytes | None = None, timeout: float = 120,
            **env: str) -> subprocess.CompletedProcess[bytes]:
        """`fabricctl ARGS --data-dir <this broker>`."""
        full_env = {**self.env, **env}
        return fabricctl(*args, "--data-dir", str(self.data_dir), env=full_env, cwd=self.home,
                         input=input, timeout=timeout)

    def wait_ready(self) -> None:
        """Bounded polling until the socket answers a status query with every consumer."""
        from fabricctl.wire.client import Client

        async def consumers() -> int:
            c = await Client.connect(self.data_dir, "observer", "test", timeout=1.0)
            try:
                st: Any = await c.status()
                return int(st["consumers"])
            finally:
                await c.close()

        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fabricctl up exited {self.proc.returncode}: "
                                   f"{self.logs()}")
            try:
                if asyncio.run(consumers()) >= self.consumers:
                    return
            except Exception as e:  # not up yet
                last = e
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"broker did not answer within {START_TIMEOUT_S} s ({last}): "
                           f"{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return (self.home / f"broker-{self.data_dir.name}.log").read_text(errors="replace")

    def stop(self) -> int:
        """`fabricctl down`, then the `up` process's exit status."""
        try:
            down = self.run("down", timeout=60)
            assert down.returncode == 0, down.stderr
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # SGR and cursor sequences: not text


def fabricctl_tty(*args: str, env: dict[str, str], cwd: Path, columns: int, lines: int = 40,
                  timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """`fabricctl ARGS` with stdout on a pseudo-terminal of `columns` x `lines` (stdin
    empty, stderr piped): what a user sees there, escape sequences removed, lines ending
    `\\n`. TERM is a real terminal's (on `dumb` Rich assumes 80 columns)."""
    import fcntl
    import pty
    import select
    import struct
    import tempfile
    import termios

    full = {**env, "COLUMNS": str(columns), "LINES": str(lines), "TERM": "xterm-256color"}
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*FABRICCTL, *args], stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=err, env=full, cwd=cwd)
        os.close(slave)
        out = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], deadline - time.monotonic())
                if not ready:
                    break
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not chunk:
                    break
                out += chunk
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            os.close(master)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        stderr = err.read()
    text = ESCAPES.sub(b"", bytes(out)).replace(b"\r\n", b"\n")
    return subprocess.CompletedProcess([*FABRICCTL, *args], code, text, stderr)
