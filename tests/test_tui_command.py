"""`fabricctl top` without a TTY, `--once` and `--json`: one snapshot, and no Textual.

Promises: `run_top` prints one snapshot (Rich, or msgspec JSON of the `Snapshot`) when asked
or when stdout is not a TTY, never importing Textual on that path; no broker is one
`fabricctl: error:` line and exit 3; a bad interval is exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from server_helpers import MODEL, SIG_A, fast_config

from fabricctl.cli.top import run_top
from fabricctl.core.snapshot import Snapshot
from fabricctl.core.types import Item
from fabricctl.server.app import BrokerServer
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.client import Client

REPO = str(Path(__file__).resolve().parent.parent)


@contextlib.contextmanager
def broker_in_a_thread(data: Path) -> Iterator[None]:
    """A live broker with 5 staged items, on its own loop, for synchronous callers."""
    loop = asyncio.new_event_loop()
    ready, failed = threading.Event(), []
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        store = DurableBroker(data, time.time())
        server = BrokerServer(store, fast_config(data))
        await server.start()
        client = await Client.connect(data, "producer")
        await client.submit([Item(f"i{k}", MODEL, SIG_A, 100, 8, b"p", "alpha")
                             for k in range(5)])
        await client.close()
        ready.set()
        await stop.wait()
        await server.stop()
        store.close()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as e:  # pragma: no cover - reported below
            failed.append(e)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30) and not failed, failed
    try:
        yield
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def probe(data: Path, once: bool, json_out: bool) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from fabricctl.cli.top import run_top\n"
        f"rc = run_top(Path({str(data)!r}), once={once}, json_out={json_out}, interval=1.0)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'textual')\n"
        "sys.stderr.write(json.dumps({'rc': rc, 'textual': loaded}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_no_broker_is_one_error_line_and_exit_3(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run_top(tmp_path, once=True, json_out=False, interval=1.0) == 3
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("fabricctl: error: no broker at ") and out.err.count("\n") == 1


def test_an_interval_below_a_tenth_is_a_usage_error(tmp_path: Path) -> None:
    assert run_top(tmp_path, once=True, json_out=False, interval=0.01) == 2


def test_json_once_and_no_tty_print_one_snapshot_without_importing_textual(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker_in_a_thread(data):
        as_json = probe(data, once=True, json_out=True)
        plain = probe(data, once=False, json_out=False)  # stdout is a pipe: one snapshot
    status = json.loads(as_json.stderr.strip().splitlines()[-1])
    assert status == {"rc": 0, "textual": []}
    snap = msgspec.json.decode(as_json.stdout, type=Snapshot)
    assert [(s.model, s.signature, s.label, s.items) for s in snap.shapes] == \
        [(MODEL, SIG_A, "alpha", 5)]
    assert snap.ledger.items_received == 5 and snap.difference == (0, 0)
    assert json.loads(plain.stderr.strip().splitlines()[-1]) == {"rc": 0, "textual": []}
    assert "\x1b[" not in plain.stdout  # a pipe gets no colour
    assert "staged" in plain.stdout and f"{SIG_A:016x}" in plain.stdout
    assert "ledger difference 0/0  received 5/500" in plain.stdout
