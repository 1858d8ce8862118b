"""Helpers for the multi-host tests: certificates, child processes, workloads, result checks.

`make_cert` writes a self-signed certificate and key made at test time with the `openssl`
CLI (there is no `cryptography` in the test deps); `make_ca_and_leaf` a CA and a leaf it
signed. `Child` runs a `fabricctl` command as a subprocess whose stderr lines a test can wait
on (bounded: every wait has a deadline). `agent_items` is a deterministic workload of three
shapes; `results` reads a broker's whole result sequence through its Unix socket and
`assert_exactly_once` checks every id got exactly one result, and its own.
`stopped_and_read(pid)` says a SIGSTOPped process has nothing more on its way to its peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from server_helpers import result_sequence

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item
from fabricctl.engines.simrequest import sim_text
from fabricctl.formats.results import ResultRecord
from fabricctl.wire.client import Client

REPO = Path(__file__).resolve().parent.parent
MODEL = "m"
TOKEN = "agents-s3cret"
PREFIXES = (
    ("You are a careful assistant.", "Example: 2+2=4."),
    ("You translate English to French.",),
    ("System: terse.", "Shots: a->b, c->d.", "Tools: calc(x)"),
)

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None,
                                   reason="the openssl CLI makes the test certificates")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_cert(directory: Path, name: str = "broker", cn: str = "localhost",
              san: str = "DNS:localhost,IP:127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate (CA:TRUE, as `openssl req -x509` makes it) and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
             "-subj", f"/CN={cn}", "-addext", f"subjectAltName={san}")
    return cert, key


def make_ca_and_leaf(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, leaf certificate signed by it, leaf key), the leaf for localhost."""
    ca, ca_key = make_cert(directory, "ca", cn="fabricctl test CA", san="DNS:ca.invalid")
    key, csr, leaf = directory / "leaf.key", directory / "leaf.csr", directory / "leaf.crt"
    ext = directory / "leaf.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(leaf), "-days", "2", "-extfile", str(ext))
    return ca, leaf, key



def fabricctl_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "fabricctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fabricctl"]


def child_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_", "XDG_"))}
    env.update(COLUMNS="200", XDG_CONFIG_HOME=str(tmp / "xdg"), XDG_DATA_HOME=str(tmp / "xdg"),
               PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), NO_COLOR="1", TERM="dumb")
    env.update(extra)
    return env


class Child:
    """Why: agents and brokers must die for real (SIGKILL, SIGSTOP), so each is a process."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.argv, self.env, self.cwd, self.log_path = argv, env, cwd, log
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.changed = asyncio.Condition()
        self.eof = False
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> Child:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        self._pump = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.log_path, "a", buffering=1) as log:
            while raw := await self.proc.stderr.readline():
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                log.write(line + "\n")
                async with self.changed:
                    self.changed.notify_all()
        self.eof = True
        async with self.changed:
            self.changed.notify_all()

    def count(self, pattern: str, start: int = 0) -> int:
        return sum(pattern in ln for ln in self.lines[start:])

    async def wait_line(self, pattern: str, timeout: float = 30.0, start: int = 0,
                        times: int = 1) -> str:
        """The `times`-th line from index `start` that contains `pattern`; waits for it."""
        def found() -> str | None:
            hits = [ln for ln in self.lines[start:] if pattern in ln]
            return hits[times - 1] if len(hits) >= times else None

        try:
            async with self.changed:
                await asyncio.wait_for(self.changed.wait_for(
                    lambda: found() is not None or self.eof), timeout)
        except TimeoutError:
            raise AssertionError(f"{pattern!r} not within {timeout} s:\n{self.tail()}") from None
        line = found()
        assert line is not None, f"{pattern!r} never came:\n{self.tail()}"
        return line

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    async def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        rc = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._pump is not None:
            await asyncio.wait_for(self._pump, timeout)
        return rc

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])


def agent_items(n: int, tag: str = "w", model: str = MODEL) -> list[Item]:
    """Item k of a workload: deterministic, one of three shapes, varied length."""
    out = []
    for k in range(n):
        comps = PREFIXES[k % len(PREFIXES)]
        comp_tokens = [40 + 16 * i for i in range(len(comps))]
        prompt_tokens = 8 + (k * 7919) % 200
        payload = Payload(list(comps), f"question {tag}{k}", comp_tokens, prompt_tokens)
        out.append(Item(f"{tag}{k}", model, signature(list(comps)),
                        sum(comp_tokens) + prompt_tokens, 4 + k % 8, encode_payload(payload)))
    return out


async def submit(data: Path, items: list[Item], chunk: int = 200) -> None:
    c = await Client.connect(data, "producer", "agents-test")
    try:
        for i in range(0, len(items), chunk):
            ack = await c.submit(items[i:i + chunk])
            assert not ack.rejects, ack.rejects
    finally:
        await c.close()


T = TypeVar("T")


async def query(data: Path, ask: Callable[[Client], Awaitable[T]]) -> T:
    """One question's answer (`ask`: a typed `Client` method, e.g. `Client.status`)."""
    c = await Client.connect(data, "observer", "agents-test", timeout=5.0)
    try:
        return await ask(c)
    finally:
        await c.close()


async def wait_until(cond: Any, timeout: float, what: str, every: float = 0.05) -> Any:
    """Bounded polling: `await cond()` until it is truthy (its value) or the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ConnectionError):
            last = await cond()
            if last:
                return last
        await asyncio.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last {last!r})")


async def consumers(data: Path) -> list[str]:
    return sorted(c.name for c in await query(data, Client.consumers))


async def done_items(data: Path) -> int:
    return int((await query(data, Client.ledger))["persisted"]["items_completed"])


async def results(data: Path) -> list[ResultRecord]:
    c = await Client.connect(data, "observer", "agents-test")
    try:
        return [r for _, r in await result_sequence(c)]
    finally:
        await c.close()


def assert_exactly_once(recs: list[ResultRecord], items: list[Item]) -> None:
    """Every item has exactly one result, its own (the text its id produces), no stranger."""
    ids = Counter(r.id for r in recs)
    want = {it.id for it in items}
    assert not [i for i, n in ids.items() if n > 1], "doubled"
    assert set(ids) == want, (sorted(want - set(ids))[:10], sorted(set(ids) - want)[:10])
    for r in recs:
        assert r.error is None, r
        assert r.text == sim_text(r.id, r.completion_tokens), r


async def stopped_and_read(pid: int) -> bool:
    """Every thread of `pid` is stopped (a SIGSTOP took effect) and its TCP peers on this
    host have read every byte it sent (Linux: /proc): nothing it wrote is still on its way."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        if stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    queues = _tcp_queues()
    for conn in psutil.Process(pid).net_connections(kind="tcp4"):
        if not conn.raddr:
            continue
        here, there = (conn.laddr.ip, conn.laddr.port), (conn.raddr.ip, conn.raddr.port)
        unacked = queues.get((here, there), (0, 0))[0]  # sent, not yet received there
        unread = queues.get((there, here), (0, 0))[1]  # received there, not yet read
        if unacked or unread:
            return False
    return True


def _tcp_queues() -> dict[tuple[tuple[str, int], tuple[str, int]], tuple[int, int]]:
    """(local, remote) -> (send queue, receive queue) of every IPv4 TCP socket of this host."""
    def addr(field: str) -> tuple[str, int]:
        ip, port = field.split(":")
        return socket.inet_ntoa(struct.pack("=I", int(ip, 16))), int(port, 16)

    out = {}
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = row.split()
        tx, rx = (int(q, 16) for q in f[4].split(":"))
        out[(addr(f[1]), addr(f[2]))] = (tx, rx)
    return out


async def all_gone(procs: list[psutil.Process]) -> bool:
    """Every one exited (a zombie waiting for a reaper counts as exited)."""
    def gone(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(gone(p) for p in procs)
