"""The table producer (`fabricctl.producer.table`): prompts, the join, bad input.

Properties, whatever order the planner returns (it is replaced here by random plans and
random at-scale rules): every output row carries exactly its input row's key and either its
own answer or an error; each prompt holds the instruction and exactly its row's fields,
each with its name. Then plain examples per format, and bad input as row-numbered errors.
"""

from __future__ import annotations

import io
import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.csv as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricctl.core.table_plan import TablePlan, cell_text
from fabricctl.errors import UsageError
from fabricctl.producer import table as producer_table
from fabricctl.producer.spill import SpillSort
from fabricctl.producer.table import TableSpec, emit_lines, instruction_text, join_answers
from fabricctl.producer.table_io import OutColumns, Table, TableFormat

INSTRUCTION = "Label the product in one word."
QUESTION = "Label:"

values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"),
                 max_size=12)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    """Column names (the key first) and rows of text, with repeated values (shareable)."""
    n_fields = draw(st.integers(1, 4))
    names = ["key", *[f"f{i}" for i in range(n_fields)]]
    pool = draw(st.lists(values, min_size=1, max_size=4))
    n = draw(st.integers(1, 25))
    rows = [[f"k{i}", *[draw(st.sampled_from(pool)) for _ in range(n_fields)]]
            for i in range(n)]
    return names, rows


def write_table(path: Path, fmt: TableFormat, names: list[str], rows: list[list[str]]) -> None:
    cols = {n: [r[i] for r in rows] for i, n in enumerate(names)}
    if fmt is TableFormat.CSV:
        pc.write_csv(pa.table(cols), path)
    elif fmt is TableFormat.PARQUET:
        pq.write_table(pa.table(cols), path)
    else:
        path.write_bytes(b"".join(msgspec.json.encode(dict(zip(names, r, strict=True))) + b"\n"
                                  for r in rows))


@dataclass(frozen=True)
class RandomRule:
    """An at-scale rule that orders and permutes at random (a stand-in for any rule)."""

    seed: int

    def _rng(self, row: Sequence[str]) -> random.Random:
        return random.Random(f"{self.seed}:{'|'.join(row)}")

    def fields_for(self, row: Sequence[str]) -> tuple[int, ...]:
        order = list(range(len(row)))
        self._rng(row).shuffle(order)
        return tuple(order)

    def shared_for(self, row: Sequence[str]) -> int:
        return self._rng(row).randint(0, len(row))

    def key(self, row: Sequence[str]) -> tuple[str, ...]:
        return (str(self._rng(row).random()),)


def random_planner(seed: int):  # type: ignore[no-untyped-def]
    def plan(rows: Sequence[Sequence[str]], weight: object = len, **_: object) -> TablePlan:
        rng = random.Random(seed)
        order = list(range(len(rows)))
        rng.shuffle(order)
        fields = []
        for r in rows:
            f = list(range(len(r)))
            rng.shuffle(f)
            fields.append(tuple(f))
        return TablePlan(tuple(order), tuple(fields),
                         tuple(rng.randint(0, len(r)) for r in rows))
    return plan


def fake_run(lines: list[bytes], seed: int) -> tuple[bytes, list[str], dict[str, str | None]]:
    """What `run --ordered` gives for `lines`: result lines in their order (a few refused
    lines have none: their "line N: reason" instead; a few answers are engine errors)."""
    rng = random.Random(seed)
    out, refused, expect = [], [], {}
    for n, raw in enumerate(lines, 1):
        ident = json.loads(raw)["id"]
        fate = rng.random()
        if fate < 0.1:
            refused.append(f"line {n}: duplicate id {ident!r}")
            expect[ident] = None
        elif fate < 0.2:
            out.append(json.dumps({"id": ident, "text": "", "error": "boom"}).encode() + b"\n")
            expect[ident] = None
        else:
            out.append(json.dumps({"id": ident, "text": f"ans:{ident}",
                                   "error": None}).encode() + b"\n")
            expect[ident] = f"ans:{ident}"
    return b"".join(out), refused, expect


def read_output(path: Path, fmt: TableFormat, names: list[str]) -> list[dict[str, object]]:
    if fmt is TableFormat.JSONL:
        return [json.loads(x) for x in path.read_bytes().splitlines()]
    text = {n: pa.string() for n in [*names, "answer", "error"]}
    t = (pc.read_csv(path, convert_options=pc.ConvertOptions(
        column_types=text, strings_can_be_null=False))
        if fmt is TableFormat.CSV else pq.read_table(path))
    return t.to_pylist()


def roundtrip(tmp: Path, fmt: TableFormat, names: list[str], rows: list[list[str]],
              spec: TableSpec, seed: int) -> tuple[list[bytes], list[dict[str, object]],
                                                   dict[str, str | None]]:
    src = tmp / f"t.{fmt.value}"
    write_table(src, fmt, names, rows)
    table = Table(src, fmt)
    buf = io.BytesIO()
    emitted = emit_lines(table, spec, buf.write, keep_order=True)
    lines = buf.getvalue().splitlines(keepends=True)
    results, refused, expect = fake_run(lines, seed)
    out = tmp / f"out.{fmt.value}"
    with out.open("wb") as fp:
        table.write_joined(join_answers(emitted, lines, results.splitlines(keepends=True),
                                        refused), fp, OutColumns())
    return lines, read_output(out, fmt, names), expect


@pytest.mark.parametrize("fmt", list(TableFormat))
@pytest.mark.parametrize("scale", [False, True], ids=["planned", "at-scale"])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=tables(), seed=st.integers(0, 2**16))
def test_every_row_gets_its_own_answer_or_an_error_whatever_the_order(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        fmt: TableFormat, scale: bool, data: tuple[list[str], list[list[str]]],
        seed: int) -> None:
    names, rows = data
    monkeypatch.setattr(producer_table, "plan_table", random_planner(seed))
    monkeypatch.setattr(producer_table, "learn_rule", lambda *a, **k: RandomRule(seed))
    spec = TableSpec(INSTRUCTION, "m", key="key", question=QUESTION,
                     plan_rows=2 if scale else 1000, sample_rows=2)
    tmp = tmp_path_factory.mktemp("t")
    lines, out, expect = roundtrip(tmp, fmt, names, rows, spec, seed)
    assert len(lines) == len(rows)
    assert [r["key"] for r in out] == [r[0] for r in rows]  # input order, one row each
    for got, row in zip(out, rows, strict=True):
        for name, value in zip(names, row, strict=True):
            assert got[name] == value
        want = expect[row[0]]
        if want is None:
            assert got["answer"] in (None, "") and got["error"]
        else:
            assert got["answer"] == want and got["error"] in (None, "")


def cells_of(line: dict[str, object]) -> tuple[str, str]:
    prefix = line["prefix"]
    assert isinstance(prefix, list)
    return prefix[0], "".join(prefix[1:]) + str(line["prompt"])


@pytest.mark.parametrize("scale", [False, True], ids=["planned", "at-scale"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=tables(), seed=st.integers(0, 2**16))
def test_each_prompt_holds_the_instruction_and_exactly_its_rows_fields(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        scale: bool, data: tuple[list[str], list[list[str]]], seed: int) -> None:
    names, rows = data
    monkeypatch.setattr(producer_table, "plan_table", random_planner(seed))
    monkeypatch.setattr(producer_table, "learn_rule", lambda *a, **k: RandomRule(seed))
    src = tmp_path_factory.mktemp("p") / "t.jsonl"
    write_table(src, TableFormat.JSONL, names, rows)
    buf = io.BytesIO()
    spec = TableSpec(INSTRUCTION, "m", key="key", question=QUESTION,
                     plan_rows=2 if scale else 1000, sample_rows=2)
    emit_lines(Table(src, TableFormat.JSONL), spec, buf.write)
    by_key = {r[0]: r for r in rows}
    seen = []
    for raw in buf.getvalue().splitlines():
        line = json.loads(raw)
        first, rest = cells_of(line)
        assert first == instruction_text(INSTRUCTION)
        assert rest.endswith(QUESTION)
        body = rest[:len(rest) - len(QUESTION)]
        row = by_key[line["id"]]
        cells = [cell_text(n, v) for n, v in zip(names[1:], row[1:], strict=True)]
        assert any("".join(p) == body for p in itertools.permutations(cells)), (body, cells)
        seen.append(line["id"])
    assert sorted(seen) == sorted(by_key)


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.tuples(st.text(max_size=3), st.integers(0, 5)), max_size=60),
       run_bytes=st.integers(1, 400))
def test_the_spilled_sort_is_a_stable_sort(keys: list[tuple[str, int]], run_bytes: int) -> None:
    sort = SpillSort(run_bytes=run_bytes)
    for n, k in enumerate(keys):
        sort.add(k, str(n).encode())
    got = [(k, int(p)) for k, p in sort]
    want = sorted(((k, n) for n, k in enumerate(keys)), key=lambda kn: kn[0])
    assert got == want


def test_a_parquet_table_keeps_its_types_and_json_answers_become_columns(
        tmp_path: Path) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [7, 8], "price": [1.5, 2.0], "title": ["a", "b"]}), src)
    table = Table(src, TableFormat.PARQUET)
    buf = io.BytesIO()
    emitted = emit_lines(table, TableSpec(INSTRUCTION, "m", key="id"), buf.write,
                         keep_order=True)
    lines = buf.getvalue().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["7", "8"]
    assert "price: 1.5\n" in json.loads(lines[0])["prompt"]
    results = [json.dumps({"id": "7", "text": '{"label": "x", "score": 3}'}).encode(),
               json.dumps({"id": "8", "text": "not json"}).encode()]
    out = tmp_path / "out.parquet"
    with out.open("wb") as fp:
        table.write_joined(join_answers(emitted, lines, results, [], ["label", "score"]), fp,
                           OutColumns(json_keys=("label", "score")))
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.int64()
    rows = got.to_pylist()
    assert rows[0]["label"] == "x" and rows[0]["score"] == "3" and rows[0]["error"] is None
    assert rows[1]["label"] is None and rows[1]["error"] == "row 2: the answer is not a JSON " \
        "object"


def emit(path: Path, fmt: TableFormat, spec: TableSpec) -> tuple[list[dict[str, object]],
                                                                list[tuple[int, str]], Table]:
    table = Table(path, fmt)
    buf = io.BytesIO()
    emitted = emit_lines(table, spec, buf.write)
    return [json.loads(x) for x in buf.getvalue().splitlines()], emitted.errors, table


def test_bad_rows_are_row_numbered_errors_and_the_rest_still_goes(tmp_path: Path) -> None:
    src = tmp_path / "t.csv"
    src.write_bytes(b"sku,title,brand\n1,Trail runner,Acme\n2,Sun hat\xff,Bolt\n"
                    b"3,too,many,fields\n4,Sandal,Bolt\n")
    lines, errors, table = emit(src, TableFormat.CSV, TableSpec(INSTRUCTION, "m", key="sku"))
    assert sorted(x["id"] for x in lines) == ["1", "4"]
    assert errors == [(1, "row 2: field 'title' is not UTF-8 (byte 0xff at 7)")]
    assert table.unreadable == ["line 4: 4 fields where the header has 3"]
    src = tmp_path / "t.jsonl"
    src.write_text('{"sku": 1, "title": "a"}\n{"sku": 2}\n[1]\n{bad\n{"sku": 5, "title": null}\n')
    lines, errors, _ = emit(src, TableFormat.JSONL, TableSpec(INSTRUCTION, "m", key="sku"))
    assert [x["id"] for x in lines] == ["1"]
    assert [e for _, e in errors][:3] == ["row 2: no value for field 'title'",
                                          "row 3: not a JSON object",
                                          errors[2][1]]
    assert errors[2][1].startswith("row 4: not JSON")
    assert errors[3] == (4, "row 5: no value for field 'title'")


def test_an_empty_table_or_an_unknown_field_is_a_usage_error(tmp_path: Path) -> None:
    for name, data in (("e.csv", b""), ("h.csv", b"a,b\n"), ("e.jsonl", b"")):
        src = tmp_path / name
        src.write_bytes(data)
        with pytest.raises(UsageError, match="has no rows"):
            emit(src, TableFormat.of(src), TableSpec(INSTRUCTION, "m"))
    src = tmp_path / "t.csv"
    src.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match=r"no column 'zz' \(columns: a, b\)"):
        emit(src, TableFormat.CSV, TableSpec(INSTRUCTION, "m", fields=("a", "zz")))
    with pytest.raises(UsageError, match="cannot tell the table's format"):
        TableFormat.of(tmp_path / "t.txt")
