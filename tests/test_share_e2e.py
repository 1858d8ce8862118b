"""Jobs sharing one fleet, through the whole product: `fabricctl up` on the simulated engine
(two GPUs, slowed down so a big job lasts seconds), `submit`, `jobs show` and `jobs priority`
as subprocesses. What is asserted is order, not speed: a small job submitted behind a big
one, or behind a producer still streaming, finishes while the big one still has work; a
priority raised on a live job makes it finish first; three windows the fleet can meet only
by serving their jobs first (earliest deadline first) are met; a window it cannot meet is
flagged well before it expires."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import FABRICCTL, Broker
from workload_files import job_lines

from fabricctl.core.jobs import JobRecord
from fabricctl.wire.client import Client

SLOW = "[sim]\ngpus = 2\ntime_scale = {scale}\n[broker]\n{broker}"


def lines(n: int, shapes: int, tag: str) -> str:
    return job_lines(n, shapes, tag, max_tokens=16)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Any]:
    started: list[Broker] = []

    def start(scale: float = 1.0, broker: str = "") -> Broker:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        (home / "fabric.toml").write_text(SLOW.format(scale=scale, broker=broker))
        b = Broker(tmp_path / "data", home)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


def submit(b: Broker, path: Path, *flags: str) -> subprocess.Popen[bytes]:
    """`submit FILE --wait` in the background (its results go to a file)."""
    out = open(path.with_suffix(".out"), "wb")  # noqa: SIM115
    return subprocess.Popen([*FABRICCTL, "submit", str(path), "--wait", *flags,
                             "--data-dir", str(b.data_dir)], env=b.env, cwd=b.home,
                            stdout=out, stderr=subprocess.PIPE)


def show(b: Broker, name: str) -> dict[str, Any] | None:
    """`jobs show ID --json` of the job whose input is NAME (None before it opened)."""
    p = b.run("jobs", "--json")
    assert p.returncode == 0, p.stderr
    jobs = [j for j in json.loads(p.stdout)["jobs"] if j.get("name", "").endswith(name)]
    if not jobs:
        return None
    p = b.run("jobs", "show", jobs[0]["id"], "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def job_of(b: Broker, name: str) -> dict[str, Any]:
    """The job record of the job whose input is NAME (through the CLI)."""
    view = show(b, name)
    assert view is not None, f"no job for {name}"
    return view["job"]


def record(b: Broker, name: str) -> JobRecord | None:
    """The job record of the job whose input is NAME, read over the wire (cheap to poll)."""
    async def read() -> list[JobRecord]:
        c = await Client.connect(b.data_dir, "observer", "test", timeout=5.0)
        try:
            return await c.jobs()
        finally:
            await c.close()

    found = [j for j in asyncio.run(read()) if j.name.endswith(name)]
    return found[0] if found else None


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = check()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def done(b: Broker, name: str) -> int:
    j = record(b, name)
    return 0 if j is None else j.completed + j.failed


def accepted(b: Broker, name: str, n: int) -> bool:
    j = record(b, name)
    return j is not None and j.total == n


def test_a_small_job_behind_a_big_one_does_not_wait_for_it(up: Any, tmp_path: Path) -> None:
    b = up()
    big = tmp_path / "big.jsonl"
    big.write_text(lines(20_000, 6, "big"))
    small = tmp_path / "small.jsonl"
    small.write_text(lines(300, 1, "small"))
    pb = submit(b, big)
    wait_for("the big job to start", lambda: done(b, "big.jsonl") > 1000)
    ps = submit(b, small)
    assert ps.wait(300) == 0, ps.stderr.read() if ps.stderr else ""
    left = 20_000 - done(b, "big.jsonl")
    assert left > 2000, f"the small job finished only as the big one ended ({left} left)"
    assert job_of(b, "small.jsonl")["state"] == "completed"
    assert pb.wait(300) == 0


@pytest.mark.parametrize("how", ["jobs priority", "submit --priority"])
def test_a_raised_priority_goes_first(up: Any, tmp_path: Path, how: str) -> None:
    """A long job submitted behind a shorter one at priority 9 (or raised to it while both
    run) ends first; without it the shorter, earlier one would (fair share, shortest first)."""
    b = up()
    short = tmp_path / "short.jsonl"
    short.write_text(lines(5000, 3, "short"))
    long = tmp_path / "long.jsonl"
    long.write_text(lines(7500, 3, "long"))
    ps = submit(b, short)
    wait_for("the short job to be accepted", lambda: accepted(b, "short.jsonl", 5000))
    pl = submit(b, long, *(["--priority", "9"] if how == "submit --priority" else []))
    wait_for("the long job to be accepted", lambda: accepted(b, "long.jsonl", 7500))
    if how == "jobs priority":
        p = b.run("jobs", "priority", job_of(b, "long.jsonl")["id"], "9")
        assert p.returncode == 0, p.stderr
    assert job_of(b, "long.jsonl")["priority"] == 9
    at_raise = done(b, "short.jsonl")
    assert pl.wait(300) == 0
    after = done(b, "short.jsonl") - at_raise
    # judged from the raise on: on a loaded box the CLIs are slow and the short job, alone
    # until then, may be far along. Fair share would give it about half the fleet and finish
    # it (measured here: 113 more of the 3,983 it had left at the raise)
    left = 5000 - at_raise
    assert after < max(300, left / 2), f"the raised job did not go first: the other did " \
        f"{after} of its {left} left at the raise"
    assert ps.wait(300) == 0


def test_three_windows_met_earliest_deadline_first(up: Any, tmp_path: Path) -> None:
    """Three jobs with windows behind a big one without: biggest-first (no fair share) would
    serve the big job's shapes first (about 20 s) and miss all three; earliest deadline
    first meets all three while the big job still has most of its work."""
    b = up(broker="fair_share = false\n")
    big = tmp_path / "big.jsonl"
    big.write_text(lines(24_000, 2, "big"))
    jobs = {"c.jsonl": (1200, "10s"), "b.jsonl": (2400, "14s"), "a.jsonl": (3600, "20s")}
    for name, (n, _) in jobs.items():
        (tmp_path / name).write_text(lines(n, 2, name[0]))
    pb = submit(b, big)
    wait_for("the big job to start", lambda: done(b, "big.jsonl") > 500)
    ps = [submit(b, tmp_path / name, "--window", window) for name, (_, window) in jobs.items()]
    for p in ps:
        assert p.wait(300) == 0, p.stderr.read() if p.stderr else ""
    left = 24_000 - done(b, "big.jsonl")
    for name in jobs:
        assert job_of(b, name)["state"] == "completed", name  # not expired: its window met
    assert left > 4000, f"the windows were met only as the big job ended ({left} left)"
    assert pb.wait(300) == 0


def test_an_infeasible_window_is_flagged_early(up: Any, tmp_path: Path) -> None:
    b = up()
    big = tmp_path / "big.jsonl"
    big.write_text(lines(20_000, 6, "big"))
    t0 = time.monotonic()
    pb = submit(b, big, "--window", "12s")

    def at_risk() -> bool:
        view = show(b, "big.jsonl") or {}
        return bool((view.get("place") or {}).get("at_risk"))  # through `jobs show --json`

    wait_for("the job to be flagged at risk", at_risk, timeout=12)
    assert time.monotonic() - t0 <= 9, "flagged less than a quarter of the window before"
    pb.wait(300)
    assert job_of(b, "big.jsonl")["state"] == "expired"
    logs = b.logs()  # the warning is logged on the broker's tick, after the flag
    assert "at risk" in logs and "after its deadline" in logs, logs[-3000:]


def test_a_small_job_behind_a_streaming_producer_does_not_wait_for_the_stream(
        up: Any, tmp_path: Path) -> None:
    """A producer streams into six shapes faster than the fleet drains them; a small job
    submitted meanwhile finishes while the stream is still going."""
    b = up()
    small = tmp_path / "small.jsonl"
    small.write_text(lines(300, 1, "small"))
    producer = subprocess.Popen([*FABRICCTL, "submit", "-", "--data-dir", str(b.data_dir)],
                                env=b.env, cwd=b.home, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert producer.stdin is not None
    feed = lines(40_000, 6, "stream").splitlines(keepends=True)
    sent = 0

    def send(n: int) -> None:
        nonlocal sent
        assert producer.stdin is not None
        producer.stdin.write("".join(feed[sent:sent + n]).encode())
        producer.stdin.flush()
        sent += n

    send(4000)
    wait_for("the stream to be served", lambda: done(b, "-") > 500)
    ps = submit(b, small)
    while ps.poll() is None and sent < len(feed):  # keep the big shapes fed meanwhile
        send(500)
        time.sleep(0.1)
    assert ps.wait(300) == 0
    assert sent < len(feed), "the stream ended before the small job did"
    assert job_of(b, "small.jsonl")["state"] == "completed"
    producer.stdin.close()
    b.run("jobs", "cancel", job_of(b, "-")["id"])  # the rest of the stream is not needed
    producer.wait(120)
