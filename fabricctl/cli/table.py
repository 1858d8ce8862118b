"""`fabricctl table`: one question asked of every row of a table, the answers joined back.

Contract: the command reads a CSV, Parquet or JSON Lines table (a path, or `-`: stdin,
spooled to a temporary file in the `--format` given, default csv), makes one native line per
row with `producer.table.emit_lines` (the instruction and exactly that row's fields, field
and row order chosen for the prefix cache by `core.table_plan`) and either writes those lines
(`--emit`: JSONL for `submit`/`run`, on stdout or `--output`) or runs them as `fabricctl run`
does (`run.run_job`: an embedded broker and engines, the same flags) and writes
the table again, in its own format and order, with the answer column(s) and an error column
(`Table.write_joined`). `--explain` prints the order chosen and the prefix share it gains
over the table's order on stderr (`Explain.lines`). A row with an input error (a missing
field, a non-UTF-8 cell, a JSONL line that is no object) and a line the broker refused get
their row-numbered error in the error column and on stderr; a CSV line that cannot be split
into the header's fields is reported on stderr as "line N: ..."; either way the exit status
is 1 (the other rows still run). An empty table, an unknown field and a bad flag are exit 2.
The run's summary goes to stderr as `run`'s (with `--json`: one JSON document).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO

import msgspec
import typer

from fabricctl.cli.jobs import Priority, Window, priority_option, window_option
from fabricctl.cli.optgroup import takes
from fabricctl.cli.support import (
    UNSET,
    ConfigFile,
    EngineFlags,
    Model,
    Verbose,
    check_input,
    guarded,
    job_logging,
    load,
    run_async,
    stdin_binary,
)
from fabricctl.config import AppConfig
from fabricctl.core.table_plan import Method
from fabricctl.errors import ExitCode, UsageError
from fabricctl.producer.table import Emitted, TableSpec, emit_lines, join_answers, refused_rows
from fabricctl.producer.table_io import OutColumns, Table, TableFormat

MAX_REPORTED = 20  # row errors written on stderr; the rest are counted


@takes(EngineFlags, omit=("model",))
def command(
    file: Path = typer.Argument(..., metavar="FILE|-", help="The table: .csv, .parquet or "
                                ".jsonl, or - for stdin (--format, default csv)."),
    instruction: str = typer.Option(..., "--instruction", "-i", metavar="TEXT|@FILE",
                                    help="What to do with each row (@FILE: read it from "
                                    "FILE); every prompt starts with it."),
    model: str | None = Model,
    fields: str | None = typer.Option(None, "--fields", "-f", metavar="A,B",
                                      help="The columns each prompt shows (default: all but "
                                      "--key).", show_default=False),
    key: str | None = typer.Option(None, "--key", "-k", metavar="COLUMN",
                                   help="The column whose value is each line's id (default: "
                                   "the row number, from 1).", show_default=False),
    question: str = typer.Option("", "--question", "-q", help="Text after the fields, at the "
                                 "end of every prompt (e.g. \"Label:\")."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="max_tokens of each "
                                   "request."),
    params: str | None = typer.Option(None, "--params", metavar="JSON",
                                      help="Other request fields, as a JSON object (e.g. "
                                      "'{\"temperature\": 0}').", show_default=False),
    fmt: str | None = typer.Option(None, "--format", metavar="csv|parquet|jsonl",
                                   help="The table's format (default: from FILE's name; csv "
                                   "for stdin).", show_default=False),
    keep_field_order: bool = typer.Option(False, "--keep-field-order", help="Show every row's "
                                          "fields in the table's (or --fields') order; only "
                                          "the rows are reordered."),
    order: str = typer.Option("fabric", "--order", metavar="fabric|ggr|original",
                              help="How the order is chosen: fabricctl's own, GGR (Liu et "
                              "al.), or the table's own."),
    explain: bool = typer.Option(False, "--explain", help="Print the order chosen and the "
                                 "prefix share it gains over the table's order on stderr."),
    emit: bool = typer.Option(False, "--emit", help="Write the lines (native JSONL, in the "
                              "chosen order) instead of running them: for fabricctl submit "
                              "or run."),
    json_answer: str | None = typer.Option(None, "--json-answer", metavar="KEY,KEY",
                                           help="Read each answer as a JSON object and add "
                                           "these keys as columns (an answer that is none: "
                                           "the row's error).", show_default=False),
    answer_column: str = typer.Option("answer", "--answer-column", help="The answer's "
                                      "column."),
    error_column: str = typer.Option("error", "--error-column", help="The error's column "
                                     "(empty where the row was answered)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where to write the table "
                                       "(or the lines; default: stdout)."),
    config: Path | None = ConfigFile,
    engines: EngineFlags = UNSET,
    json_out: bool = typer.Option(False, "--json", help="Print the run's summary as JSON "
                                  "(on stderr)."),
    priority: str | None = Priority,
    window: str | None = Window,
    verbose: bool = Verbose,
) -> None:
    """Ask one question of every row of a table: the answers come back as a new column.

    Each row becomes one prompt: the instruction, then that row's fields as "name: value"
    lines, then --question. Rows and fields are ordered so consecutive prompts share
    prefixes, which are declared as the lines' shape (--explain shows what that gains);
    the output is the table in its own order and format, with the answer and error columns.

    Runs the job as fabricctl run does (an embedded broker and engines, --engine as run's),
    or with --emit writes the lines for fabricctl submit or run.

    A row that cannot be asked (a missing field, a cell that is not UTF-8) or that the
    broker refused gets its error in the error column and on stderr, the rest runs, and the
    exit status is 1. An empty table or an unknown field is exit 2.
    """
    job_logging(verbose)
    prio = priority_option(priority)
    window_s = window_option(window)
    cfg = load(config, model=model, **engines.config())
    spec = guarded(lambda: TableSpec(
        instruction=_instruction(instruction), model=cfg.model_name,
        fields=_names(fields), key=key, question=question, max_tokens=max_tokens,
        params=_params(params), keep_field_order=keep_field_order, method=_method(order)))
    cols = OutColumns(answer_column, _names(json_answer), error_column)
    check_input(file, "a table")
    with tempfile.TemporaryDirectory(prefix="fabricctl-table-") as tmp:
        work = Path(tmp)
        table = guarded(lambda: _open(file, fmt, work))
        if emit:
            with _Output(output) as out:
                emitted = guarded(lambda: emit_lines(table, spec, out.write))
            bad = _report(table, emitted.errors, emitted if explain else None)
        else:
            bad = _run(cfg, table, spec, cols, work, output, json_out, explain, prio, window_s)
    if bad:
        raise typer.Exit(ExitCode.RUNTIME)


def _run(cfg: AppConfig, table: Table, spec: TableSpec, cols: OutColumns, work: Path,
         output: Path | None, json_out: bool, explain: bool, prio: int | None,
         window_s: float) -> bool:
    """Run the lines through `run.run_job` (input order) and write the joined table;
    whether a row failed on its input, was refused or asked for a model nobody serves."""
    from fabricctl.cli.run import run_job
    from fabricctl.cli.run_summary import print_run_summary
    from fabricctl.server.heap import settle_heap

    lines, results = work / "lines.jsonl", work / "results.jsonl"
    with lines.open("wb") as fp:
        emitted = guarded(lambda: emit_lines(table, spec, fp.write, keep_order=True))
    refused: list[str] = []

    def errors(message: str) -> None:
        if message.startswith("line "):
            refused.append(message)  # its row's error, below
        else:
            sys.stderr.write(message + "\n")

    summary = None
    with results.open("wb") as rfp:
        if emitted.lines:
            settle_heap()  # this process runs the broker: its collector settings
            summary = run_async(run_job(cfg, lines, rfp, errors=errors,
                                        priority=prio, window_s=window_s))
    with lines.open("rb") as sent, results.open("rb") as got, _Output(output) as out:
        answers = join_answers(emitted, sent, got, refused, cols.json_keys)
        guarded(lambda: table.write_joined(answers, out, cols))
    rows = sorted([*emitted.errors, *refused_rows(emitted, refused).values()])
    bad = _report(table, rows, emitted if explain else None)
    if summary is not None:
        if json_out:
            sys.stderr.write(msgspec.json.encode(summary).decode() + "\n")
        else:
            print_run_summary(summary)
    return bad or bool(summary is not None and summary.unserved)


def _report(table: Table, rows: list[tuple[int, str]], explained: Emitted | None) -> bool:
    """The explanation, the unreadable lines and the row errors on stderr; whether any."""
    if explained is not None and explained.explain is not None:
        for line in explained.explain.lines():
            sys.stderr.write(f"fabricctl: {line}\n")
    for line in table.unreadable:
        sys.stderr.write(f"fabricctl: error: {table.path}: {line}\n")
    for _, message in rows[:MAX_REPORTED]:
        sys.stderr.write(f"fabricctl: error: {message}\n")
    if len(rows) > MAX_REPORTED:
        sys.stderr.write(f"fabricctl: error: {len(rows) - MAX_REPORTED:,} more rows have an "
                         "error (the error column names each)\n")
    return bool(rows or table.unreadable)


def _open(file: Path, fmt: str | None, work: Path) -> Table:
    """The table at `file`; stdin or a pipe (`<(cmd)`) spooled into `work` first, as it is
    read twice (lines, then the join); csv unless --format or its name says otherwise."""
    if str(file) != "-" and file.is_file():
        return Table(file, TableFormat.of(file, fmt))
    kind = TableFormat.of(file, fmt or (None if file.suffix else "csv"))
    path = work / f"stdin.{kind.value}"
    with (stdin_binary() if str(file) == "-" else file.open("rb")) as src, \
            path.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return Table(path, kind)


class _Output:
    """Why: the output is `--output`'s file, else stdout (never closed)."""

    def __init__(self, output: Path | None) -> None:
        self.output = output
        self.fp: IO[bytes] | None = None

    def __enter__(self) -> IO[bytes]:
        self.fp = self.output.open("wb") if self.output else None
        return self.fp or sys.stdout.buffer

    def __exit__(self, *exc: object) -> None:
        if self.fp is not None:
            self.fp.close()
        else:
            sys.stdout.buffer.flush()


def _instruction(text: str) -> str:
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--instruction {text}: {e}") from None
    return text


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip()) if text else ()


def _params(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise UsageError(f"--params is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError("--params takes a JSON object")
    return value


def _method(text: str) -> Method:
    try:
        return Method(text.lower())
    except ValueError:
        raise UsageError(f"--order takes fabric, ggr or original, not {text!r}") from None
