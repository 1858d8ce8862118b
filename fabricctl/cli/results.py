"""`fabricctl results`: the broker's stored results, in the order it stored them.

Contract: the `results` command (`command`) refuses (exit 2) `--json` with `--follow` and
`--ordered` with `--since` or `--follow`, then runs `print_results` on stdout.
- Results carry a sequence number (1, 2, ... in storage order); `since` N prints those after N.
  Default output is JSONL, one `result_line` per result (native or OpenAI batch output, as its
  input line came), flushed per page (`PAGE`). `as_json` writes one document instead, `{"results":
  [<result line objects>], "since": N, "next": M}`, M the `since` to pass next time. Both stream:
  memory stays constant.
- `follow` then prints each new result as the broker pushes it until interrupted (exit 130).
- `ordered` lists every stored result in *ingest order* instead, paged by entry key (the broker's
  `results_by_key`; what that order is: ARCHITECTURE.md, "The store on disk"), one page at a time.
  With `as_json`, `since` is 0 and `next` the number of results stored when the listing began (all
  of them are in it; one stored while it ran may be too).
- `job` (an id or a unique prefix) keeps only that job's results: in storage order (with `since`),
  or with `ordered` in the job's *input order* (line by line, whatever the shapes), or with
  `follow` until the job ends (what it has, in input order, then each result as it is stored:
  `follow.JobFollower`), then exit 0. An unknown job is exit 1.
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
from fabricctl.producer.follow import job_pages
from fabricctl.wire.client import Client
from fabricctl.wire.questions import pages

PAGE = 2000


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
    """The stored results after `since`, a page at a time; with `follow`, then each result
    as the broker pushes it (`Client.follow_results`), until interrupted."""
    seq = since
    async for page in pages(client.results, since, lambda row: row[0], PAGE):
        seq = page[-1][0]
        yield page
    if follow:
        async for push in client.follow_results(0, seq):
            if push.rows:
                yield push.rows


def _key_pages(client: Client) -> AsyncIterator[list[tuple[str, ResultRecord]]]:
    """Every stored result in entry-key order, a page at a time (each key as hex)."""
    return pages(client.results_by_key, "", lambda row: row[0], PAGE)


async def print_results(cfg: AppConfig, out: BinaryIO, *, since: int, follow: bool,
                        as_json: bool, ordered: bool = False) -> None:
    client = await Client.connect(cfg.data_dir, "observer", "fabricctl-results")
    try:
        source = _key_pages(client) if ordered else _pages(client, since, follow and not as_json)
        if as_json:
            out.write(b'{"results":[')
            first, last = True, since
            if ordered:
                last = await results_stored(client)  # before the listing: all of those are in it
            async for page in source:
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
        async for page in source:
            out.write(b"".join(result_line(rec) for _, rec in page))
            out.flush()
    finally:
        await client.close()


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
        source = (job_pages(client, job_id) if ordered
                  else _job_stream_pages(client, number, since))
        first = True
        if as_json:
            out.write(b'{"job":"%s","results":[' % job_id.encode())
        async for page in source:
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
