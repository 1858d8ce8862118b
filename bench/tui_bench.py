"""CPU cost of `fabricctl top`: 100 shapes x 2,048 lanes, refreshed 4 times a second.

Each scenario runs the real `TopApp` in a child process on a pseudo-terminal (so Textual's
Linux driver renders and writes every frame, as in a real terminal; the parent drains the
terminal), fed by `SyntheticSource`: snapshots decoded from msgpack like the wire's, every
`--interval` s (0.25). After `--warmup` s the child measures `process_time()` delta / wall
delta over `--seconds` (10) and reports it; the parent cross-checks with psutil's CPU times
of the child over the same window. The target is < 25% of one core.

Scenarios:
- `overview`: the overview (state machine, 100-row table, GPUs, ledger); no lane lists,
  as the broker sends when no shape is selected;
- `lanes`: the lanes view of one shape, its 2,048 lanes in every snapshot (Enter);
- `all-lanes`: what the app never asks for: every shape carries its 2,048 lanes (204,800
  lanes, 6.6 MB, ~0.1 s of msgpack decoding per snapshot), overview shown. It shows why
  `top` subscribes the lanes of the selected shape only; it is reported, not judged.

    .venv/bin/python bench/tui_bench.py                      # every scenario, a table
    .venv/bin/python bench/tui_bench.py --scenario lanes --json
    .venv/bin/python bench/tui_bench.py --size 80x24 --seconds 5
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tui_synthetic

TARGET = 0.25  # of one core
SCENARIOS = ("overview", "lanes", "all-lanes")
JUDGED = ("overview", "lanes")  # what `top` subscribes to


def child(args: argparse.Namespace) -> None:
    """Run the app on this terminal and write the measurement to `args.report`."""
    import msgspec
    from tui_synthetic import SyntheticSource

    from fabricctl.core.snapshot import Snapshot
    from fabricctl.tui.app import TopApp

    source = SyntheticSource(args.shapes, args.lanes, all_lanes=args.scenario == "all-lanes")
    first = msgspec.msgpack.decode(source.prepare([])[0], type=Snapshot).shapes[0]
    if args.scenario == "lanes":  # build the synthetic data before the clock starts
        source.prepare([(first.model, first.signature)])
    out: dict[str, float | int | str] = {"scenario": args.scenario}

    class BenchApp(TopApp):
        def on_mount(self) -> None:
            super().on_mount()
            if args.scenario == "lanes":
                key = f"{first.model}:{first.signature:016x}"
                self.set_timer(args.warmup / 2, lambda: self.open_lanes(key))
            self.set_timer(args.warmup, self.start)

        def start(self) -> None:
            out["received0"] = self.received
            self._t0 = (time.process_time(), time.perf_counter())
            Path(args.report + ".start").touch()  # the parent's psutil window starts too
            self.set_timer(args.seconds, self.stop)

        def stop(self) -> None:
            cpu0, wall0 = self._t0
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            out.update(cpu_s=cpu, wall_s=wall, cpu_fraction=cpu / wall, view=self.view,
                       snapshots=self.received - int(out["received0"]),
                       lanes_drawn=self.query_one("#lane-list").count)  # type: ignore[attr-defined]
            self.exit(0)

    BenchApp(source, interval=args.interval).run()
    Path(args.report).write_text(json.dumps(out))


def run_scenario(scenario: str, args: argparse.Namespace) -> dict[str, object]:
    import psutil

    cols, rows = (int(x) for x in args.size.split("x"))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    report = Path(f"/tmp/tui_bench_{os.getpid()}_{scenario}.json")
    cmd = [sys.executable, __file__, "--child", "--scenario", scenario, "--report", str(report),
           "--shapes", str(args.shapes), "--lanes", str(args.lanes), "--interval",
           str(args.interval), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True)
    os.close(slave)
    written = [0]
    tail = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            written[0] += len(chunk)
            tail.extend(chunk)
            del tail[:-8192]

    threading.Thread(target=drain, daemon=True).start()
    ps = psutil.Process(proc.pid)
    started = Path(f"{report}.start")
    deadline = time.monotonic() + 120
    while not started.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{scenario}: the app did not start:\n"
                             + tail.decode(errors="replace")[-3000:])
        time.sleep(0.01)
    started.unlink()
    c0, b0, w0 = sum(ps.cpu_times()[:2]), written[0], time.perf_counter()
    time.sleep(args.seconds - 0.1)
    c1, b1, w1 = sum(ps.cpu_times()[:2]), written[0], time.perf_counter()
    proc.wait(timeout=60 + args.seconds)
    os.close(master)
    result: dict[str, object] = json.loads(report.read_text())
    report.unlink()
    if "cpu_fraction" not in result:
        raise SystemExit(f"{scenario}: the app stopped early:\n"
                         + tail.decode(errors="replace")[-3000:])
    result.update(psutil_cpu_fraction=(c1 - c0) / (w1 - w0),
                  terminal_bytes_per_s=round((b1 - b0) / (w1 - w0)), size=args.size,
                  shapes=args.shapes, lanes=args.lanes, interval=args.interval)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=SCENARIOS)
    ap.add_argument("--shapes", type=int, default=100)
    ap.add_argument("--lanes", type=int, default=2048)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--size", default="160x50", help="terminal COLSxROWS")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = [run_scenario(s, args) for s in ([args.scenario] if args.scenario else SCENARIOS)]
    judged = [float(r["cpu_fraction"]) for r in results  # type: ignore[arg-type]
              if r["scenario"] in JUDGED]
    worst = max(judged, default=0.0)
    if args.json:
        print(json.dumps({"target": TARGET, "ok": worst < TARGET, "results": results}))
        return
    print(f"fabricctl top, {args.shapes} shapes x {args.lanes} lanes, every {args.interval} s, "
          f"{args.size} terminal, {args.seconds:g} s measured (target < {TARGET:.0%} of a core)")
    print(f"{'scenario':<10} {'cpu (process_time)':>18} {'cpu (psutil)':>13} {'snapshots':>9} "
          f"{'terminal B/s':>12}")
    for r in results:
        note = "" if r["scenario"] in JUDGED else "  (not judged: top never subscribes this)"
        print(f"{r['scenario']:<10} {float(r['cpu_fraction']):>18.1%} "  # type: ignore[arg-type]
              f"{float(r['psutil_cpu_fraction']):>13.1%} {r['snapshots']:>9} "  # type: ignore[arg-type]
              f"{r['terminal_bytes_per_s']:>12,}{note}")
    if judged:
        print(f"worst judged: {worst:.1%} of a core: "
              + ("OK" if worst < TARGET else "OVER TARGET"))


if __name__ == "__main__":
    main()
