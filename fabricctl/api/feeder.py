"""One batch's feed in a process of its own: parse its file, submit the items, seal the job.

Contract: `python -m fabricctl.api.feeder SOCKET NUMBER ID FILE LINES [--resume]
[--tokenizer PATH] [--model NAME] [--shapes auto|declared] [--block-size N]` connects
to the broker's Unix socket as a producer (as
`submit` does), runs `fabricctl.api.batches.feed` for job NUMBER (id ID) over FILE of LINES
lines (token counts by `formats.tokens.choose_counter(tokenizer, model)`; shapes found
where none is declared as `[producer] shapes` and `block_size` say), and exits 0 once
the job is sealed; on any error it writes one line on stderr and exits 1 (the API then
fails the job with that line). The Batch API starts one per batch it feeds, so parsing and
token counting, the costly part, never hold the daemon's GIL while the broker serves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from fabricctl.api.batches import feed
from fabricctl.core.defaults import BLOCK_TOKENS, SHAPES
from fabricctl.core.jobs import JobRecord
from fabricctl.formats.autoshape import finder_for
from fabricctl.formats.tokens import choose_counter
from fabricctl.wire.client import Client


async def run(args: argparse.Namespace) -> None:
    counter = choose_counter(args.tokenizer, args.model)
    client = await Client.connect(args.socket, "producer", f"fabricctl-api-feed-{args.id}")
    try:
        job = JobRecord(number=args.number, id=args.id, kind="api")
        await feed(client, Path(args.file), job, counter, args.lines, resume=args.resume,
                   finder=finder_for(args.shapes, args.block_size))
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fabricctl.api.feeder", description=__doc__)
    ap.add_argument("socket")
    ap.add_argument("number", type=int)
    ap.add_argument("id")
    ap.add_argument("file")
    ap.add_argument("lines", type=int)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--model", default="fabric-demo")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--block-size", type=int, default=BLOCK_TOKENS)
    args = ap.parse_args(argv)
    try:
        asyncio.run(run(args))
    except Exception as e:
        sys.stderr.write(f"{type(e).__name__}: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
