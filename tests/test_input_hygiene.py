"""Input hygiene: blank lines, CRLF line ends, a UTF-8 BOM and `"prefix": []`.

Promises checked (`fabricctl.formats.reader`): blank and whitespace-only lines are skipped,
not errors, and still counted, so every error names the real 1-based line of the file;
CRLF line ends are accepted; a UTF-8 byte order mark on the first line is accepted (and
only there: elsewhere it is not JSON); `"prefix": []` (native, or `body.prefix` of an
OpenAI completions line) is no shared prefix, signature 0, exactly as leaving it out. The
same through `fabricctl run` and `fabricctl submit --wait` as subprocesses.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from cli_helpers import clean_env, error_lines, fabricctl

from fabricctl.core.payload import decode_payload
from fabricctl.formats.reader import LineError, Parsed, parse_lines, parse_stream

BOM = b"\xef\xbb\xbf"


def native(ident: str, **over: object) -> dict:
    obj = {"id": ident, "model": "fabric-demo", "prompt": "hi", "max_tokens": 4}
    obj.update(over)
    return obj


def crlf(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\r\n"


# A file written on Windows by hand: BOM, CRLF, blank and whitespace-only lines, a bad line.
FILE = (BOM + crlf(native("a", prefix=[]))  # 1
        + b"\r\n"  # 2: blank
        + b"   \t \r\n"  # 3: whitespace only
        + crlf(native("b"))  # 4
        + b"\n"  # 5: blank, LF
        + crlf(native("c", max_tokens=0))  # 6: bad
        + b" \r\n"  # 7
        + crlf({"custom_id": "d", "method": "POST", "url": "/v1/completions",
                "body": {"model": "fabric-demo", "prompt": "x", "prefix": []}})  # 8
        + BOM + crlf(native("e"))  # 9: a BOM after the first line is not JSON
        + crlf(native("f", prefix=["SYS"]))[:-2])  # 10: no line end at all


def outcomes(results: list[Parsed | LineError]) -> list[tuple[int, str]]:
    return [(r.line_no, r.item.id if isinstance(r, Parsed) else f"error: {r.reason}")
            for r in results]


def test_blank_lines_crlf_and_bom_with_real_line_numbers() -> None:
    got = outcomes(list(parse_stream(io.BytesIO(FILE))))
    assert got == [
        (1, "a"),
        (4, "b"),
        (6, "error: max_tokens must be at least 1"),
        (8, "d"),
        (9, "error: line is not valid JSON: invalid character (byte 0)"),
        (10, "f"),
    ]


def test_the_same_lines_give_the_same_outcomes_as_a_list() -> None:
    lines = FILE.splitlines(keepends=True)
    assert len(lines) == 10
    assert list(parse_lines(lines)) == list(parse_stream(io.BytesIO(FILE)))


def test_only_blank_lines_give_nothing() -> None:
    assert list(parse_stream(io.BytesIO(BOM + b"\r\n \r\n\t\n\n"))) == []


def test_crlf_never_reaches_the_prompt() -> None:
    (p,) = parse_lines([crlf(native("x", prompt="ends here"))])
    assert isinstance(p, Parsed)
    assert decode_payload(p.item.payload).prompt == "ends here"


def test_empty_prefix_is_signature_zero_as_no_prefix() -> None:
    empty, absent, null = parse_lines([crlf(native("p1", prefix=[])), crlf(native("p2")),
                                       crlf(native("p3", prefix=None))])
    for p in (empty, absent, null):
        assert isinstance(p, Parsed), p
        assert p.item.signature == 0
        assert decode_payload(p.item.payload).components == []
    assert isinstance(empty, Parsed) and isinstance(absent, Parsed)
    assert empty.item.input_tokens == absent.item.input_tokens
    assert decode_payload(empty.item.payload).body == decode_payload(absent.item.payload).body


def test_submit_and_run_report_real_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "windows.jsonl"
    path.write_bytes(FILE)
    out_file = tmp_path / "out.jsonl"
    run = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=120)
    assert run.returncode == 1, run.stderr  # two lines refused
    errors = [ln for ln in run.stderr.decode().splitlines() if ln.startswith("line ")]
    assert errors == ["line 6: max_tokens must be at least 1",
                      "line 9: line is not valid JSON: invalid character (byte 0)"]
    summary = json.loads(run.stdout)
    assert (summary["items"], summary["rejected"]) == (4, 2)
    results = [json.loads(x) for x in out_file.read_bytes().splitlines()]
    assert sorted(r.get("custom_id") or r["id"] for r in results) == ["a", "b", "d", "f"]
    shapes = {r["id"]: r["shape"] for r in results if "shape" in r}
    assert shapes["a"] == shapes["b"] == "0000000000000000"  # prefix [] and none: one shape
    assert shapes["f"] != "0000000000000000"


def test_submit_reports_real_line_numbers(tmp_path: Path) -> None:
    from cli_helpers import Broker

    broker = Broker(tmp_path / "broker", tmp_path)
    try:
        path = tmp_path / "windows.jsonl"
        path.write_bytes(FILE)
        out = broker.run("submit", str(path), "--wait", "--timeout", "60")
    finally:
        assert broker.stop() == 0
    assert out.returncode == 1
    assert error_lines(out.stderr) == [
        "fabricctl: error: line 6: max_tokens must be at least 1",
        "fabricctl: error: line 9: line is not valid JSON: invalid character (byte 0)",
    ]
    results = [json.loads(x) for x in out.stdout.splitlines()]
    assert sorted(r.get("custom_id") or r["id"] for r in results) == ["a", "b", "d", "f"]
