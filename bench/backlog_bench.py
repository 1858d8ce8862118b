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
Everything goes through the CLI and the socket; nothing is mocked. This box is shared and
noisy: compare runs of the same N, and read RSS per item, not seconds.

    .venv/bin/python bench/backlog_bench.py                     # 200,000 items, a table
    .venv/bin/python bench/backlog_bench.py --items 2000000 --shapes 40 --drain --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
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


def write_lines(path: Path, items: int, shapes: int, seed: int = 7) -> None:
    """`items` native lines, shape k drawn with Pareto popularity (a few shapes hold most)."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** 1.2 for k in range(shapes)]
    prefixes = [f"Shape {k}: " + " ".join(f"w{k}x{j}" for j in range(150))[:1000]
                for k in range(shapes)]
    with path.open("w") as f:
        for i, k in enumerate(rng.choices(range(shapes), weights, k=items)):
            f.write(json.dumps({"id": f"q{i}", "model": MODEL, "prefix": [prefixes[k]],
                                "prompt": f"item {i}", "max_tokens": 4}) + "\n")


def rss_anon_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
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

    def run(self, *args: str) -> None:
        done = subprocess.run([*FABRICCTL, *args, "--data-dir", str(self.data)], env=self.env,
                              cwd=self.home, capture_output=True, timeout=3600)
        if done.returncode:
            raise RuntimeError(f"fabricctl {args[0]} exited {done.returncode}: "
                               f"{done.stderr.decode()[-2000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run([*FABRICCTL, "down", "--data-dir", str(self.data)], env=self.env,
                           cwd=self.home, capture_output=True, timeout=120)
            self.proc.wait(60)


def measure(items: int, shapes: int, drain: bool) -> Figures:
    out = Figures(items, shapes)
    with tempfile.TemporaryDirectory(prefix="backlog-") as tmp:
        home = Path(tmp)
        src = home / "lines.jsonl"
        write_lines(src, items, shapes)
        broker = Broker(home)
        try:
            broker.start()
            assert broker.proc is not None
            out.rss_anon_before_mb = rss_anon_mb(broker.proc.pid)
            t0 = time.monotonic()
            broker.run("submit", str(src))
            out.submit_items_per_s = items / (time.monotonic() - t0)
            assert broker.queued() == items
            out.rss_anon_queued_mb = rss_anon_mb(broker.proc.pid)
            out.rss_bytes_per_queued_item = ((out.rss_anon_queued_mb - out.rss_anon_before_mb)
                                             * 2**20 / items)
            broker.kill()
            out.restart_s = broker.start()
            assert broker.queued() == items
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
                    out.drain_items_per_s = items / (time.monotonic() - t0)
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
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    a = ap.parse_args()
    fig = measure(a.items, a.shapes, a.drain)
    if a.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in asdict(fig).items()}))
        return 0
    print(f"backlog of {fig.items:,} items over {fig.shapes} shapes, one broker, no GPUs")
    rows = [("submit", f"{fig.submit_items_per_s:,.0f} items/s"),
            ("anonymous RSS before / queued", f"{fig.rss_anon_before_mb:.0f} / "
             f"{fig.rss_anon_queued_mb:.0f} MiB"),
            ("RSS per queued item", f"{fig.rss_bytes_per_queued_item:.0f} bytes"),
            ("restart after kill -9", f"{fig.restart_s:.2f} s until status answers "
             f"({fig.rss_anon_restarted_mb:.0f} MiB anonymous RSS)")]
    if fig.drain_items_per_s is not None:
        rows.append(("drain (2 sim GPUs, time_scale 0)", f"{fig.drain_items_per_s:,.0f} items/s"))
    for k, v in rows:
        print(f"  {k:<34} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
