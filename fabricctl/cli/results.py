"""`fabricctl results`: the broker's stored results, in the order it stored them.

Contract: the `results` command (`command`) refuses (exit 2) `--json` with `--follow` and
`--ordered` with `--since` or `--follow`, then runs `print_results` on stdout.
Results carry a sequence number (1, 2, ... in storage order); `since` N prints those after N.
Default output is JSONL, one `result_line` per result (native or OpenAI batch output, as its
input line came), flushed per page. `as_json` writes one document instead,
`{"results": [<result line objects>], "since": N, "next": M}` where M is the `since` to
pass next time; it is streamed, so memory stays constant either way. `follow` keeps polling
for new results until interrupted (exit 130) and cannot be combined with `as_json`.

`ordered` lists every stored result in *ingest order* instead, paged by entry key (the
broker's `results_by_key` query): the entry key is seg_id << 32 | offset and segment ids
only grow (store/keys.py), so the order is the order of the broker's ingest commits, as it
acknowledged the submits (one commit may hold several submit chunks, from one producer or
several); within one commit, grouped by shape: the shape that continues the newest segment
first, then the others in the order their first item came, a shape that filled a segment
continuing after them; within a shape, input order. So one submit's results are in its
input order when its items have one shape. It takes no `since` and cannot `follow`
(a late result can belong anywhere in the order); with `as_json`, `since` is 0 and
`next` the number of results stored when the listing began (every one of them is in it;
a result stored while it ran may be too). Memory stays constant: one page at a time.

`job` (an id or a unique prefix) keeps only that job's results: in storage order (with
`since`), or with `ordered` in the job's *input order* (line by line, whatever the shapes),
or with `follow` until the job ends (what it has, in input order, then each result as it is
stored: `follow.JobFollower`), then exit 0. An unknown job is exit 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import typer

from fabricctl.cli.support import ConfigFile, DataDir, fail, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.errors import ExitCode
from fabricctl.formats.results import ResultRecord, result_line
from fabricctl.producer import JobFollower, results_stored
from fabricctl.wire.client import Client

PAGE = 2000
FOLLOW_POLL_S = 0.25


def command(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new results "
                                "until interrupted."),
    since: int = typer.Option(0, "--since", min=0, metavar="N", help="Only results stored "
                              "after result number N (results are numbered 1, 2, ... as "
                              "stored)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document: {results, since, "
                                  "next} (not with --follow)."),
    ordered: bool = typer.Option(False, "--ordered", help="In ingest order instead (the "
                                 "broker's entry-key order): commit by commit as the broker "
                                 "acknowledged the submits, within a commit grouped by "
                                 "shape. Not with --since or --follow."),
    job: str | None = typer.Option(None, "--job", "-j", metavar="ID", help="Only this job's "
                                   "results (an id or a unique prefix); with --ordered in its "
                                   "input order; with --follow until the job ends."),
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """Print the broker's stored results as JSONL, in the order they were stored.

    With --ordered, in the order their items were stored (ingest order): the broker's
    entry-key order, which is commit by commit in the order it acknowledged the submits,
    and within one commit (which may hold several submit chunks) grouped by shape, each
    group in input order. One submit's results are in its input order when it had a single
    shape; with several shapes they are grouped by shape within each commit.
    """
    if follow and json_out:
        raise fail("--json prints one document and cannot follow; drop one of them",
                   ExitCode.USAGE)
    if job is not None:
        if json_out and follow:
            raise fail("--json prints one document and cannot follow; drop one of them",
                       ExitCode.USAGE)
        if ordered and (follow or since):
            raise fail("--ordered lists the job's results in input order; it cannot take "
                       "--since or --follow", ExitCode.USAGE)
        cfg = settings(data_dir, config)
        guarded(lambda: asyncio.run(print_job_results(cfg, sys.stdout.buffer, job, since=since,
                                                      follow=follow, as_json=json_out,
                                                      ordered=ordered)))
        return
    if ordered and (follow or since):
        raise fail("--ordered lists every stored result in ingest order; it cannot take "
                   "--since or --follow (they count results in storage order)",
                   ExitCode.USAGE)
    cfg = settings(data_dir, config)
    guarded(lambda: asyncio.run(print_results(cfg, sys.stdout.buffer, since=since,
                                              follow=follow, as_json=json_out,
                                              ordered=ordered)))


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


async def _key_pages(client: Client) -> AsyncIterator[list[tuple[str, ResultRecord]]]:
    """Every stored result in entry-key order, a page at a time (each key as hex)."""
    after = ""
    while True:
        page = await client.query("results_by_key", after, limit=PAGE,
                                  type=list[tuple[str, ResultRecord]])
        if page:
            after = page[-1][0]
            yield page
        if len(page) < PAGE:
            return


async def print_results(cfg: AppConfig, out: BinaryIO, *, since: int, follow: bool,
                        as_json: bool, ordered: bool = False) -> None:
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-results")
    try:
        pages = _key_pages(client) if ordered else _pages(client, since, follow and not as_json)
        if as_json:
            out.write(b'{"results":[')
            first, last = True, since
            if ordered:
                last = await results_stored(client)  # before the listing: all of those are in it
            async for page in pages:
                for key, rec in page:
                    if not first:
                        out.write(b",")
                    out.write(result_line(rec).rstrip(b"\n"))
                    first = False
                    if not ordered:
                        last = int(key)
            out.write(b'],"since":%d,"next":%d}\n' % (since, last))
            out.flush()
            return
        async for page in pages:
            out.write(b"".join(result_line(rec) for _, rec in page))
            out.flush()
    finally:
        await client.close()


async def _job_line_pages(client: Client, job: str) -> AsyncIterator[list[ResultRecord]]:
    """A job's results in input order, a page at a time."""
    after = 0
    while True:
        page = await client.job_results(job, after_line=after, limit=PAGE)
        if page:
            after = page[-1].line
            yield page
        if len(page) < PAGE:
            return


async def _job_stream_pages(client: Client, number: int, since: int
                            ) -> AsyncIterator[list[ResultRecord]]:
    """A job's results in storage order, from the broker's result stream after `since`."""
    async for page in _pages(client, since, False):
        yield [rec for _, rec in page if rec.job == number]


async def print_job_results(cfg: AppConfig, out: BinaryIO, job: str, *, since: int,
                            follow: bool, as_json: bool, ordered: bool) -> None:
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-results")
    try:
        view = await client.job(job)
        number, job_id = view.job.number, view.job.id
        if follow:
            def write(rec: ResultRecord) -> None:
                out.write(result_line(rec))
                out.flush()

            await JobFollower(client, job_id, number, write, since=since).run()
            return
        pages = (_job_line_pages(client, job_id) if ordered
                 else _job_stream_pages(client, number, since))
        first = True
        if as_json:
            out.write(b'{"job":"%s","results":[' % job_id.encode())
        async for page in pages:
            if as_json:
                for rec in page:
                    if not first:
                        out.write(b",")
                    out.write(result_line(rec).rstrip(b"\n"))
                    first = False
            else:
                out.write(b"".join(result_line(rec) for rec in page))
            out.flush()
        if as_json:
            out.write(b"]}\n")
            out.flush()
    finally:
        await client.close()
