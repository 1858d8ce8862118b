"""The OpenAI Batch API against `submit --wait`: the same file, the same simulated GPUs.

Two fresh `fabricctl up --engine sim` daemons in their own data dirs, one after the other:
- api: `up --api 127.0.0.1:PORT`; the official `openai` SDK uploads the file
  (`files.create`), creates the batch, retrieves it every `--poll-s` (50 ms) until it ended and
  downloads the output file (`files.content`). Wall time from the start of the upload to
  the last byte of output.
- submit: `fabricctl submit FILE --wait` (output to a file), its wall time from start to
  exit.
The file: `--lines` OpenAI chat requests over `--shapes` system prompts, generated before
either clock starts. Reported: both wall times, their ratio (api / submit; the issue's
target is <= 1.2), the upload's own time and rate, and the daemon's memory while it took
the upload: VmHWM (peak RSS) just before and just after `files.create`, and the growth,
against the file's size (flat means the growth does not scale with the file), and when (from
the start of the upload) the poll first saw each status. Both runs must write one output
line per input line.

    .venv/bin/python bench/api_bench.py                 # a table, 100,000 lines
    .venv/bin/python bench/api_bench.py --json          # exactly one JSON object
    .venv/bin/python bench/api_bench.py --lines 20000   # a quicker look
    .venv/bin/python bench/api_bench.py --repeat 3      # the median of 3 alternating pairs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FABRICCTL = [sys.executable, "-m", "fabricctl"]
CHAT = "/v1/chat/completions"


def make_file(path: Path, lines: int, shapes: int, seed: int = 7) -> int:
    rnd = random.Random(seed)
    systems = [f"You are assistant {s}. " + "Rules: be brief. " * 20 for s in range(shapes)]
    with path.open("wb") as fp:
        for i in range(lines):
            row = {"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
                   "body": {"model": "fabric-demo", "max_tokens": rnd.randint(4, 32),
                            "messages": [{"role": "system", "content": rnd.choice(systems)},
                                         {"role": "user", "content": f"question {i} " +
                                          "word " * rnd.randint(5, 60)}]}}
            fp.write(json.dumps(row).encode() + b"\n")
    return path.stat().st_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRICCTL_", "XDG_"))}
    env.update(XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               NO_COLOR="1", PYTHONPATH=str(ROOT))
    return env


class Up:
    """One `fabricctl up --engine sim` daemon (optionally with the API) in its own dir."""

    def __init__(self, home: Path, api_port: int | None) -> None:
        self.home, self.data_dir = home, home / "data-dir"
        home.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(home)
        args = ["up", "--data-dir", str(self.data_dir), "--engine", "sim"]
        if api_port is not None:
            args += ["--api", f"127.0.0.1:{api_port}"]
        self.log = (home / "up.log").open("wb")
        self.proc = subprocess.Popen([*FABRICCTL, *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=self.env, cwd=home)
        self.wait_ready(api_port)

    def wait_ready(self, api_port: int | None, timeout: float = 60) -> None:
        import httpx

        from fabricctl.wire.client import Client

        async def consumers() -> int:
            c = await Client.connect(self.data_dir, "observer", "bench", timeout=1.0)
            try:
                return int((await c.status())["consumers"])
            finally:
                await c.close()

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.home / "up.log").read_text(errors="replace"))
            try:
                ready = asyncio.run(consumers()) >= 1
                if ready and api_port is not None:
                    ready = httpx.get(f"http://127.0.0.1:{api_port}/v1/files").is_success
                if ready:
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.05)
        raise RuntimeError("fabricctl up did not get ready")

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        subprocess.run([*FABRICCTL, "down", "--data-dir", str(self.data_dir)], env=self.env,
                       cwd=self.home, capture_output=True, timeout=120)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_api(home: Path, path: Path, poll_s: float = 0.05) -> dict[str, Any]:
    import openai

    port = free_port()
    up = Up(home, port)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                          max_retries=0, timeout=600)
        hwm_before, rss_before = up.status_kib("VmHWM"), up.status_kib("VmRSS")
        t0 = time.perf_counter()
        with path.open("rb") as fp:
            f = c.files.create(file=(path.name, fp), purpose="batch")
        t_up = time.perf_counter() - t0
        hwm_after = up.status_kib("VmHWM")
        b = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        statuses = [b.status]
        seen_at = {b.status: time.perf_counter() - t0}
        while b.status not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(poll_s)
            b = c.batches.retrieve(b.id)
            if b.status != statuses[-1]:
                statuses.append(b.status)
                seen_at[b.status] = time.perf_counter() - t0
        if b.status != "completed" or not b.output_file_id:
            raise RuntimeError(f"batch ended {b.status}: {b.errors}")
        out = home / "api-out.jsonl"
        with c.files.with_streaming_response.content(b.output_file_id) as resp, \
                out.open("wb") as fp:
            for chunk in resp.iter_bytes():
                fp.write(chunk)
        wall = time.perf_counter() - t0
        with out.open("rb") as fp:
            lines_out = sum(1 for _ in fp)
        return {"wall_s": wall, "upload_s": t_up, "statuses": statuses,
                "seen_at_s": {k: round(v, 2) for k, v in seen_at.items()},
                "lines_out": lines_out, "upload_hwm_before_kib": hwm_before,
                "upload_hwm_after_kib": hwm_after, "upload_rss_before_kib": rss_before,
                "upload_peak_growth_kib": hwm_after - hwm_before}
    finally:
        up.stop()


def run_submit(home: Path, path: Path) -> dict[str, Any]:
    up = Up(home, None)
    try:
        out = home / "submit-out.jsonl"
        t0 = time.perf_counter()
        with out.open("wb") as fp:
            done = subprocess.run([*FABRICCTL, "submit", str(path), "--wait", "--data-dir",
                                   str(up.data_dir)], stdout=fp, stderr=subprocess.PIPE,
                                  env=up.env, cwd=home, timeout=3600)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"submit exited {done.returncode}: {done.stderr[-2000:]!r}")
        with out.open("rb") as fp:
            lines_out = sum(1 for _ in fp)
        return {"wall_s": wall, "lines_out": lines_out}
    finally:
        up.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--shapes", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--poll-s", type=float, default=0.05, help="batches.retrieve interval")
    ap.add_argument("--repeat", type=int, default=1, help="run both N times, alternating "
                    "which goes first; report the median pair (by ratio)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="fabric-api-bench-"))
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    try:
        path = tmp / "batch.jsonl"
        size = make_file(path, args.lines, args.shapes)
        for r in range(args.repeat):
            if r % 2 == 0:
                api = run_api(tmp / f"api{r}", path, args.poll_s)
                sub = run_submit(tmp / f"submit{r}", path)
            else:
                sub = run_submit(tmp / f"submit{r}", path)
                api = run_api(tmp / f"api{r}", path, args.poll_s)
            runs.append((api, sub))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    runs.sort(key=lambda pair: pair[0]["wall_s"] / pair[1]["wall_s"])
    api, sub = runs[len(runs) // 2]
    result = {
        "lines": args.lines, "file_mib": round(size / 2**20, 1), "runs": len(runs),
        "api_wall_s": round(api["wall_s"], 2), "submit_wall_s": round(sub["wall_s"], 2),
        "api_vs_submit": round(api["wall_s"] / sub["wall_s"], 3),
        "api_vs_submit_all": [round(a["wall_s"] / s["wall_s"], 3) for a, s in runs],
        "upload_s": round(api["upload_s"], 2),
        "upload_mib_per_s": round(size / 2**20 / api["upload_s"], 1),
        "upload_peak_rss_before_mib": round(api["upload_hwm_before_kib"] / 1024, 1),
        "upload_peak_rss_after_mib": round(api["upload_hwm_after_kib"] / 1024, 1),
        "upload_peak_growth_mib": round(api["upload_peak_growth_kib"] / 1024, 1),
        "statuses": api["statuses"],
        "api_status_seen_at_s": api["seen_at_s"],
        "api_lines_out": api["lines_out"], "submit_lines_out": sub["lines_out"],
    }
    ok = all(a["lines_out"] == s["lines_out"] == args.lines for a, s in runs)
    result["ok"] = ok
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
