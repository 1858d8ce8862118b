"""Jobs sharing one fleet, through the whole product: `fabricctl up` on the simulated engine and
`fabricctl submit --wait` as a user runs them.

Scenarios (each measured in one run, against its own standalone baseline):
- small behind big: a big job (`--big` lines over 6 shapes) submitted, then (`--delay` s
  later, or once a quarter of it is done) a 300-line job of its own shape. Reported: the
  small job's time behind the big one over its standalone time (target <= 2x), the big
  job's throughput over its standalone throughput (target >= 0.95x).
- behind a stream (`--stream S`): a producer streams into the big job's 6 shapes for S
  seconds; the small job is submitted `--delay` s in. Reported: its time over standalone.

Run: .venv/bin/python bench/share_bench.py [--big 20000] [--time-scale 0.1] [--stream 0]
[--json]. Figures are simulated-engine wall times on this machine (a shared, noisy box):
read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # workload_files: the lines the sharing tests submit

from workload_files import job_line_stream  # noqa: E402

FABRICCTL = [sys.executable, "-m", "fabricctl"]


def write(path: Path, it: Iterator[str]) -> Path:
    path.write_text("".join(ln + "\n" for ln in it))
    return path


class Up:
    """A `fabricctl up --engine sim` in its own data dir and environment."""

    def __init__(self, home: Path, time_scale: float, extra: str = "") -> None:
        self.home = home
        (home / "config").mkdir(parents=True, exist_ok=True)
        cfg = home / "fabric.toml"
        cfg.write_text(f"[sim]\ngpus = 2\ntime_scale = {time_scale}\n{extra}")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_", "XDG_"))}
        self.env.update(XDG_CONFIG_HOME=str(home / "config"), NO_COLOR="1", TERM="dumb",
                        PYTHONPATH=str(ROOT), FABRICCTL_DATA_DIR=str(home / "data"))
        self.log = open(home / "up.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([*FABRICCTL, "up", "--engine", "sim"], cwd=home,
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while self.run("status", "--json", check=False).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"up did not start: {(home / 'up.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def run(self, *args: str, check: bool = True, input: bytes | None = None
            ) -> subprocess.CompletedProcess[bytes]:
        p = subprocess.run([*FABRICCTL, *args], cwd=self.home, env=self.env,
                           capture_output=True, input=input, timeout=1800)
        if check and p.returncode != 0:
            raise SystemExit(f"fabricctl {' '.join(args)}: {p.stderr.decode()[-2000:]}")
        return p

    def submit_wait(self, path: Path, *flags: str) -> float:
        """Seconds `submit --wait` took (every result back)."""
        t0 = time.monotonic()
        self.run("submit", str(path), "--wait", *flags)  # results on stdout, captured
        return time.monotonic() - t0

    def progress(self, name: str) -> float:
        """The share of the job reading NAME with an outcome (0 before it opened)."""
        p = self.run("jobs", "--json", check=False)
        if p.returncode != 0:
            return 0.0
        for j in json.loads(p.stdout)["jobs"]:
            if j.get("name", "").endswith(name) and j.get("total"):
                return (j["completed"] + j["failed"] + j["cancelled"]) / j["total"]
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def small_behind_big(big: int, delay: float, time_scale: float, work: Path) -> dict[str, float]:
    big_f = write(work / "big.jsonl", job_line_stream(big, 6, "big", 16))
    small_f = write(work / "small.jsonl", job_line_stream(300, 1, "small", 16))
    up = Up(work / "alone-big", time_scale)
    big_alone = up.submit_wait(big_f)
    up.stop()
    up = Up(work / "alone-small", time_scale)
    small_alone = up.submit_wait(small_f)
    up.stop()
    up = Up(work / "shared", time_scale)
    out: dict[str, float] = {}

    def run_big() -> None:
        out["big"] = up.submit_wait(big_f)

    t = threading.Thread(target=run_big)
    t.start()
    if delay > 0:
        time.sleep(delay)
    else:  # when a quarter of the big job is done
        while up.progress("big.jsonl") < 0.25:  # each look is a process: look rarely
            time.sleep(0.5)
    out["at_progress"] = up.progress("big.jsonl")
    out["small"] = up.submit_wait(small_f)
    t.join()
    up.stop()
    return {"big_alone_s": round(big_alone, 2), "small_alone_s": round(small_alone, 2),
            "big_shared_s": round(out["big"], 2), "small_shared_s": round(out["small"], 2),
            "big_done_when_small_sent": round(out["at_progress"], 3),
            "small_slowdown": round(out["small"] / small_alone, 2),
            "big_throughput_ratio": round(big_alone / out["big"], 3)}


def behind_stream(seconds: float, rate: int, delay: float, time_scale: float, work: Path
                  ) -> dict[str, float]:
    small_f = write(work / "small.jsonl", job_line_stream(300, 1, "small", 16))
    up = Up(work / "stream-alone", time_scale)
    small_alone = up.submit_wait(small_f)
    up.stop()
    up = Up(work / "stream", time_scale)
    producer = subprocess.Popen([*FABRICCTL, "submit", "-", "--wait"],
                                cwd=up.home, env=up.env, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert producer.stdin is not None
    t0 = time.monotonic()
    sent = 0
    done: dict[str, float] = {}

    def small() -> None:
        time.sleep(delay)
        done["small"] = up.submit_wait(small_f)
        done["at"] = time.monotonic() - t0

    t = threading.Thread(target=small)
    t.start()
    while time.monotonic() - t0 < seconds:
        want = int((time.monotonic() - t0) * rate)
        chunk = "".join(ln + "\n" for ln in job_line_stream(want - sent, 6, "stream", 16, sent))
        producer.stdin.write(chunk.encode())
        producer.stdin.flush()
        sent = want
        time.sleep(0.05)
    producer.stdin.close()
    t.join()
    producer.wait(1800)
    up.stop()
    return {"stream_s": seconds, "stream_lines": sent, "small_alone_s": round(small_alone, 2),
            "small_behind_stream_s": round(done["small"], 2),
            "small_done_at_s": round(done["at"], 2),
            "small_slowdown": round(done["small"] / small_alone, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", type=int, default=20_000)
    ap.add_argument("--delay", type=float, default=0.0,
                    help="seconds before the small job (0: once a quarter of the big is done)")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--stream", type=float, default=0.0, help="seconds of streaming (0: skip)")
    ap.add_argument("--rate", type=int, default=1500, help="streamed lines per second")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="share-bench-") as tmp:
        work = Path(tmp)
        res: dict[str, object] = {"simulated": True, "time_scale": a.time_scale,
                                  "small_behind_big": small_behind_big(a.big, a.delay,
                                                                       a.time_scale, work)}
        if a.stream > 0:
            res["behind_stream"] = behind_stream(a.stream, a.rate, 5.0, a.time_scale, work)
    if a.json:
        print(json.dumps(res))
        return 0
    for name, figs in res.items():
        if isinstance(figs, dict):
            print(f"{name}:")
            for k, v in figs.items():
                print(f"  {k:24} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
