"""Workload files for the tests: a generated workload as JSONL (`write_workload`), and the
jobs the sharing and deadline tests submit through `up` (`job_lines`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
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


def job_line_stream(n: int, shapes: int, tag: str, max_tokens: int,
                    start: int = 0) -> Iterator[str]:
    """Native lines `start`..`start+n` over `shapes` long system prompts of the job's own
    (`tag`, about 120 tokens each), round robin, each with a short question."""
    for i in range(start, start + n):
        s = i % shapes
        system = f"[{tag}-{s}] You are assistant number {s}. " + "Answer briefly. " * 30
        yield json.dumps({"id": f"{tag}{i}", "model": "fabric-demo", "prefix": [system],
                          "prompt": f"Question {i}: what is {i} plus {s}?",
                          "max_tokens": max_tokens})


def job_lines(n: int, shapes: int, tag: str, max_tokens: int) -> str:
    """`job_line_stream`'s lines as one JSONL text."""
    return "".join(ln + "\n" for ln in job_line_stream(n, shapes, tag, max_tokens))
