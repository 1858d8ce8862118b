"""What reaches an OpenAI-compatible server, and what comes back, through `fabricctl run`.

`fabricctl run --engine openai` (its `run_job`) against `fake_vllm.FakeVllm`, a server on a
real socket that answers each request by its own fields as vLLM does. Each item must reach
it as its producer wrote it (the native `params`, the OpenAI `body`), with only `model` set,
and its answer must come back as the server gave it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeVllm, run_through


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    server = FakeVllm()
    yield server
    server.close()


async def run_lines(tmp_path: Path, fake: FakeVllm, lines: list[dict[str, Any]]
                    ) -> dict[str, dict[str, Any]]:
    recs = await run_through(tmp_path, fake.url, lines)
    by_id = {r.get("custom_id") or r["id"]: r for r in recs}
    assert len(by_id) == len(recs) == len(lines)
    return by_id


async def test_native_params_reach_the_server_with_nothing_added(tmp_path: Path,
                                                                  fake: FakeVllm) -> None:
    params = {"temperature": 0.7, "seed": 11, "stop": [".", "\n"],
              "response_format": {"type": "json_object"}}
    await run_lines(tmp_path, fake, [{"id": "a", "model": "m", "prefix": ["SYS. "],
                                      "prompt": "hello", "max_tokens": 7, "params": params}])
    assert fake.bodies() == [{**params, "max_tokens": 7, "model": "m",
                              "prompt": "SYS. hello"}]


async def test_two_items_of_one_batch_get_their_own_max_tokens(tmp_path: Path,
                                                               fake: FakeVllm) -> None:
    """Fails where one request carries a batch-wide max_tokens (and ignore_eos)."""
    lines = [{"id": "five", "model": "m", "prefix": ["P" * 8], "prompt": "x", "max_tokens": 5,
              "params": {"ignore_eos": True}},
             {"id": "forty", "model": "m", "prefix": ["P" * 8], "prompt": "y",
              "max_tokens": 40}]
    recs = await run_lines(tmp_path, fake, lines)
    assert {r["id"]: r["shape"] for r in recs.values()}["five"] == recs["forty"]["shape"]
    assert recs["five"]["usage"]["completion_tokens"] == 5
    assert recs["five"]["finish_reason"] == "length"
    assert recs["forty"]["usage"]["completion_tokens"] <= 40
    assert sorted(b["max_tokens"] for b in fake.bodies()) == [5, 40]
    assert "ignore_eos" not in next(b for b in fake.bodies() if b["max_tokens"] == 40)
    # usage is the server's count (a character a token), not fabricctl's estimate (3)
    assert recs["forty"]["usage"]["prompt_tokens"] == 9
    assert recs["forty"]["usage"]["cached_tokens"] == 0


async def test_openai_lines_keep_their_body_and_get_the_servers_answer(
        tmp_path: Path, fake: FakeVllm) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a colour."}]
    lines = [
        {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": messages, "max_tokens": 3, "n": 2, "seed": 4,
                  "logprobs": True, "top_logprobs": 2, "unknown_knob": "kept"}},
        {"custom_id": "c2", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": "Once", "prefix": ["Story: "], "max_tokens": 2,
                  "temperature": -1}},
        {"custom_id": "c3", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": "Twice"}},
    ]
    recs = await run_lines(tmp_path, fake, lines)
    [chat] = fake.bodies("/v1/chat/completions")
    assert chat == {**lines[0]["body"], "model": "m"}
    comp = {b["prompt"]: b for b in fake.bodies()}
    assert comp["Story: Once"] == {"model": "m", "prompt": "Story: Once", "max_tokens": 2,
                                   "temperature": -1}
    assert comp["Twice"] == {"model": "m", "prompt": "Twice"}  # no max_tokens added

    c1 = recs["c1"]
    assert c1["error"] is None and c1["response"]["status_code"] == 200
    body = c1["response"]["body"]
    assert body["object"] == "chat.completion" and len(body["choices"]) == 2
    assert 2 <= body["usage"]["completion_tokens"] <= 6
    # the server refused c2 (a bad value): its status and error object, the rest completed
    c2 = recs["c2"]
    assert c2["response"]["status_code"] == 400 and c2["response"]["body"] is None
    assert c2["error"]["error"]["message"].startswith("temperature must be non-negative")
    assert recs["c3"]["response"]["body"]["usage"]["completion_tokens"] <= 16
