"""`fabricctl run`: the one-shot batch job — embedded broker and engines, submit, wait, write.

Contract: the `run` command (`command`) writes the results on stdout (or `--output`) and the
summary on stderr: a Rich table (`print_run_summary`, also `make demo`'s), or with `--json` one
JSON document (on stdout with `--output`, else on stderr after the results).
- `run_job` starts a `Daemon` in a data dir of its own (temporary unless given; deleted after a
  run that succeeded, kept after a failed or interrupted one and named on stderr, with the
  `logs/engine-<n>.log` an error names), feeds the input as one job of kind "run" (`core.jobs`),
  waits for every accepted item's result, writes the job's results in the input's form (native or
  OpenAI batch output) and returns a `RunSummary` (`run_summary`: the broker's and the engines'
  own counters; KV hits against `AchievableHits`).
- Results go in completion order, or with `ordered` in input order (`ordered.InputOrder`); it
  keeps running totals, not the records. A bad line is reported by number; the rest goes in.
- Token counts (`formats.tokens.choose_counter`, named in `token_counter`) and the shapes of lines
  declaring none (`[producer] shapes`, `--shapes`) are `submit`'s.
- Resume: with `--data-dir` (`keep_data`) the same command after a crash or Ctrl-C finds a FILE's
  job by path and sha256 and sends every line with `resume` (stored items skipped, none with a
  result runs again); the output, earlier results included, has one line per accepted input line.
- `--priority N`, `--window DUR`: its job's terms, as `submit`'s (a continued job takes the
  priority, keeps its window). Without `--verbose`, warnings (a vLLM server's failed start, with
  its log's tail) go to stderr as `fabricctl: <message>`. Items for a model no consumer of the run
  serves, and refused lines, get error rows (`run_rows.Unserved`, `run_rows.RefusedRows`).
- Exit 1: a refused line or an unserved item (as `submit`); 2: a missing input file or a bad term
  (before anything starts); other errors: `support.guarded`'s.
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

from fabricctl.cli.jobs import Priority, Window, priority_option, window_option
from fabricctl.cli.optgroup import takes
from fabricctl.cli.run_rows import RefusedRows, Unserved
from fabricctl.cli.run_summary import AchievableHits, RunSummary, print_run_summary, thrash_note
from fabricctl.cli.support import (
    UNSET,
    ConfigFile,
    EngineFlags,
    Shapes,
    Verbose,
    check_input,
    input_name,
    job_logging,
    load,
    run_async,
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
from fabricctl.producer import Chunk, Feed, FeedHooks, InputOrder, Job, Producer, file_digest
from fabricctl.server.heap import settle_heap
from fabricctl.wire.protocol import Ack

log = logging.getLogger("fabricctl.run")


@takes(EngineFlags)
def command(
    file: Path = typer.Argument(..., metavar="FILE|-",
                                help="JSONL (native or OpenAI batch), or - for stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where to write results "
                                       "(default: stdout)."),
    config: Path | None = ConfigFile,
    engines: EngineFlags = UNSET,
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON: on stdout "
                                  "with --output, else on stderr after the results."),
    ordered: bool = typer.Option(False, "--ordered", help="Write the results in input order "
                                 "(as vllm run-batch does) instead of as they complete; each "
                                 "is written once every earlier line's result has been. "
                                 "A refused OpenAI batch line's error row takes its place."),
    data_dir: Path | None = typer.Option(None, "--data-dir", "-d", metavar="DIR",
                                         help="Keep the job in this data dir (default: a "
                                         "temporary one, deleted): the same command again "
                                         "after a crash or Ctrl-C continues it, sending only "
                                         "what has no result yet.",
                                         show_default=False),
    priority: str | None = Priority,
    window: str | None = Window,
    shapes: str | None = Shapes,
    verbose: bool = Verbose,
) -> None:
    """One-shot batch job: embedded broker and engines; submit, wait, write results, summarise.

    Results are written in completion order, or in input order with --ordered.

    Token counts come from [producer] tokenizer, else the model directory's tokenizer.json
    (--model DIR), else an estimate of 4 bytes a token; the --json summary names it
    (token_counter).

    Items for a model no engine of this run serves are not sent: each gets an error result,
    stderr names the model and what is served, the rest runs, and the exit status is 1.
    A refused line is reported on stderr as "line N: reason" (an OpenAI batch line also
    gets an error row in the output, as vllm run-batch writes one), the rest runs, and the
    exit status is 1.

    --priority and --window set the job's priority and completion window (as submit's).
    """
    job_logging(verbose)
    prio = priority_option(priority)
    window_s = window_option(window)
    cfg = load(config, data_dir=data_dir, **shapes_flag(shapes), **engines.config())
    check_input(file)
    out = output.open("wb") if output else sys.stdout.buffer
    try:
        settle_heap()  # this process runs the broker: its collector settings
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


async def _run(job: Job, path: Path, shapes: AchievableHits, errors: Callable[[str], None],
               results: _Results, unserved: Unserved) -> Feed:
    """Run `job` over the input (`Job.run`, the one orchestration: follow, submit, seal,
    await every result through `results.write`); its feed.
    `order` learns the ids in input order (and which the broker refused). Items `unserved`
    takes (no consumer of this run serves their model) are not sent: their error results go
    out through `unserved.write`, or into `order` at their place in the input. `refused`
    gets every refused line (the reader's before the chunk's items go, the broker's before
    `order` drops them)."""

    order, refused = results.order, results.refused

    async def before_seal() -> None:
        for message in unserved.messages():
            errors(f"fabricctl: error: {message}")
        results.out.flush()

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
        await job.run(read_lines(fp, job.max_line_bytes), write=results.write,
                      hooks=FeedHooks(on_refused=errors, prepare=prepare, on_ack=acked),
                      before_seal=before_seal)
    return job.feed


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
    t0 = time.perf_counter()
    done = False
    daemon: Daemon | None = None
    try:
        daemon = await Daemon.start(cfg)
        shapes = AchievableHits()
        for c in daemon.fleet.consumers:  # before any pre-warm: each is a request counted
            c.on_prewarm = functools.partial(shapes.prewarmed, c.gpu)
        await daemon.fleet.wait_connected()
        producer = await Producer.connect(daemon.server.state.cfg.socket_path, name="run",
                                          counter=counter,
                                          max_line_bytes=cfg.producer.max_line_bytes,
                                          shapes=cfg.producer.shapes,
                                          block_size=cfg.producer.block_size)
        results = _Results(out, shapes, ordered)
        try:
            name, sha256 = "-", ""
            if str(input_path) != "-":
                name = input_name(input_path)
                sha256 = (await asyncio.to_thread(file_digest, input_path))[0]
            t_job = time.perf_counter()
            job = await producer.open_job("run", priority=priority, name=name, sha256=sha256,
                                          window_s=window_s, attach=keep_data and bool(sha256))
            if job.attached:
                j = job.record
                log.warning("continuing job %s from %s: %d items stored, %d with an outcome",
                            j.id, cfg.data_dir, j.total, j.outcomes)
            unserved = Unserved({n for c in daemon.fleet.consumers
                                 for n in c.contract().served()},
                                lambda rec: out.write(result_line(rec)))
            feed = await _run(job, input_path, shapes, errors, results, unserved)
            serve_s = time.perf_counter() - t_job
            results.finish()
        finally:
            await producer.close()
        wall = time.perf_counter() - t0
        summary = await _summarise(daemon, feed, results, shapes, unserved, counter.name,
                                   wall, serve_s)
        done = True
        return summary
    finally:
        if daemon is not None:
            await daemon.stop()
        if tmp is not None and done:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:  # what the error names (an engine's log) must still be there
            errors(f"fabricctl: the run did not finish; its data dir is kept: {tmp} (the "
                   f"servers' logs in {tmp / 'logs'}; delete it when done)")


async def _summarise(daemon: Daemon, feed: Feed, results: _Results, shapes: AchievableHits,
                     unserved: Unserved, counter: str, wall: float, serve_s: float
                     ) -> RunSummary:
    """The run's figures from the broker's and the engines' own counters (the engines'
    once nothing more reaches them)."""
    fig = daemon.store.figures()
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
        shape_switches=fig.shape_switches, midstream_switches=fig.midstream_switches,
        kv_hit_rate=round(hits / queries, 4) if queries else 0.0,
        kv_hit_achievable=round(min(1.0, achievable / queries), 4) if queries else 0.0,
        padding_waste=round(fig.padding_waste, 4), thrash_events=fig.thrash_events,
        engine=daemon.fleet.kind, simulated=daemon.fleet.kind == "sim",
        gpus=len(daemon.fleet.engines), ledger_difference=fig.ledger_difference,
        token_counter=counter, unserved=unserved.total, serve_s=round(serve_s, 3),
        kv_note=shapes.kv_note(queries, achievable, block),
        thrash_note=thrash_note(fig.thrash_events),
        device=("cpu" if daemon.fleet.kind == "vllm" and daemon.fleet.cfg.vllm.device == "cpu"
                else "gpu"),
    )
