"""An engine server's log: each start marked, and a failed start's tail read back to say why.

Contract:
- stdout+stderr of server i append to `<logs_dir>/engine-<i>.log`; each start opens its part
  with a line beginning `START_MARK`;
- `log_tail(path)`: the last `LOG_TAIL_LINES` lines written since the last start, read from
  the log's last `_TAIL_BYTES` (a vLLM log can be gigabytes); [] when there is none;
- `tail_note(path)`: those lines as indented lines to append to a message, under the log's
  path, with what to change for a cause vLLM's log names (`vllm_install.start_hint`);
- `exit_words(code)`: a child's exit status in words (`exited with 1`, `killed by SIGKILL`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from fabricctl.supervisor.vllm_install import start_hint

LOG_TAIL_LINES = 15  # of a failed start's log, on stderr: vLLM's traceback ends in its cause
_TAIL_BYTES = 64 * 1024  # read from the log's end for its tail: a vLLM log can be gigabytes
START_MARK = "=== fabricctl: start "  # opens each start's part of an engine log


def exit_words(code: int | None) -> str:
    """`exited with 1`, `killed by SIGKILL`: a child's exit status in words."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of the engine log at `path` written since its last start
    (`START_MARK`), read from its last `_TAIL_BYTES`; [] when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    mark = text.rfind(START_MARK)
    if mark >= 0:
        text = text[mark:].partition("\n")[2]
    kept = [ln.rstrip() for ln in text.splitlines()]
    while kept and not kept[-1]:
        kept.pop()
    return kept[-lines:]


def tail_note(path: Path) -> str:
    """The last lines the log at `path` got from the start that just ended, under the log's
    path, as lines to append to a message."""
    tail = log_tail(path)
    if not tail:
        return f"\n  {path} holds nothing from this start"
    lines = f"{len(tail)} lines" if len(tail) > 1 else "line"
    hint = start_hint(tail)
    return (f"\n  the last {lines} of {path}:"
            + "".join(f"\n  | {ln}" for ln in tail) + (f"\n  hint: {hint}" if hint else ""))
