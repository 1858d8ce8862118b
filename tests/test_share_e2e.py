"""Jobs sharing one fleet, through the whole product: `fabricctl up` on the simulated engine
(two GPUs, slowed down so a big job lasts seconds), `submit`, `jobs show` and `jobs priority`
as subprocesses. What is asserted is order, not speed: a small job submitted behind a big
one, or behind a producer still streaming, finishes while the big one still has work; a
priority raised on a live job makes it finish first; a window the fleet can meet only by
serving its job first is met; a window it cannot meet is flagged well before it expires."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import FABRICCTL, Broker

SLOW = "[sim]\ngpus = 2\ntime_scale = {scale}\n[broker]\n{broker}"


def lines(n: int, shapes: int, tag: str) -> str:
    out = []
    for i in range(n):
        s = i % shapes
        system = f"[{tag}-{s}] You are assistant number {s}. " + "Answer briefly. " * 30
        out.append(json.dumps({"id": f"{tag}{i}", "model": "fabric-demo", "prefix": [system],
                               "prompt": f"Question {i}: what is {i} plus {s}?",
                               "max_tokens": 16}))
    return "\n".join(out) + "\n"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Any]:
    started: list[Broker] = []

    def start(scale: float = 0.05, broker: str = "") -> Broker:
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
    """The job record of the job whose input is NAME."""
    view = show(b, name)
    assert view is not None, f"no job for {name}"
    return view["job"]


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = check()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def done(b: Broker, name: str) -> int:
    view = show(b, name)
    if view is None:
        return 0
    j = view["job"]
    return int(j.get("completed", 0)) + int(j.get("failed", 0))


def test_a_small_job_behind_a_big_one_does_not_wait_for_it(up: Any, tmp_path: Path) -> None:
    b = up()
    big = tmp_path / "big.jsonl"
    big.write_text(lines(6000, 6, "big"))
    small = tmp_path / "small.jsonl"
    small.write_text(lines(300, 1, "small"))
    pb = submit(b, big)
    wait_for("the big job to start", lambda: done(b, "big.jsonl") > 200)
    ps = submit(b, small)
    assert ps.wait(300) == 0, ps.stderr.read() if ps.stderr else ""
    j = job_of(b, "big.jsonl")
    assert j["state"] == "in_progress" and done(b, "big.jsonl") < 6000, (
        "the small job finished only after the big one")
    assert job_of(b, "small.jsonl")["state"] == "completed"
    assert pb.wait(300) == 0


def test_a_raised_priority_goes_first(up: Any, tmp_path: Path) -> None:
    b = up()
    first = tmp_path / "first.jsonl"
    first.write_text(lines(3000, 3, "first"))
    second = tmp_path / "second.jsonl"
    second.write_text(lines(3000, 3, "second"))
    pf = submit(b, first)
    wait_for("the first job to start", lambda: done(b, "first.jsonl") > 100)
    p2 = submit(b, second)
    wait_for("the second job to be accepted",
             lambda: (show(b, "second.jsonl") or {"job": {}})["job"].get("total") == 3000)
    jid = job_of(b, "second.jsonl")["id"]
    p = b.run("jobs", "priority", jid, "9")
    assert p.returncode == 0, p.stderr
    assert job_of(b, "second.jsonl")["priority"] == 9
    assert p2.wait(300) == 0
    assert done(b, "first.jsonl") < 3000, "the raised job did not go first"
    assert pf.wait(300) == 0


def test_a_window_met_by_going_first(up: Any, tmp_path: Path) -> None:
    """Jobs one after another (no fair share): only its deadline puts the later, smaller
    job before the big one, whose shapes have more tokens."""
    b = up(broker="fair_share = false\n")
    big = tmp_path / "big.jsonl"
    big.write_text(lines(6000, 2, "big"))
    urgent = tmp_path / "urgent.jsonl"
    urgent.write_text(lines(600, 2, "urgent"))
    pb = submit(b, big)
    wait_for("the big job to start", lambda: done(b, "big.jsonl") > 100)
    pu = submit(b, urgent, "--window", "2m")
    assert pu.wait(300) == 0
    assert job_of(b, "urgent.jsonl")["state"] == "completed"
    assert done(b, "big.jsonl") < 6000, "the deadline did not put its job first"
    assert pb.wait(300) == 0


def test_an_infeasible_window_is_flagged_early(up: Any, tmp_path: Path) -> None:
    b = up(scale=0.2)
    big = tmp_path / "big.jsonl"
    big.write_text(lines(6000, 6, "big"))
    t0 = time.monotonic()
    pb = submit(b, big, "--window", "40s")

    def at_risk() -> bool:
        view = show(b, "big.jsonl") or {}
        return bool((view.get("place") or {}).get("at_risk"))

    wait_for("the job to be flagged at risk", at_risk, timeout=30)
    assert time.monotonic() - t0 <= 30, "flagged less than a quarter of the window before"
    logs = b.logs()
    pb.wait(300)
    assert job_of(b, "big.jsonl")["state"] == "expired"
    assert "after its deadline" in logs or "at risk" in logs.lower()
