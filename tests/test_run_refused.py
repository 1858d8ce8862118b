"""Refused lines in `fabricctl run`: an error row for each OpenAI batch line, and exit 1.

Promises checked: through `fabricctl run` as a subprocess, an OpenAI batch file with good
lines and refused ones (not JSON, not an object, an unknown url, no body, a body without
messages, a custom_id that is not a string, a duplicate custom_id, an id the broker
refuses) exits 1, reports each refused line on stderr as `line N: reason`, and writes
exactly one row per input line: the good lines' answers and, for each refused line, a row
in `vllm run-batch`'s form for a line it does not run (status 400, `body` null, the message
as a string `error`, `custom_id` the line's or ""), at the line's place with --ordered.
A file whose every line is refused exits 1 with a row for each. The pure parts: what the
reader keeps of a refused line (`LineError.openai`, `.id`), the row's shape
(`formats.results.refused_line`, field for field vLLM's `BatchRequestOutput`), and
`cli.run_rows.RefusedRows` (the input's form decides lines of unknown form, native lines get no
row, rows held for their place in order).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from cli_helpers import clean_env, fabricctl

from fabricctl.cli.run_rows import RefusedRows
from fabricctl.formats.reader import LineError, Parsed, parse_lines
from fabricctl.formats.results import refused_line
from fabricctl.producer import Chunk

CHAT = "/v1/chat/completions"
LONG_ID = "\U0001f600" * 200  # 200 characters (the reader's limit is 256), 800 bytes: the
# broker's id index takes at most 511


def j(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def chat(cid: object, i: int = 0, **over: object) -> dict:
    line: dict = {"custom_id": cid, "method": "POST", "url": CHAT,
                  "body": {"model": "fabric-demo", "max_tokens": 4,
                           "messages": [{"role": "system", "content": f"SYS-{i % 3}"},
                                        {"role": "user", "content": f"q {cid} {i}"}]}}
    line.update(over)
    return line


def mixed_file() -> tuple[list[bytes], dict[int, tuple[str, str]]]:
    """Good chat lines with refused ones spread through; refused: line -> (custom_id in
    the row, the start of the reason)."""
    lines = [j(chat(f"ok-{i}", i)) for i in range(30)]
    bad: list[tuple[int, bytes, str, str]] = [  # (index in lines, line, custom_id, reason)
        (0, b'{"custom_id": "cut", "method": "POST"\n', "", "line is not valid JSON"),
        (4, j(chat("foo-url", url="/v1/foo")), "foo-url", "url must be"),
        (9, j({k: v for k, v in chat("no-body").items() if k != "body"}), "no-body",
         "body is missing"),
        (13, j(chat("no-messages", body={"model": "fabric-demo"})), "no-messages",
         "body.messages is missing"),
        (17, b"[1]\n", "", "line must be a JSON object"),
        (20, j(chat(7, url="/v1/foo")), "", "custom_id must be a string"),
        (24, j(chat("ok-3", 3)), "ok-3", "custom_id 'ok-3' is a duplicate of line"),
        (28, j(chat(LONG_ID, 5)), LONG_ID, "id is longer than"),
    ]
    for at, line, _, _ in bad:
        lines.insert(at, line)
    lines.insert(12, b"\n")  # blank: skipped, still counted
    refused = {}
    for n, line in enumerate(lines, 1):
        for _, b, cid, reason in bad:
            if line is b:
                refused[n] = (cid, reason)
    return lines, refused


def key(row: dict) -> object:
    """A good line's custom_id, or a refused line's number (from its error)."""
    if row["error"] is None:
        return row["custom_id"]
    assert isinstance(row["error"], str), row
    return int(row["error"].split(":")[0].removeprefix("line "))


def check_rows(rows: list[dict], lines: list[bytes], refused: dict[int, tuple[str, str]]
               ) -> list[object]:
    """Every line has exactly one row; the refused ones in run-batch's form. The keys."""
    want = []
    for n, line in enumerate(lines, 1):
        if n in refused:
            want.append(n)
        elif line.strip():
            want.append(json.loads(line)["custom_id"])
    got = [key(r) for r in rows]
    assert sorted(got, key=str) == sorted(want, key=str)
    for r in rows:
        assert list(r) == ["id", "custom_id", "response", "error"]
        if r["error"] is None:
            assert r["response"]["status_code"] == 200 and r["response"]["body"] is not None
            continue
        n = key(r)
        assert isinstance(n, int)
        cid, reason = refused[n]
        assert r["custom_id"] == cid
        assert r["error"].startswith(f"line {n}: {reason}"), r["error"]
        assert r["response"]["status_code"] == 400 and r["response"]["body"] is None
        assert r["response"]["request_id"].startswith("fabric-batch-")
    return want


def test_run_writes_a_row_for_every_refused_line_and_exits_1(tmp_path: Path) -> None:
    lines, refused = mixed_file()
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    for ordered in (False, True):
        out_file = tmp_path / f"out-{ordered}.jsonl"
        out = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                        *(["--ordered"] if ordered else []),
                        env=clean_env(tmp_path), cwd=tmp_path, timeout=180)
        assert out.returncode == 1, out.stderr
        assert json.loads(out.stdout)["rejected"] == len(refused) == 8
        stderr = [ln for ln in out.stderr.decode().splitlines() if ln.startswith("line ")]
        assert sorted(int(ln.split(":")[0][5:]) for ln in stderr) == sorted(refused)
        rows = [json.loads(x) for x in out_file.read_bytes().splitlines()]
        want = check_rows(rows, lines, refused)
        if ordered:
            assert [key(r) for r in rows] == want  # input order, refused rows in place


def test_a_file_whose_every_line_is_refused_exits_1_with_a_row_each(tmp_path: Path) -> None:
    lines = [b"not json\n", j(chat("foo-url", url="/v1/foo")),
             j({k: v for k, v in chat("no-body").items() if k != "body"})]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    out = fabricctl("run", str(path), "--ordered", "--engine", "sim",
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=120)
    assert out.returncode == 1, out.stderr
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert [key(r) for r in rows] == [1, 2, 3]
    assert [r["custom_id"] for r in rows] == ["", "foo-url", "no-body"]
    assert all(r["response"]["status_code"] == 400 for r in rows)


# ---- the pure parts ---------------------------------------------------------------------------


def test_the_reader_keeps_the_form_and_id_of_a_refused_line() -> None:
    got = list(parse_lines([
        b"{oops\n",  # 1: not JSON
        b'"a string"\n',  # 2: not an object
        b'{"hello": 1}\n',  # 3: neither form
        j(chat("c1", url="/v1/foo")),  # 4: OpenAI, bad url
        j(chat(["x"])),  # 5: OpenAI, custom_id not a string
        j({"id": "n1", "model": "fabric-demo", "prompt": "p", "max_tokens": 0}),  # 6: native
        j(chat("c2")),  # 7: good
        j(chat("c2")),  # 8: duplicate
    ]))
    errors = [(e.line_no, e.openai, e.id) for e in got if isinstance(e, LineError)]
    assert errors == [(1, None, None), (2, None, None), (3, None, None), (4, True, "c1"),
                      (5, True, None), (6, False, "n1"), (8, True, "c2")]
    assert str(got[3]) == ("line 4: url must be one of /v1/completions, /v1/chat/completions, "
                           "/v1/embeddings, /v1/score, /v1/rerank, /v1/responses, "
                           "/v1/audio/transcriptions, /score, /rerank, /v2/rerank")


class RunBatchResponse(msgspec.Struct, forbid_unknown_fields=True):
    """Why: vLLM's `BatchResponseData` of a line it did not run, no field more."""

    status_code: int
    request_id: str
    body: None


class RunBatchRow(msgspec.Struct, forbid_unknown_fields=True):
    """Why: vLLM's `BatchRequestOutput` with a string error, no field more."""

    id: str
    custom_id: str
    response: RunBatchResponse | None
    error: str | None


def test_the_row_has_run_batch_fields_and_its_error_form() -> None:
    row = json.loads(refused_line(3, "body is missing", "c9"))
    assert row["custom_id"] == "c9" and row["error"] == "line 3: body is missing"
    assert row["response"]["status_code"] == 400 and row["response"]["body"] is None
    assert row["id"].startswith("fabric-") and row["id"].removeprefix("fabric-") == \
        row["response"]["request_id"].removeprefix("fabric-batch-")
    assert json.loads(refused_line(3, "r", None))["custom_id"] == ""
    assert refused_line(3, "r", "c9") == refused_line(3, "r", "c9")  # reproducible
    assert refused_line(3, "r", "c9") != refused_line(4, "r", "c9")
    msgspec.json.decode(refused_line(3, "r", "c9"), type=RunBatchRow)


def chunk(lines: list[bytes], first: int = 1) -> Chunk:
    c = Chunk()
    for p in parse_lines(lines, first_line_no=first):
        if isinstance(p, Parsed):
            c.items.append(p.item)
        else:
            c.errors.append(p)
    return c


def refused_ids(rows: list[bytes]) -> list[tuple[str, str]]:
    return [(r["custom_id"], r["error"].split(":")[0]) for r in map(json.loads, rows)]


def test_lines_of_unknown_form_wait_for_the_input_form() -> None:
    rows: list[bytes] = []
    r = RefusedRows(rows.append, ordered=False)
    r.chunk(chunk([b"{\n", b"[1]\n"]))  # form unknown yet: held
    assert rows == [] and r.openai is None
    r.chunk(chunk([b"{\n", j(chat("a")), j(chat("b", url="/v1/x"))], first=3))
    assert r.openai is True
    assert refused_ids(rows) == [("", "line 1"), ("", "line 2"), ("", "line 3"),
                                 ("b", "line 5")]
    r.chunk(chunk([j({"id": "n", "model": "m", "prompt": "p", "max_tokens": 0})], first=6))
    assert len(rows) == 4  # a native line: its stderr line only
    r.finish()
    assert r.rows == 4


def test_native_input_gets_no_rows() -> None:
    rows: list[bytes] = []
    r = RefusedRows(rows.append, ordered=False)
    r.chunk(chunk([b"{\n"]))
    r.chunk(chunk([j({"id": "n", "model": "m", "prompt": "p", "max_tokens": 4}), b"{\n",
                   j(chat("c", url="/v1/x"))], first=2))
    assert r.openai is False
    r.finish()
    assert refused_ids(rows) == [("c", "line 4")]  # an OpenAI line in it still gets its row
    r = RefusedRows(rows.append, ordered=False)
    r.chunk(chunk([b"{\n", b"[2]\n"]))
    r.finish()  # no line of known form at all: no rows
    assert r.rows == 0 and len(rows) == 1


def test_ordered_rows_wait_for_their_place() -> None:
    rows: list[bytes] = []
    r = RefusedRows(rows.append, ordered=True)
    c = chunk([j(chat("a")), b"{\n", j(chat("b")), b"[1]\n"])
    r.chunk(c)
    r.rejected(c.items[1], "duplicate id 'b'")  # the broker refused line 3
    assert rows == []
    r.before(1)  # line 1's result goes next: nothing before it
    assert rows == []
    r.before(5)
    assert refused_ids(rows) == [("", "line 2"), ("b", "line 3"), ("", "line 4")]
    r.finish()
    assert r.rows == 3 and len(rows) == 3
