"""`fabricctl run`: the one-shot batch job — embedded broker and engines, submit, wait, write.

Contract: the `run` command (`command`) writes the results on stdout (or `--output`) and the
summary on stderr: a Rich table (`print_run_summary`, also `make demo`'s), or with `--json`
one JSON document (on stdout with `--output`, else on stderr after the results). A missing
input file is exit 2; errors are `support.guarded`'s. Lines that declare no shape get the one
`[producer] shapes` (`--shapes`) finds, as `submit`'s (`formats.autoshape`).
`run_job` starts a `Daemon` in a data dir of its own (a temporary one unless given),
streams the input through the producer reader (a bad line is reported with its line number
and the rest still goes in; token counts from `formats.tokens.choose_counter`: `[producer]
tokenizer` when set, else the configured model directory's `tokenizer.json`, else the
estimate, named in the summary's `token_counter`), waits until every accepted item has its
result, writes the results in the input's form (native or OpenAI batch output) and returns a
`RunSummary` whose figures come from the broker's and the engines' own counters. KV hit rate
is the engines' hits over their queries, which count every request they ran, pre-warms
included; achievable is the most those same requests could hit (`AchievableHits`): on each GPU,
every request's leading prefix blocks below its last token, less one computation of each
distinct prefix block there (a pre-warm's prefill pays it for the items after it; shapes
whose components start alike share their leading blocks). Results are written in
completion order, or with `ordered` in input order (`ordered.InputOrder`: the accepted ids
in input order, and only the results that came out of order, are held). The input is one
job of kind "run" (`core.jobs`), followed by `follow.JobFollower`: the results are the
job's, whatever else the data dir holds, and the run keeps running totals of them, not the
records.
Resume: with `--data-dir` (`keep_data`) a FILE's job is found again by its path and sha256.
The same command after a crash or Ctrl-C attaches to it and sends every line with `resume`:
the broker skips those it already stored (items with a result are never sent to an engine
again; queued ones run from the store), and the output holds the earlier run's results
too, so it ends with exactly one line per accepted input line.
`--priority N` and `--window DUR` are its job's terms, as `submit` takes them (a bad value:
exit 2 before anything starts); a continued job takes the priority, keeps its own window.
Items for a model none of the run's own consumers serves get an error row at once and
refused lines their run-batch error row (`run_rows.Unserved`, `run_rows.RefusedRows`); the
command then exits 1, as `submit` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import msgspec
import typer

from fabricctl.cli.jobs import PRIORITY_HELP, WINDOW_HELP, priority_option, window_option
from fabricctl.cli.run_rows import RefusedRows, Unserved
from fabricctl.cli.run_summary import AchievableHits, RunSummary, print_run_summary
from fabricctl.cli.support import (
    ConfigFile,
    Shapes,
    Verbose,
    fail,
    load,
    run_async,
    setup_logging,
    shapes_flag,
    stdin_binary,
)
from fabricctl.config import AppConfig
from fabricctl.core.types import Item
from fabricctl.daemon import Daemon
from fabricctl.errors import ExitCode
from fabricctl.formats.reader import read_lines
from fabricctl.formats.results import (
    ResultRecord,
    result_line,
)
from fabricctl.formats.tokens import choose_counter
from fabricctl.producer import Chunk, Feed, InputOrder, Job, Producer, file_digest
from fabricctl.wire.protocol import Ack

log = logging.getLogger("fabricctl.run")


def command(
    file: Path = typer.Argument(..., help="JSONL (native or OpenAI batch), or - for stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where to write results "
                                       "(default: stdout)."),
    config: Path | None = ConfigFile,
    engine: str | None = typer.Option(None, "--engine", "-e"),
    model: str | None = typer.Option(None, "--model", "-m"),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON: on stdout "
                                  "with --output, else on stderr after the results."),
    ordered: bool = typer.Option(False, "--ordered", help="Write the results in input order "
                                 "(as vllm run-batch does) instead of as they complete; each "
                                 "is written once every earlier line's result has been. "
                                 "A refused OpenAI batch line's error row takes its place."),
    data_dir: Path | None = typer.Option(None, "--data-dir", "-d", help="Keep the job in this "
                                         "data dir (default: a temporary one, deleted): the "
                                         "same command again after a crash or Ctrl-C continues "
                                         "it, sending only what has no result yet.",
                                         show_default=False),
    priority: str | None = typer.Option(None, "--priority", "-p", metavar="N",
                                        help=PRIORITY_HELP, show_default=False),
    window: str | None = typer.Option(None, "--window", metavar="DUR", help=WINDOW_HELP,
                                      show_default=False),
    shapes: str | None = Shapes,
    verbose: bool = Verbose,
) -> None:
    """One-shot batch job: embedded broker and engines; submit, wait, write results, summarise.

    Results are written in completion order, or in input order with --ordered. Token counts
    come from [producer] tokenizer, else the model directory's tokenizer.json (--model
    DIR), else an estimate of 4 bytes a token; the --json summary names it (token_counter).
    Items for a model no engine of this run serves are not sent: each gets an error result,
    stderr names the model and what is served, the rest runs, and the exit status is 1.
    A refused line is reported on stderr as "line N: reason" (an OpenAI batch line also
    gets an error row in the output, as vllm run-batch writes one), the rest runs, and the
    exit status is 1.
    --priority and --window set the job's priority and completion window (as submit's).
    """
    setup_logging(verbose) if verbose else logging.basicConfig(level=logging.WARNING)
    prio = priority_option(priority)
    window_s = window_option(window)
    cfg = load(config, engine=engine, model=model, data_dir=data_dir, **shapes_flag(shapes))
    if str(file) != "-" and not file.is_file():
        raise fail(f"{file}: no such file", ExitCode.USAGE)
    out = output.open("wb") if output else sys.stdout.buffer
    try:
        summary = run_async(run_job(cfg, file, out, ordered=ordered,
                                    keep_data=data_dir is not None, priority=prio,
                                    window_s=window_s))
    finally:
        if output:
            out.close()
    if json_out:
        (sys.stdout if output else sys.stderr).write(msgspec.json.encode(summary).decode() + "\n")
    else:
        print_run_summary(summary)
    if summary.unserved or summary.rejected:
        raise typer.Exit(ExitCode.RUNTIME)  # some lines got an error, not an answer


async def _submit(job: Job, path: Path, shapes: AchievableHits, errors: Callable[[str], None],
                  order: InputOrder | None, unserved: Unserved, refused: RefusedRows) -> Feed:
    """Send the input into `job` (`Job.submit`, the one pipeline) and seal it; its feed.
    `order` learns the ids in input order (and which the broker refused). Items `unserved`
    takes (no consumer of this run serves their model) are not sent: their error results go
    out through `unserved.write`, or into `order` at their place in the input. `refused`
    gets every refused line (the reader's before the chunk's items go, the broker's before
    `order` drops them)."""

    def prepare(chunk: Chunk) -> None:
        refused.chunk(chunk)
        ids = [i.id for i in chunk.items]  # in input order, the unserved ones included
        sent: list[Item] = []
        early: list[ResultRecord] = []  # with `order`: this chunk's unserved items' results
        for item in chunk.items:
            rec = unserved.take(item)
            if rec is None:
                shapes.add(item)
                sent.append(item)
            elif order is not None:
                early.append(rec)
            else:
                unserved.write(rec)
        chunk.items = sent
        if order is not None:
            order.expect(ids)
            for rec in early:
                order.add(rec)

    def acked(items: list[Item], ack: Ack) -> None:
        for r in ack.rejects:
            refused.rejected(items[r.index], r.reason)
            if order is not None:
                order.drop(items[r.index].id)

    with path.open("rb") if str(path) != "-" else contextlib.nullcontext(stdin_binary()) as fp:
        feed = await job.submit(read_lines(fp, job.producer.max_line_bytes),
                                on_refused=errors, prepare=prepare, on_ack=acked)
    await job.seal()
    return feed


class _Totals:
    """Why: the summary needs token sums and who served what, not every result record."""

    def __init__(self) -> None:
        self.results = self.tokens_in = self.tokens_out = 0

    def add(self, rec: ResultRecord) -> None:
        self.results += 1
        self.tokens_in += rec.prompt_tokens
        self.tokens_out += rec.completion_tokens


class _Results:
    """Why: each result of the job counts in the totals and the achievable bound, then goes
    out in completion order, or through the input order (`--ordered`)."""

    def __init__(self, out: IO[bytes], shapes: AchievableHits, ordered: bool) -> None:
        self.out, self.shapes, self.totals = out, shapes, _Totals()
        self.order = InputOrder(self._emit) if ordered else None
        self.refused = RefusedRows(out.write, ordered)

    def _emit(self, rec: ResultRecord) -> None:
        if self.order is not None:
            self.refused.before(rec.line)
        self.out.write(result_line(rec))

    def write(self, rec: ResultRecord) -> None:
        self.totals.add(rec)
        self.shapes.completed(rec)
        if self.order is not None:
            self.order.add(rec)
        else:
            self._emit(rec)

    def finish(self) -> None:
        """Every result of the job came: what the input order holds (nothing by now) goes."""
        if self.order is not None:
            self.order.finish()
        self.refused.finish()
        self.out.flush()


async def run_job(
    cfg: AppConfig, input_path: Path, out: IO[bytes],
    errors: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
    keep_data: bool = False, ordered: bool = False, priority: int | None = None,
    window_s: float = 0.0,
) -> RunSummary:
    counter = choose_counter(cfg.producer.tokenizer, cfg.model)
    log.info("token counts: %s", counter.name)
    tmp = None
    if not keep_data:
        tmp = Path(tempfile.mkdtemp(prefix="fabricctl-run-"))
        cfg = dataclasses.replace(cfg, data_dir=tmp)
    daemon = Daemon(cfg)
    t0 = time.perf_counter()
    try:
        await daemon.start()
        assert daemon.server is not None and daemon.fleet is not None
        shapes = AchievableHits()
        for c in daemon.fleet.consumers:  # before any pre-warm: each is a request counted
            c.on_prewarm = functools.partial(shapes.prewarmed, c.gpu)
        await daemon.fleet.wait_connected()
        producer = await Producer.connect(daemon.server.state.cfg.socket_path, name="run",
                                          counter=counter,
                                          max_line_bytes=cfg.producer.max_line_bytes,
                                          shapes=cfg.producer.shapes,
                                          block_size=cfg.producer.block_size)
        collector = None
        results = _Results(out, shapes, ordered)
        try:
            name, sha256 = "-", ""
            if str(input_path) != "-":
                name = str(input_path.resolve())
                sha256 = (await asyncio.to_thread(file_digest, input_path))[0]
            t_job = time.perf_counter()
            job = await producer.open_job("run", priority=priority, name=name, sha256=sha256,
                                          window_s=window_s, attach=keep_data and bool(sha256))
            if job.attached:
                j = job.record
                log.warning("continuing job %s from %s: %d items stored, %d with an outcome",
                            j.id, cfg.data_dir, j.total, j.outcomes)
            follower = job.follower(results.write)
            collector = asyncio.ensure_future(follower.run())
            unserved = Unserved({n for c in daemon.fleet.consumers
                                 for n in c.contract().served()},
                                lambda rec: out.write(result_line(rec)))
            feed = await _submit(job, input_path, shapes, errors, results.order, unserved,
                                 results.refused)
            for message in unserved.messages():
                errors(f"fabricctl: error: {message}")
            out.flush()
            follower.nudge()
            await collector
            serve_s = time.perf_counter() - t_job
            results.finish()
        finally:
            if collector is not None and not collector.done():
                collector.cancel()
            await producer.close()
        wall = time.perf_counter() - t0
        return await _summarise(daemon, feed, results, shapes, unserved, counter.name,
                                wall, serve_s)
    finally:
        await daemon.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


async def _summarise(daemon: Daemon, feed: Feed, results: _Results, shapes: AchievableHits,
                     unserved: Unserved, counter: str, wall: float, serve_s: float
                     ) -> RunSummary:
    """The run's figures from the broker's and the engines' own counters (the engines'
    once nothing more reaches them)."""
    assert daemon.server is not None and daemon.fleet is not None
    core = daemon.server.state.core
    stats = await daemon.fleet.settled_stats()
    queries = sum(s.prefix_cache_queries for s in stats)
    hits = sum(s.prefix_cache_hits for s in stats)
    block = max((s.block_size for s in stats), default=0) or 16
    achievable = shapes.achievable(block)
    totals = results.totals
    return RunSummary(
        items=feed.accepted + feed.skipped,  # this run's items and the earlier one's
        rejected=feed.refusals.count,
        tokens_in=totals.tokens_in, tokens_out=totals.tokens_out,
        wall_s=round(wall, 3), shapes=len(shapes.prefix),
        shape_switches=sum(m.switches for m in core.models.values()),
        midstream_switches=sum(m.midstream_switches for m in core.models.values()),
        kv_hit_rate=round(hits / queries, 4) if queries else 0.0,
        kv_hit_achievable=round(min(1.0, achievable / queries), 4) if queries else 0.0,
        padding_waste=round(core.waste(), 4), thrash_events=core.batches_hist.thrashed,
        engine=daemon.fleet.kind, simulated=daemon.fleet.kind == "sim",
        gpus=len(daemon.fleet.engines), ledger_difference=core.ledger.difference(),
        token_counter=counter, unserved=unserved.total, serve_s=round(serve_s, 3),
    )
