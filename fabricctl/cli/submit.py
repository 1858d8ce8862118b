"""`fabricctl submit`: stream JSONL into a running broker, optionally waiting for the results.

Contract: the `submit` command (`command`) reads FILE, or stdin for `-` (said on a terminal), and
`run_submit` sends it through `producer.feed.Feed` as one job (`core.jobs`; `fabricctl: job ID` on
stderr), sealed with its line count and first refusals at its end; it returns the exit code.
- A FILE goes with its sha256: submitted again it attaches to its job (unless `--new-job`), as
  `--job ID` does any input, and sends every line with `resume` (stored ones skipped:
  `Ack.skipped`). `--priority N`, `--window DUR`: the new job's terms (`jobs.priority_option`,
  `jobs.window_option`); attached, `--priority` sets the live job's priority, its window stays.
- Every refused line is one `fabricctl: error: line N: reason` on stderr; the rest still goes in.
  Items for a model no consumer serves go in too; once the input is in, `fabricctl: warning: no
  consumer serves model 'M' (served: ...): its N items wait until one joins` per model
  (`ServedCheck`).
- stdout stays empty unless `wait`: then each result of the job, as soon as stored, is one JSONL
  line (`result_line`, in its input line's form), an attached job's earlier ones too; `ordered`:
  in input order (`producer.ordered.InputOrder`, still streaming).
- A progress line (`ProgressView`) when the CLI passes one (stderr a terminal, results not
  streaming to one), from the first chunk on; errors come after it is gone (`support.guarded`).
  Tokens, shapes: this command's `[producer] tokenizer`, `shapes` (`--shapes`), `block_size`.
- Exit: 0 every line accepted (with `wait`, every result written); 1 some line refused; 2 a
  missing file, `--ordered` without `--wait`, a bad term (nothing sent); 3 no broker
  (`BackendMissing`), or one lost mid-stream: one error line (`lost_message`: the lines
  acknowledged, i.e. stored, and to run it again), nothing after; 4 `timeout` seconds after the
  input ended, results missing (those arrived are written).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import typer

from fabricctl.cli.jobs import Priority, Window, priority_option, window_option
from fabricctl.cli.support import (
    ConfigFile,
    DataDir,
    Shapes,
    check_input,
    fail,
    guarded,
    input_name,
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
from fabricctl.producer import Chunk, FeedHooks, InputOrder, Job, Producer, file_digest
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
    priority: str | None = Priority,
    window: str | None = Window,
    shapes: str | None = Shapes,
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """Stream JSONL prompts into the running broker as one job.

    Input is read and sent in chunks, so memory stays flat on any input size. Each refused
    line is one "fabricctl: error: line N: reason" on stderr; the rest goes in.

    stdout stays empty unless --wait, which prints each result as JSONL as it completes
    (in input order with --ordered).

    Items for a model no consumer serves go in (one may join) with one warning per model
    on stderr. If the broker dies mid-stream, one error line says how many lines were
    acknowledged (stored durably): run the same submit again, it skips what is stored.

    --priority and --window set the new job's priority and completion window.

    \b
    Exit status:
      0  every line accepted
      1  some lines refused
      2  a bad flag (nothing is sent)
      3  no broker (or it was lost)
      4  --timeout expired
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
    check_input(file)
    name, sha256, size = "-", "", 0
    if file != "-":
        name = input_name(Path(file))
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

    def __init__(self, job: Job, client: Client, *, wait: bool, out: BinaryIO,
                 err: Any = None, progress: Any = None, ordered: bool = False) -> None:
        self.job, self.wait, self.out, self.err = job, wait, out, err
        self.progress = progress
        self.written = 0
        # --ordered: results go through the input order, which calls _emit in its turn
        self.order = InputOrder(self._emit) if ordered and wait else None
        self.results_done = False
        self.started = time.monotonic()
        self.first_result: float | None = None
        self.served = ServedCheck(client)
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

    async def run(self, fp: BinaryIO, timeout: float | None) -> None:
        """The job's one orchestration (`Job.run`): the input in, counting the bytes read,
        then (`wait`) every result out, `timeout` seconds at most after the seal."""
        counting = _Counting(fp)
        lines = read_lines(counting, self.job.max_line_bytes)  # type: ignore[arg-type]
        hooks = FeedHooks(on_refused=self.error, prepare=self._prepare, on_ack=self._acked,
                          on_progress=self._tick)
        await self.job.run(lines, hooks=hooks, position=lambda: counting.n,
                           write=self._write if self.wait else None, timeout=timeout,
                           before_seal=self.warn_unserved)
        if self.wait:
            self.results_done = True
            self._tick()

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
        sub = Submitter(the_job, producer.client, wait=wait, out=out, err=err,
                        progress=progress, ordered=ordered)
        _announce(err, the_job.record, the_job.attached)
        try:
            await sub.run(fp, timeout)
        except BackendMissing as e:  # the broker went away mid-stream
            sub.finish()
            raise BackendMissing(lost_message(sub, e)) from None
        except TimeoutError:  # the follower is stopped: no result comes in while held ones go
            sub.finish()
            left = (await producer.client.job(the_job.id)).job.queued
            sub.error(f"timed out after {timeout:g} s with {left:,} result(s) missing "
                      f"({sub.written:,} written); `fabricctl results --job {the_job.id}` "
                      "prints them later")
            return ExitCode.TIMEOUT
        finally:
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
            consumers = await self.client.consumers()
        except Exception:  # a warning is best effort; a lost broker is the feed's to report
            return None
        return {n for c in consumers for n in (c.model, *c.names)}

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
