"""fabricctl.producer alone (no CLI) against a running broker (`fabricctl up --engine sim`).

Promises checked: importing the library loads neither the CLI, the TUI nor the server; a
Python producer opens a job with its terms, submits dicts and JSONL strings (a bad line and
a duplicate refused with their line numbers, the rest in), seals it, and reads every result
once each until the job ends; the same job attached again skips what it stored; a second
job is cancelled and says so.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ROOT, Broker

from fabricctl.core.jobs import JobState
from fabricctl.producer import FeedHooks, Producer


def test_importing_the_producer_loads_no_cli_tui_or_server() -> None:
    code = ("import sys, fabricctl.producer; print(sorted(m for m in sys.modules if "
            "m.startswith(('fabricctl.cli', 'fabricctl.tui', 'fabricctl.server', "
            "'fabricctl.store', 'fabricctl.api', 'textual', 'typer', 'lmdb'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("producer-lib")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


def _line(i: int) -> dict[str, object]:
    return {"id": f"q{i}", "model": "fabric-demo", "prefix": [f"SYS-{i % 3}"],
            "prompt": f"question {i}", "max_tokens": 4}


def test_a_producer_submits_follows_and_ends_a_job(broker: Broker) -> None:
    n = 300

    async def go() -> None:
        async with await Producer.connect(broker.data_dir, name="lib-test") as p:
            job = await p.open_job(name="lib", priority=3, window_s=3600)
            assert not job.attached and job.record.priority == 3
            refused: list[str] = []
            lines: list[object] = [_line(i) for i in range(n)]
            lines.insert(10, "not json at all")  # line 11
            lines.append(json.dumps(_line(5)))  # line n + 2: a duplicate id
            feed = await job.submit(lines,  # type: ignore[arg-type]
                                    hooks=FeedHooks(on_refused=refused.append))
            assert feed.accepted == n and feed.lines == n + 2
            assert [m.split(":")[0] for m in refused] == ["line 11", f"line {n + 2}"]
            record = await job.seal()
            assert record.sealed and record.rejected == 2
            got = [rec.id async for rec in job.results()]
            assert sorted(got) == sorted(f"q{i}" for i in range(n))  # each once
            # every outcome is in: the job is finalizing or has completed
            assert job.record.state in (JobState.FINALIZING, JobState.COMPLETED)
            assert job.record.completed == n

            again = await p.open_job(job=job.id)
            assert again.attached and again.id == job.id
            feed = await again.submit([_line(i) for i in range(n)])
            assert feed.skipped == n and feed.accepted == 0

            other = await p.open_job(name="to-cancel")
            await other.submit([_line(i) for i in range(50)])
            record = await other.cancel()
            assert record.state in (JobState.CANCELLING, JobState.CANCELLED)
            async for _ in other.results():  # ends once the cancel is through
                pass
            assert other.record.state in (JobState.CANCELLED, JobState.FINALIZING)
            assert other.record.completed + other.record.cancelled == 50

    asyncio.run(asyncio.wait_for(go(), 120))


def test_the_readme_producer_runs_as_written(broker: Broker, tmp_path: Path) -> None:
    """The README's producer (section "From Python"), as written, finds this broker as the
    commands do (here by `FABRICCTL_DATA_DIR`) and prints one line per result."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### From Python"):]
    start = section.index("```python\n") + 10
    code = section[start:section.index("\n```", start)]
    assert "asyncio.run(main())" in code and len(code.splitlines()) <= 15
    script = tmp_path / "producer.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120,
                         env={**broker.env, "FABRICCTL_DATA_DIR": str(broker.data_dir)})
    assert out.returncode == 0, out.stderr
    assert sorted(ln.split()[0] for ln in out.stdout.splitlines()) == sorted(
        f"q{i}" for i in range(100))
