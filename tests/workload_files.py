"""Workload files for the tests: a generated workload as JSONL (`write_workload`), and the
jobs the sharing and deadline tests submit through `up` (`job_lines`)."""

from __future__ import annotations

import json
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


def job_lines(n: int, shapes: int, tag: str, max_tokens: int) -> str:
    """`n` native lines over `shapes` long system prompts of the job's own (`tag`), round robin."""
    out = []
    for i in range(n):
        s = i % shapes
        system = f"[{tag}-{s}] You are assistant number {s}. " + "Answer briefly. " * 30
        out.append(json.dumps({"id": f"{tag}{i}", "model": "fabric-demo", "prefix": [system],
                               "prompt": f"Question {i}: what is {i} plus {s}?",
                               "max_tokens": max_tokens}))
    return "\n".join(out) + "\n"
