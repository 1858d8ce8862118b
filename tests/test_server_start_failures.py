"""A vLLM server that cannot start is reported at once and stops `run` and `up`, not retried in
silence.

Promises checked, through `fabricctl` as a subprocess with a `[vllm] command` that prints a
recognisable error and exits 1 (engine vllm, `gpus` set, so no NVML is needed):
- `run` exits 6 within seconds (`[vllm] start_attempts` failed starts: a crash loop), its
  stderr holds, without `-v`, the error line from the server's log, the log's path and a
  one-line error naming the log; that log still exists after `run` returned (its temporary
  data dir is kept, and stderr says where).
- `up` with the same configuration exits 6 the same way, naming the log in its data dir.
- `up` with a fleet of two servers, one of which crash-loops, keeps serving on the other,
  says which server it serves without and why, and `status` (human and `--json`) shows the
  failed server with its reason, exit status and log.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from cli_helpers import Broker, clean_env, fabricctl
from test_launcher import FAKE, free_port

BROKEN = "PackageNotFoundError: No package metadata was found for vllm"


def broken_config(tmp_path: Path) -> Path:
    """engine vllm on GPU 0 whose server prints BROKEN and exits 1; restarts 50 ms apart."""
    command = [sys.executable, "-c", f"import sys; print({BROKEN!r}); sys.exit(1)"]
    path = tmp_path / "broken.toml"
    path.write_text(f'engine = "vllm"\ngpus = [0]\n[vllm]\ncommand = {json.dumps(command)}\n'
                    f"port_base = {free_port()}\nrestart_backoff_s = [0.05]\n")
    return path


def named_log(stderr: str) -> Path:
    """The engine log the one-line error names."""
    error = [ln for ln in stderr.splitlines() if ln.startswith("fabricctl: error: ")]
    assert len(error) == 1, stderr
    m = re.search(r"crash loop: 3 starts in a row failed before it was ever ready \(last: "
                  r"exited with 1\); see (\S+engine-0\.log)(; hint: .+)?$", error[0])
    assert m, stderr
    return Path(m.group(1))


def test_run_with_a_server_that_cannot_start_exits_6_at_once_and_keeps_its_log(
        tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hi", "max_tokens": 4}\n')
    env = clean_env(tmp_path, TMPDIR=str(tmp_path))  # the run's temporary data dir in here
    t0 = time.monotonic()
    run = fabricctl("run", "in.jsonl", "--config", str(broken_config(tmp_path)), env=env,
                    cwd=tmp_path, timeout=90)
    took = time.monotonic() - t0
    err = run.stderr.decode()
    assert run.returncode == 6, err
    assert took < 60, took  # the exits decide, not ready_timeout_s (600 s)
    log = named_log(err)
    # the first failure, with the log's last lines, came before the error: no -v needed
    assert f"the last line of {log}:\n  | {BROKEN}\n" in err, err
    assert err.index(BROKEN) < err.index("fabricctl: error: ")
    # vLLM's cause has a known remedy: said under the tail and in the error
    assert err.count("hint: this install's `vllm` command cannot find its own package") == 2
    assert log.is_file() and log.read_text().splitlines().count(BROKEN) == 3  # kept where it says
    kept = log.parent.parent
    assert kept.parent == tmp_path and kept.name.startswith("fabricctl-run-")
    assert f"its data dir is kept: {kept}" in err


def test_up_with_a_server_that_cannot_start_exits_6_naming_the_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = fabricctl("up", "--config", str(broken_config(tmp_path)), "--data-dir", str(data),
                   env=clean_env(tmp_path), cwd=tmp_path, timeout=90)
    err = up.stderr.decode()
    assert up.returncode == 6, err
    log = named_log(err)
    assert log == data / "logs" / "engine-0.log" and log.read_text().splitlines().count(BROKEN) == 3
    assert f"  | {BROKEN}" in err  # the first failure's log tail, without -v


def test_up_serves_on_without_a_server_in_a_crash_loop_and_status_shows_it(
        tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text(
        f'engine = "vllm"\n[vllm]\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        f"port_base = {free_port(2)}\nrestart_backoff_s = [0.05]\nready_timeout_s = 30\n"
        '[[servers]]\nmodel = "good"\ngpus = [[0]]\n'
        '[[servers]]\nmodel = "bad"\ngpus = [[1]]\n'
        f'extra_args = ["--fail-start", "{BROKEN}"]\n')
    broker = Broker(tmp_path / "data", tmp_path, engine="vllm", consumers=1)
    try:
        log = tmp_path / "data" / "logs" / "engine-1.log"
        assert ("serving without 1 of 2 servers, which did not start: engine 1 (gpu 1, model "
                "bad): crash loop") in " ".join(broker.logs().split())
        st = broker.run("status", "--json")
        assert st.returncode == 0, st.stderr
        servers = json.loads(st.stdout)["extra"]["servers"]
        assert [(s["index"], s["state"]) for s in servers] == [(0, "ready"), (1, "failed")]
        bad = servers[1]
        assert (bad["model"], bad["gpus"], bad["last_exit"], bad["failed_starts"],
                bad["log"]) == ("bad", "1", 1, 3, str(log))
        assert bad["reason"].startswith("crash loop: 3 starts in a row failed")
        human = " ".join(broker.run("status").stdout.decode().split())
        assert (f"engine 1 (gpu 1, model bad) failed: crash loop: 3 starts in a row failed "
                f"before it was ever ready (last: exited with 1); see {log}; hint: ") in human
        assert human.count("; exit 1") == 1
        assert "engine 0 (gpu 0" not in human  # a ready server needs no line
    finally:
        assert broker.stop() == 0
