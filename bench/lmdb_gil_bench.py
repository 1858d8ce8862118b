"""Why the writer thread runs only the commit: py-lmdb puts against a busy event loop.

py-lmdb releases and retakes the GIL around every put. A thread that does the puts of a
write transaction therefore needs the GIL back once per row, and a busy main thread holds it
for up to the switch interval each time. This measures one `--rows`-row durable write
(putmulti + commit) on a second thread, first with an idle main thread, then with a busy one,
and then the commit alone on the thread (the puts done by the main thread), as
`fabricctl.server.writer` does it.

    .venv/bin/python bench/lmdb_gil_bench.py           # a table
    .venv/bin/python bench/lmdb_gil_bench.py --json    # exactly one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import lmdb


def median_ms(samples: list[float]) -> float:
    s = sorted(samples)
    return round(s[len(s) // 2] * 1e3, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gil-bench-") as d:
        env = lmdb.open(d, map_size=1 << 30, max_dbs=2, lock=False)
        db = env.open_db(b"x")
        nxt = [0]

        def rows() -> list[tuple[bytes, bytes]]:
            base = nxt[0]
            nxt[0] += args.rows
            return [((base + i).to_bytes(8, "big"), b"v" * 600) for i in range(args.rows)]

        def on_thread(fn: Callable[[], None]) -> float:
            took: list[float] = []

            def run() -> None:
                t0 = time.perf_counter()
                fn()
                took.append(time.perf_counter() - t0)

            t = threading.Thread(target=run)
            t.start()
            t.join()
            return took[0]

        def whole() -> None:
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(rows(), append=True)

        def commit_only() -> float:
            txn = env.begin(write=True)
            txn.cursor(db=db).putmulti(rows(), append=True)
            return on_thread(txn.commit)

        busy = threading.Event()

        def spin() -> None:
            x = 0
            while not busy.is_set():
                for i in range(1000):
                    x += i

        out: dict[str, object] = {"rows": args.rows}
        out["thread_write_idle_ms"] = median_ms([on_thread(whole) for _ in range(args.rounds)])
        spinner = threading.Thread(target=spin)
        spinner.start()
        try:
            out["thread_write_busy_ms"] = median_ms([on_thread(whole)
                                                     for _ in range(args.rounds)])
            out["thread_commit_only_busy_ms"] = median_ms([commit_only()
                                                           for _ in range(args.rounds)])
        finally:
            busy.set()
            spinner.join()
        env.close()
    if args.json:
        print(json.dumps(out))
    else:
        width = max(len(k) for k in out)
        for k, v in out.items():
            print(f"{k:<{width}}  {v:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
