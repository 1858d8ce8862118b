"""`fabricctl results`: the broker's stored results, in the order it stored them.

Contract: results carry a sequence number (1, 2, ... in storage order); `since` N prints
those after N. Default output is JSONL, one `result_line` per result (native or OpenAI batch
output, as its input line came), flushed per page. `as_json` writes one document instead,
`{"results": [<result line objects>], "since": N, "next": M}` where M is the `since` to
pass next time; it is streamed, so memory stays constant either way. `follow` keeps polling
for new results until interrupted (exit 130) and cannot be combined with `as_json`.
"""

from __future__ import annotations

import asyncio
from typing import Any, BinaryIO

from fabricctl.client import Client
from fabricctl.config import AppConfig
from fabricctl.formats.results import ResultRecord, result_line

PAGE = 2000
FOLLOW_POLL_S = 0.25


async def _pages(client: Client, since: int, follow: bool) -> Any:
    seq = since
    while True:
        page = await client.query("results", since=seq, limit=PAGE,
                                  type=list[tuple[int, ResultRecord]])
        if page:
            seq = page[-1][0]
            yield page
        if len(page) < PAGE:
            if not follow:
                return
            await asyncio.sleep(FOLLOW_POLL_S)


async def print_results(cfg: AppConfig, out: BinaryIO, *, since: int, follow: bool,
                        as_json: bool) -> None:
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-results")
    try:
        if as_json:
            out.write(b'{"results":[')
            first, last = True, since
            async for page in _pages(client, since, False):
                for seq, rec in page:
                    if not first:
                        out.write(b",")
                    out.write(result_line(rec).rstrip(b"\n"))
                    first, last = False, seq
            out.write(b'],"since":%d,"next":%d}\n' % (since, last))
            out.flush()
            return
        async for page in _pages(client, since, follow):
            out.write(b"".join(result_line(rec) for _, rec in page))
            out.flush()
    finally:
        await client.close()
