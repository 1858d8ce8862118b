"""Batches for the endpoints beyond completions and chat against `fabricctl up --api` on
simulated GPUs, the official `openai` SDK as the client (issue 26).

Promises checked:
- an embeddings batch file as written for OpenAI or `vllm run-batch` (no fabricctl field, the
  retrieval instructions inside `input`, float and base64 vectors) is uploaded, a batch made
  with endpoint /v1/embeddings (which it echoes) completes, and its output file has one row
  per line, in input order, each vLLM's embedding body (one vector of the simulated model's
  16 dimensions, base64 its float32 bytes); `batch.model` is the lines' model; `batch.usage`
  equals the sum of the output lines' usage (`line_usage`), no output tokens, no cached
  tokens (vLLM's pooling usage reports none); `jobs show --json` has the same usage; with
  `output_expires_after` the output file is gone (404) once the API's clock is past it (a
  restart whose `FABRICCTL_API_CLOCK_SKEW_S` runs it an hour on), the batch keeping its id,
  usage and model;
- a score batch (`/v1/score`) and a rerank batch (endpoint /v1/rerank, its lines naming
  vLLM's `/rerank` and `/v2/rerank`: the same endpoint) complete with vLLM's bodies and usage
  equal to their lines' sums; a responses batch whose lines share long instructions reports
  the cached tokens its lines report (> 0), and its output tokens;
- a batch whose endpoint its lines are not for is a 400 naming the first such line.

"The sum of the output lines' usage" (`line_usage`) reads each line's `response.body.usage`
as vLLM wrote it: input tokens are `prompt_tokens` (pooling, completions, chat) or
`input_tokens` (responses); cached tokens `prompt_tokens_details.cached_tokens` or
`input_tokens_details.cached_tokens`, 0 where absent or null; output tokens
`completion_tokens` or `output_tokens`, 0 where absent (rerank's usage has none).
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import openai
import pytest
from test_api_e2e import ApiBroker, jsonl, wait_ended

MODEL = "fabric-demo"
EXPIRES = {"anchor": "created_at", "seconds": 3600}
DIM = 16  # the simulated model's hidden size (`engines.simendpoints.EMBED_DIM`)
INSTRUCTIONS = [
    "Instruct: Given a web search query, retrieve relevant passages that answer it\nQuery: ",
    "Instruct: Retrieve the segment that the broker writes for a batch\nQuery: ",
    "Instruct: Find the sentence about the cache and its blocks\nQuery: ",
]
PASSAGES = ["the broker routes the items.", "a lane packs a prefix.",
            "the cache keeps its blocks.", "every consumer reads the queue."]
DOCUMENTS = ["the broker packs the items.", "a lane drains the queue.", "the cache evicts."]
SYSTEM = "You answer in one word. " + "Context: the answer is always brief. " * 40


def line(cid: str, url: str, body: dict[str, Any], model: str = MODEL) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": model, **body}}


def embedding_lines(n: int = 12, model: str = MODEL) -> list[dict[str, Any]]:
    """`n` embeddings lines as written for run-batch: three instructions inside `input`,
    every other line base64."""
    out = []
    for i in range(n):
        body: dict[str, Any] = {"input": INSTRUCTIONS[i % 3] + PASSAGES[i % len(PASSAGES)]}
        if i % 2:
            body["encoding_format"] = "base64"
        out.append(line(f"emb-{i}", "/v1/embeddings", body, model))
    return out


def line_usage(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(input, cached, output) tokens of one line's `response.body.usage` (module docstring)."""
    if "input_tokens" in usage:  # a Responses body
        details = usage.get("input_tokens_details") or {}
        return usage["input_tokens"], details.get("cached_tokens") or 0, usage["output_tokens"]
    details = usage.get("prompt_tokens_details") or {}
    return (usage["prompt_tokens"], details.get("cached_tokens") or 0,
            usage.get("completion_tokens") or 0)


def output_usage(text: str) -> dict[str, Any]:
    """The sums over an output file's lines' usage, in the Batch's usage shape."""
    p = c = o = 0
    for row in text.splitlines():
        i, k, u = line_usage(json.loads(row)["response"]["body"]["usage"])
        p, c, o = p + i, c + k, o + u
    return {"input_tokens": p, "input_tokens_details": {"cached_tokens": c},
            "output_tokens": o, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + o}


def vector(data: dict[str, Any]) -> list[float]:
    e = data["embedding"]
    if isinstance(e, str):
        raw = base64.b64decode(e)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return e


def run_batch(c: openai.OpenAI, rows: list[dict[str, Any]], endpoint: str,
              model: str = MODEL, **extra: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Upload `rows`, run them as one batch for `endpoint` and check what every batch must
    be (completed, one row a line in input order, each a 200, `model`, usage the lines'
    sums): the ended batch and its output rows."""
    f = c.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                         completion_window="24h", **extra)
    assert b.endpoint == endpoint
    assert wait_ended(c, b.id)[-1] == "completed"
    done = c.batches.retrieve(b.id)
    assert done.endpoint == endpoint and done.output_file_id and done.error_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (len(rows), len(rows))
    text = c.files.content(done.output_file_id).text
    out = [json.loads(r) for r in text.splitlines()]
    assert [r["custom_id"] for r in out] == [r["custom_id"] for r in rows]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in out), out
    assert done.model == model and done.usage is not None
    assert done.usage.model_dump() == output_usage(text)
    return done, out


def test_an_embeddings_batch_end_to_end_with_usage_model_and_expiry(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b.client()
        rows = embedding_lines()
        done, out = run_batch(c, rows, "/v1/embeddings", output_expires_after=EXPIRES)
        for row, given in zip(out, rows, strict=True):
            body = row["response"]["body"]
            assert (body["object"], body["model"]) == ("list", MODEL)
            [data] = body["data"]
            assert (data["index"], data["object"]) == (0, "embedding")
            base64_asked = given["body"].get("encoding_format") == "base64"
            assert isinstance(data["embedding"], str) is base64_asked
            assert len(vector(data)) == DIM
            assert body["usage"]["completion_tokens"] == 0
            assert body["usage"]["prompt_tokens"] > 0
            assert body["usage"]["prompt_tokens_details"] is None  # as vLLM's pooling usage
        want = output_usage("\n".join(json.dumps(r) for r in out))
        assert want["input_tokens"] > 0
        assert (want["output_tokens"], want["input_tokens_details"]["cached_tokens"]) == (0, 0)
        shown = b.run("jobs", "show", done.id, "--json")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["usage"] == want and doc["job"]["model"] == MODEL
        assert doc["job"]["endpoint"] == "/v1/embeddings"
        meta = c.files.retrieve(done.output_file_id)
        assert done.completed_at is not None and meta.expires_at == done.completed_at + 3600

        # a file of chat lines is not an embeddings batch: 400 at create, nothing made
        chat = [line("c1", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})]
        f = c.files.create(file=("chat.jsonl", jsonl(chat)), purpose="batch")
        with pytest.raises(openai.BadRequestError) as e:
            c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                             completion_window="24h")
        err = e.value.response.json()["error"]
        assert (err["param"], err["code"]) == ("endpoint", "mismatched_url"), err
        assert err["message"].startswith("line 1: url /v1/chat/completions does not match")
        assert [x.id for x in c.batches.list().data] == [done.id]
    finally:
        assert b.stop() == 0, b.logs()

    later = ApiBroker(tmp_path / "d", tmp_path, env={"FABRICCTL_API_CLOCK_SKEW_S": "3660"})
    try:
        c = later.client()
        again = c.batches.retrieve(done.id)
        assert again.output_file_id == done.output_file_id  # the batch keeps the id
        assert again.usage is not None and again.usage.model_dump() == want
        assert (again.model, again.endpoint) == (MODEL, "/v1/embeddings")
        with pytest.raises(openai.NotFoundError):
            c.files.retrieve(done.output_file_id)
        with pytest.raises(openai.NotFoundError):
            c.files.content(done.output_file_id)
    finally:
        assert later.stop() == 0, later.logs()


def test_score_rerank_and_responses_batches(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b.client()
        query = "which part packs the items?"
        score = [line(f"s{i}", "/v1/score", {"text_1": query, "text_2": DOCUMENTS[i:] or
                                             DOCUMENTS}) for i in range(3)]
        _, out = run_batch(c, score, "/v1/score")
        for row, given in zip(out, score, strict=True):
            body = row["response"]["body"]
            assert [d["index"] for d in body["data"]] == list(range(len(given["body"]["text_2"])))
            assert all(-1.0 <= d["score"] <= 1.0 for d in body["data"])
        rerank = [line(f"r{i}", "/rerank" if i % 2 else "/v2/rerank",
                       {"query": query, "documents": DOCUMENTS, "top_n": 2}) for i in range(4)]
        done, out = run_batch(c, rerank, "/v1/rerank")
        for row in out:
            body = row["response"]["body"]
            assert set(body["usage"]) == {"prompt_tokens", "total_tokens"}  # vLLM's RerankUsage
            scores = [r["relevance_score"] for r in body["results"]]
            assert len(scores) == 2 and scores == sorted(scores, reverse=True)
        assert done.usage is not None and done.usage.output_tokens == 0
        responses = [line(f"q{i}", "/v1/responses", {
            "instructions": SYSTEM, "input": f"question {i}", "max_output_tokens": 3 + i % 3})
            for i in range(8)]
        done, out = run_batch(c, responses, "/v1/responses")
        assert all(r["response"]["body"]["object"] == "response" for r in out)
        assert done.usage is not None
        assert done.usage.input_tokens_details.cached_tokens > 0  # the lines report hits
        assert done.usage.output_tokens > 0
    finally:
        assert b.stop() == 0, b.logs()
