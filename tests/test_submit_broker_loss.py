"""`fabricctl submit` when its broker dies mid-stream: one error line, no traceback.

Promises checked: with `fabricctl up` SIGKILLed while `submit` streams lines into it, the
submit ends non-zero (3, the broker is gone) with exactly one line on stderr, which names
how many lines were acknowledged and says to run the same submit again; nothing follows
it (no "Future exception was never retrieved", no traceback). The number it names is safe:
a broker restarted on the same data dir holds at least that many items, and the same
input sent again with `--job ID` (the job the line names) attaches: no duplicate error,
and the broker then holds every line once.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cli_helpers import FABRICCTL, Broker, error_lines

LINES = 8_000
KILL_AFTER = 2048  # items the broker has stored when it is killed
LOST = re.compile(r"^fabricctl: error: lost the broker mid-stream \(.+\): ([\d,]+) lines? "
                  r"(?:was|were) acknowledged \(stored durably\); run the same submit again "
                  r"\(from stdin: with --job (batch_\w+)\): it skips the stored lines and "
                  r"sends the rest$")


def line(i: int) -> bytes:
    # ~3 KB a line: the submit writes faster than the broker commits, so when the broker
    # dies there are submits in flight, some of them still being written.
    return json.dumps({"id": f"k{i}", "model": "fabric-demo", "prefix": ["SYS" * 300, "FEW"],
                       "prompt": "p" * 2000, "max_tokens": 4}).encode() + b"\n"


def received(data_dir: Path) -> int:
    from fabricctl.wire.client import Client

    async def ask() -> int:
        c = await Client.connect(data_dir, "observer", "test", timeout=5.0)
        try:
            st: Any = await c.status()
            return int(st["ledger"]["items_received"])
        finally:
            await c.close()

    return asyncio.run(ask())


def wait_received(data_dir: Path, at_least: int, timeout: float = 60.0) -> int:
    """Bounded polling until the broker has stored `at_least` items."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = received(data_dir)
        if n >= at_least:
            return n
        time.sleep(0.02)
    raise AssertionError(f"the broker did not receive {at_least} items within {timeout} s")


def test_submit_says_what_is_safe_when_the_broker_is_killed(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    broker = Broker(data_dir, tmp_path)
    sub = subprocess.Popen([*FABRICCTL, "submit", "-", "--data-dir", str(data_dir)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=broker.env, cwd=tmp_path)
    assert sub.stdin is not None

    def feed() -> None:
        assert sub.stdin is not None
        try:
            for i in range(LINES):
                sub.stdin.write(line(i))
            sub.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # the submit stopped reading: what this test is for

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        wait_received(data_dir, KILL_AFTER)
        broker.proc.kill()  # SIGKILL, mid-stream
        broker.proc.wait(timeout=30)
        out, err = sub.communicate(timeout=60)
    finally:
        if sub.poll() is None:
            sub.kill()
        broker.log.close()
    lines = error_lines(err)
    assert sub.returncode == 3, err.decode()
    assert len(lines) == 1, err.decode()
    m = LOST.match(lines[0])
    assert m, lines[0]
    acknowledged = int(m.group(1).replace(",", ""))
    assert out == b""

    again = Broker(data_dir, tmp_path)  # recovery: what the submit called safe is there
    try:
        stored = received(data_dir)
        assert KILL_AFTER <= stored < LINES
        assert acknowledged <= stored
        # as the line says: the same input with --job sends only the rest, no duplicates
        rerun = again.run("submit", "-", "--job", m.group(2),
                          input=b"".join(line(i) for i in range(LINES)), timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        assert error_lines(rerun.stderr) == []
        assert "attached" in rerun.stderr.decode()
        assert received(data_dir) == LINES  # 0 lost, 0 doubled
        job = json.loads(again.run("jobs", "show", m.group(2), "--json").stdout)["job"]
        assert job["total"] == LINES and job["sealed"]
    finally:
        assert again.stop() == 0


# ---- the wire client on its own -----------------------------------------------------------


def test_a_request_cut_off_while_being_written_leaves_no_unseen_exception(
        tmp_path: Path) -> None:
    """The broker dies while a request's bytes are still waiting to be written (writing
    paused): the caller gets `BackendMissing`, and no reply future is left behind with an
    exception nobody retrieved (asyncio would log it, with a traceback, at exit)."""
    import gc

    from fabricctl.core.types import Item
    from fabricctl.errors import BackendMissing
    from fabricctl.wire.client import Client
    from fabricctl.wire.protocol import PROTOCOL_VERSION, Welcome, encode

    path = tmp_path / "b.sock"
    logged: list[dict[str, Any]] = []

    async def go() -> str:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: logged.append(ctx))
        conns: list[asyncio.StreamWriter] = []

        async def on_conn(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            conns.append(w)  # never reads past the hello: the client's writes back up
            w.write(encode(Welcome(PROTOCOL_VERSION, "fake", str(tmp_path))))

        server = await asyncio.start_unix_server(on_conn, str(path))
        client = await Client.connect(path, "producer", "test")
        items = [Item(f"i{k}", "m", 0, 10, 4, b"x" * 4096) for k in range(2048)]  # 8 MiB
        req = asyncio.ensure_future(client.submit(items))
        deadline = time.monotonic() + 10  # 8 MiB never fits a socket buffer: it pauses
        while client._wire._writable is None:
            assert time.monotonic() < deadline, "writing never paused"
            await asyncio.sleep(0)
        conns[0].transport.abort()  # the broker dies mid-write
        try:
            await req
        except BackendMissing as e:
            got = str(e)
        server.close()
        await client.close()
        return got

    assert asyncio.run(go()).startswith("the broker closed the connection")
    gc.collect()  # an unretrieved future logs (to the loop's handler) when it is collected
    assert [c.get("message") for c in logged] == []
