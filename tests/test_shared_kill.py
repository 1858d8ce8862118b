"""`up` killed with SIGKILL while live traffic holds a shared server loses nothing.

A stand-in vLLM (`FakeVllm`) reports 16 live requests on a server of 16 slots, so the batch
is paused: its consumer holds a batch it may not send. The broker is killed; the live load
falls; a new `up` on the same data dir answers every line once, and the server saw each
line's request once (none went out while paused).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from cli_helpers import Broker
from fake_vllm import FakeVllm

DEADLINE_S = 60.0
LINES = 40


def ledger(b: Broker) -> dict[str, int]:
    out = b.run("status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["ledger"]


def wait_for(b: Broker, what: str, ok: object) -> dict[str, int]:
    deadline = time.monotonic() + DEADLINE_S
    while True:  # bounded polling of the broker's own status
        led = ledger(b)
        if ok(led):  # type: ignore[operator]
            return led
        assert time.monotonic() < deadline, f"{what}: {led}\n{b.logs()[-3000:]}"
        time.sleep(0.1)


def test_up_killed_while_the_batch_is_paused_loses_and_doubles_nothing(tmp_path: Path) -> None:
    fake = FakeVllm()
    fake.live = 16
    conf = tmp_path / "config" / "fabricctl" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'engine = "openai"\nmodel = "m"\n\n[vllm]\nendpoints = ["{fake.url}"]\n'
                    "shared = true\nshared_capacity = 16\n")
    lines = b"".join(json.dumps({"id": f"q{i}", "model": "m", "prompt": f"question {i}",
                                 "max_tokens": 4}).encode() + b"\n" for i in range(LINES))
    try:
        b = Broker(tmp_path / "broker", tmp_path, engine="openai", consumers=1)
        try:
            out = b.run("submit", "-", input=lines)
            assert out.returncode == 0, out.stderr
            wait_for(b, "the paused consumer holds a batch", lambda led: led["items_inflight"])
            assert fake.bodies() == []  # paused: nothing was sent
            b.proc.kill()
            b.proc.wait(timeout=30)
            b.log.close()
        finally:
            if b.proc.poll() is None:
                b.proc.kill()
        fake.live = 0
        again = Broker(tmp_path / "broker", tmp_path, engine="openai", consumers=1)
        try:
            led = wait_for(again, "every line answered",
                           lambda led: led["items_completed"] >= LINES)
            assert led["items_completed"] == LINES and led["items_queued"] == 0
            prompts = [body["prompt"] for body in fake.bodies()]
            assert sorted(prompts) == sorted(f"question {i}" for i in range(LINES))
        finally:
            assert again.stop() == 0
    finally:
        fake.close()
