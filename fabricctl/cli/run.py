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
Items for a model none of the run's own consumers serves (`Unserved`) are not sent: each
gets an error result line at once (its error names the model and what is served; OpenAI
form: status 404), stderr gets one `fabricctl: error: N items are for model 'M', which no
consumer serves (served: ...)` per such model when the input has been read, the rest runs,
and the command exits 1 (`RunSummary.unserved` counts them); with `ordered` an unserved
item's error result takes its place in the input order.
Refused lines (`RefusedRows`): every line the reader or the broker refuses is reported on
stderr as `line N: reason` (as before), and an OpenAI batch line also gets a row in the
output, in `vllm run-batch`'s form for a line it does not run (`formats.results.
refused_line`: status 400, no body, the message as `error`; `custom_id` "" when the line
has none that reads as a string). A line whose form cannot be told (not JSON, not an
object, too long) takes the input's form: that of the input's first line whose form can be
told (rows for such lines at the start wait until it is read; with none, they get no row).
A native line gets no row: native output has one line per item, errors on stderr. Rows go
out as the line is read, or with `ordered` at the line's place in the input order. The
command then exits 1, as `submit` does (`RunSummary.rejected` counts the lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import heapq
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec
import typer

from fabricctl.cli.jobs import PRIORITY_HELP, WINDOW_HELP, priority_option, window_option
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
from fabricctl.core.types import Item, ItemResult
from fabricctl.daemon import Daemon
from fabricctl.errors import ExitCode
from fabricctl.formats.reader import LineError, read_lines
from fabricctl.formats.results import (
    ResultRecord,
    Source,
    make_record,
    refused_line,
    result_line,
)
from fabricctl.formats.tokens import choose_counter
from fabricctl.producer import Chunk, Feed, InputOrder, Job, Producer, file_digest
from fabricctl.wire.protocol import Ack

if TYPE_CHECKING:
    pass


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


class Unserved:
    """Why: an item for a model no consumer of this run serves would wait forever; it gets
    an error result at once instead, and the run says which model and what is served."""

    def __init__(self, served: Iterable[str], write: Callable[[ResultRecord], object]) -> None:
        self.served = sorted(set(served))
        self._served = set(self.served)
        self.write = write
        self.counts: dict[str, int] = {}  # model -> items not sent, in order of first sight

    def take(self, item: Item) -> ResultRecord | None:
        """None for an item a consumer serves; else its error result (it is not sent)."""
        if item.model in self._served:
            return None
        self.counts[item.model] = self.counts.get(item.model, 0) + 1
        result = ItemResult(item.id, finish_reason="error", error=self.reason(item.model),
                            status=404)  # 404: what OpenAI answers for an unknown model
        return make_record(item, result, created=int(time.time()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reason(self, model: str) -> str:
        return f"no consumer serves model {model!r} (served: {self._listed()})"

    def messages(self) -> list[str]:
        """One line per unserved model, for stderr."""
        return [f"{n:,} item{'s are' if n != 1 else ' is'} for model {m!r}, which no "
                f"consumer serves (served: {self._listed()}); each gets an error result"
                for m, n in self.counts.items()]

    def _listed(self) -> str:
        return ", ".join(self.served) or "none"


class RefusedRows:
    """Why: `vllm run-batch` writes a row for every line it does not run, so a refused
    OpenAI batch line gets one too (see the module's contract): at once, or with `ordered`
    held until every earlier line's row is out (`before`, `finish`)."""

    def __init__(self, write: Callable[[bytes], object], ordered: bool) -> None:
        self.write, self.ordered = write, ordered
        self.openai: bool | None = None  # the input's form, once a line of known form came
        self.rows = 0  # rows made
        self._unknown: list[LineError] = []  # lines of unknown form before `openai` is known
        self._held: list[tuple[int, bytes]] = []  # ordered: (line, row), a heap

    def chunk(self, chunk: Chunk) -> None:
        """A chunk read: learn the input's form from it, then row its refused lines."""
        if self.openai is None:
            error = next((e for e in chunk.errors if e.openai is not None), None)
            item = chunk.items[0] if chunk.items else None
            if item is not None and (error is None or item.line < error.line_no):
                self._learn(item.source != Source.NATIVE)
            elif error is not None:
                self._learn(bool(error.openai))
        for e in chunk.errors:
            if e.openai is None and self.openai is None:
                self._unknown.append(e)
            else:
                self._refused(e)

    def rejected(self, item: Item, reason: str) -> None:
        """An item the broker refused."""
        if item.source != Source.NATIVE:
            self._row(item.line, reason, item.id)

    def before(self, line: int) -> None:
        """Ordered: write the held rows of the lines before `line` (its result goes next)."""
        held = self._held
        while held and held[0][0] < line:
            self.write(heapq.heappop(held)[1])

    def finish(self) -> None:
        """The input is read and every result written: the rows still held go."""
        self._unknown.clear()  # no line of known form: native, no row
        while self._held:
            self.write(heapq.heappop(self._held)[1])

    def _learn(self, openai: bool) -> None:
        self.openai = openai
        waiting, self._unknown = self._unknown, []
        for e in waiting:
            self._refused(e)

    def _refused(self, e: LineError) -> None:
        openai = self.openai if e.openai is None else e.openai
        if openai:
            self._row(e.line_no, e.reason, e.id)

    def _row(self, line: int, reason: str, custom_id: str | None) -> None:
        row = refused_line(line, reason, custom_id)
        self.rows += 1
        if self.ordered:
            heapq.heappush(self._held, (line, row))
        else:
            self.write(row)


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
            unserved = Unserved({c.model for c in daemon.fleet.consumers},
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
