"""The table producer: one question asked of every row of a table, answers joined back.

Contract: `emit_lines(table, spec, write)` writes one native line per readable row (id: the
`spec.key` column's value, else the row number from 1), whose prefix components are the
instruction and then the row's leading shared cells and whose prompt is the rest of the
row's cells then `spec.question`: each prompt holds the instruction and exactly its row's
shown fields, each as `core.table_plan.cell_text` (its name and value). Field and row
order come from `core.table_plan`: tables of up to `spec.plan_rows` rows are planned whole
(`plan_table`); bigger ones by an `OrderRule` learnt on their first `spec.sample_rows` rows,
the rows streamed through `SpillSort` by its key (memory flat whatever the table's size).
Rows with an input error (`table_io`) are not sent; `Emitted` keeps their errors, the order
the lines went out in (with `keep_order`) and the `Explain`: the order chosen and the prefix
share (characters of leading cells equal to the previous row's, summed) it gains over the
table's own order, on the whole table or on the sample.
`join_answers(emitted, lines, results, refused, json_keys)` matches the lines with the job's
native result lines by id, in any order (a line the broker refused has none: its "line N:
reason" is in `refused`), and gives one `Answer` per row, in table order, for
`Table.write_joined`; with `json_keys` each answer is read as a JSON object and those keys
become columns (an answer that is none: the row's error). `ask_table` does it all on a
`Job` of a running broker; `fabricctl table` on `fabricctl run`'s embedded one.
"""

from __future__ import annotations

import re
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from fabricctl.core.table_plan import (
    Method,
    OrderRule,
    TablePlan,
    cell_text,
    learn_rule,
    plan_table,
    prefix_share,
    prompt_parts,
)
from fabricctl.errors import FabricError, UsageError
from fabricctl.formats.results import native_line
from fabricctl.producer.feed import FeedHooks
from fabricctl.producer.session import Job
from fabricctl.producer.spill import SpillSort
from fabricctl.producer.table_io import Answer, OutColumns, RowIn, Table, cell_value

PLAN_ROWS = 100_000  # tables up to this many rows are planned whole, in memory (~330 MB)
SAMPLE_ROWS = 20_000  # a bigger table's rule is learnt on its first rows
TOP_ORDERS = 3  # field orders --explain lists


@dataclass(frozen=True, slots=True)
class TableSpec:
    """Why: what to ask of every row and how, as the CLI and a Python caller both give it."""

    instruction: str
    model: str
    fields: tuple[str, ...] = ()  # the columns shown; (): every column but the key
    key: str | None = None  # the column whose value is each line's id; None: the row number
    question: str = ""  # after the fields
    max_tokens: int = 64
    params: dict[str, Any] = field(default_factory=dict)  # the request's other fields
    keep_field_order: bool = False
    method: Method = Method.FABRIC
    plan_rows: int = PLAN_ROWS
    sample_rows: int = SAMPLE_ROWS

    def shown(self, table: Table) -> list[str]:
        fields = list(self.fields) or [c for c in table.columns if c != self.key]
        table.check(fields, self.key)
        if not fields:
            raise UsageError(f"{table.path}: no field to show")
        return fields


@dataclass(frozen=True, slots=True)
class Explain:
    """Why: what `--explain` says: the order chosen and the prefix share it gains."""

    rows: int  # the rows measured
    whole: bool  # the whole table, else its first `rows`
    method: str
    orders: list[tuple[tuple[str, ...], int]]  # the most used field orders, with their rows
    share: int  # prefix share in the chosen order (characters of cells)
    share_original: int  # in the table's order, its fields as given
    cells: int  # characters of every cell measured
    instruction: int  # characters of the instruction, shared by every row in any order

    def lines(self) -> list[str]:
        scope = "the whole table" if self.whole else f"its first {self.rows:,} rows"
        out = [f"order: {self.method} on {self.rows:,} rows ({scope})"]
        for names, n in self.orders:
            out.append(f"field order ({n:,} rows): {', '.join(names)}")
        pct = (lambda x: 100.0 * x / self.cells) if self.cells else (lambda x: 0.0)
        out.append(f"prefix share: {self.share:,} of {self.cells:,} field characters "
                   f"({pct(self.share):.1f}%) in the chosen order, {self.share_original:,} "
                   f"({pct(self.share_original):.1f}%) in the table's order: "
                   f"{self.share - self.share_original:+,} characters reused")
        out.append(f"the instruction ({self.instruction:,} characters) is every row's first "
                   "prefix component in either order")
        return out


@dataclass
class Emitted:
    """Why: what emitting learnt that the join and the report need."""

    rows: int = 0
    lines: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (row index, message)
    order: array[int] = field(default_factory=lambda: array("q"))  # row index per line
    explain: Explain | None = None


class _NativeLine(msgspec.Struct, omit_defaults=True):
    """Why: the native input line each row becomes (README, Formats: Native)."""

    id: str
    model: str
    prefix: list[str]
    prompt: str
    max_tokens: int
    params: dict[str, Any] = {}


def instruction_text(instruction: str) -> str:
    """The instruction as every prompt starts: its text, then a blank line."""
    text = instruction.strip()
    if not text:
        raise UsageError("the instruction is empty")
    return text + "\n\n"


def emit_lines(table: Table, spec: TableSpec, write: Callable[[bytes], object], *,
               keep_order: bool = False) -> Emitted:
    """Write the table's lines in the planned order (see the module's contract)."""
    fields = spec.shown(table)
    names = tuple(fields)
    instruction = instruction_text(spec.instruction)
    enc = msgspec.json.Encoder()
    emitted = Emitted()

    def line(row: RowIn, cells: list[str], order: Sequence[int], shared: int) -> bytes:
        prefix, prompt = prompt_parts(instruction, cells, order, shared, spec.question)
        return enc.encode(_NativeLine(row.key, spec.model, prefix, prompt, spec.max_tokens,
                                      spec.params)) + b"\n"

    def sent(row: RowIn) -> None:
        emitted.lines += 1
        if keep_order:
            emitted.order.append(row.index)

    held: list[tuple[RowIn, list[str]]] = []
    rows = table.rows(fields, spec.key)
    whole = True
    for row in rows:
        emitted.rows += 1
        if row.values is None:
            emitted.errors.append((row.index, row.error or f"row {row.index + 1}: unreadable"))
            continue
        held.append((row, [cell_text(n, v) for n, v in zip(names, row.values, strict=True)]))
        if len(held) > spec.plan_rows:
            whole = False
            break
    if whole:
        cells = [c for _, c in held]
        plan = plan_table(cells, len, method=spec.method,
                          keep_field_order=spec.keep_field_order)
        emitted.explain = _explain(cells, plan, names, spec, instruction, whole=True)
        for i in plan.order:
            row, c = held[i]
            write(line(row, c, plan.fields[i], plan.shared[i]))
            sent(row)
        return emitted
    sample = [c for _, c in held[:spec.sample_rows]]
    rule = learn_rule(sample, len, keep_field_order=spec.keep_field_order)
    emitted.explain = _explain(sample, _rule_plan(rule, sample), names, spec, instruction,
                               whole=False)
    sort = SpillSort()
    try:
        def add(row: RowIn, c: list[str]) -> None:
            sort.add((tuple(rule.key(c)), row.index),
                     line(row, c, rule.fields_for(c), rule.shared_for(c)))

        for row, c in held:
            add(row, c)
        del held
        for row in rows:
            emitted.rows += 1
            if row.values is None:
                emitted.errors.append((row.index, row.error or f"row {row.index + 1}: "
                                       "unreadable"))
                continue
            add(row, [cell_text(n, v) for n, v in zip(names, row.values, strict=True)])
        for (_, index), data in sort:
            write(data)
            emitted.lines += 1
            if keep_order:
                emitted.order.append(index)
    finally:
        sort.close()
    return emitted


def _rule_plan(rule: OrderRule, rows: Sequence[Sequence[str]]) -> TablePlan:
    """The plan `rule` makes of `rows` (the sample --explain measures at scale)."""
    order = sorted(range(len(rows)), key=lambda i: (tuple(rule.key(rows[i])), i))
    return TablePlan(order=tuple(order), fields=tuple(rule.fields_for(r) for r in rows),
                     shared=tuple(rule.shared_for(r) for r in rows))


def _explain(rows: Sequence[Sequence[str]], plan: TablePlan, names: tuple[str, ...],
             spec: TableSpec, instruction: str, *, whole: bool) -> Explain:
    original = plan_table(rows, len, method=Method.ORIGINAL)
    counts: dict[tuple[int, ...], int] = {}
    for f in plan.fields:
        counts[tuple(f)] = counts.get(tuple(f), 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:TOP_ORDERS]
    return Explain(rows=len(rows), whole=whole,
                   method="the table's own order" if spec.method is Method.ORIGINAL
                   else spec.method.value + (" (fields kept in order)"
                                             if spec.keep_field_order else ""),
                   orders=[(tuple(names[i] for i in f), n) for f, n in top],
                   share=prefix_share(rows, plan, len),
                   share_original=prefix_share(rows, original, len),
                   cells=sum(len(c) for r in rows for c in r), instruction=len(instruction))


_LINE = re.compile(r"line (\d+): ")


def refused_rows(emitted: Emitted, refused: Iterable[str]) -> dict[int, tuple[int, str]]:
    """Line number -> (row index, "row N: reason") for each "line N: reason" refused."""
    out: dict[int, tuple[int, str]] = {}
    for message in refused:
        m = _LINE.match(message)
        if m is not None and 0 < int(m.group(1)) <= len(emitted.order):
            index = emitted.order[int(m.group(1)) - 1]
            out[int(m.group(1))] = (index, f"row {index + 1}: {message[m.end():]}")
    return out


class _Sent(msgspec.Struct):
    """Why: the join reads only a line's or a result's id (and a result's answer)."""

    id: str
    text: str = ""
    error: Any = None


def join_answers(emitted: Emitted, lines: Iterable[bytes], results: Iterable[bytes],
                 refused: Iterable[str], json_keys: Sequence[str] = ()) -> Iterator[Answer]:
    """Every row's `Answer`, in table order (see the module's contract). The lines and the
    results are matched by id through sorts on disk, so memory stays flat."""
    gone = refused_rows(emitted, refused)
    dec = msgspec.json.Decoder(_Sent)
    nothing: list[str | None] = [None] * len(json_keys)
    sent, got, out = SpillSort(), SpillSort(), SpillSort()
    try:
        for index, message in emitted.errors:
            out.add(index, msgspec.msgpack.encode((None, nothing, message)))
        for n, (index, raw) in enumerate(zip(emitted.order, lines, strict=True), 1):
            if n in gone:
                out.add(index, msgspec.msgpack.encode((None, nothing, gone[n][1])))
            else:
                sent.add(dec.decode(raw).id, index.to_bytes(8, "little"))
        for raw in results:
            res = dec.decode(raw)
            got.add(res.id, msgspec.msgpack.encode((res.text, _error_text(res.error))))
        answers = iter(got)
        for ident, where in sent:
            index = int.from_bytes(where, "little")
            match = next(answers, None)
            if match is None or match[0] != ident:
                raise FabricError(f"row {index + 1}: the job ended without its result "
                                  f"(id {ident!r})")
            answer, error = msgspec.msgpack.decode(match[1])
            if error is not None:
                answer = None  # an engine's error: no answer to show
            values = nothing
            if error is None and json_keys:
                values, error = _json_fields(answer or "", json_keys, index)
            out.add(index, msgspec.msgpack.encode((answer, values, error)))
        for index, payload in out:
            answer, values, error = msgspec.msgpack.decode(payload)
            yield Answer(index, answer, list(values), error)
    finally:
        for sort in (sent, got, out):
            sort.close()


async def ask_table(job: Job, table: Table, spec: TableSpec, out: IO[bytes],
                    cols: OutColumns | None = None) -> Emitted:
    """Ask `spec` of every row of `table` in `job` (of a running broker: `Producer`), seal
    it, wait for its results and write the table joined with them to `out`. Lines, results
    and sorts go to a temporary directory, not memory. `Emitted.errors` and the job's
    refusals are the rows that failed on their input."""
    cols = cols or OutColumns()
    with tempfile.TemporaryDirectory(prefix="fabricctl-table-") as tmp:
        lines, results = Path(tmp) / "lines.jsonl", Path(tmp) / "results.jsonl"
        with lines.open("wb") as fp:
            emitted = emit_lines(table, spec, fp.write, keep_order=True)
        refused: list[str] = []
        await job.submit_file(lines, hooks=FeedHooks(on_refused=refused.append))
        await job.seal()
        with results.open("wb") as fp:
            async for rec in job.results():
                fp.write(native_line(rec))
        with lines.open("rb") as sent, results.open("rb") as got:
            table.write_joined(join_answers(emitted, sent, got, refused, cols.json_keys),
                               out, cols)
        emitted.errors.extend(refused_rows(emitted, refused).values())
    return emitted


def _error_text(error: Any) -> str | None:
    if error is None or isinstance(error, str):
        return error
    return msgspec.json.encode(error).decode()


def _json_fields(answer: str, keys: Sequence[str], index: int
                 ) -> tuple[list[str | None], str | None]:
    """The answer's `keys` as text, or why the answer is no JSON object."""
    try:
        obj = msgspec.json.decode(answer.strip())
    except msgspec.DecodeError:
        obj = None
    if not isinstance(obj, dict):
        return [None] * len(keys), f"row {index + 1}: the answer is not a JSON object"
    return [cell_value(obj.get(k)) for k in keys], None
