"""`fabricctl jobs [list]|show|cancel|priority`: the jobs (one per submit, run or API batch).

Contract: `group` is the `jobs` Typer group; `fabricctl jobs` alone lists (as `jobs list`).
- `list` (`show_list`): the jobs the broker keeps, newest first: id, state (OpenAI's names), kind,
  priority, input, progress (items with an outcome / total), failed, cancelled, refused lines,
  age, the endpoint mix (`fmt.endpoint_mix`) and each job's place in the fleet (oldest wait,
  holders, share, predicted finish, how late against its deadline). A Rich table on a terminal,
  fitted by `common.fitted_table` (id, state and progress never cut; the caption names hidden
  columns), TSV with a header when piped (last column `endpoints`: `chat=80,embeddings=20`),
  `--json` `{"jobs": [JobRecord...], "job_views": [...]}`.
- `show ID` (`show_job`): one job by id or unique prefix, as README's table of commands lists
  (usage by `usage_text`; the predicted finish is `core.forecast.finish_in`, `eta_s` in `--json`;
  "AT RISK: predicted to finish Xs after its deadline"). `--json`: the broker's `JobView`
  (`place`: every field, or null), `usage` as the Batch API's (`core.jobs.job_usage`) and `mix`
  (`core.mix.mix`: `[{endpoint, items, share}]`, most first).
- `cancel ID` (`cancel_job`): queued items removed durably (each a "cancelled" error result,
  counted cancelled), in-flight ones finish; prints the state after (cancelling, or cancelled); a
  job already ended is left as it is and said so (exit 0).
- `priority ID N` (`set_priority`): a live job's new priority (0..MAX_PRIORITY, higher first; the
  shape choice follows at once); prints `ID: priority N` on stderr (`--json`: the record).
- Exit: 1 an unknown or ambiguous id (the broker's message), or a priority for a job ended or none
  (its refusal); 2 N out of range or not whole (nothing sent). `priority_option` and
  `window_option` read the terms of `submit` and `run` too (`--priority N`, `--window DUR`): a bad
  one is exit 2 before anything is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import typer

from fabricctl.cli.support import ConfigFile, DataDir, JsonOut, fail, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.forecast import finish_in
from fabricctl.core.jobs import JobRecord, job_usage, parse_window
from fabricctl.core.mix import mix
from fabricctl.core.terms import MAX_PRIORITY, check_priority
from fabricctl.core.unserved import Waiting, waiting_line
from fabricctl.errors import ExitCode
from fabricctl.fmt import CRITICAL, NA, age, finish_vs_deadline, pct, relative, si
from fabricctl.wire.client import Client

from .common import Col, call, console, fitted_table, stdout_is_tty, write_json, write_tsv
from .helpfmt import HelpCommand, HelpGroup
from .jobmix import endpoints_text, endpoints_tsv, mix_cell

JobId = typer.Argument(..., metavar="ID", help="A job id, or a unique prefix of one.")
JobAction = Callable[[AppConfig, str, bool], None]  # (settings, job id or prefix, --json)

group = typer.Typer(cls=HelpGroup, help="List, show, cancel and prioritise jobs (one per "
                    "submit, run or API batch).\n\nAlone, `fabricctl jobs` lists them (as "
                    "`jobs list`): the options here are for that list.",
                    invoke_without_command=True)


@group.callback()
def _default(ctx: typer.Context, json_out: bool = JsonOut, data_dir: Path | None = DataDir,
             config: Path | None = ConfigFile) -> None:
    """List, show, cancel and prioritise jobs. Alone: the list (as `jobs list`)."""
    if ctx.invoked_subcommand is None:
        cfg = settings(data_dir, config)
        guarded(lambda: show_list(cfg, json_out))


@group.command("list", cls=HelpCommand)
def list_command(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
                 config: Path | None = ConfigFile) -> None:
    """List jobs, newest first: state, progress, failures, age."""
    cfg = settings(data_dir, config)
    guarded(lambda: show_list(cfg, json_out))


def job_command(name: str) -> Callable[[JobAction], JobAction]:
    """Declares `jobs NAME ID [--json]`: the decorated action, with its docstring as the
    command's help, runs on the settings, the job id (or prefix) and --json."""

    def declare(action: JobAction) -> JobAction:
        def command(job: str = JobId, json_out: bool = JsonOut, data_dir: Path | None = DataDir,
                    config: Path | None = ConfigFile) -> None:
            cfg = settings(data_dir, config)
            guarded(lambda: action(cfg, job, json_out))

        command.__doc__ = action.__doc__
        group.command(name, cls=HelpCommand)(command)
        return action

    return declare


@job_command("show")
def show_command(cfg: AppConfig, job: str, json_out: bool) -> None:
    """Show one job: state and times, counts, throughput, predicted finish, shapes, errors."""
    show_job(cfg, job, json_out)


@job_command("cancel")
def cancel_command(cfg: AppConfig, job: str, json_out: bool) -> None:
    """Cancel a job: its queued items are removed (counted as cancelled); in-flight ones finish."""
    cancel_job(cfg, job, json_out)


@group.command("priority", cls=HelpCommand,
               context_settings={"ignore_unknown_options": True})  # N may be -1
def priority_command(
    job: str = JobId,
    priority: str = typer.Argument(..., metavar="N", help=f"The new priority: a whole number "
                                   f"from 0 to {MAX_PRIORITY}; higher goes first."),
    json_out: bool = JsonOut, data_dir: Path | None = DataDir, config: Path | None = ConfigFile,
) -> None:
    """Change a live job's priority: its items go before those of lower ones.

    The broker's scheduler is given the new priority at once. A job that has ended keeps
    its record: exit 1.
    """
    value = priority_option(priority, "N")
    assert value is not None
    cfg = settings(data_dir, config)
    guarded(lambda: set_priority(cfg, job, value, json_out))


PRIORITY_HELP = (f"The job's priority: a whole number from 0 (the default) to {MAX_PRIORITY}; "
                 "higher goes first. Change it later with: fabricctl jobs priority ID N.")
WINDOW_HELP = ("The job's completion window, as the Batch API's completion_window: \"24h\", "
               "\"90m\", \"30s\". Items still queued when it passes are cancelled and the "
               "job ends expired. Default: none.")
# the job-terms options `run`, `submit` and `table` share (read with the two parsers below)
Priority = typer.Option(None, "--priority", "-p", metavar="N", help=PRIORITY_HELP,
                        show_default=False)
Window = typer.Option(None, "--window", metavar="DUR", help=WINDOW_HELP, show_default=False)


def priority_option(text: str | None, name: str = "--priority") -> int | None:
    """A priority as typed (None: not given), or exit 2 naming the rule."""
    if text is None:
        return None
    try:
        return check_priority(text)
    except ValueError as e:
        raise fail(f"{name}: {e}", ExitCode.USAGE) from None


def window_option(text: str | None) -> float:
    """A completion window as typed, in seconds (0.0: not given), or exit 2 naming the form."""
    if text is None:
        return 0.0
    try:
        return parse_window(text)
    except ValueError as e:
        raise fail(f"--window: {e}", ExitCode.USAGE) from None


def progress_of(j: JobRecord) -> str:
    """`outcomes/total (pct)`, or `outcomes/total+` while input is still coming."""
    more = "" if j.sealed else "+"
    share = pct(j.outcomes / j.total) if j.total else "-"
    return f"{j.outcomes:,}/{j.total:,}{more} ({share})"


LIST_COLUMNS = ["id", "state", "kind", "input", "total", "completed", "failed", "cancelled",
                "refused", "created", "priority"]
PLACE_COLUMNS = ["oldest_wait_s", "holders", "share", "predicted_finish", "deadline", "at_risk"]
# The table on a terminal: the id, state and progress are never cut nor hidden; the input
# (its start: the file name stays) and endpoints are cut first, then the other columns
# hidden, those with nothing to say first, then from DEADLINE up to AGE.
TABLE_COLUMNS = [
    Col("JOB"), Col("STATE"), Col("KIND", drop=6), Col("PRIO", True, drop=5),
    Col("INPUT", shrink=12, drop=3, tail=True), Col("PROGRESS", True),
    Col("ENDPOINTS", shrink=12, drop=4),
    Col("FAILED", True, drop=2), Col("CANCELLED", True, drop=10), Col("REFUSED", True, drop=9),
    Col("AGE", True, drop=1), Col("WAIT", True, drop=8), Col("SHARE", True, drop=11),
    Col("FINISH", True, drop=7), Col("DEADLINE", True, drop=12)]



def place_doc(p: JobPlace | None) -> dict[str, Any] | None:
    """Every field of a job's place (the wire omits defaults; readers of --json get all)."""
    return None if p is None else msgspec.structs.asdict(p)


def place_tsv(j: JobRecord, p: JobPlace | None) -> list[Any]:
    if p is None:
        return [None, None, None, None, j.deadline, None]
    return [p.oldest_wait_s, p.holders, p.share, p.predicted_finish, j.deadline,
            int(p.at_risk)]


def place_cells(j: JobRecord, p: JobPlace | None, now: float) -> list[Any]:
    """The list's WAIT, SHARE, FINISH and DEADLINE cells: `-` with nothing queued; the
    finish of a job at risk in the critical colour with how late it is."""
    from rich.text import Text

    deadline = "-" if j.deadline is None else relative(j.deadline - now)
    if p is None:
        return ["-", "-", "-", deadline]
    share = f"{pct(p.share, 0)} ({p.holders})"
    if p.predicted_finish is None:
        return [age(p.oldest_wait_s), share, NA, deadline]
    finish = Text(relative(finish_in(p, now)))
    if p.at_risk and p.deadline is not None:
        finish.append(f" ({age(p.predicted_finish - p.deadline)} late)")
        finish.stylize(CRITICAL)
    return [age(p.oldest_wait_s), share, finish, deadline]


def show_list(cfg: AppConfig, as_json: bool) -> None:
    async def fetch(c: Client) -> tuple[list[JobRecord], list[JobPlace]]:
        return await c.jobs(), await c.job_views()

    jobs, views = call(cfg, "observer", fetch)
    placed = {v.job: v for v in views}
    if as_json:
        write_json({"jobs": jobs, "job_views": [place_doc(v) for v in views]})
        return
    if not stdout_is_tty():
        write_tsv([*LIST_COLUMNS, *PLACE_COLUMNS, "endpoints"],
                  [[j.id, j.state.value, j.kind, j.name, j.total, j.completed,
                    j.failed, j.cancelled, j.rejected, j.created, j.priority,
                    *place_tsv(j, placed.get(j.number)), endpoints_tsv(j)] for j in jobs])
        return
    from rich.text import Text

    now = time.time()
    con = console()
    rows = [[j.id, j.state.value, j.kind, str(j.priority), j.name or "-", progress_of(j),
             mix_cell(j), f"{j.failed:,}", f"{j.cancelled:,}", f"{j.rejected:,}",
             age(now - j.created), *place_cells(j, placed.get(j.number), now)] for j in jobs]
    con.print(fitted_table(TABLE_COLUMNS, rows, con.width, " (see jobs show ID)",
                           title=Text(f"{len(jobs)} job(s) — {cfg.data_dir}"),
                           title_justify="left"))


def _fetch_view(cfg: AppConfig, job: str) -> tuple[Any, dict[str, Any]]:
    async def fetch(c: Client) -> tuple[Any, dict[str, Any]]:
        view = await c.job(job)
        status = await c.status()
        return view, status

    return call(cfg, "observer", fetch)


def _waiting_lines(status: dict[str, Any]) -> list[str]:
    """The broker's "N items wait for model X: no consumer" lines, from its status."""
    return [waiting_line(Waiting(w["model"], w["items"], w["tokens"]))
            for w in status.get("unserved", [])]


def show_job(cfg: AppConfig, job: str, as_json: bool) -> None:
    view, status = _fetch_view(cfg, job)
    if as_json:
        doc = msgspec.to_builtins(view)
        doc["place"] = place_doc(view.place)
        doc["usage"] = msgspec.to_builtins(job_usage(view.job))
        doc["mix"] = msgspec.to_builtins(mix(view.job.endpoints))
        write_json(doc)
        return
    from rich.table import Table

    j: JobRecord = view.job
    now = time.time()
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("job", j.id)
    t.add_row("state", j.state.value)
    t.add_row("kind", j.kind)
    if j.model:
        t.add_row("model", j.model)
    t.add_row("priority", str(j.priority))
    t.add_row("input", f"{j.name or '-'}" + (f"  sha256 {j.sha256[:16]}…" if j.sha256 else ""))
    if j.endpoint:
        t.add_row("endpoint", j.endpoint)
    for k, v in sorted(j.metadata.items()):
        t.add_row(f"metadata.{k}", v)
    t.add_row("progress", progress_of(j) + ("" if j.sealed else "  (input still coming)"))
    t.add_row("counts", f"{j.total:,} items: {j.completed:,} completed, {j.failed:,} failed, "
                        f"{j.cancelled:,} cancelled, {j.queued:,} to go "
                        f"({view.in_flight:,} in flight); {j.rejected:,} line(s) refused")
    t.add_row("usage", usage_text(j))
    if (endpoints := endpoints_text(j)) is not None:
        t.add_row("endpoints", endpoints)
    if view.items_per_s:
        t.add_row("throughput", f"{view.items_per_s:,.1f} items/s")
    if j.deadline is not None:
        left = j.deadline - now
        t.add_row("deadline", f"in {age(left)}" if left > 0 else f"{age(-left)} ago")
    for name, value in place_rows(j, view.place, now):
        t.add_row(name, value)
    for state, at in sorted(j.times.items(), key=lambda kv: kv[1]):
        t.add_row(f"{state} at", f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}"
                                 f"  ({age(now - at)} ago)")
    for sh in view.shapes:
        t.add_row("shape", f"{sh.signature}  {sh.model}" + (f"  {sh.label}" if sh.label else ""))
    for line in _waiting_lines(status):
        t.add_row("waiting", line)
    for e in j.errors:
        t.add_row("refused", e)
    if j.rejected > len(j.errors):
        t.add_row("", f"... and {j.rejected - len(j.errors):,} more")
    console().print(t)


def usage_text(j: JobRecord) -> str:
    """The job's usage, as the Batch API's `usage` has it: input (of it cached), output,
    total tokens, exact."""
    u = job_usage(j)
    return (f"{u.input_tokens:,} input tokens ({u.input_tokens_details.cached_tokens:,} "
            f"cached), {u.output_tokens:,} output, {u.total_tokens:,} total")


def place_rows(j: JobRecord, p: JobPlace | None, now: float) -> list[tuple[str, Any]]:
    """`jobs show`'s lines of a job's place in the fleet (none with nothing queued)."""
    from rich.text import Text

    if p is None:
        return []
    rows: list[tuple[str, Any]] = [
        ("oldest wait", f"{age(p.oldest_wait_s)}  ({p.queued_items:,} items, "
                        f"{si(p.queued_tokens)} tokens queued)"),
        ("share", f"{p.holders} consumer(s) on its shapes: {pct(p.share, 0)} of the fleet"),
    ]
    if p.predicted_finish is None:
        rows.append(("finish", f"{NA} (no rate measured yet)"))
        return rows
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.predicted_finish))
    deadline = p.deadline if p.deadline is not None else j.deadline
    deadline_in = None if deadline is None else deadline - now
    rows.append(("finish", f"predicted {stamp}  "
                           f"({finish_vs_deadline(finish_in(p, now), deadline_in)})"))
    if p.at_risk and p.deadline is not None:
        late = age(p.predicted_finish - p.deadline)
        rows.append(("risk", Text(f"AT RISK: predicted to finish {late} after its deadline",
                                  style=CRITICAL)))
    return rows


def cancel_job(cfg: AppConfig, job: str, as_json: bool) -> None:
    async def go(c: Client) -> tuple[bool, JobRecord]:
        before = (await c.job(job)).job
        if before.ended:
            return True, before
        return False, (await c.cancel_job(before.id)).job

    ended_before, j = call(cfg, "producer", go)
    if as_json:
        write_json(j)
        return
    err = console(stderr=True)
    if not ended_before and j.state.value in ("cancelling", "cancelled"):
        err.print(f"{j.id}: {j.state.value}: {j.cancelled:,} queued item(s) cancelled, "
                  f"{j.completed + j.failed:,} finished, {j.queued:,} still in flight")
    else:
        err.print(f"{j.id} had already ended ({j.state.value}); nothing to cancel")


def set_priority(cfg: AppConfig, job: str, priority: int, as_json: bool) -> None:
    async def go(c: Client) -> JobRecord:
        return (await c.set_job_priority(job, priority)).job

    j = call(cfg, "producer", go)
    if as_json:
        write_json(j)
        return
    console(stderr=True).print(f"{j.id}: priority {j.priority}")
