"""Issue 26's endpoints end to end: `fabricctl run --engine openai` (its `run_job`) against a
small pooling server on a real socket. Embeddings and rerank lines reach their endpoints as
written, their answers come back as the server gave them (OpenAI output body, native
`response`), and a line on an endpoint the server lacks is that line's error while the rest
completes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import run_through


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def embedding(body: dict[str, Any]) -> dict[str, Any]:
    """A vLLM /v1/embeddings answer: one two-float vector per input, 1 token per 4 bytes."""
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    tokens = sum(-(-len(text) // 4) for text in inputs)
    return {"id": "embd-1", "object": "list", "created": 1764633600, "model": body["model"],
            "data": [{"index": i, "object": "embedding", "embedding": [0.5, float(i)]}
                     for i in range(len(inputs))],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None}}


def rerank(body: dict[str, Any]) -> dict[str, Any]:
    """A vLLM /v1/rerank answer: the documents scored by their length, best first."""
    docs = body["documents"]
    order = sorted(range(len(docs)), key=lambda i: -len(docs[i]))
    return {"id": "rerank-1", "model": body["model"],
            "usage": {"prompt_tokens": 10, "total_tokens": 10},
            "results": [{"index": i, "document": {"text": docs[i], "multi_modal": None},
                         "relevance_score": len(docs[i]) / 10} for i in order]}


class PoolingServer:
    """Why: a pooling model's server (embeddings and rerank only), for the fast suite."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    self._send(200, _compact({"object": "list", "data": [
                        {"id": "m", "object": "model", "max_model_len": 512}]}))
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, body))
                if self.path == "/v1/embeddings":
                    self._send(200, _compact(embedding(body)))
                elif self.path == "/v1/rerank":
                    self._send(200, _compact(rerank(body)))
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


@pytest.fixture
def server() -> Iterator[PoolingServer]:
    s = PoolingServer()
    yield s
    s.close()


LINES: list[dict[str, Any]] = [
    {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
     "body": {"model": "m", "input": "Instruct: Find it\nQuery: cats", "dimensions": 2}},
    {"custom_id": "e2", "method": "POST", "url": "/v1/embeddings",
     "body": {"model": "m", "input": ["a doc", "another doc"]}},
    {"custom_id": "r1", "method": "POST", "url": "/rerank",
     "body": {"model": "m", "query": "longest?", "documents": ["ab", "abcd"], "top_n": 2}},
    {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}},
    {"id": "n1", "model": "m", "endpoint": "rerank",
     "params": {"query": "q", "documents": ["xyz"]}},
    {"id": "n2", "model": "m", "endpoint": "embeddings", "prefix": ["search_query: "],
     "params": {"input": "dogs"}},
]


async def test_pooling_lines_run_end_to_end(tmp_path: Path, server: PoolingServer) -> None:
    recs = {r.get("custom_id") or r["id"]: r
            for r in await run_through(tmp_path, server.url, LINES)}
    assert sorted(recs) == ["c1", "e1", "e2", "n1", "n2", "r1"]

    sent = sorted((p, json.dumps(b, sort_keys=True)) for p, b in server.requests)
    assert sent == sorted([
        ("/v1/embeddings", json.dumps({"model": "m", "input": "Instruct: Find it\nQuery: cats",
                                       "dimensions": 2}, sort_keys=True)),
        ("/v1/embeddings", json.dumps({"model": "m", "input": ["a doc", "another doc"]},
                                      sort_keys=True)),
        ("/v1/rerank", json.dumps({"model": "m", "query": "longest?",
                                   "documents": ["ab", "abcd"], "top_n": 2}, sort_keys=True)),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "hi"}]}, sort_keys=True)),
        ("/v1/rerank", json.dumps({"model": "m", "query": "q", "documents": ["xyz"]},
                                  sort_keys=True)),
        ("/v1/embeddings", json.dumps({"model": "m", "input": "search_query: dogs"},
                                      sort_keys=True)),
    ])

    e1 = recs["e1"]["response"]
    assert (e1["status_code"], recs["e1"]["error"]) == (200, None)
    assert e1["body"] == embedding({"model": "m", "input": "Instruct: Find it\nQuery: cats"})
    assert recs["e2"]["response"]["body"]["data"] == [
        {"index": 0, "object": "embedding", "embedding": [0.5, 0.0]},
        {"index": 1, "object": "embedding", "embedding": [0.5, 1.0]}]
    assert recs["r1"]["response"]["body"]["results"][0] == {
        "index": 1, "document": {"text": "abcd", "multi_modal": None}, "relevance_score": 0.4}
    c1 = recs["c1"]
    assert c1["response"]["status_code"] == 400 and c1["response"]["body"] is None
    assert c1["error"] == "Model does not support endpoint: /v1/chat/completions"

    n1 = recs["n1"]
    assert (n1["text"], n1["finish_reason"], n1["error"]) == ("", "stop", None)
    assert n1["usage"] == {"prompt_tokens": 10, "completion_tokens": 0, "cached_tokens": None}
    assert n1["response"] == rerank({"model": "m", "query": "q", "documents": ["xyz"]})
    n2 = recs["n2"]
    assert n2["usage"]["prompt_tokens"] == 5  # "search_query: dogs": the server's own count
    assert n2["response"]["data"] == [{"index": 0, "object": "embedding",
                                       "embedding": [0.5, 0.0]}]
