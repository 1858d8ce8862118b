#!/usr/bin/env python3
"""Write a realistic multi-shape native JSONL workload to stdout.

Contract: one compact JSON object a line, `{"id", "model", "prefix", "prompt",
"max_tokens", "input_tokens", "label"}`, flushed as it goes; the same arguments give the
same bytes. Shapes are (system prompt, few-shot block, tool schema) triples with Zipf
popularity (`--zipf-s`); prompt lengths are lognormal (`--median-tokens`, `--sigma`).
The generator is `fabricctl.formats.workload.generate`, re-exported here as `generate` so
benchmarks and tests can import it.

    python examples/produce.py --items 1000 --shapes 8 --seed 7 | fabricctl submit - --wait
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import msgspec

from fabricctl.errors import UsageError
from fabricctl.formats.workload import generate, make_shapes

__all__ = ["generate", "main", "make_shapes"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="produce.py",
        description="Write a synthetic multi-shape native JSONL workload to stdout.",
    )
    p.add_argument("--items", type=int, default=1000, help="lines to write (default 1000)")
    p.add_argument("--shapes", type=int, default=8, help="distinct prompt shapes (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--zipf-s", type=float, default=1.1, help="Zipf exponent of shape popularity (1.1)"
    )
    p.add_argument(
        "--median-tokens", type=int, default=256, help="median prompt length in tokens (256)"
    )
    p.add_argument(
        "--sigma", type=float, default=0.6, help="log-space sigma of prompt lengths (0.6)"
    )
    p.add_argument(
        "--models",
        default="fabric-demo",
        help="comma-separated model names, assigned to shapes round-robin (fabric-demo)",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="output token limit (128)")
    p.add_argument(
        "--prefix-tokens",
        type=int,
        default=None,
        help="size every shape's shared prefix to exactly this many tokens",
    )
    p.add_argument("--id-prefix", default="q", help="item ids are this plus a number (q)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    try:
        rows = generate(
            args.items,
            args.shapes,
            args.seed,
            zipf_s=args.zipf_s,
            median_tokens=args.median_tokens,
            sigma=args.sigma,
            models=models,
            max_tokens=args.max_tokens,
            prefix_tokens=args.prefix_tokens,
            id_prefix=args.id_prefix,
        )
        encode = msgspec.json.Encoder().encode
        out = sys.stdout.buffer
        for row in rows:
            out.write(encode(row) + b"\n")
            out.flush()  # one line at a time, so a pipeline consumer sees it at once
    except UsageError as exc:
        print(f"produce.py: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as the Python docs advise.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
