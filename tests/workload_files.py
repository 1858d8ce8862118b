"""A generated workload written as a JSONL file, for the tests that replay one from disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fabricctl.formats.workload import generate


def write_workload(path: Path, **kw: Any) -> Path:
    """`fabricctl.formats.workload.generate(**kw)`, one JSON line each, at `path`."""
    with path.open("wb") as f:
        for d in generate(**kw):
            f.write(msgspec.json.encode(d) + b"\n")
    return path
