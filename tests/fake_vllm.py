"""An in-process stand-in for a vLLM server on a real socket, answering as vLLM does.

`FakeVllm()` serves on 127.0.0.1 (a free port) from a thread until `close()`. It records
every request as `(path, body)` in `requests` (and every GET's path in `gets`), and answers
`/v1/completions` (a prompt as text or as token ids) and `/v1/chat/completions` one request
at a time the way vLLM does: each request's own `max_tokens` (default 16), `n` choices,
`ignore_eos`, with the simulated engine's drawn output lengths
(`fabricctl.engines.simanswer`), vLLM's usage (a character a token, a token id a token), and
HTTP 400 with vLLM's error body for a bad value (a negative temperature, n < 1, a prompt
that is neither text nor token ids, no messages). It answers `/v1/embeddings`, `/v1/score`
(`/score`), `/v1/rerank` (`/rerank`, `/v2/rerank`) and `/v1/responses` with the simulated
engine's bodies (`fabricctl.engines.simendpoints`: vLLM 0.32's schemas, deterministic
vectors and scores, its 400s), counting a character a token (each input; query + text of
each pair; instructions + input) and no cached token; a Responses answer runs to
`max_output_tokens` (default 16) as completions do.
`unsupported` names endpoints its model does not serve: a POST there gets what vLLM's server
answers a route it did not register for the model's task, 404 `{"detail": "Not Found"}`
(run-batch's 400 "Model does not support endpoint: <url>" is a row of its output file, not
a server answer). `GET /metrics` gives zero counters with block size 16 and 64 KV blocks,
`GET /v1/models` one model "m" (max_model_len 512) and its LoRA `adapters` (names, each with
`"parent": "m"`), `GET /health` 200; a POST whose `model` is neither gets vLLM's 404 "The
model `X` does not exist.". It is the simulated
engine seen through the HTTP path, so a test on it fails where the wire is wrong, as one on
the real vLLM would. `delay_s` makes each completion take that long;
with `max_running`, at most that many run at once and the rest wait, as --max-num-seqs does.
`live` (settable) is a live service's requests on the same server: `/metrics` shows them and
the requests in progress as `vllm:num_requests_running` (a shared server's load).
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fabricctl.cli.run import run_job
from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings
from fabricctl.core.types import Item
from fabricctl.engines.simanswer import SimSpec, choice_plan
from fabricctl.engines.simbodies import Refusal
from fabricctl.engines.simendpoints import (
    CHAT,
    GENERATION,
    SIMULATED,
    ResponsesAsk,
    endpoint_of,
    parse_ask,
)

METRICS = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",\
num_gpu_blocks="64"} 1.0
"""


def _bad(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"message": message, "type": "BadRequestError", "param": None,
                           "code": 400}}


def answer(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, response body) of one request, as vLLM would give them."""
    if endpoint_of(path) not in GENERATION:
        return _answer_endpoint(endpoint_of(path), body)
    chat = path == CHAT
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, int | float) and temperature < 0:
        return _bad("temperature must be non-negative, got -1.0.")
    n = body.get("n", 1)
    if not isinstance(n, int) or n < 1:
        return _bad("n must be at least 1, got 0.")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad("messages: Field required")
        prompt = json.dumps(messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = " ".join(map(str, prompt))  # token ids, counted a token each below
            prompt_tokens = len(body["prompt"])
        elif not isinstance(prompt, str):
            return _bad("prompt must be a string or a list of token ids")
    max_tokens = body.get("max_tokens") or 16
    # the drawn lengths depend on the prompt and seed only, as a model's output would
    item = Item(id=f"{body.get('seed')}|{prompt}", model=str(body.get("model")),
                signature=0, input_tokens=1, max_tokens=max_tokens)
    plan = choice_plan(item, SimSpec(n=n, ignore_eos=body.get("ignore_eos") is True),
                       max_tokens)
    choices = []
    for j, (tokens, reason) in enumerate(plan):
        text = " ".join(["tok"] * tokens)
        if chat:
            choices.append({"index": j, "message": {"role": "assistant", "content": text},
                            "logprobs": None, "finish_reason": reason, "stop_reason": None})
        else:
            choices.append({"index": j, "text": text, "logprobs": None,
                            "finish_reason": reason, "stop_reason": None})
    if not isinstance(body.get("prompt"), list):
        prompt_tokens = len(prompt)  # a character a token: unlike fabricctl's estimate
    completion = sum(t for t, _ in plan)
    return 200, {"id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion",
                 "created": 1, "model": body.get("model"), "choices": choices,
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                           "total_tokens": prompt_tokens + completion,
                           "prompt_tokens_details": {"cached_tokens": 0}}}


def _answer_endpoint(endpoint: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An embeddings, score, rerank or responses answer: the simulated engine's bodies."""
    model = str(body.get("model"))
    ask = parse_ask(endpoint, body, model)
    if isinstance(ask, Refusal):
        return ask.status, json.loads(ask.body)
    prompt_tokens = sum(len(p) for p in ask.prompts)  # a character a token
    seed = json.dumps(body, sort_keys=True)
    if not isinstance(ask, ResponsesAsk):
        return 200, json.loads(ask.body(model, seed, prompt_tokens))
    limit = ask.limit or 16
    item = Item(id=f"{body.get('seed')}|{ask.prompt}", model=model, signature=0,
                input_tokens=1, max_tokens=limit)
    [(tokens, reason)] = choice_plan(item, SimSpec(ignore_eos=ask.ignore_eos), limit)
    out = ask.body(model, seed, text=" ".join(["tok"] * tokens), finish_reason=reason,
                   prompt_tokens=prompt_tokens, cached_tokens=0, cache_write_tokens=0,
                   output_tokens=tokens, max_output_tokens=limit)
    return 200, json.loads(out)


class _Server(ThreadingHTTPServer):
    """Why: the stdlib's listen backlog of 5 drops connections past it, and a dropped SYN
    costs a client a 1 s retransmit: 32 requests opened at once would read as a slow engine."""

    request_queue_size = 256
    daemon_threads = True


class FakeVllm:
    """Why: the HTTP path's semantics without a 2.5 GB vLLM, for the fast suite."""

    def __init__(self, delay_s: float = 0.0, max_running: int = 0,
                 unsupported: Iterable[str] = (), adapters: Iterable[str] = ()) -> None:
        self.adapters = list(adapters)  # LoRA adapter names it answers besides "m"
        self.delay_s = delay_s  # each completion takes this long: an engine doing work
        # the endpoints it serves: every one the simulator answers, less `unsupported`
        self.served = SIMULATED - {endpoint_of(p) for p in unsupported}
        # at most this many run at once, the rest wait (vLLM's --max-num-seqs); 0: no bound
        self._running = threading.BoundedSemaphore(max_running) if max_running else None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.gets: list[str] = []  # the paths of every GET, in order
        self.live = 0  # a live service's requests running beside ours (the gauge shows them)
        self.in_progress = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                with fake._lock:
                    fake.gets.append(self.path)
                if self.path == "/metrics":
                    gauges = ("# TYPE vllm:num_requests_running gauge\n"
                              f"vllm:num_requests_running {fake.live + fake.in_progress}\n"
                              "# TYPE vllm:num_requests_waiting gauge\n"
                              "vllm:num_requests_waiting 0\n")
                    self._send(200, (METRICS + gauges).encode(), "text/plain")
                elif self.path == "/health":
                    self._send(200, b"", "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "m", "object": "model", "max_model_len": 512},
                        *({"id": a, "object": "model", "parent": "m", "max_model_len": 512}
                          for a in fake.adapters)]}).encode(), "application/json")
                else:
                    self._send(404, b'{"detail":"Not Found"}', "application/json")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                with fake._lock:
                    fake.requests.append((self.path, body))
                    fake.in_progress += 1
                try:
                    self._answer(body)
                finally:
                    with fake._lock:
                        fake.in_progress -= 1

            def _answer(self, body: dict[str, Any]) -> None:
                if endpoint_of(self.path) not in fake.served:
                    self._send(404, b'{"detail":"Not Found"}', "application/json")
                    return
                model = body.get("model")
                if model != "m" and model not in fake.adapters:
                    self._send(404, json.dumps({"error": {
                        "message": f"The model `{model}` does not exist.",
                        "type": "NotFoundError", "param": "model", "code": 404}}).encode(),
                        "application/json")
                    return
                if fake.delay_s:
                    if fake._running is not None:
                        with fake._running:
                            time.sleep(fake.delay_s)  # the engine's work, not synchronisation
                    else:
                        time.sleep(fake.delay_s)
                status, out = answer(self.path, body)
                self._send(status, json.dumps(out).encode(), "application/json")

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self, path: str = "/v1/completions") -> list[dict[str, Any]]:
        with self._lock:
            return [b for p, b in self.requests if p == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def run_through(tmp_path: Path, url: str, lines: list[dict[str, Any]],
                      errors: list[str] | None = None) -> list[dict[str, Any]]:
    """`fabricctl run` (in-process, engine "openai") of `lines` against the server at `url`,
    batches of 8: its output records, in output order (no run error allowed unless
    `errors` is given: the run's error lines go there)."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = AppConfig(data_dir=tmp_path / "data", engine="openai", model="m",
                    vllm=VllmSettings(endpoints=[url]),
                    consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=8 * 512,
                                              max_input_len=500))
    out = io.BytesIO()
    said: list[str] = []
    await run_job(cfg, path, out, errors=said.append, keep_data=True)
    if errors is None:
        assert said == []
    else:
        errors.extend(said)
    return [json.loads(line) for line in out.getvalue().splitlines()]
