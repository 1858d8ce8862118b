"""Windows that hold through the whole product (issue 41): `fabricctl up` on the simulated
engine (two GPUs, slowed so a job lasts seconds) and `submit --window` as subprocesses.
T is one job served alone, measured first on the same broker; equal jobs (two shapes of
their own each, `max_tokens` 4) are then submitted together with windows of k x T (whole
seconds, rounded up), which earliest deadline first meets: three windows (1.4T, 2.4T,
3.4T) are all met (fair share between equal priorities served them side by side and sank
the first), none called late, each first prediction (once every input is in) near its
finish; so are five (1.2T to 5.2T, a second added to each, as the bench does: five inputs
take longer to read than one); with a fourth out of reach (0.5T) among three (a second
added to theirs likewise), that one is
said early in its window (at risk or given up: bench/deadlines_up_bench.py measures the
first quarter), given up while it still runs (a `job_hopeless` event) and the three others
are met. The forecast starts from the pace the alone run measured (`core.pace`)."""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import FABRICCTL, Broker
from workload_files import job_lines

from fabricctl.core.jobs import JobRecord
from fabricctl.wire.client import Client

LINES = 4000  # per job, as in the issue: T is about 4 s at time_scale 2 on a quiet box
SCALE = 2.0


def lines(n: int, tag: str) -> str:
    """`n` lines over two prefixes of the job's own, `max_tokens` 4 (the issue's jobs)."""
    return job_lines(n, 2, tag, max_tokens=4)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "fabric.toml").write_text(f"[sim]\ngpus = 2\ntime_scale = {SCALE}\n")
    b = Broker(tmp_path / "data", home)
    yield b
    b.stop()


def ask(b: Broker, question: Callable[[Client], Awaitable[Any]]) -> Any:
    """One question's answer (`question`: a typed `Client` method, e.g. `Client.status`)."""
    async def go() -> Any:
        c = await Client.connect(b.data_dir, "observer", "test", timeout=5.0)
        try:
            return await question(c)
        finally:
            await c.close()
    return asyncio.run(go())


def records(b: Broker) -> dict[str, JobRecord]:
    return {Path(j.name).name: j for j in ask(b, Client.jobs)}


def submit(b: Broker, path: Path, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*FABRICCTL, "submit", str(path), "--wait", *flags,
                             "--data-dir", str(b.data_dir)], env=b.env, cwd=b.home,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def alone(b: Broker, folder: Path) -> float:
    """T: one job served alone on this broker (its completion minus its creation)."""
    path = folder / "alone.jsonl"
    path.write_text(lines(LINES, "solo"))
    p = submit(b, path)
    assert p.wait(300) == 0, p.stderr.read() if p.stderr else ""
    end = time.monotonic() + 60
    while time.monotonic() < end:  # `submit --wait` may return while the job finalizes
        rec = records(b)["alone.jsonl"]
        if rec.ended:
            return rec.times["completed"] - rec.created
        time.sleep(0.05)
    raise AssertionError(f"job not ended: {records(b)['alone.jsonl']}")


def together(b: Broker, folder: Path, ks: dict[str, float], t: float,
             first: dict[str, float] | None = None, plus: dict[str, float] | None = None
             ) -> tuple[dict[str, JobRecord], dict[str, float]]:
    """The jobs submitted at once, each with a window of k x T + its `plus` (rounded up to whole
    seconds, as `--window` takes them); polled until all ended: (their records, when each was first
    seen at risk after its submit); `first` gets each job's first predicted finish (unix
    seconds) once every job's input is in (a forecast cannot count a job not yet sent)."""
    procs = []
    for name in ks:
        (folder / name).write_text(lines(LINES, name.split(".")[0]))
    for name, k in ks.items():
        procs.append(submit(b, folder / name, "--window",
                            f"{max(1, math.ceil(k * t + (plus or {}).get(name, 0.0)))}s"))
    flagged: dict[str, float] = {}
    end = time.monotonic() + 300
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        now = time.time()
        recs = records(b)
        for row in ask(b, Client.status)["jobs"]:
            name = Path(row["name"]).name
            if row["at_risk"] and name not in flagged and name in recs:
                flagged[name] = now - recs[name].created
            if (first is not None and name in ks and row["predicted_finish"] is not None
                    and all(n in recs and recs[n].sealed for n in ks)):
                first.setdefault(name, row["predicted_finish"])
        time.sleep(0.1)
    for p in procs:
        assert p.wait(60) in (0, 1), p.stderr.read() if p.stderr else ""
    while time.monotonic() < end:  # `submit --wait` may return while a job finalizes
        recs = records(b)
        if all(recs[name].ended for name in ks):
            return recs, flagged
        time.sleep(0.05)
    raise AssertionError(f"jobs not ended: {records(b)}")


def test_three_windows_met_earliest_deadline_first(broker: Broker, tmp_path: Path) -> None:
    t = alone(broker, tmp_path)
    ks = {"a.jsonl": 1.4, "b.jsonl": 2.4, "c.jsonl": 3.4}
    first: dict[str, float] = {}
    recs, flagged = together(broker, tmp_path, ks, t, first)
    states = {n: (recs[n].state.value, recs[n].completed) for n in ks}
    assert all(s == "completed" for s, _ in states.values()), (t, states)
    assert not flagged, flagged  # no job that makes its window is called late
    # the first prediction holds (bench/deadlines_up_bench.py measures the 25% target; the
    # floored first-seconds rate this replaced was 35% to 50% late)
    errors = {n: (first[n] - recs[n].times["completed"]) / (recs[n].times["completed"]
                                                            - recs[n].created) for n in ks}
    assert all(abs(e) <= 0.3 for e in errors.values()), errors
    ends = [recs[n].times["completed"] for n in ks]
    assert ends == sorted(ends), "served earliest deadline first"
    hopeless = [e for e in ask(broker, lambda c: c.events(0, 10_000))
                if e.kind == "job_hopeless"]
    assert not hopeless, hopeless


def test_a_window_out_of_reach_is_given_up_and_the_others_met(broker: Broker,
                                                               tmp_path: Path) -> None:
    t = alone(broker, tmp_path)
    ks = {"doomed.jsonl": 0.5, "a.jsonl": 1.4, "b.jsonl": 2.4, "c.jsonl": 3.4}
    # (a second added to the three others' windows, as the bench does: four inputs take
    # longer to read than one)
    recs, flagged = together(broker, tmp_path, ks, t,
                             plus={n: 1.0 for n in ks if n != "doomed.jsonl"})
    doomed = recs["doomed.jsonl"]
    states = {n: (recs[n].state.value, recs[n].completed) for n in ks if n != "doomed.jsonl"}
    assert all(s == "completed" for s, _ in states.values()), (t, states)
    assert doomed.state.value == "expired"
    assert doomed.deadline is not None
    window = doomed.deadline - doomed.created
    # said early: at risk within its window (the event's time), and given up while it still
    # ran (the event names it); no other job called late
    events = ask(broker, lambda c: c.events(0, 10_000))
    said = [e.t for e in events if e.kind in ("job_at_risk", "job_hopeless")
            and e.value == doomed.number]
    # (before its window ends; the bench measures the first quarter, which a box loaded
    # enough to take seconds to read the four inputs cannot keep)
    assert said and min(said) - doomed.created < window, (said, doomed.created, window)
    assert set(flagged) == {"doomed.jsonl"}, flagged
    given_up = [e for e in events if e.kind == "job_hopeless"]
    assert [e.value for e in given_up] == [doomed.number], given_up
    assert given_up[0].t < doomed.deadline


def test_five_windows_from_1_2_to_5_2_are_all_met(broker: Broker, tmp_path: Path) -> None:
    t = alone(broker, tmp_path)
    ks = {f"j{k}.jsonl": 1.2 + k for k in range(5)}
    recs, _ = together(broker, tmp_path, ks, t, plus=dict.fromkeys(ks, 1.0))
    states = {n: (recs[n].state.value, recs[n].completed) for n in ks}
    assert all(s == "completed" for s, _ in states.values()), (t, states)
