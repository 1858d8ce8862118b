"""The Batch API's pure parts, and its routes driven by the official `openai` SDK in-process.

Promises checked: completion windows parse as `<N>h|m|s` and print back the same; a job maps
onto OpenAI's Batch field by field (status names, `*_at` as ints, counts that add up with
cancelled requests counted as failed, output/error file ids only once ended); the upload
line checker refuses each kind of bad line naming its line, whatever the chunking, and
accepts BOM, CRLF, blank lines and a last line without newline. Through the SDK (httpx's
ASGI transport, the fake backend of `api_fake.py`, a real `FileStore`): upload, create,
retrieve, content in input order, the error file with `batch_cancelled` lines, list paging,
cancel, and every refusal in OpenAI's error shape with its status (400, 401, 404). A batch
takes every endpoint the reader takes (embeddings, score, rerank, responses beside
completions and chat; vLLM's short forms are their endpoints) and echoes it; an unknown one
is a 400 listing them, a file with a line for another endpoint a 400 naming that line.
The Batch's `model` (its first line's) and `usage` (equal to the sums over its output file's
lines' usage, cached tokens included; reasoning 0); `output_expires_after` parsed (anchor
`created_at`, 3600..2592000 seconds; anything else a 400 naming the field, no batch made) and
honoured by the API's clock: at the output file's creation + seconds its output and error
files are 404s (their cached sizes dropped) while the Batch keeps their ids; a batch without
it keeps its files.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from api_fake import FakeBackend

from fabricctl.api.app import build_app
from fabricctl.api.objects import (
    ENDPOINTS,
    batch_object,
    check_endpoint,
    check_urls,
    parse_output_expires,
    parse_window,
    virtual_file,
    window_text,
)
from fabricctl.api.service import BatchApi
from fabricctl.api.upload import LineChecker
from fabricctl.core import jobs as J
from fabricctl.errors import ApiError
from fabricctl.formats.tokens import EstimateCounter
from fabricctl.store.files import FileStore

CHAT = "/v1/chat/completions"


def request(cid: str, prompt: str = "hi", url: str = CHAT, **extra: object) -> dict:
    if url == CHAT:
        body: dict = {"model": "fabric-demo", "messages": [{"role": "user", "content": prompt}],
                      "max_tokens": 4}
    else:
        body = {"model": "fabric-demo", "prompt": prompt, "max_tokens": 4}
    return {"custom_id": cid, "method": "POST", "url": url, "body": body, **extra}


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


# ---- completion_window ----------------------------------------------------------------------


def test_window_parses_hours_minutes_seconds_and_prints_back() -> None:
    assert parse_window("24h") == 86400
    assert parse_window("90m") == 5400
    assert parse_window("30s") == 30
    for text in ("24h", "90m", "45s", "2h"):
        job = J.new_job(1, "batch_1", "api", 1000.5, window_s=parse_window(text))
        assert window_text(job) == text


@pytest.mark.parametrize("bad", ["24", "0h", "1d", "1.5h", "h", "-1h", 24, None, " 24h"])
def test_window_refuses_anything_else(bad: object) -> None:
    with pytest.raises(ApiError) as e:
        parse_window(bad)
    assert e.value.status == 400 and e.value.param == "completion_window"


# ---- the Batch object ----------------------------------------------------------------------


def test_batch_object_follows_the_job_through_its_states() -> None:
    job = J.new_job(7, "batch_7ab", "api", 100.9, validating=True, window_s=3600,
                    name="file-x", endpoint=CHAT, metadata={"k": "v"})
    b = batch_object(job)
    assert (b.id, b.object, b.status, b.input_file_id, b.endpoint) == (
        "batch_7ab", "batch", "validating", "file-x", CHAT)
    assert (b.created_at, b.expires_at, b.in_progress_at) == (100, 3700, None)
    assert b.completion_window == "1h" and b.metadata == {"k": "v"}
    assert b.output_file_id is None and b.error_file_id is None and b.errors is None
    job.total = 4
    J.start(job, 101.2)
    J.seal(job, 4, 101.3)
    b = batch_object(job)
    assert b.status == "in_progress" and b.in_progress_at == 101
    job.completed, job.failed = 3, 1
    assert J.settle(job, 0, 102.0) and batch_object(job).status == "finalizing"
    assert J.settle(job, 0, 103.0)
    b = batch_object(job)
    assert (b.status, b.finalizing_at, b.completed_at) == ("completed", 102, 103)
    assert (b.request_counts.total, b.request_counts.completed,
            b.request_counts.failed) == (4, 3, 1)
    assert b.output_file_id == "file-batch_7ab-output"
    assert b.error_file_id == "file-batch_7ab-error"
    assert virtual_file(b.output_file_id) == ("batch_7ab", "output")
    assert virtual_file(b.error_file_id) == ("batch_7ab", "error")
    assert virtual_file("file-0123abc") is None


def test_cancelled_requests_count_as_failed_and_counts_add_up() -> None:
    job = J.new_job(2, "batch_2", "api", 10.0)
    job.total = 10
    J.seal(job, 10, 11.0)
    job.completed = 3
    assert J.request_cancel(job, 12.0)
    job.cancelled = 7
    assert J.settle(job, 0, 13.0)
    b = batch_object(job)
    assert (b.status, b.cancelling_at, b.cancelled_at) == ("cancelled", 12, 13)
    counts = b.request_counts
    assert counts.completed + counts.failed == counts.total == 10
    assert b.error_file_id is not None and b.output_file_id is not None


def test_validation_errors_carry_their_line() -> None:
    job = J.new_job(3, "batch_3", "api", 10.0, validating=True)
    J.fail_validation(job, ["line 4: url must be /v1/completions or /v1/chat/completions",
                            "the file has no requests"], 11.0)
    b = batch_object(job)
    assert b.status == "failed" and b.failed_at == 11 and b.errors is not None
    assert [(e.line, e.message) for e in b.errors.data] == [
        (4, "url must be /v1/completions or /v1/chat/completions"),
        (None, "the file has no requests")]


# ---- the line checker -----------------------------------------------------------------------


def check(data: bytes, step: int = 0) -> LineChecker:
    c = LineChecker(max_line_bytes=4096)
    if step:
        for i in range(0, len(data), step):
            c.feed(data[i:i + step])
    else:
        c.feed(data)
    c.end()
    return c


def test_a_good_file_passes_in_any_chunking() -> None:
    data = (b"\xef\xbb\xbf" + json.dumps(request("a")).encode() + b"\r\n\n   \n"
            + jsonl([request("b", url="/v1/completions")]) + json.dumps(request("c")).encode())
    for step in (0, 1, 7, 64):
        c = check(data, step)
        assert c.error is None, (step, c.error)
        assert (c.lines, c.requests) == (5, 3)
        assert c.urls == {CHAT: 1, "/v1/completions": 4}


@pytest.mark.parametrize(("line", "reason"), [
    (b"not json", "line 2: line is not valid JSON"),
    (b"[1, 2]", "line 2: line must be a JSON object, not an array"),
    (json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(),
     "line 2: custom_id is missing"),
    (json.dumps({**request("x"), "method": "GET"}).encode(), "line 2: method must be POST"),
    (json.dumps({**request("x"), "url": "/v1/moderations"}).encode(),
     "line 2: url must be one of /v1/completions, /v1/chat/completions, /v1/embeddings, "
     "/v1/score, /v1/rerank, /v1/responses, /v1/audio/transcriptions, /score, /rerank, "
     "/v2/rerank"),
    (json.dumps({**request("x"), "body": "text"}).encode(),
     "line 2: body must be a JSON object, not a string"),
    (b'{"custom_id": "' + b"x" * 5000 + b'"}', "line 2: line is longer than 4096 bytes"),
])
def test_each_bad_line_is_named(line: bytes, reason: str) -> None:
    data = jsonl([request("a")]) + line + b"\n" + jsonl([request("z")])
    for step in (0, 3, 100):
        c = check(data, step)
        assert c.error is not None and c.error.startswith(reason), (step, c.error)


def test_duplicates_are_found_after_the_stream_and_named_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.jsonl"
    data = jsonl([request("a"), request("b")]) + b"\n" + jsonl([request("c"), request("b")])
    path.write_bytes(data)
    c = check(data, 5)
    assert c.error is None  # the streaming checks keep 8 bytes an id, not the ids
    assert c.duplicate(path) == "line 5: custom_id 'b' is a duplicate of line 2"
    path.write_bytes(jsonl([request("a"), request("b")]))
    assert check(path.read_bytes()).duplicate(path) is None
    # every id hashing alike: only an exact repeat is a duplicate
    import fabricctl.api.upload as upload

    monkeypatch.setattr(upload.xxhash, "xxh3_64_intdigest", lambda b: 42)
    path.write_bytes(jsonl([request("x"), request("y"), request("z")]))
    assert check(path.read_bytes()).duplicate(path) is None
    path.write_bytes(jsonl([request("x"), request("y"), request("x")]))
    assert check(path.read_bytes()).duplicate(path) == (
        "line 3: custom_id 'x' is a duplicate of line 1")


# ---- the routes, through the SDK -----------------------------------------------------------


class Harness:
    def __init__(self, tmp: Path, token: str = "") -> None:
        self.backend = FakeBackend()
        self.files = FileStore(tmp / "files")
        self.api = BatchApi(self.backend, self.files, EstimateCounter(), token=token,
                            clock=lambda: self.backend.now)
        self.app = build_app(self.api)

    def client(self, key: str = "sk-none") -> openai.AsyncOpenAI:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                 base_url="http://api.test")
        return openai.AsyncOpenAI(api_key=key, base_url="http://api.test/v1",
                                  http_client=http, max_retries=0)

    async def fed(self) -> None:
        await asyncio.gather(*self.api.feeds.values())


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    await harness.api.stop()
    harness.files.close()


async def test_upload_batch_retrieve_and_output_in_input_order(h: Harness) -> None:
    c = h.client()
    rows = [request(f"r{i}", f"prompt {i}") for i in range(1200)]
    rows[5] = request("r5", "please fail")
    f = await c.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(jsonl(rows))
    assert f.filename == "in.jsonl"
    got = await c.files.retrieve(f.id)
    assert got.id == f.id and got.bytes == f.bytes
    assert (await c.files.content(f.id)).content == jsonl(rows)

    b = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                               metadata={"run": "one"})
    assert b.status == "validating" and b.metadata == {"run": "one"}
    await h.fed()
    b = await c.batches.retrieve(b.id)
    assert b.status == "in_progress" and b.request_counts is not None
    assert b.request_counts.total == 1200
    assert h.backend.submits == 3  # 512-item chunks
    number = h.backend.jobs_by_number[1].number
    h.backend.run(number)
    b = await c.batches.retrieve(b.id)
    assert b.status == "completed" and b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (1199, 1)
    assert b.output_file_id and b.error_file_id
    out = [json.loads(x) for x in (await c.files.content(b.output_file_id)).text.splitlines()]
    assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(1200) if i != 5]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert "prompt 0" in out[0]["response"]["body"]["choices"][0]["message"]["content"]
    err = [json.loads(x) for x in (await c.files.content(b.error_file_id)).text.splitlines()]
    assert [e["custom_id"] for e in err] == ["r5"]
    assert "engine said no" in json.dumps(err[0]["error"])
    meta = await c.files.retrieve(b.output_file_id)
    assert meta.purpose == "batch_output"
    assert meta.bytes == len((await c.files.content(b.output_file_id)).content)


async def test_cancel_writes_unrun_requests_as_batch_cancelled(h: Harness) -> None:
    c = h.client()
    f = await c.files.create(file=("in.jsonl", jsonl([request(f"c{i}") for i in range(50)])),
                             purpose="batch")
    b = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="1h")
    await h.fed()
    h.backend.run(1, 20)
    b = await c.batches.cancel(b.id)
    assert b.status == "cancelled" and b.cancelling_at is not None
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
        50, 20, 30)
    assert b.output_file_id and b.error_file_id
    out = (await c.files.content(b.output_file_id)).text.splitlines()
    assert [json.loads(x)["custom_id"] for x in out] == [f"c{i}" for i in range(20)]
    err = [json.loads(x) for x in (await c.files.content(b.error_file_id)).text.splitlines()]
    assert [e["custom_id"] for e in err] == [f"c{i}" for i in range(20, 50)]
    assert {e["error"]["code"] for e in err} == {"batch_cancelled"}
    assert all(e["response"] is None for e in err)
    with pytest.raises(openai.ConflictError):
        await c.batches.cancel(b.id)


async def test_list_is_newest_first_with_paging(h: Harness) -> None:
    c = h.client()
    f = await c.files.create(file=("in.jsonl", jsonl([request("a")])), purpose="batch")
    ids = []
    for _ in range(5):
        h.backend.now += 1
        ids.append((await c.batches.create(input_file_id=f.id, endpoint=CHAT,
                                           completion_window="24h")).id)
    await h.fed()
    first = await c.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    rest = await c.batches.list(limit=10, after=first.data[-1].id)
    assert [b.id for b in rest.data] == ids[::-1][2:] and not rest.has_more
    every = [b.id async for b in c.batches.list(limit=2)]  # the SDK pages by last_id
    assert every == ids[::-1]
    files = await c.files.list()
    assert [x.id for x in files.data] == [f.id]


async def test_bad_uploads_get_openai_errors(h: Harness) -> None:
    c = h.client()
    cases = [
        (("a.jsonl", jsonl([request("a")])), "assistants", "purpose must be 'batch'"),
        (("a.pdf", b"%PDF-1.4\n\x00\x01binary"), "batch", "line 1: line is not valid JSON"),
        (("a.jsonl", jsonl([request("a"), request("b"), request("a")])), "batch",
         "line 3: custom_id 'a' is a duplicate of line 1"),
        (("a.jsonl", b"\n\n"), "batch", "the file has no requests"),
    ]
    for file, purpose, message in cases:
        with pytest.raises(openai.BadRequestError) as e:
            await c.files.create(file=file, purpose=purpose)  # type: ignore[arg-type]
        assert e.value.status_code == 400
        body = e.value.response.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
        assert message in body["error"]["message"], body
    assert (await c.files.list()).data == []
    assert list((h.files.dir).glob("*.part")) == [] and list(h.files.dir.glob("*.jsonl")) == []


async def test_bad_batches_get_openai_errors(h: Harness) -> None:
    c = h.client()
    f = await c.files.create(file=("a.jsonl", jsonl([request("a"), request(
        "b", url="/v1/completions")])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        await c.batches.create(input_file_id=f.id, endpoint="/v1/moderations",
                               completion_window="24h")
    assert e.value.response.json()["error"]["param"] == "endpoint"
    assert e.value.response.json()["error"]["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError) as e:
        await c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                               completion_window="24h")
    assert e.value.response.json()["error"]["code"] == "mismatched_url"
    assert "line 1: url " + CHAT in e.value.response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert "line 2: url /v1/completions" in e.value.response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await c.batches.create(input_file_id=f.id, endpoint=CHAT,
                               completion_window="1 day")  # type: ignore[arg-type]
    assert e.value.response.json()["error"]["param"] == "completion_window"
    with pytest.raises(openai.BadRequestError):
        await c.batches.create(input_file_id="file-nope", endpoint=CHAT,
                               completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        await c.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        await c.files.retrieve("file-nope")
    with pytest.raises(openai.NotFoundError):  # no such batch: no such output file
        await c.files.content("file-batch_nope-output")
    assert h.backend.jobs_by_number == {}


async def test_a_refused_item_lands_in_the_errors(h: Harness) -> None:
    c = h.client()
    rows = [request("a"), request("b")]
    rows[1]["body"]["model"] = "refuse-me"
    f = await c.files.create(file=("a.jsonl", jsonl(rows)), purpose="batch")
    b = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    await h.fed()
    b = await c.batches.retrieve(b.id)
    assert b.errors is not None and b.errors.data is not None
    assert [(e.line, e.message) for e in b.errors.data] == [(2, "model refuse-me is refused")]
    assert b.request_counts is not None and b.request_counts.total == 2


async def test_delete_file(h: Harness) -> None:
    c = h.client()
    f = await c.files.create(file=("a.jsonl", jsonl([request("a")])), purpose="batch")
    d = await c.files.delete(f.id)
    assert d.deleted and d.id == f.id
    assert not h.files.blob_path(f.id).exists()
    with pytest.raises(openai.NotFoundError):
        await c.files.delete(f.id)


async def test_a_token_guards_every_route(tmp_path: Path) -> None:
    h = Harness(tmp_path, token="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            await h.client("wrong").files.list()
        assert e.value.status_code == 401
        assert e.value.response.json()["error"]["code"] == "invalid_api_key"
        assert (await h.client("s3cret").files.list()).data == []
    finally:
        h.files.close()


def test_api_address_refuses_non_loopback_without_token() -> None:
    from fabricctl.api.address import api_address
    from fabricctl.errors import UsageError

    assert api_address("127.0.0.1:8000", "") == ("127.0.0.1", 8000)
    assert api_address("[::1]:0", "") == ("::1", 0)
    assert api_address("localhost:9", "") == ("localhost", 9)
    assert api_address("0.0.0.0:8000", "tok") == ("0.0.0.0", 8000)
    with pytest.raises(UsageError, match=r"server\.token"):
        api_address("0.0.0.0:8000", "")
    with pytest.raises(UsageError, match="HOST:PORT"):
        api_address("8000", "")


# ---- endpoints ------------------------------------------------------------------------------


def test_every_endpoint_the_reader_takes_makes_a_batch_and_no_other() -> None:
    assert ENDPOINTS == ("/v1/completions", CHAT, "/v1/embeddings", "/v1/score", "/v1/rerank",
                         "/v1/responses", "/v1/audio/transcriptions", "/score", "/rerank",
                         "/v2/rerank")
    for endpoint in ENDPOINTS:
        check_endpoint(endpoint)
    for bad in ("/v1/moderations", "/v1/embeddings/", "v1/embeddings", ""):
        with pytest.raises(ApiError) as e:
            check_endpoint(bad)
        err = e.value
        assert (err.status, err.param, err.code) == (400, "endpoint", "invalid_value")
        assert "/v1/embeddings, /v1/score, /v1/rerank, /v1/responses" in err.message


def test_every_line_must_be_for_the_batchs_endpoint_aliases_included() -> None:
    check_urls("/v1/embeddings", {"/v1/embeddings": 1})
    check_urls("/v1/rerank", {"/rerank": 1, "/v2/rerank": 4, "/v1/rerank": 9})
    check_urls("/score", {"/v1/score": 2})
    for endpoint, urls, line in (
            ("/v1/embeddings", {"/v1/embeddings": 1, CHAT: 3}, "line 3: url " + CHAT),
            ("/v1/score", {"/v1/score": 1, "/rerank": 2}, "line 2: url /rerank"),
            (CHAT, {"/v1/completions": 1, CHAT: 2}, "line 1: url /v1/completions")):
        with pytest.raises(ApiError) as e:
            check_urls(endpoint, urls)
        err = e.value
        assert (err.status, err.param, err.code) == (400, "endpoint", "mismatched_url")
        assert err.message.startswith(f"{line} does not match the batch's endpoint {endpoint}")


# ---- model, usage and output_expires_after ---------------------------------------------------


def test_batch_object_has_the_jobs_model_and_usage() -> None:
    job = J.new_job(3, "batch_3", "api", 10.0)
    b = batch_object(job)
    assert b.model is None
    assert b.usage is not None and (b.usage.input_tokens, b.usage.output_tokens,
                                    b.usage.total_tokens) == (0, 0, 0)
    job.model = "fabric-demo"
    J.add_usage(job, 120, 64, 30)
    J.add_usage(job, 80, 0, 10)
    b = batch_object(job)
    assert b.model == "fabric-demo" and b.usage is not None
    assert msgspec.to_builtins(b.usage) == {
        "input_tokens": 200, "input_tokens_details": {"cached_tokens": 64},
        "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 240}


def test_output_expires_after_takes_the_created_at_anchor_and_one_hour_to_30_days() -> None:
    assert parse_output_expires(None) == 0
    assert parse_output_expires({"anchor": "created_at", "seconds": 3600}) == 3600
    assert parse_output_expires({"anchor": "created_at", "seconds": 2_592_000}) == 2_592_000


@pytest.mark.parametrize(("bad", "param", "code"), [
    ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds",
     "integer_below_min_value"),
    ({"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after.seconds",
     "integer_above_max_value"),
    ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds",
     "invalid_type"),
    ({"anchor": "created_at", "seconds": 3600.5}, "output_expires_after.seconds",
     "invalid_type"),
    ({"anchor": "created_at", "seconds": True}, "output_expires_after.seconds",
     "invalid_type"),
    ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor",
     "invalid_value"),
    ({"seconds": 3600}, "output_expires_after.anchor", "missing_required_parameter"),
    ({"anchor": "created_at"}, "output_expires_after.seconds", "missing_required_parameter"),
    ({"anchor": "created_at", "seconds": 3600, "days": 1}, "output_expires_after.days",
     "unknown_parameter"),
    (3600, "output_expires_after", "invalid_type"),
])
def test_output_expires_after_refuses_anything_else(bad: object, param: str,
                                                    code: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_output_expires(bad)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code)


def output_usage(lines: list[dict]) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens summed over an output file's lines."""
    total = [0, 0, 0]
    for o in lines:
        u = o["response"]["body"]["usage"]
        total[0] += u["prompt_tokens"]
        total[1] += (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        total[2] += u["completion_tokens"]
    return total[0], total[1], total[2]


async def test_usage_model_and_output_files_that_expire(h: Harness) -> None:
    c = h.client()
    rows = [request(f"u{i}", f"prompt number {i}") for i in range(40)]
    rows[3] = request("u3", "please fail")
    f = await c.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    b = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                               output_expires_after={"anchor": "created_at", "seconds": 3600})
    keep = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    await h.fed()
    for n in h.backend.jobs_by_number:
        h.backend.run(n)
    h.backend.now += 5  # the batches ended at `now`: their files were created then
    b = await c.batches.retrieve(b.id)
    assert b.status == "completed" and b.model == "fabric-demo"
    assert b.output_file_id and b.error_file_id and b.usage is not None
    out = [json.loads(x) for x in (await c.files.content(b.output_file_id)).text.splitlines()]
    assert len(out) == 39
    prompt, cached, completion = output_usage(out)
    assert cached > 0 and prompt > 0 and completion > 0
    assert (b.usage.input_tokens, b.usage.input_tokens_details.cached_tokens,
            b.usage.output_tokens, b.usage.total_tokens) == (
        prompt, cached, completion, prompt + completion)
    assert b.usage.output_tokens_details.reasoning_tokens == 0
    meta = await c.files.retrieve(b.output_file_id)
    ended = int(h.backend.now) - 5
    assert meta.created_at == ended and meta.expires_at == ended + 3600
    assert (await c.files.retrieve((await c.batches.retrieve(keep.id)).output_file_id or "")
            ).expires_at is None

    h.backend.now = ended + 3599.5  # not yet
    assert (await c.files.retrieve(b.error_file_id)).expires_at == ended + 3600
    h.backend.now = ended + 3600  # passed: both files are gone, the batch keeps their ids
    for fid in (b.output_file_id, b.error_file_id):
        with pytest.raises(openai.NotFoundError):
            await c.files.retrieve(fid)
        with pytest.raises(openai.NotFoundError):
            await c.files.content(fid)
        assert h.files.size_of(fid) is None
    again = await c.batches.retrieve(b.id)
    assert (again.output_file_id, again.error_file_id) == (b.output_file_id, b.error_file_id)
    assert again.usage == b.usage
    kept = await c.batches.retrieve(keep.id)  # a batch without it keeps its files
    assert kept.output_file_id and len(
        (await c.files.content(kept.output_file_id)).text.splitlines()) == 39


async def test_a_bad_output_expires_after_is_a_400_and_no_batch(h: Harness) -> None:
    c = h.client()
    f = await c.files.create(file=("a.jsonl", jsonl([request("a")])), purpose="batch")
    for bad, param in (({"anchor": "created_at", "seconds": 60}, "seconds"),
                       ({"anchor": "now", "seconds": 3600}, "anchor")):
        with pytest.raises(openai.BadRequestError) as e:
            await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                                   output_expires_after=bad)  # type: ignore[arg-type]
        err = e.value.response.json()["error"]
        assert err["param"] == f"output_expires_after.{param}"
        assert err["type"] == "invalid_request_error"
    assert h.backend.jobs_by_number == {}
