"""`fabricctl submit`: stream JSONL into a running broker, optionally waiting for the results.

Contract:
- The `submit` command (`command`) reads FILE, or stdin for `-` (saying so on a terminal);
  a missing file, or `--ordered` without `--wait`, is exit 2; errors are written after the
  progress bar is gone (`support.guarded`).
- A submit is one **job** (`fabricctl.core.jobs`): it opens one before the first line
  goes (`fabricctl: job ID` on stderr) and seals it when the input ends, with its line
  count and the first refused lines' messages. A FILE (not stdin) is sent with its sha256:
  the same file submitted again *attaches* to its job (unless `--new-job`), as `--job ID`
  does for any input; an attached submit sends every line again with `resume`, and the
  broker skips the ones the job already stored (`Ack.skipped`), with no duplicate errors.
- `--priority N` and `--window DUR` are the new job's terms (`jobs.priority_option`,
  `jobs.window_option`: a bad value is exit 2 and nothing is sent); an attached submit with
  `--priority` changes its live job's priority to N, and keeps the job's own window.
- The input goes through `fabricctl.producer.feed.Feed`, the one submit pipeline (at most
  `max_line_bytes` of one line held; memory bounded by its chunking, not by the input).
  What grows with the input is the reader's set of ids seen (duplicate check) and, with
  `--wait`, one int per result written (`producer.follow.JobFollower`).
- Items for a model no registered consumer serves still go in (a remote consumer may
  join): once the input is in, one `fabricctl: warning: no consumer serves model 'M'
  (served: ...): its N items wait until one joins` per such model (`ServedCheck`: the
  broker is asked by a task the first ack starts, and again only when needed).
- Every refused line, the reader's (`line N: reason`) or the broker's (a duplicate id, same
  form, with the input line number), is one `fabricctl: error: line N: reason` on stderr; the
  other lines still go in.
- stdout stays empty unless `wait`: then each result of the job is written as one JSONL
  line (`result_line`: native or OpenAI batch output, as the input line came) as soon as the
  broker has stored it, and nothing else, until every item of the job has its outcome. An
  attached submit writes the results the job already had too, so the output holds one line
  per accepted input line.
- `ordered` (with `wait`): the same results in input order instead of completion order,
  through an `InputOrder` (`producer.ordered`): each is written once every earlier accepted line's
  result has been, so output still streams; refused lines have no place in the order. It
  holds the ids sent and not yet written, and only the results that came out of order.
- Exit: 0 every line accepted (and with `wait` every result written), 1 some line refused,
  4 `timeout` seconds passed after the input ended with results still missing (what has
  arrived is written, in input order with `ordered`). No broker raises `BackendMissing` (3).
- The broker lost after the connect (killed mid-stream): exit 3 with exactly one error line
  (`lost_message`) naming how many lines were acknowledged, i.e. stored durably, and saying
  to run the same submit again; nothing after it on stderr: the reader thread stops at its
  next hand-off, in-flight sends end with the connection, and no task or reply future is
  left with an exception nobody saw.
- Token counts: `formats.tokens.choose_counter([producer] tokenizer, model)` of this
  command's configuration (the broker counts nothing; `fabricctl status` names the choice).
- Shapes of lines that declare none: `[producer] shapes` (`--shapes auto|declared`) and
  `block_size` of this command's configuration (`formats.autoshape`, one finder per job).
- A progress line (Rich, `ProgressView`) is drawn on stderr only when the CLI passes one:
  stderr is a terminal and results are not streaming to a terminal. It starts on the
  first chunk, so a failed connect leaves no bar; refused lines print above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import typer

from fabricctl.cli.jobs import PRIORITY_HELP, WINDOW_HELP, priority_option, window_option
from fabricctl.cli.support import (
    ConfigFile,
    DataDir,
    Shapes,
    fail,
    guarded,
    load,
    shapes_flag,
    stdin_binary,
)
from fabricctl.config import AppConfig
from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Item
from fabricctl.errors import BackendMissing, ExitCode
from fabricctl.formats.reader import read_lines
from fabricctl.formats.results import ResultRecord, result_line
from fabricctl.formats.tokens import choose_counter
from fabricctl.producer import Chunk, InputOrder, Job, Producer, file_digest
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import Ack


def command(
    file: str = typer.Argument("-", metavar="FILE|-", help="JSONL, native or OpenAI batch; "
                               "- (the default) reads stdin.", show_default=False),
    wait: bool = typer.Option(False, "--wait", "-w", help="Stay until every accepted item has "
                              "its result and print the results as JSONL on stdout."),
    timeout: float | None = typer.Option(None, "--timeout", "-t", min=0, metavar="SECONDS",
                                         help="With --wait: give up (exit 4) this many "
                                         "seconds after the input ended if results are still "
                                         "missing."),
    ordered: bool = typer.Option(False, "--ordered", help="With --wait: print the results "
                                 "in input order (as vllm run-batch does) instead of as they "
                                 "complete; each is printed once every earlier line's result "
                                 "has been. Refused lines have no result."),
    job: str = typer.Option("", "--job", "-j", metavar="ID", help="Continue this job (an id "
                            "or unique prefix): lines already stored in it are skipped. A "
                            "FILE submitted again continues its job on its own."),
    new_job: bool = typer.Option(False, "--new-job", help="Always start a new job, even for "
                                 "a file submitted before."),
    priority: str | None = typer.Option(None, "--priority", "-p", metavar="N",
                                        help=PRIORITY_HELP, show_default=False),
    window: str | None = typer.Option(None, "--window", metavar="DUR", help=WINDOW_HELP,
                                      show_default=False),
    shapes: str | None = Shapes,
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """Stream JSONL prompts into the running broker as one job.

    Input is read and sent in chunks, so memory stays flat on any input size.
    Each refused line is one "fabricctl: error: line N: reason" on stderr; the rest goes in.
    stdout stays empty unless --wait, which prints each result as JSONL as it completes
    (in input order with --ordered).
    Items for a model no consumer serves go in (one may join) with one warning per model
    on stderr. If the broker dies mid-stream, one error line says how many lines were
    acknowledged (stored durably): run the same submit again, it skips what is stored.
    --priority and --window set the new job's priority and completion window.
    Exit status: 0 all lines accepted, 1 some refused, 2 a bad flag (nothing is sent), 3 no
    broker (or lost), 4 --timeout expired.
    """
    from fabricctl.cli.progress import ProgressView, input_size, stderr_is_tty

    if ordered and not wait:
        raise fail("--ordered orders the results that --wait prints; add --wait",
                   ExitCode.USAGE)
    if job and new_job:
        raise fail("--job continues a job and --new-job starts one; drop one of them",
                   ExitCode.USAGE)
    prio = priority_option(priority)
    window_s = window_option(window)
    cfg = load(config, data_dir=data_dir, **shapes_flag(shapes))
    if file != "-" and not Path(file).is_file():
        raise fail(f"{file}: no such file", ExitCode.USAGE)
    name, sha256, size = "-", "", 0
    if file != "-":
        name = str(Path(file).resolve())
        sha256, size = file_digest(Path(file))
    with open(file, "rb") if file != "-" else contextlib.nullcontext(stdin_binary()) as fp:
        if file == "-" and sys.stdin.isatty():
            sys.stderr.write("fabricctl: reading JSONL from the terminal; end with Ctrl-D\n")
        # A bar only for a person watching stderr, and not over results streaming to them.
        show_bar = stderr_is_tty() and not (wait and sys.stdout.isatty())
        view = ProgressView(input_size(fp)) if show_bar else None

        def body() -> int:
            with view if view is not None else contextlib.nullcontext():
                return asyncio.run(run_submit(cfg, fp, wait=wait, timeout=timeout,
                                              out=sys.stdout.buffer, progress=view,
                                              ordered=ordered, name=name, sha256=sha256,
                                              size=size, job=job, new_job=new_job,
                                              priority=prio, window_s=window_s))

        code = guarded(body)  # errors are written after the progress bar is gone
    raise typer.Exit(code)


class _Counting:
    """Why: a byte count for the progress bar without a second pass over the input."""

    def __init__(self, fp: BinaryIO) -> None:
        self.fp, self.n = fp, 0

    def readline(self, limit: int = -1) -> bytes:
        line = self.fp.readline(limit)
        self.n += len(line)
        return line


class Submitter:
    """Why: the state one submit shares between its feed, its acks and its result follower."""

    def __init__(self, job: Job, *, wait: bool, out: BinaryIO, err: Any = None,
                 progress: Any = None, ordered: bool = False) -> None:
        self.job, self.wait, self.out, self.err = job, wait, out, err
        self.progress = progress
        self.written = 0
        # --ordered: results go through the input order, which calls _emit in its turn
        self.order = InputOrder(self._emit) if ordered and wait else None
        self.results_done = False
        self.started = time.monotonic()
        self.first_result: float | None = None
        self.served = ServedCheck(job.producer.client)
        self.feed = job.feed

    # what the progress bar and the lost-broker message read
    accepted = property(lambda self: self.feed.accepted)
    skipped = property(lambda self: self.feed.skipped)  # stored in the job before: not sent
    rejected = property(lambda self: self.feed.refusals.count)
    lines = property(lambda self: self.feed.lines)
    bytes_read = property(lambda self: self.feed.bytes_read)
    input_done = property(lambda self: self.feed.done)

    def error(self, message: str, kind: str = "error") -> None:
        err = self.err or sys.stderr  # looked up now: a progress bar redirects sys.stderr
        err.write(f"fabricctl: {kind}: {message}\n")
        err.flush()

    async def warn_unserved(self) -> None:
        """Once the input is in: one warning per model of it that no consumer serves."""
        for message in await self.served.warnings():
            self.error(message, "warning")

    async def run(self, fp: BinaryIO) -> None:
        """Send the input into the job (`Job.submit`), counting the bytes read."""
        counting = _Counting(fp)
        lines = read_lines(counting, self.job.producer.max_line_bytes)  # type: ignore[arg-type]
        await self.job.submit(lines, position=lambda: counting.n, on_refused=self.error,
                              prepare=self._prepare, on_ack=self._acked,
                              on_progress=self._tick)

    def _prepare(self, chunk: Chunk) -> None:
        if self.order is not None:  # sent in input order; refusals dropped on ack
            self.order.expect(i.id for i in chunk.items)

    def _acked(self, items: list[Item], ack: Ack) -> None:
        refused = {r.index for r in ack.rejects}
        if self.order is not None:
            for i in refused:
                self.order.drop(items[i].id)
        self.served.count(items, refused)

    def _write(self, rec: ResultRecord) -> None:
        """A result of this submit's job: out now, or into the input order (`ordered`)."""
        if self.first_result is None:
            self.first_result = time.monotonic()
        if self.order is not None:
            self.order.add(rec)
        else:
            self._emit(rec)
        self._tick()

    def _emit(self, rec: ResultRecord) -> None:
        self.out.write(result_line(rec))
        self.written += 1

    def finish(self) -> None:
        """Write what the input order still holds (results whose earlier ones never came)."""
        if self.order is not None:
            self.order.finish()

    def done(self) -> bool:
        return self.input_done and (not self.wait or self.results_done)

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(self)


async def run_submit(cfg: AppConfig, fp: BinaryIO, *, wait: bool, timeout: float | None,
                     out: BinaryIO, err: Any = None, progress: Any = None,
                     ordered: bool = False, name: str = "-", sha256: str = "", size: int = 0,
                     job: str = "", new_job: bool = False, priority: int | None = None,
                     window_s: float = 0.0) -> int:
    """Submit a stream as a job; the exit code (see the module contract). `priority` (None:
    not given, 0 for a new job) and `window_s` (0: none) are a new job's terms."""
    producer = await Producer.connect(
        cfg.data_dir, name="fabricctl-submit",
        counter=choose_counter(cfg.producer.tokenizer, cfg.model),
        max_line_bytes=cfg.producer.max_line_bytes, shapes=cfg.producer.shapes,
        block_size=cfg.producer.block_size)
    try:
        the_job = await producer.open_job("submit", name=name, sha256=sha256, size=size,
                                          window_s=window_s, priority=priority, job=job,
                                          attach=bool(sha256) and not new_job)
        sub = Submitter(the_job, wait=wait, out=out, err=err, progress=progress,
                        ordered=ordered)
        _announce(err, the_job.record, the_job.attached)
        follower = the_job.follower(sub._write) if wait else None
        collector = asyncio.ensure_future(follower.run()) if follower is not None else None
        try:
            await sub.run(fp)
            await sub.warn_unserved()
            await the_job.seal()
            if follower is not None and collector is not None:
                follower.nudge()
                await asyncio.wait_for(asyncio.shield(collector), timeout)
                sub.results_done = True
                sub._tick()
        except BackendMissing as e:  # the broker went away mid-stream
            sub.finish()
            raise BackendMissing(lost_message(sub, e)) from None
        except TimeoutError:
            if collector is not None and not collector.done():
                collector.cancel()  # no result may come in while the held ones go out
            sub.finish()
            left = (await producer.client.job(the_job.id)).job.queued
            sub.error(f"timed out after {timeout:g} s with {left:,} result(s) missing "
                      f"({sub.written:,} written); `fabricctl results --job {the_job.id}` "
                      "prints them later")
            return ExitCode.TIMEOUT
        finally:
            if collector is not None:
                _settle(collector)
            sub.served.close()
            out.flush()
        return ExitCode.RUNTIME if sub.rejected else ExitCode.OK
    finally:
        await producer.close()


def _announce(err: Any, job: JobRecord, attached: bool) -> None:
    """The job id on stderr (one line), and whether this submit continues an earlier one."""
    e = err or sys.stderr
    if attached:
        e.write(f"fabricctl: job {job.id}: attached (submitted before: {job.total:,} items "
                f"stored, {job.outcomes:,} with an outcome); stored lines are skipped\n")
    else:
        e.write(f"fabricctl: job {job.id}\n")
    e.flush()


class ServedCheck:
    """Why: items for a model no consumer serves wait, silently, until one joins (a remote
    consumer may): the submit asks the broker which models are served, once, off the hot
    path (a task started by the first ack), and warns per model at the end of the input."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.models: dict[str, int] = {}  # model -> items accepted, in order of first sight
        self._asked: asyncio.Task[set[str] | None] | None = None

    def count(self, items: list[Item], refused: set[int]) -> None:
        """An ack's accepted items; the first ack starts the question to the broker."""
        models = self.models
        for i, item in enumerate(items):
            if i not in refused:
                models[item.model] = models.get(item.model, 0) + 1
        if self._asked is None:
            self._asked = asyncio.ensure_future(self._served())

    async def _served(self) -> set[str] | None:
        """The models the broker's registered consumers serve; None when it cannot say."""
        try:
            consumers = await self.client.query("consumers")
        except Exception:  # a warning is best effort; a lost broker is the feed's to report
            return None
        return {str(n) for c in consumers for n in (c.get("model", ""), *c.get("names", ()))}

    async def warnings(self) -> list[str]:
        """`no consumer serves model 'M' (served: ...): its N items wait until one joins`,
        per model accepted that no consumer serves. Asked again only when the first answer
        leaves a model unserved, so a consumer that joined meanwhile counts."""
        if self._asked is None:
            return []
        served = await self._asked
        if served is not None and any(m not in served for m in self.models):
            served = await self._served()
        if served is None:
            return []
        listed = ", ".join(sorted(served)) or "none"
        return [f"no consumer serves model {m!r} (served: {listed}): its {n:,} "
                f"item{'s wait' if n != 1 else ' waits'} until one joins"
                for m, n in self.models.items() if m not in served]

    def close(self) -> None:
        if self._asked is not None:
            _settle(self._asked)


def lost_message(sub: Submitter, e: BackendMissing) -> str:
    """The one error line of a submit whose broker went away after it connected: how many
    lines are safe (acknowledged: stored durably) and how to go on."""
    safe = (f"{sub.accepted:,} line{'' if sub.accepted == 1 else 's'} "
            f"{'was' if sub.accepted == 1 else 'were'} acknowledged (stored durably)")
    again = "run the same submit again"
    again += f" (from stdin: with --job {sub.job.id}): it skips the stored lines and"
    if not sub.input_done:
        return f"lost the broker mid-stream ({e}): {safe}; {again} sends the rest"
    return (f"lost the broker while waiting for results ({e}): every line was sent and "
            f"{safe}; {sub.written:,} result(s) were written: once the broker is back, "
            f"{again} prints every result")


def _settle(task: asyncio.Future[Any]) -> None:
    """A task this submit stops waiting for: cancelled, or its exception marked as seen (the
    error that matters has been raised already), so asyncio logs nothing at exit."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()
