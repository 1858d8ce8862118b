"""Pooling and responses lines on the real vLLM CPU build, against `vllm run-batch`.

Embeddings: a batch file of `/v1/embeddings` lines written for run-batch (no fabricctl
field; three retrieval instructions inside `input`; float and base64 vectors; plus the bad
lines a user meets: an empty input, a non-string input, a `dimensions` the model refuses)
goes through `fabricctl run` against the tiny Llama served with `--runner pooling --convert
embed`, and through run-batch with the same flags (the two lines run-batch cannot validate,
which make it write nothing, only through fabricctl: each its own 400 row): per line the
same status and `usage.prompt_tokens`, vectors with cosine >= 0.9999. Score and rerank: the
same on a tiny random one-label classifier (`--runner pooling`). Responses: `/v1/responses` lines at
temperature 0 through `fabricctl run` on the session's generation servers equal the same
server answering each body alone (status, usage, text); run-batch 0.32 has no responses. An
embeddings line in that file (a generative model: no such route) is run-batch's 400 row.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import EMBED, MAKE_MODEL, serve_pooling, starting
from runbatch import cosine, run_batch, through_fabricctl, vectors, write

from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

CLASSIFY = ("--runner", "pooling")
INSTRUCTIONS = [
    "Instruct: Given a web search query, retrieve relevant passages that answer it\nQuery: ",
    "Instruct: Retrieve the segment that the broker writes for a batch\nQuery: ",
    "Instruct: Find the sentence about the cache and its blocks\nQuery: ",
]
PASSAGES = ["the broker routes the items.", "a lane packs a prefix.", "the cache keeps its blocks.",
            "every consumer reads the queue.", "the engine counts the tokens.",
            "one prompt evicts its blocks."]
QUERY = "which part packs the items?"
DOCUMENTS = ["the broker packs the items.", "a lane drains the queue.", "the cache evicts."]


@pytest.fixture(scope="session")
def tiny_classifier(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-classifier")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    subprocess.run([str(vllm_python), str(MAKE_MODEL), str(out), "--classify"], check=True,
                   env=env, timeout=300, capture_output=True)
    return out


@pytest_asyncio.fixture(loop_scope="session")
async def score_server(tiny_classifier: Path,
                       tmp_path: Path) -> AsyncIterator[asyncio.Task[Launcher]]:
    async with starting(serve_pooling(tiny_classifier, CLASSIFY, tmp_path / "logs")) as task:
        yield task


def embedding_lines() -> list[dict[str, Any]]:
    """18 good lines and one whose `dimensions` the model refuses (vLLM's 400)."""
    lines = []
    for i in range(18):
        body: dict[str, Any] = {"model": "tiny",
                                "input": INSTRUCTIONS[i % 3] + PASSAGES[i % len(PASSAGES)]}
        if i % 2:
            body["encoding_format"] = "base64"
        lines.append({"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
                      "body": body})
    lines.append({"custom_id": "bad-dimensions", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "tiny", "input": INSTRUCTIONS[0] + "x", "dimensions": 8}})
    return lines


# Lines run-batch cannot validate (it then writes no output at all): fabricctl refuses each
# with its row and runs the rest.
UNREADABLE = [{"custom_id": "bad-empty", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "tiny", "input": ""}},
              {"custom_id": "bad-type", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "tiny", "input": [7, "x"]}}]


def status_and_usage(rec: dict[str, Any]) -> tuple[int, int | None]:
    body = rec["response"]["body"] if rec["response"] else None
    status = rec["response"]["status_code"] if rec["response"] else 0
    return status, None if body is None else body["usage"]["prompt_tokens"]


async def test_embedding_lines_answer_as_run_batch_does(
        embed_server: asyncio.Task[Launcher], tiny_model: Path, tmp_path: Path) -> None:
    lines = embedding_lines()
    inp = write(tmp_path / "emb.jsonl", lines)
    ours_inp = write(tmp_path / "ours.jsonl", [*lines, *UNREADABLE])
    t0 = time.monotonic()
    ref, server = await asyncio.gather(  # run-batch on core 1 while the server starts on 0
        run_batch(tiny_model, inp, tmp_path / "rb.jsonl", 1, *EMBED), embed_server)
    ours = await through_fabricctl(server, tiny_model / "tokenizer.json", tmp_path, ours_inp,
                                   refused=len(UNREADABLE))
    print(f"\nembeddings: run-batch and fabricctl run in {time.monotonic() - t0:.1f} s")
    assert set(ours) == set(ref) | {line["custom_id"] for line in UNREADABLE}
    assert set(ref) == {line["custom_id"] for line in lines}
    for line in lines:
        cid = line["custom_id"]
        assert status_and_usage(ours[cid]) == status_and_usage(ref[cid]), (ours[cid], ref[cid])
        if ref[cid]["response"]["status_code"] == 200:
            for a, b in zip(vectors(ours[cid]["response"]["body"]),
                            vectors(ref[cid]["response"]["body"]), strict=True):
                assert cosine(a, b) >= 0.9999, cid
        else:
            assert ours[cid]["error"] is not None, ours[cid]
    assert all(ref[f"emb-{i}"]["response"]["status_code"] == 200 for i in range(18))
    assert ref["bad-dimensions"]["response"]["status_code"] >= 400
    for line in UNREADABLE:
        row = ours[line["custom_id"]]
        assert row["response"]["status_code"] == 400 and row["response"]["body"] is None, row
        assert "input" in row["error"], row


async def test_score_and_rerank_lines_answer_as_run_batch_does(
        score_server: asyncio.Task[Launcher], tiny_classifier: Path, tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = []
    for i in range(4):
        docs = [f"{DOCUMENTS[0][:-1]} {i}.", *DOCUMENTS[1:]]
        lines.append({"custom_id": f"score-{i}", "method": "POST", "url": "/score",
                      "body": {"model": "tiny", "text_1": QUERY, "text_2": docs}})
        lines.append({"custom_id": f"rerank-{i}", "method": "POST", "url": "/rerank",
                      "body": {"model": "tiny", "query": QUERY, "documents": docs}})
    inp = write(tmp_path / "score.jsonl", lines)
    ref, server = await asyncio.gather(
        run_batch(tiny_classifier, inp, tmp_path / "rb.jsonl", 1, *CLASSIFY), score_server)
    ours = await through_fabricctl(server, tiny_classifier / "tokenizer.json", tmp_path, inp)
    assert set(ours) == set(ref) == {line["custom_id"] for line in lines}
    for line in lines:
        cid = line["custom_id"]
        assert status_and_usage(ours[cid]) == status_and_usage(ref[cid]), (ours[cid], ref[cid])
        assert ref[cid]["response"]["status_code"] == 200, ref[cid]
        body, want = ours[cid]["response"]["body"], ref[cid]["response"]["body"]
        if cid.startswith("score"):
            got = [d["score"] for d in sorted(body["data"], key=lambda d: d["index"])]
            exp = [d["score"] for d in sorted(want["data"], key=lambda d: d["index"])]
        else:
            got = [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]
            exp = [r["relevance_score"] for r in sorted(want["results"], key=lambda r: r["index"])]
        assert got == pytest.approx(exp, abs=1e-4), cid


async def test_responses_lines_answer_as_the_server_does(vllm_servers: Launcher,
                                                         tiny_model: Path,
                                                         tmp_path: Path) -> None:
    lines = []
    for i, passage in enumerate(PASSAGES):
        body: dict[str, Any] = {"model": "tiny", "temperature": 0, "max_output_tokens": 6,
                                "instructions": "You are terse. the broker routes the items.",
                                "input": passage}
        if i % 2:
            body["input"] = [{"role": "user", "content": "the shape warms a prefix."},
                             {"role": "assistant", "content": "a lane packs."},
                             {"role": "user", "content": passage}]
        lines.append({"custom_id": f"resp-{i}", "method": "POST", "url": "/v1/responses",
                      "body": body})
    wrong = {"custom_id": "emb-on-generator", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "tiny", "input": "the cache keeps its blocks."}}
    inp = write(tmp_path / "responses.jsonl", [*lines, wrong])
    server = vllm_servers.servers[0]
    await server.wait_ready(240)
    ours = await through_fabricctl(vllm_servers, tiny_model / "tokenizer.json", tmp_path, inp)
    # a generative model has no embeddings route: the row run-batch writes for that line
    assert ours["emb-on-generator"]["response"]["status_code"] == 400
    assert ours["emb-on-generator"]["error"] == "Model does not support endpoint: /v1/embeddings"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        for line in lines:
            resp = await client.post("/v1/responses", json=line["body"])
            assert resp.status_code == 200, resp.text
            direct = resp.json()
            mine = ours[line["custom_id"]]
            assert mine["response"]["status_code"] == 200, mine
            body = mine["response"]["body"]
            assert body["object"] == "response"
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                assert body["usage"][key] == direct["usage"][key], (key, body, direct)
            assert _text(body) == _text(direct), line["custom_id"]


def _text(body: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for o in body["output"] if o.get("type") == "message"
                   for c in o["content"])
