"""A table on disk as the table producer reads it, twice, and writes it back with its answers.

Contract: `Table(path, fmt)` opens a CSV, Parquet or JSON Lines file (pyarrow reads CSV and
Parquet; each JSONL line is one msgspec-decoded object) and knows its `columns` (a JSONL
table's are its first object's keys). `rows(fields, key)` streams the rows, batch by batch,
as `RowIn`: the shown fields' text in the given order (`cell_value`: strings as they are,
numbers and booleans as JSON writes them, nested values as JSON) and the row's key, or the
row-numbered reason it has none (a missing or null field, a non-UTF-8 cell, a JSONL line
that is no object). A CSV line pyarrow cannot split into the header's fields is no row at
all: it is in `unreadable` as "line N: ...". `write_joined(answers, out, cols)` reads the
table again and writes it in its own format with the answer columns after the input's and
the error column last, one output row per row (`answers` in row order, one per row).
A table with no rows, or a field or key that is not a column, is a `UsageError`.
Memory is one batch of rows (`BATCH_ROWS`), whatever the table's size.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from fabricctl.errors import FabricError, UsageError

BATCH_ROWS = 8192
_MISSING = object()


class TableFormat(enum.Enum):
    """The table formats read and written."""

    CSV = "csv"
    PARQUET = "parquet"
    JSONL = "jsonl"

    @classmethod
    def of(cls, path: Path, given: str | None = None) -> TableFormat:
        """`given` (`--format`), else the format `path`'s suffix names."""
        if given:
            try:
                return cls(given.lower())
            except ValueError:
                raise UsageError(f"--format takes csv, parquet or jsonl, not {given!r}") from None
        found = _SUFFIXES.get(path.suffix.lower())
        if found is None:
            raise UsageError(f"{path}: cannot tell the table's format from its name: give "
                             "--format csv|parquet|jsonl")
        return found


_SUFFIXES = {".csv": TableFormat.CSV, ".parquet": TableFormat.PARQUET, ".pq": TableFormat.PARQUET,
             ".jsonl": TableFormat.JSONL, ".ndjson": TableFormat.JSONL}


@dataclass(frozen=True, slots=True)
class RowIn:
    """One input row as the producer sees it: its shown fields' text and key, or why not."""

    index: int  # 0-based among the table's rows; "row N" is index + 1
    key: str
    values: list[str] | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """One row's outcome, joined back: the answer, the JSON answer's fields, or the error."""

    index: int
    answer: str | None
    fields: list[str | None]
    error: str | None


@dataclass(frozen=True, slots=True)
class OutColumns:
    """The columns the output adds: the answer, a JSON answer's fields, the error."""

    answer: str = "answer"
    json_keys: tuple[str, ...] = ()
    error: str = "error"

    def names(self) -> list[str]:
        return [self.answer, *self.json_keys, self.error]


def cell_value(value: Any) -> str | None:
    """A cell as text (None: no value); bytes must be UTF-8 (UnicodeDecodeError if not)."""
    if value is None or value is _MISSING:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return str(value)


class Table:
    """Why: the producer reads a table twice (prompts, then the join) without holding it."""

    def __init__(self, path: Path, fmt: TableFormat) -> None:
        self.path, self.fmt = path, fmt
        self.unreadable: list[str] = []
        if path.stat().st_size == 0:
            raise UsageError(f"{path}: the table has no rows")
        self.columns = self._columns()

    def _columns(self) -> list[str]:
        if self.fmt is TableFormat.JSONL:
            return self._jsonl_columns()
        try:
            import pyarrow as pa
        except ImportError:
            raise UsageError(f"reading {self.fmt.value} tables needs pyarrow: pip install "
                             "'fabricctl[table]'") from None
        try:
            if self.fmt is TableFormat.CSV:
                return list(self._open_csv(None).schema.names)
            if self.fmt is TableFormat.PARQUET:
                import pyarrow.parquet as pq

                return list(pq.ParquetFile(self.path).schema_arrow.names)
        except (pa.ArrowInvalid, OSError) as e:
            raise UsageError(f"{self.path}: not a readable {self.fmt.value} table: {e}") from None
        raise AssertionError(self.fmt)

    def _jsonl_columns(self) -> list[str]:
        with self.path.open("rb") as fp:
            for line in fp:
                if line.strip():
                    try:
                        obj = msgspec.json.decode(line)
                    except msgspec.DecodeError:
                        return []  # the first row is an error row; no columns known
                    return list(obj) if isinstance(obj, dict) else []
        return []

    def _open_csv(self, names: list[str] | None) -> Any:
        import pyarrow as pa
        import pyarrow.csv as pc

        bad = self.unreadable
        if names is not None:
            bad.clear()  # each pass sees the same lines

        def skip(row: Any) -> str:
            bad.append(f"line {row.number}: {row.actual_columns} fields where the header has "
                       f"{row.expected_columns}")
            return "skip"

        types = {n: pa.binary() for n in names} if names else {}
        return pc.open_csv(self.path, read_options=pc.ReadOptions(use_threads=False,
                                                                  block_size=1 << 22),
                           parse_options=pc.ParseOptions(invalid_row_handler=skip,
                                                         newlines_in_values=True),
                           convert_options=pc.ConvertOptions(column_types=types,
                                                             strings_can_be_null=False,
                                                             quoted_strings_can_be_null=False))

    def check(self, fields: Sequence[str], key: str | None) -> None:
        """Every shown field and the key is a column (a JSONL table's first row's keys)."""
        missing = [f for f in [*fields, *([key] if key else [])] if f not in self.columns]
        if missing and self.columns:
            raise UsageError(f"{self.path}: no column {', '.join(map(repr, missing))} "
                             f"(columns: {', '.join(self.columns)})")

    def _records(self, names: Sequence[str]
                 ) -> Iterator[tuple[int, Sequence[Any] | None, str | None]]:
        """(index, the row's values of `names`, why it has none), in table order."""
        if self.fmt is TableFormat.JSONL:
            for index, obj, error in self._jsonl_records():
                yield index, None if obj is None else [obj.get(n, _MISSING) for n in names], error
            return
        index = 0
        for batch in self._batches():
            for values in zip(*(_values(batch.column(n)) for n in names), strict=True):
                yield index, values, None
                index += 1

    def _batches(self) -> Iterator[Any]:
        if self.fmt is TableFormat.CSV:
            yield from self._open_csv(self.columns)
        else:
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(self.path).iter_batches(batch_size=BATCH_ROWS)

    def _jsonl_records(self) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
        dec = msgspec.json.Decoder()
        with self.path.open("rb") as fp:
            for index, line in enumerate(fp):
                try:
                    obj = dec.decode(line)
                except msgspec.DecodeError as e:
                    yield index, None, f"row {index + 1}: not JSON: {e}"
                    continue
                if isinstance(obj, dict):
                    yield index, obj, None
                else:
                    yield index, None, f"row {index + 1}: not a JSON object"

    def rows(self, fields: Sequence[str], key: str | None) -> Iterator[RowIn]:
        """The rows in table order (see the module's contract); none at all: a UsageError."""
        n = 0
        names = [*fields, *([key] if key else [])]
        for index, record, error in self._records(names):
            n += 1
            if record is None:
                yield RowIn(index, str(index + 1), None, error)
                continue
            if all(type(v) is str for v in record):
                values: list[str] = list(record)
            else:
                texts, why = _texts(record, names)
                if texts is None:
                    yield RowIn(index, str(index + 1), None, f"row {index + 1}: {why}")
                    continue
                values = texts
            row_key = values.pop() if key else str(index + 1)
            yield RowIn(index, row_key, values)
        if n == 0:
            raise UsageError(f"{self.path}: the table has no rows")

    def write_joined(self, answers: Iterator[Answer], out: IO[bytes], cols: OutColumns) -> int:
        """The table again with its answers (see the module's contract); the rows written."""
        clash = [c for c in cols.names() if c in self.columns]
        if clash:
            raise UsageError(f"{self.path}: the table already has a column {clash[0]!r}: name "
                             "the output's columns otherwise (--answer-column, --error-column)")
        if self.fmt is TableFormat.JSONL:
            return self._write_jsonl(answers, out, cols)
        import pyarrow as pa

        writer: Any = None
        n = 0
        try:
            for batch in self._batches():
                got = [_next(answers, n + j) for j in range(batch.num_rows)]
                n += batch.num_rows
                arrays = [_text_array(c) if pa.types.is_binary(c.type) else c
                          for c in batch.columns]
                extra = [[a.answer for a in got],
                         *([a.fields[k] for a in got] for k in range(len(cols.json_keys))),
                         [a.error for a in got]]
                table = pa.Table.from_arrays(
                    [*arrays, *(pa.array(x, pa.string()) for x in extra)],
                    names=[*batch.schema.names, *cols.names()])
                if writer is None:
                    writer = _writer(self.fmt, out, table.schema)
                writer.write_table(table) if self.fmt is TableFormat.PARQUET \
                    else writer.write(table)
        finally:
            if writer is not None:
                writer.close()
        return n

    def _write_jsonl(self, answers: Iterator[Answer], out: IO[bytes], cols: OutColumns) -> int:
        enc = msgspec.json.Encoder()
        n = 0
        for index, record, _ in self._jsonl_records():
            a = _next(answers, index)
            row = dict(record) if record is not None else {}
            row[cols.answer] = a.answer
            for k, v in zip(cols.json_keys, a.fields, strict=True):
                row[k] = v
            row[cols.error] = a.error
            out.write(enc.encode(row) + b"\n")
            n += 1
        return n


def _values(col: Any) -> list[Any]:
    """A column's values; a CSV column (bytes) as text when all of it is UTF-8."""
    import pyarrow as pa

    if pa.types.is_binary(col.type):
        with contextlib.suppress(pa.ArrowInvalid):  # a cell is not UTF-8: its row says which
            col = col.cast(pa.string())
    return list(col.to_pylist())


def _texts(values: Sequence[Any], names: Sequence[str]) -> tuple[list[str] | None, str]:
    """The row's cells as text, or (None, why not)."""
    out: list[str] = []
    for f, v in zip(names, values, strict=True):
        try:
            text = cell_value(v)
        except UnicodeDecodeError as e:
            return None, f"field {f!r} is not UTF-8 (byte {e.object[e.start]:#04x} at {e.start})"
        if text is None:
            return None, f"no value for field {f!r}"
        out.append(text)
    return out, ""


def _next(answers: Iterator[Answer], index: int) -> Answer:
    a = next(answers, None)
    if a is None or a.index != index:
        raise FabricError(f"table join out of step at row {index + 1}: {a}")
    return a


def _text_array(col: Any) -> Any:
    """A CSV column read as bytes, as text (a non-UTF-8 cell with U+FFFD in its place: its
    row's error says so)."""
    import pyarrow as pa

    try:
        return col.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace")
                         for b in col.to_pylist()], pa.string())


def _writer(fmt: TableFormat, out: IO[bytes], schema: Any) -> Any:
    if fmt is TableFormat.PARQUET:
        import pyarrow.parquet as pq

        return pq.ParquetWriter(out, schema)
    import pyarrow.csv as pc

    return pc.CSVWriter(out, schema, write_options=pc.WriteOptions(quoting_style="needed"))
