"""Runs an engine server so that it dies with the process that supervises it.

Contract:
- `tethered(argv)` is the command line that runs `argv` through this module, as
  `python -m fabricctl.supervisor.tether PID -- argv...` where PID is the caller's pid.
- Run as a program, on Linux it asks the kernel (`prctl(PR_SET_PDEATHSIG, SIGTERM)`) to send
  it SIGTERM when the thread that started it exits, then checks that its parent is still
  PID (else the supervisor died before the request took hold: exit 1), then `execvp`s
  argv: the pid, the session and the request carry over to the server. A server ends its
  own workers on SIGTERM (vLLM stops its EngineCore). A supervisor killed with SIGKILL
  thus leaves no server holding a GPU and a port that its next start needs.
- Where prctl is missing (not Linux) it execs argv unchanged. A command that cannot be
  run exits 127 with the reason on stderr (the engine log), as a shell does.

The supervisor starts servers from its event loop's thread, which lives as long as the
servers do (a Ray worker's loop thread too), so the signal comes only when it should.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tethered(argv: list[str]) -> list[str]:
    """`argv`, run so that it gets SIGTERM when this process (its starting thread) dies."""
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *argv]


def _ask_for_sigterm_on_parent_death() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        print(f"fabricctl tether: prctl failed: {os.strerror(err)}", file=sys.stderr)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m fabricctl.supervisor.tether PARENT_PID -- COMMAND [ARG...]",
              file=sys.stderr)
        return 2
    _ask_for_sigterm_on_parent_death()
    if os.getppid() != int(args[0]):
        print("fabricctl tether: the supervisor is gone; not starting", file=sys.stderr)
        return 1
    argv = args[2:]
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"fabricctl tether: cannot run {argv[0]}: {e}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
