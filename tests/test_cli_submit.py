"""`fabricctl submit` and `fabricctl run` end to end: bad input, OpenAI batch, exit codes.

Promises checked: every refused line is one `fabricctl: error: line N: reason` on stderr
(reader and broker alike) while every good line goes in; stdout holds only the results of
this submit's accepted items (with --wait) or nothing; exit 1 when a line was refused, 4 on
--timeout, 0 otherwise; OpenAI batch input comes back as OpenAI batch output, each
custom_id once. (The pipeline's bounds are tested in test_producer_feed.py.)
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from cli_helpers import ROOT, Broker, clean_env, error_lines, fabricctl


def j(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def native(ident: object = "n1", **over: object) -> dict:
    obj = {"id": ident, "model": "fabric-demo", "prefix": ["SYS-M", "FEW"], "prompt": "hi",
           "max_tokens": 8}
    obj.update(over)
    return obj


def without(obj: dict, key: str) -> dict:
    return {k: v for k, v in obj.items() if k != key}


def comp(cid: str, **body_over: object) -> dict:
    body = {"model": "fabric-demo", "prompt": "hello", "max_tokens": 4}
    body.update(body_over)
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("cli-submit")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


# ---- the bad-input matrix -------------------------------------------------------------------

HUGE = b'{"id": "huge", "prompt": "' + b"y" * (10 * 1024 * 1024) + b'"}\n'

# (line, expected reason or None for a good line); "dup-broker" was submitted before.
MATRIX: list[tuple[bytes, str | None]] = [
    (j(native("g1")), None),
    (b"not json {\n", "line is not valid JSON: invalid character (byte 4)"),
    (b"[1, 2]\n", "line must be a JSON object, not an array"),
    (b'"a string"\n', "line must be a JSON object, not a string"),
    (b"42\n", "line must be a JSON object, not a number"),
    (b'{"id": "\xff\xfe"}\n', "line is not valid UTF-8"),
    (HUGE, "line is longer than 1048576 bytes"),
    (j({"foo": 1}), "line is neither a native item nor an OpenAI batch request"),
    (j(without(native("x1"), "id")), "id is missing"),
    (j(without(native("x2"), "model")), "model is missing"),
    (j(without(native("x3"), "prompt")), "prompt is missing"),
    (j(without(native("x4"), "max_tokens")), "max_tokens is missing"),
    (j(native(5)), "id must be a string"),
    (j(native("")), "id must not be empty"),
    (j(native("x5", model=3)), "model must be a string"),
    (j(native("x6", prefix="SYS")), "prefix must be a list of strings"),
    (j(native("x7", params="hot")), "params must be a JSON object, not a string"),
    (j(native("x8", max_tokens="8")), "max_tokens must be an integer"),
    (j(native("x9", max_tokens=-3)), "max_tokens must be at least 1"),
    (j(native("x10", input_tokens=1.5)), "input_tokens must be an integer"),
    (b"\n", None),  # blank: skipped, still numbered
    (j(native("g2", prefix=None)), None),
    (j(native("g1")), "id 'g1' is a duplicate of line 1"),
    (j(native("dup-broker")), None),  # the same id in another job is an item of its own
    (j(comp("c1")), None),
    (j({**comp("x11"), "url": "/v1/moderations"}),
     "url must be one of /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/score, "
     "/v1/rerank, /v1/responses, /v1/audio/transcriptions, /score, /rerank, /v2/rerank"),
    (j({**comp("x12"), "method": "GET"}), "method must be POST"),
    (j(native("x13", messages=[{"role": "user", "content": "u"}])),
     "give prompt or messages, not both"),
    (j(comp("x14", stream=True)), "body.stream must be false in a batch"),
    (j({"custom_id": "x15", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "fabric-demo", "messages": []}}),
     "body.messages must be a non-empty list"),
    (j(native("g3")), None),
]

ERROR = re.compile(r"^fabricctl: error: line (\d+): (.*)$")


def job_of(stderr: bytes) -> str:
    m = re.search(rb"fabricctl: job (batch_\w+)", stderr)
    assert m, stderr
    return m.group(1).decode()


def test_the_bad_input_matrix_reports_each_line_and_lets_the_rest_in(broker: Broker) -> None:
    first = broker.run("submit", "-", input=j(native("dup-broker")))
    assert first.returncode == 0 and first.stdout == b"" and error_lines(first.stderr) == []
    out = broker.run("submit", "-", "--wait", "--timeout", "60",
                     input=b"".join(line for line, _ in MATRIX))
    assert out.returncode == 1
    got = []
    for line in error_lines(out.stderr):
        m = ERROR.match(line)
        assert m, line
        got.append((int(m.group(1)), m.group(2)))
    expected = [(n, why) for n, (_, why) in enumerate(MATRIX, 1) if why is not None]
    assert sorted(got) == expected
    assert len({why for _, why in expected}) >= 20
    results = [json.loads(x) for x in out.stdout.splitlines()]
    ids = [r.get("custom_id") or r["id"] for r in results]
    assert sorted(ids) == ["c1", "dup-broker", "g1", "g2", "g3"]  # each good line, once


def test_the_matrix_from_a_file_without_wait_prints_nothing_on_stdout(
        broker: Broker, tmp_path: Path) -> None:
    lines = [(j(native(f"file-{i}")), None) for i in range(3)] + MATRIX[1:4]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(line for line, _ in lines))
    out = broker.run("submit", str(path))
    assert out.returncode == 1 and out.stdout == b""
    assert [ERROR.match(x).group(1) for x in error_lines(out.stderr)] == ["4", "5", "6"]  # type: ignore[union-attr]
    status = json.loads(broker.run("status", "--json").stdout)
    assert status["difference"] == [0, 0]


def test_all_good_lines_exit_0_and_wait_prints_exactly_their_results(broker: Broker) -> None:
    items = [native(f"ok-{i}", prefix=[f"SYS-{i % 3}", "FEW"], prompt="p" * (i * 37 % 900))
             for i in range(1200)]  # three chunks of 512 or fewer
    out = broker.run("submit", "-", "--wait", input=b"".join(j(x) for x in items))
    assert out.returncode == 0, out.stderr
    assert error_lines(out.stderr) == []
    results = [json.loads(x) for x in out.stdout.splitlines()]
    assert sorted(r["id"] for r in results) == sorted(x["id"] for x in items)
    assert all(r["error"] is None and r["finish_reason"] for r in results)


def test_a_missing_file_is_a_usage_error(broker: Broker) -> None:
    out = broker.run("submit", "/nonexistent/in.jsonl")
    assert out.returncode == 2
    assert error_lines(out.stderr) == ["fabricctl: error: /nonexistent/in.jsonl: no such file"]


def test_wait_times_out_with_exit_4(broker: Broker) -> None:
    stuck = native("never-served", model="no-consumer-serves-this-model")
    out = broker.run("submit", "-", "--wait", "--timeout", "0.5", input=j(stuck))
    assert out.returncode == 4 and out.stdout == b""
    assert error_lines(out.stderr) == [
        "fabricctl: warning: no consumer serves model 'no-consumer-serves-this-model' "
        "(served: fabric-demo): its 1 item waits until one joins",
        "fabricctl: error: timed out after 0.5 s with 1 result(s) missing (0 written); "
        f"`fabricctl results --job {job_of(out.stderr)}` prints them later"]


# ---- OpenAI batch ---------------------------------------------------------------------------


def _check_openai_output(lines: list[bytes], inputs: list[dict]) -> None:
    outs = [json.loads(x) for x in lines]
    assert sorted(o["custom_id"] for o in outs) == sorted(x["custom_id"] for x in inputs)
    by_url = {x["custom_id"]: x["url"] for x in inputs}
    for o in outs:
        assert set(o) == {"id", "custom_id", "response", "error"}
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        want = "chat.completion" if by_url[o["custom_id"]].endswith("chat/completions") \
            else "text_completion"
        assert body["object"] == want and body["model"] == "fabric-demo"
        assert body["usage"]["total_tokens"] == (body["usage"]["prompt_tokens"]
                                                 + body["usage"]["completion_tokens"])
        choice = body["choices"][0]
        assert isinstance(choice["message"]["content"] if want == "chat.completion"
                          else choice["text"], str)


def test_openai_batch_round_trip_through_submit(broker: Broker) -> None:
    path = ROOT / "examples" / "openai_batch.jsonl"
    inputs = [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
    out = broker.run("submit", str(path), "--wait", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    _check_openai_output(out.stdout.splitlines(), inputs)


def test_openai_batch_round_trip_through_run(tmp_path: Path) -> None:
    path = ROOT / "examples" / "openai_batch.jsonl"
    inputs = [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
    out_file = tmp_path / "out.jsonl"
    out = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["items"] == len(inputs) and summary["rejected"] == 0
    _check_openai_output(out_file.read_bytes().splitlines(), inputs)


def _fifo_of(path: Path, data: bytes) -> threading.Thread:
    """A named pipe at `path` that a thread fills with `data` once a reader opens it: what the
    shell's `<(cmd)` hands a command."""
    os.mkfifo(path)

    def fill() -> None:
        with path.open("wb") as w:
            w.write(data)

    writer = threading.Thread(target=fill, daemon=True)
    writer.start()
    return writer


def test_a_pipe_is_read_like_a_file_and_a_directory_refused(broker: Broker) -> None:
    items = [native(f"p{i}") for i in range(30)]
    fifo = broker.home / "in.pipe"
    writer = _fifo_of(fifo, b"".join(j(x) for x in items))
    out = broker.run("submit", str(fifo), "--wait")
    writer.join(10)
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(x)["id"] for x in out.stdout.splitlines()) == sorted(
        x["id"] for x in items)
    jobs = json.loads(broker.run("jobs", "--json").stdout)["jobs"]
    names = [j["name"] for j in jobs]  # (the module's broker holds its other tests' jobs)
    assert str(fifo) in names and not [n for n in names if "pipe:[" in n]  # as given
    folder = broker.run("submit", str(broker.home))
    assert folder.returncode == 2
    assert error_lines(folder.stderr) == [
        f"fabricctl: error: {broker.home}: is a directory, not a JSONL file"]
