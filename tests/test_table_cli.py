"""`fabricctl table` as a user runs it: CSV in, CSV out through the simulated engine.

The answers joined to each row are the ones `fabricctl run` gives the same lines (the
simulator answers by id), `--emit` pipes into `fabricctl run -`, `--explain` says what the
order gained, and bad input is row-numbered with its exit status.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import threading
from pathlib import Path

import pytest
from cli_helpers import ROOT, clean_env, fabricctl

PRODUCTS = ROOT / "examples" / "products.csv"
ASK = ("-i", "Is this product waterproof? Answer yes, no or unsure.", "--question", "Answer:",
       "--max-tokens", "8")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path, FABRICCTL_ENGINE="sim")


def read_csv(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def test_csv_in_csv_out_each_row_with_the_answer_run_gives_its_line(
        tmp_path: Path, env: dict[str, str]) -> None:
    out = fabricctl("table", str(PRODUCTS), "--key", "sku", *ASK, "-o", "out.csv", "--json",
                    env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    rows = read_csv((tmp_path / "out.csv").read_bytes())
    src = read_csv(PRODUCTS.read_bytes())
    assert [{k: r[k] for k in src[0]} for r in rows] == src  # input order, every column
    assert list(rows[0]) == [*src[0], "answer", "error"]
    summary = json.loads(out.stderr.decode().strip().splitlines()[-1])
    assert summary["items"] == len(src)
    emitted = fabricctl("table", str(PRODUCTS), "--key", "sku", *ASK, "--emit", env=env,
                        cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stderr.decode()
    ran = fabricctl("run", "-", "--ordered", input=emitted.stdout, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr.decode()
    by_id = {r["id"]: r for r in map(json.loads, ran.stdout.splitlines())}
    assert len(by_id) == len(src)
    for row in rows:
        assert row["answer"] == by_id[row["sku"]]["text"] and row["answer"]
        assert row["error"] == ""


def test_emit_writes_one_native_line_per_row_with_its_fields(tmp_path: Path,
                                                             env: dict[str, str]) -> None:
    out = fabricctl("table", str(PRODUCTS), "--key", "sku", "--fields", "title,category",
                    *ASK, "--emit", "--params", '{"temperature": 0}', env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    src = {r["sku"]: r for r in read_csv(PRODUCTS.read_bytes())}
    assert sorted(x["id"] for x in lines) == sorted(src)
    for line in lines:
        text = "".join(line["prefix"]) + line["prompt"]
        row = src[line["id"]]
        assert text.startswith("Is this product waterproof? Answer yes, no or unsure.\n\n")
        assert f"title: {row['title']}\n" in text and f"category: {row['category']}\n" in text
        assert "brand:" not in text and "price:" not in text and text.endswith("Answer:")
        assert line["params"] == {"temperature": 0} and line["max_tokens"] == 8
        assert line["model"] == "fabric-demo"


def test_explain_says_the_order_and_the_prefix_share(tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    out = fabricctl("table", str(PRODUCTS), "--key", "sku", *ASK, "--emit", "--explain",
                    env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    err = out.stderr.decode()
    assert "order: fabric on 48 rows (the whole table)" in err
    assert "field order (" in err and "prefix share: " in err
    assert "in the table's order" in err
    fixed = fabricctl("table", str(PRODUCTS), "--key", "sku", *ASK, "--emit", "--explain",
                      "--keep-field-order", env=env, cwd=tmp_path)
    assert "field order (48 rows): title, brand, category, price" in fixed.stderr.decode()


def test_jsonl_from_stdin_comes_back_as_jsonl(tmp_path: Path, env: dict[str, str]) -> None:
    data = b'{"id": "a", "review": "Leaked in the rain."}\n{"id": "b", "review": "Dry."}\n'
    out = fabricctl("table", "-", "--format", "jsonl", "--key", "id", *ASK, input=data,
                    env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    assert all(r["answer"] and r["error"] is None for r in rows)


def test_a_table_from_a_pipe_is_csv_unless_its_name_says_otherwise(
        tmp_path: Path, env: dict[str, str]) -> None:
    """What `fabricctl table <(cmd) ...` hands the command: a pipe, read once, spooled."""
    for name, data in (("63", PRODUCTS.read_bytes()),  # as /dev/fd/63: no suffix
                       ("rows.jsonl", b'{"id": "a", "review": "Dry."}\n')):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_bytes, args=(data,), daemon=True)
        writer.start()
        key = "sku" if name == "63" else "id"
        out = fabricctl("table", str(fifo), "--key", key, *ASK, "--emit", env=env, cwd=tmp_path)
        writer.join(10)
        assert out.returncode == 0, out.stderr.decode()
        ids = sorted(json.loads(x)["id"] for x in out.stdout.splitlines())
        want = sorted(r["sku"] for r in read_csv(data)) if key == "sku" else ["a"]
        assert ids == want


def test_bad_rows_get_their_error_and_exit_1_the_rest_is_answered(
        tmp_path: Path, env: dict[str, str]) -> None:
    src = tmp_path / "t.csv"
    src.write_bytes(b"sku,title\n1,Trail runner\n2,Sun hat\xff\n1,Duplicate key\n"
                    b"4,too,many\n5,Sandal\n")
    out = fabricctl("table", str(src), "--key", "sku", *ASK, env=env, cwd=tmp_path)
    assert out.returncode == 1
    rows = read_csv(out.stdout)
    assert [r["sku"] for r in rows] == ["1", "2", "1", "5"]
    assert rows[3]["answer"] and not rows[3]["error"]
    assert rows[1]["error"] == "row 2: field 'title' is not UTF-8 (byte 0xff at 7)"
    assert rows[1]["title"] == "Sun hat\ufffd" and not rows[1]["answer"]
    # the key 1 twice: whichever of the two rows went second is refused (the order decides)
    first, second = ((rows[0], rows[2]) if rows[0]["answer"] else (rows[2], rows[0]))
    assert first["answer"] and not first["error"] and not second["answer"]
    assert "duplicate" in second["error"]
    assert second["error"].startswith(f"row {1 if second is rows[0] else 3}: ")
    err = out.stderr.decode()
    assert "line 5: 3 fields where the header has 2" in err
    assert "row 2: field 'title' is not UTF-8" in err


@pytest.mark.parametrize(("content", "args", "message"), [
    (b"", (), "the table has no rows"),
    (b"sku,title\n", (), "the table has no rows"),
    (b"sku,title\n1,a\n", ("--fields", "color"), "no column 'color' (columns: sku, title)"),
    (b"sku,title\n1,a\n", ("--params", "[1]"), "--params takes a JSON object"),
    (b"sku,title\n1,a\n", ("--order", "random"), "--order takes fabric, ggr or original"),
])
def test_usage_errors_are_exit_2(tmp_path: Path, env: dict[str, str], content: bytes,
                                 args: tuple[str, ...], message: str) -> None:
    src = tmp_path / "t.csv"
    src.write_bytes(content)
    out = fabricctl("table", str(src), *ASK, *args, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr.decode()
    assert message in out.stderr.decode()
    assert out.stdout == b""
    missing = fabricctl("table", "nope.csv", *ASK, env=env, cwd=tmp_path)
    assert missing.returncode == 2 and b"nope.csv: no such file" in missing.stderr


def test_ask_table_from_python_on_a_running_broker(tmp_path: Path) -> None:
    from cli_helpers import Broker

    from fabricctl.producer import OutColumns, Producer, Table, TableFormat, TableSpec, ask_table

    src = tmp_path / "reviews.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "stars": i % 5, "text": f"review {i}"})
                           + "\n" for i in range(30)) + '{"id": "r30"}\n')
    broker = Broker(tmp_path / "broker", tmp_path)
    try:
        async def go() -> tuple[int, bytes]:
            async with await Producer.connect(broker.data_dir, name="table-test") as p:
                job = await p.open_job(name="reviews")
                out = io.BytesIO()
                spec = TableSpec("Summarise the review.", "fabric-demo", key="id",
                                 max_tokens=4)
                emitted = await ask_table(job, Table(src, TableFormat.JSONL), spec, out,
                                          OutColumns(answer="summary"))
                return len(emitted.errors), out.getvalue()

        errors, data = asyncio.run(go())
    finally:
        assert broker.stop() == 0
    rows = [json.loads(x) for x in data.splitlines()]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(31)]
    assert all(r["summary"] and r["error"] is None for r in rows[:30])
    assert rows[30]["summary"] is None and rows[30]["error"] == "row 31: no value for field " \
        "'stars'"
    assert errors == 1


def test_parquet_in_parquet_out_on_a_pipe_keeps_the_types(tmp_path: Path,
                                                          env: dict[str, str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [3, 1, 2], "colour": ["red", "red", "blue"]}),
                   tmp_path / "t.parquet")
    out = fabricctl("table", "t.parquet", *ASK, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    got = pq.read_table(pa.BufferReader(out.stdout))
    assert got.schema.field("id").type == pa.int64()
    assert got.column("id").to_pylist() == [3, 1, 2]
    assert all(got.column("answer").to_pylist()) and got.column("error").null_count == 3
