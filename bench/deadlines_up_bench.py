"""Jobs with completion windows sharing `fabricctl up --engine sim`: are the windows met?

The scenario of issue 41: `--jobs` equal jobs of `--lines` lines each (two shapes of their
own each, `max_tokens` 4) on the simulator (2 GPUs, `[sim] time_scale`). T, one job served
alone, is measured first (or given with `--T`); then the jobs are submitted together with
windows of k x T + `--plus` seconds for each k of `--windows`, rounded to whole seconds as
`--window` takes them (served one after another, earliest window first, a job of rank r
finishes near r x T: each k >= r + 0.4 is met). Reported per job: its window, its state,
its items done, when it finished (seconds after it was submitted), whether its window was
met, its first predicted finish once every job's input is in (from `status`, seconds after
its submit; a forecast cannot count a job not yet sent) and that prediction's error against
the finish (`first_prediction_error`), when it was
first flagged at risk, when its last line was accepted and when its window was given up
(`job_hopeless`). Everything goes through the CLI and the socket, as a user's would;
nothing is mocked.

    .venv/bin/python bench/deadlines_up_bench.py                        # the issue's scenario
    .venv/bin/python bench/deadlines_up_bench.py --windows 1.2,2.2,3.2,4.2,5.2 --jobs 5
    .venv/bin/python bench/deadlines_up_bench.py --windows 0.5,1.4,2.4,3.4 --jobs 4 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # workload_files

from workload_files import job_lines

from fabricctl.wire.client import Client

ROOT = Path(__file__).resolve().parent.parent
FABRICCTL = [sys.executable, "-m", "fabricctl"]


@dataclass
class Outcome:
    """Why: one row of the report: what became of one job and what was said of it."""

    name: str
    window_s: float
    state: str = ""
    done: int = 0
    total: int = 0
    finished_s: float | None = None  # after its submit
    met: bool = False
    first_prediction_s: float | None = None  # the first predicted finish, after its submit
    first_prediction_error: float | None = None  # (first prediction - finished) / finished
    flagged_s: float | None = None  # first seen at risk, after its submit
    accepted_s: float | None = None  # every line accepted (read and stored), after its submit
    given_up_s: float | None = None  # its window said out of reach (`job_hopeless`), after


class Up:
    """Why: one `fabricctl up --engine sim` in a scratch dir, asked over its socket."""

    def __init__(self, folder: Path, scale: float) -> None:
        self.home = folder / "home"
        (self.home / "config").mkdir(parents=True)
        (self.home / "fabric.toml").write_text(f"[sim]\ngpus = 2\ntime_scale = {scale}\n")
        self.data = folder / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_",
                                                                             "XDG_"))}
        self.env.update(XDG_CONFIG_HOME=str(self.home / "config"), NO_COLOR="1",
                        PYTHONPATH=str(ROOT))
        self.log = open(folder / "up.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([*FABRICCTL, "up", "--data-dir", str(self.data),
                                      "--engine", "sim"], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=self.env, cwd=self.home)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if int(self.ask(Client.status)["consumers"]) >= 2:
                    return
            except Exception:  # not up yet
                time.sleep(0.1)
        raise RuntimeError("fabricctl up did not answer in 60 s")

    def ask(self, question: Callable[[Client], Awaitable[Any]]) -> Any:
        """One question's answer (`question`: a typed `Client` method)."""
        async def go() -> Any:
            c = await Client.connect(self.data, "observer", "bench", timeout=2.0)
            try:
                return await question(c)
            finally:
                await c.close()
        return asyncio.run(go())

    def records(self) -> dict[str, Any]:
        async def go() -> Any:
            c = await Client.connect(self.data, "observer", "bench", timeout=2.0)
            try:
                return await c.jobs()
            finally:
                await c.close()
        return {Path(j.name).name: j for j in asyncio.run(go())}

    def submit(self, path: Path, *flags: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*FABRICCTL, "submit", str(path), "--wait", *flags,
                                 "--data-dir", str(self.data)], env=self.env, cwd=self.home,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        subprocess.run([*FABRICCTL, "down", "--data-dir", str(self.data)], env=self.env,
                       cwd=self.home, capture_output=True, timeout=60)
        self.proc.wait(30)


def alone(up: Up, folder: Path, n: int) -> float:
    """T: one job of `n` lines served alone (its completion minus its creation)."""
    path = folder / "alone.jsonl"
    path.write_text(job_lines(n, 2, "solo", max_tokens=4))
    assert up.submit(path).wait(300) == 0
    end = time.monotonic() + 30  # every result is out; the job finalizes at the next tick
    while "completed" not in (rec := up.records()["alone.jsonl"]).times:
        assert time.monotonic() < end, rec
        time.sleep(0.05)
    return float(rec.times["completed"] - rec.created)


def together(up: Up, folder: Path, n: int, windows: list[float]) -> list[Outcome]:
    """The jobs submitted at once with their windows; polled until every one ended."""
    outcomes: dict[str, Outcome] = {}
    procs = []
    for k, window in enumerate(windows):
        name = f"job{k}.jsonl"
        (folder / name).write_text(job_lines(n, 2, f"j{k}x", max_tokens=4))
        outcomes[name] = Outcome(name, max(1, round(window)))  # whole seconds
    for name, o in outcomes.items():
        procs.append(up.submit(folder / name, "--window", f"{o.window_s:.0f}s"))
    while any(p.poll() is None for p in procs):
        now = time.time()
        recs = up.records()
        for name, rec in recs.items():
            o = outcomes.get(name)
            if o is not None and o.accepted_s is None and rec.total >= n:
                o.accepted_s = round(now - rec.created, 2)
        for row in up.ask(Client.status)["jobs"]:
            o = outcomes.get(Path(row["name"]).name)
            rec = recs.get(Path(row["name"]).name)
            if o is None or rec is None:
                continue
            whole = all(n in recs and recs[n].sealed for n in outcomes)  # every input in
            if o.first_prediction_s is None and row["predicted_finish"] is not None and whole:
                o.first_prediction_s = round(row["predicted_finish"] - rec.created, 2)
            if o.flagged_s is None and row["at_risk"]:
                o.flagged_s = round(now - rec.created, 2)
        time.sleep(0.1)
    end = time.monotonic() + 60
    while time.monotonic() < end:  # `submit --wait` may return while a job finalizes
        recs = up.records()
        if all(recs[name].state.ended for name in outcomes):
            break
        time.sleep(0.05)
    by_number = {recs[name].number: name for name in outcomes}
    for e in up.ask(lambda c: c.events(0, 100_000)):
        name = by_number.get(e.value)
        if e.kind == "job_hopeless" and name and outcomes[name].given_up_s is None:
            outcomes[name].given_up_s = round(e.t - recs[name].created, 2)
    for name, o in outcomes.items():
        rec = recs[name]
        o.state, o.done, o.total = rec.state.value, rec.completed + rec.failed, rec.total
        end = rec.times.get("completed")
        o.finished_s = None if end is None else round(end - rec.created, 2)
        o.met = o.state == "completed"
        if o.finished_s and o.first_prediction_s is not None:
            o.first_prediction_error = round((o.first_prediction_s - o.finished_s)
                                             / o.finished_s, 3)
    return list(outcomes.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=12000,
                    help="lines per job (T about 5 s: windows are whole seconds plus --plus, "
                    "so at T = 2 s a 0.5T window rounds up to about T, not out of reach)")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--windows", default="1.4,2.4,3.4", help="windows, in multiples of T")
    ap.add_argument("--plus", type=float, default=1.0, help="seconds added to each window")
    ap.add_argument("--scale", type=float, default=1.0, help="[sim] time_scale")
    ap.add_argument("--T", type=float, default=None, help="T, when known (else measured)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log", type=Path, default=None, help="keep the broker's log here")
    args = ap.parse_args(argv)
    ks = [float(k) for k in args.windows.split(",")]
    assert len(ks) == args.jobs, "one window per job"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        up = Up(folder, args.scale)
        try:
            t = args.T if args.T is not None else alone(up, folder, args.lines)
            rows = together(up, folder, args.lines, [k * t + args.plus for k in ks])
        finally:
            up.stop()
            if args.log is not None:
                args.log.write_bytes((folder / "up.log").read_bytes())
    met = sum(o.met for o in rows)
    errors = [abs(o.first_prediction_error) for o in rows
              if o.first_prediction_error is not None]
    worst = max(errors) if errors else None
    if args.json:
        print(json.dumps({"T": round(t, 2), "met": met, "worst_first_prediction_error": worst,
                          "jobs": [asdict(o) for o in rows]}))
    else:
        print(f"T (one job alone) = {t:.2f} s; {met} of {len(rows)} windows met; first "
              f"predictions within {'-' if worst is None else f'{worst:.0%}'} of the finish")
        print(f"{'job':10} {'window':>7} {'state':>10} {'done':>11} {'finished':>9} "
              f"{'1st pred':>9} {'error':>6} {'flagged':>8} {'accepted':>9} {'given up':>9}")
        for o in rows:
            fin = "-" if o.finished_s is None else f"{o.finished_s:.1f}"
            pred = "-" if o.first_prediction_s is None else f"{o.first_prediction_s:.1f}"
            err = ("-" if o.first_prediction_error is None
                   else f"{o.first_prediction_error:+.0%}")
            flag = "-" if o.flagged_s is None else f"{o.flagged_s:.1f}"
            acc = "-" if o.accepted_s is None else f"{o.accepted_s:.1f}"
            gone = "-" if o.given_up_s is None else f"{o.given_up_s:.1f}"
            print(f"{o.name:10} {o.window_s:>7.1f} {o.state:>10} {o.done:>5}/{o.total:<5} "
                  f"{fin:>9} {pred:>9} {err:>6} {flag:>8} {acc:>9} {gone:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
