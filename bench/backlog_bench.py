"""A backlog far larger than what is in flight: what it costs the broker to hold, restart, drain.

One broker with no GPUs (`fabricctl up --gpus none --engine sim`), as a user runs it. Phases:
1. `fabricctl submit FILE` of `--items` native lines over `--shapes` shapes (Pareto-popular,
   each its own 1,000-character prefix; written outside the clock): items/s from the
   command's start to its exit (`submit_items_per_s`);
2. the broker process's anonymous RSS (`RssAnon`, /proc: the heap, not LMDB's mapped pages)
   before and after, over the items queued (`rss_bytes_per_queued_item`);
3. kill -9 of `up`, `up` again: seconds from its start until `status` answers with every item
   still queued (`restart_s`), and its anonymous RSS then;
4. with `--drain`, `fabricctl consume --engine sim --gpus 0,1` against it (`[sim] time_scale =
   0`: the simulated GPUs take no time): items/s until nothing is queued (`drain_items_per_s`).
With `--bad-line N`, line N of the file is not JSON: `submit` must report it by number (exit
1, `line N:` on stderr) and queue every other line (`bad_line_reported`). `--prefix-chars`
sizes the lines (a 10 GB file: `--items 2500000 --prefix-chars 4000`). Peaks are sampled
while `submit` runs: the broker's and `submit`'s anonymous RSS every 0.2 s (`rss_anon_peak_mb`,
`submit_peak_anon_mb`), and `submit`'s peak RSS with mapped files (`submit_peak_rss_mb`):
is memory flat as the file streams?
Everything goes through the CLI and the socket; nothing is mocked. This box is shared and
noisy: compare runs of the same N, and read RSS per item, not seconds.

    .venv/bin/python bench/backlog_bench.py                     # 200,000 items, a table
    .venv/bin/python bench/backlog_bench.py --items 2000000 --shapes 40 --drain --json
    .venv/bin/python bench/backlog_bench.py --items 2500000 --prefix-chars 4000 \
        --bad-line 2499000                                  # 10 GB, a bad line near its end
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricctl.wire.client import Client

ROOT = Path(__file__).resolve().parent.parent
FABRICCTL = [sys.executable, "-m", "fabricctl"]
MODEL = "fabric-demo"


@dataclass
class Figures:
    """Why: one run's figures, the table's rows and the JSON's keys."""

    items: int
    shapes: int
    submit_items_per_s: float = 0.0
    rss_anon_before_mb: float = 0.0
    rss_anon_queued_mb: float = 0.0
    rss_bytes_per_queued_item: float = 0.0
    restart_s: float = 0.0
    rss_anon_restarted_mb: float = 0.0
    drain_items_per_s: float | None = None
    file_bytes: int = 0
    rss_anon_peak_mb: float = 0.0  # the broker's, sampled while `submit` ran
    submit_peak_rss_mb: float = 0.0  # the `submit` process's own peak (mapped files too)
    submit_peak_anon_mb: float = 0.0  # its anonymous RSS, sampled: what it allocated
    bad_line: int | None = None
    bad_line_reported: bool | None = None  # `line N:` on stderr, exit 1, every other queued


def write_lines(path: Path, items: int, shapes: int, seed: int = 7, prefix_chars: int = 1000,
                bad_line: int | None = None) -> None:
    """`items` native lines, shape k drawn with Pareto popularity (a few shapes hold most);
    line `bad_line` (1-based), when given, is cut short: not JSON."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** 1.2 for k in range(shapes)]
    words = prefix_chars // 5 + 1
    prefixes = [f"Shape {k}: " + " ".join(f"w{k}x{j}" for j in range(words))[:prefix_chars]
                for k in range(shapes)]
    with path.open("w") as f:
        for i, k in enumerate(rng.choices(range(shapes), weights, k=items)):
            line = json.dumps({"id": f"q{i}", "model": MODEL, "prefix": [prefixes[k]],
                               "prompt": f"item {i}", "max_tokens": 4})
            f.write((line[:40] if i + 1 == bad_line else line) + "\n")


def rss_anon_mb(pid: int) -> float:
    """A process's anonymous RSS (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Broker:
    """`fabricctl up --gpus none` in its own data dir."""

    def __init__(self, home: Path) -> None:
        self.home, self.data = home, home / "data"
        (home / "fabric.toml").write_text(f'model = "{MODEL}"\n\n[sim]\ntime_scale = 0\n')
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_",
                                                                             "XDG_"))}
        self.env.update(XDG_CONFIG_HOME=str(home / "config"), NO_COLOR="1",
                        PYTHONPATH=str(ROOT))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start `up`; seconds until `status` answers."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen([*FABRICCTL, "up", "--data-dir", str(self.data), "--gpus",
                                      "none", "--engine", "sim"], env=self.env, cwd=self.home,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while time.monotonic() < t0 + 600:
            try:
                self.status()
                return time.monotonic() - t0
            except Exception:  # not up yet
                time.sleep(0.02)
        raise RuntimeError("fabricctl up did not answer in 600 s")

    def status(self) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            c = await Client.connect(self.data, "observer", "bench", timeout=2.0)
            try:
                return await c.status()
            finally:
                await c.close()
        return asyncio.run(go())

    def queued(self) -> int:
        return int(self.status()["ledger"]["items_queued"])

    def submit(self, src: Path, ok: tuple[int, ...]) -> tuple[bytes, float, float]:
        """`fabricctl submit SRC`: its stderr, the broker's and its own anonymous RSS peaks."""
        proc = subprocess.Popen([*FABRICCTL, "submit", str(src), "--data-dir", str(self.data)],
                                env=self.env, cwd=self.home, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        assert self.proc is not None
        with PeakRss(self.proc.pid) as broker, PeakRss(proc.pid) as own:
            _, err = proc.communicate(timeout=3600)
        if proc.returncode not in ok:
            raise RuntimeError(f"fabricctl submit exited {proc.returncode}: "
                               f"{err.decode()[-2000:]}")
        return err, broker.peak_mb, own.peak_mb

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([*FABRICCTL, *args, "--data-dir", str(self.data)], env=self.env,
                              cwd=self.home, capture_output=True, timeout=3600)
        if done.returncode not in ok:
            raise RuntimeError(f"fabricctl {args[0]} exited {done.returncode}: "
                               f"{done.stderr.decode()[-2000:]}")
        return done

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run([*FABRICCTL, "down", "--data-dir", str(self.data)], env=self.env,
                           cwd=self.home, capture_output=True, timeout=120)
            self.proc.wait(60)


class PeakRss:
    """Why: a peak between two readings is what "memory flat" is about; sampled off-thread."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid, self.every_s, self.peak_mb = pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak_mb = max(self.peak_mb, rss_anon_mb(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(items: int, shapes: int, drain: bool, prefix_chars: int = 1000,
            bad_line: int | None = None) -> Figures:
    out = Figures(items, shapes, bad_line=bad_line)
    queued = items - (bad_line is not None)
    with tempfile.TemporaryDirectory(prefix="backlog-", dir=os.environ.get("BENCH_TMP")) as tmp:
        home = Path(tmp)
        src = home / "lines.jsonl"
        write_lines(src, items, shapes, prefix_chars=prefix_chars, bad_line=bad_line)
        out.file_bytes = src.stat().st_size
        broker = Broker(home)
        try:
            broker.start()
            assert broker.proc is not None
            out.rss_anon_before_mb = rss_anon_mb(broker.proc.pid)
            t0 = time.monotonic()
            err, out.rss_anon_peak_mb, out.submit_peak_anon_mb = broker.submit(
                src, ok=(0,) if bad_line is None else (1,))
            out.submit_items_per_s = items / (time.monotonic() - t0)
            out.submit_peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            if bad_line is not None:
                out.bad_line_reported = (f"line {bad_line}:".encode() in err
                                         and broker.queued() == queued)
            assert broker.queued() == queued, (broker.queued(), queued)
            out.rss_anon_queued_mb = rss_anon_mb(broker.proc.pid)
            out.rss_bytes_per_queued_item = ((out.rss_anon_queued_mb - out.rss_anon_before_mb)
                                             * 2**20 / queued)
            broker.kill()
            out.restart_s = broker.start()
            assert broker.queued() == queued
            out.rss_anon_restarted_mb = rss_anon_mb(broker.proc.pid)
            if drain:
                t0 = time.monotonic()
                agent = subprocess.Popen([*FABRICCTL, "consume", "--broker", str(broker.data),
                                          "--engine", "sim", "--gpus", "0,1", "--config",
                                          str(home / "fabric.toml")], env=broker.env,
                                         cwd=home, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
                try:
                    while broker.queued():
                        time.sleep(0.2)
                    out.drain_items_per_s = queued / (time.monotonic() - t0)
                finally:
                    agent.terminate()
                    agent.wait(60)
        finally:
            broker.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--shapes", type=int, default=40)
    ap.add_argument("--drain", action="store_true", help="also drain through one agent")
    ap.add_argument("--prefix-chars", type=int, default=1000, help="each shape's prefix")
    ap.add_argument("--bad-line", type=int, default=None, metavar="N",
                    help="line N (1-based) is not JSON: submit must name it, queue the rest")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    a = ap.parse_args()
    fig = measure(a.items, a.shapes, a.drain, a.prefix_chars, a.bad_line)
    if a.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in asdict(fig).items()}))
        return 0
    print(f"backlog of {fig.items:,} items over {fig.shapes} shapes "
          f"({fig.file_bytes / 2**30:.2f} GiB of JSONL), one broker, no GPUs")
    rows = [("submit", f"{fig.submit_items_per_s:,.0f} items/s (its own peak: "
                       f"{fig.submit_peak_anon_mb:.0f} MiB anonymous, "
                       f"{fig.submit_peak_rss_mb:.0f} MiB RSS)"),
            ("anonymous RSS before / peak / queued", f"{fig.rss_anon_before_mb:.0f} / "
             f"{fig.rss_anon_peak_mb:.0f} / {fig.rss_anon_queued_mb:.0f} MiB"),
            ("RSS per queued item", f"{fig.rss_bytes_per_queued_item:.0f} bytes"),
            ("restart after kill -9", f"{fig.restart_s:.2f} s until status answers "
             f"({fig.rss_anon_restarted_mb:.0f} MiB anonymous RSS)")]
    if fig.bad_line is not None:
        rows.append((f"bad line {fig.bad_line:,}", "reported by number, every other line "
                     "queued" if fig.bad_line_reported else "NOT reported as it should be"))
    if fig.drain_items_per_s is not None:
        rows.append(("drain (2 sim GPUs, time_scale 0)", f"{fig.drain_items_per_s:,.0f} items/s"))
    for k, v in rows:
        print(f"  {k:<34} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
