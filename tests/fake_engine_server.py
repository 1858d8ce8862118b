"""A stand-in engine server for launcher tests: GET /health answers 200 once "ready".

Usage (as the launcher calls it): fake_engine_server.py MODEL --port N [--ready-delay S]
[--ignore-sigterm] [--child-pid-file PATH] [--record PATH] [--fail-start MESSAGE
[--fail-if PATH]] [any other flags, ignored].
--record appends one JSON line per start: its argv, CUDA_VISIBLE_DEVICES and pid.
--fail-start prints MESSAGE on stderr and exits 1 before serving, as a vLLM that cannot
start does (with --fail-if, only while PATH exists).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-delay", type=float, default=0.0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--child-pid-file")
    ap.add_argument("--record")
    ap.add_argument("--fail-start")
    ap.add_argument("--fail-if")
    args, _ = ap.parse_known_args()
    if args.record:  # what a stand-in `vllm` was started with, one line per start
        with open(args.record, "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(),
                                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
    if args.fail_start is not None and (args.fail_if is None or os.path.exists(args.fail_if)):
        sys.stderr.write(args.fail_start + "\n")
        sys.exit(1)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child_pid_file:  # a worker process, like vLLM's EngineCore
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args.child_pid_file, "w") as f:
            f.write(str(child.pid))
        if not args.ignore_sigterm:  # vLLM stops its EngineCore on SIGTERM
            def stop(*_: object) -> None:
                child.kill()
                os._exit(0)

            signal.signal(signal.SIGTERM, stop)
    ready_at = time.monotonic() + args.ready_delay

    class Handler(BaseHTTPRequestHandler):
        """Serves /health (503 until ready) and /env (what the launcher passed us)."""

        def do_GET(self) -> None:
            if self.path == "/health" and time.monotonic() >= ready_at:
                body = b""
            elif self.path == "/env":
                body = json.dumps({"argv": sys.argv, "env": dict(os.environ)}).encode()
            else:
                self.send_response(503)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *a: object) -> None:
            sys.stderr.write("fake: " + fmt % a + "\n")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
