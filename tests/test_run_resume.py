"""`fabricctl run FILE --data-dir D` killed with SIGKILL mid-job and run again: the second
run attaches to the job, sends only the items with no outcome yet (counted at the engine:
a `FakeVllm` on a real socket, records every request), and the output file ends with
exactly one line per input item."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from cli_helpers import FABRICCTL, clean_env
from fake_vllm import FakeVllm

N = 600
DEADLINE_S = 120.0


def config(url: str) -> str:
    return (f'model = "m"\nengine = "openai"\n[vllm]\nendpoints = ["{url}"]\n'
            "[consumer]\nmax_batch_size = 8\nmax_batch_tokens = 4096\nmax_input_len = 500\n")


def test_a_killed_run_continues_without_sending_a_completed_item_again(tmp_path: Path) -> None:
    fake = FakeVllm(delay_s=0.03)
    # the second run talks to a server of its own: a request the killed run had sent may
    # reach the first one after the kill, and must not count as the second run's
    fake2 = FakeVllm(delay_s=0.03)
    try:
        (tmp_path / "fabric.toml").write_text(config(fake.url))
        src = tmp_path / "in.jsonl"
        src.write_text("".join(json.dumps({"id": f"r{i}", "model": "m", "prefix": [f"S{i % 5}"],
                                           "prompt": f"q{i}", "max_tokens": 4}) + "\n"
                               for i in range(N)))
        data, out = tmp_path / "data", tmp_path / "out.jsonl"
        cmd = [*FABRICCTL, "run", str(src), "--data-dir", str(data), "-o", str(out)]
        env = clean_env(tmp_path)
        first = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        deadline = time.monotonic() + DEADLINE_S
        while len(fake.requests) < N // 4:  # a quarter answered: mid-job
            assert first.poll() is None, first.stderr.read() if first.stderr else b""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        assert len(fake.requests) < N
        (tmp_path / "fabric.toml").write_text(config(fake2.url))

        second = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True,
                                timeout=DEADLINE_S)
        assert second.returncode == 0, second.stderr
        m = re.search(rb"continuing job (batch_\w+) .*: (\d+) items stored, (\d+) with an "
                      rb"outcome", second.stderr)
        assert m, second.stderr
        done_before = int(m.group(3))
        assert 0 < done_before < N
        sent = [b["prompt"] for b in fake2.bodies()]
        assert len(sent) == len(set(sent)) == N - done_before  # each item without an outcome
        ids = [json.loads(ln)["id"] for ln in out.read_bytes().splitlines()]
        assert sorted(ids) == sorted(f"r{i}" for i in range(N))  # one line per item
    finally:
        fake.close()
        fake2.close()
