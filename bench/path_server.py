"""An OpenAI-compatible server that answers at once: the far end of `bench/path_bench.py`.

Contract: `python bench/path_server.py --port N [--dims D] [--keep-alive S]` serves on
127.0.0.1:N with uvicorn (uvloop when installed; its own HTTP/1.1 parser; an idle connection
closed S seconds after its last answer was sent, default 5 as vLLM's
`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`) a bare ASGI app that answers, without waiting for anything:
`POST /v1/completions` and `/v1/chat/completions` with one fixed vLLM-shaped body of one
token; `POST /v1/embeddings` with vLLM's `EmbeddingResponse` (`fabricctl.engines.simbodies`)
of one `D`-float vector (default 384, a small embedder's); `GET /metrics` the few vLLM
counters the engine reads (zeros); `GET /health` 200; anything else 404. Bodies are
encoded once, at start: the server costs as little per request as uvicorn lets it, so what
a client's rate shows is the client. The request body is read (as a server must) and not
parsed. `Server.start(dims, keep_alive_s)` runs it as a child process and waits for
/health; `stop()` ends it. It prints nothing but uvicorn's errors.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import msgspec

from fabricctl.engines.simbodies import EmbeddingData, EmbeddingResponse, PoolingUsage
from fabricctl.engines.simendpoints import EMBED_DIM, embedding

KEEP_ALIVE_S = 5  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default
MODEL = "m"

COMPLETION = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL,
              "choices": [{"index": 0, "text": " yes", "logprobs": None,
                           "finish_reason": "length", "stop_reason": None,
                           "prompt_logprobs": None}],
              "usage": {"prompt_tokens": 12, "total_tokens": 13, "completion_tokens": 1,
                        "prompt_tokens_details": None}}
CHAT = {"id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes",
                                              "tool_calls": []},
                     "logprobs": None, "finish_reason": "length", "stop_reason": None}],
        "usage": {"prompt_tokens": 12, "total_tokens": 13, "completion_tokens": 1,
                  "prompt_tokens_details": None}}
METRICS = (b'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 0\n'
           b'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0\n'
           b'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n')

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def bodies(dims: int) -> dict[tuple[str, str], tuple[int, bytes, bytes]]:
    """(method, path) -> (status, content type, body), encoded once."""
    enc = msgspec.json.encode
    vector = (embedding("x") * (dims // EMBED_DIM + 1))[:dims]  # vLLM's floats, any width
    emb = EmbeddingResponse(id="embd-0", object="list", created=0, model=MODEL,
                            data=[EmbeddingData(index=0, object="embedding", embedding=vector)],
                            usage=PoolingUsage(prompt_tokens=8, total_tokens=8))
    js, text = b"application/json", b"text/plain; version=0.0.4"
    return {("POST", "/v1/completions"): (200, js, enc(COMPLETION)),
            ("POST", "/v1/chat/completions"): (200, js, enc(CHAT)),
            ("POST", "/v1/embeddings"): (200, js, enc(emb)),
            ("GET", "/metrics"): (200, text, METRICS),
            ("GET", "/health"): (200, text, b"")}


def app_of(dims: int) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    """The ASGI app: each answer is a fixed body, sent once the request's body is read."""
    table = bodies(dims)
    missing = (404, b"application/json", b'{"detail":"Not Found"}')

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the body, as a server must before it answers on this connection
            more = (await receive()).get("more_body", False)
        status, kind, body = table.get((scope["method"], scope["path"]), missing)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Why: the bench's clients and the server must not share a process (or a GIL)."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

    @classmethod
    def start(cls, dims: int = 384, keep_alive_s: int = KEEP_ALIVE_S,
              timeout_s: float = 30.0) -> Server:
        port = free_port()
        proc = subprocess.Popen([sys.executable, __file__, "--port", str(port),
                                 "--dims", str(dims), "--keep-alive", str(keep_alive_s)])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    return cls(proc, url)
            except httpx.HTTPError:
                time.sleep(0.05)  # polling a child's start-up: a bench, not a test
        proc.kill()
        raise SystemExit(f"path_server did not start on {url}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--keep-alive", type=int, default=KEEP_ALIVE_S)
    args = ap.parse_args()
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    uvicorn.run(app_of(args.dims), host="127.0.0.1", port=args.port, loop=loop,
                log_level="warning", access_log=False, backlog=4096,
                timeout_keep_alive=args.keep_alive, lifespan="off")


if __name__ == "__main__":
    main()
