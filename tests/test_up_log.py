"""The log of `fabricctl up` (and `consume`) carries fabricctl's own lines only.

Promises checked: after `setup_logging(False)` a third-party logger (httpx, httpcore,
asyncio) emits nothing below WARNING while fabricctl's loggers emit INFO; with `-v`
(`setup_logging(True)`) both emit down to DEBUG. End to end: `fabricctl up --engine openai`
against an in-test HTTP engine writes no httpx `HTTP Request:` line for the engine requests
it makes, and with `-v` it does (so the check would see one).
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_helpers import FABRICCTL, START_TIMEOUT_S, clean_env, fabricctl

from fabricctl.cli.app import setup_logging

THIRD_PARTY = ("httpx", "httpcore", "asyncio")


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """setup_logging changes process-wide state; put it back for the other tests."""
    root = logging.getLogger()
    fabric = logging.getLogger("fabricctl")
    saved = (root.level, list(root.handlers), fabric.level)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    fabric.setLevel(saved[2])


def test_third_party_info_lines_are_dropped_without_verbose(
        logging_restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging(False)
    for name in THIRD_PARTY:
        logging.getLogger(name).info("HTTP Request: GET http://127.0.0.1:8001/health 200 OK")
        logging.getLogger(name).debug("debug from %s", name)
    assert capsys.readouterr().err == ""
    logging.getLogger("fabricctl").info("engine: sim — chosen")
    logging.getLogger("fabricctl.fleet").info("fleet line")
    logging.getLogger("fabricctl.server").debug("not without -v")
    logging.getLogger("httpx").warning("httpx warns")
    err = capsys.readouterr().err
    assert "engine: sim" in err and "fleet line" in err and "httpx warns" in err
    assert "not without -v" not in err


def test_verbose_shows_third_party_and_debug_lines(
        logging_restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging(True)
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1:8001/health")
    logging.getLogger("httpcore").debug("connect_tcp.started")
    logging.getLogger("fabricctl.server").debug("server debug")
    err = capsys.readouterr().err
    assert "HTTP Request: GET" in err and "connect_tcp.started" in err
    assert "server debug" in err


def test_a_real_httpx_request_leaves_no_line(logging_restored: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    setup_logging(False)
    transport = httpx.MockTransport(lambda req: httpx.Response(200, text="ok"))
    with httpx.Client(transport=transport) as client:
        assert client.get("http://engine.test/health").status_code == 200
    assert capsys.readouterr().err == ""


# ---- end to end: `fabricctl up --engine openai` ---------------------------------------------


class _Engine(BaseHTTPRequestHandler):
    """A stand-in OpenAI-compatible server: every POST is a one-choice completion."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(404)  # no /metrics: the engine stops scraping
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wait_ready(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Bounded polling until the broker answers with its one consumer registered."""
    import asyncio

    from fabricctl.wire.client import Client

    async def consumers() -> int:
        c = await Client.connect(data_dir, "observer", "test", timeout=1.0)
        try:
            return int((await c.status())["consumers"])
        finally:
            await c.close()

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            if asyncio.run(consumers()) >= 1:
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"broker not ready: {log.read_text(errors='replace')}")


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_up_log_has_no_http_request_lines_unless_verbose(tmp_path: Path, engine_url: str,
                                                         verbose: bool) -> None:
    env = clean_env(tmp_path)
    config = tmp_path / "fabric.toml"
    config.write_text(f'engine = "openai"\n[vllm]\nendpoints = ["{engine_url}"]\n')
    data_dir = tmp_path / "broker"
    log = tmp_path / "up.log"
    with log.open("wb") as logf:
        proc = subprocess.Popen([*FABRICCTL, "up", "--data-dir", str(data_dir), "--config",
                                 str(config), *(["-v"] if verbose else [])],
                                stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        try:
            _wait_ready(data_dir, proc, log)
            item = {"id": "one", "model": "fabric-demo", "prompt": "hi", "max_tokens": 2}
            out = fabricctl("submit", "-", "--wait", "--timeout", "60", "--data-dir",
                            str(data_dir), env=env, cwd=tmp_path,
                            input=json.dumps(item).encode() + b"\n")
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["text"] == "ok"  # the engine was asked over HTTP
            down = fabricctl("down", "--data-dir", str(data_dir), env=env, cwd=tmp_path)
            assert down.returncode == 0, down.stderr
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert "engine: openai" in text  # fabricctl's own lines are kept
    assert ("HTTP Request:" in text) is verbose, text
