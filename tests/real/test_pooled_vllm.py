"""Grouped embeddings requests on the real vLLM CPU build answer as one request per item.

One file of `/v1/embeddings` lines (texts with float and base64 vectors, token-id inputs
with one id the model's vocabulary lacks, two lines with a `dimensions` the model refuses)
goes through `fabricctl run` on the session's embedding server (`conftest.embed_server`)
twice: items grouped into one request (`[consumer] group_pooling`, the default, texts
counted by the tiny model's tokenizer) and one request per item. The server's own count of
`/v1/embeddings` requests (`http_requests_total`) shows which path each took; the rows
agree line by line: status, error, `usage` and every other field but the per-request random
`id`, vectors with cosine >= 0.9999 (vLLM runs an input batched with others either way).
The same rows equal `vllm run-batch`'s in `test_pooling_vllm.py`, which goes the grouped
path by default.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from runbatch import cosine, through_fabricctl, vectors, write

from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

TEXTS = ["the broker routes the items.", "a lane packs a prefix.", "the cache keeps its blocks.",
         "every consumer reads the queue.", "the engine counts the tokens.",
         "one prompt evicts its blocks."]


def lines() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(cid: str, body: dict[str, Any]) -> None:
        out.append({"custom_id": cid, "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "tiny", **body}})

    for i in range(16):
        body: dict[str, Any] = {"input": f"Query: {TEXTS[i % 6]} {i}"}
        if i % 4 == 3:
            body["encoding_format"] = "base64"
        add(f"text-{i}", body)
    add("ids-0", {"input": [5, 6, 7, 8]})
    add("ids-1", {"input": [9, 10]})
    add("ids-oov", {"input": [9, 10**7]})  # refused: the list of ids goes item by item
    add("dims-0", {"input": TEXTS[0], "dimensions": 8})  # refused, both
    add("dims-1", {"input": TEXTS[1], "dimensions": 8})
    return out


async def embed_requests(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("http_requests_total{") and '"/v1/embeddings"' in line)


def rest(row: dict[str, Any]) -> dict[str, Any]:
    """The row but its ids and, in a 200's body, the id and the vectors."""
    response = dict(row["response"] or {})
    body = response.pop("body", None)
    response.pop("request_id", None)
    if isinstance(body, dict) and "data" in body:
        body = {k: v for k, v in body.items() if k not in ("id", "created")}
        body["data"] = [{k: v for k, v in d.items() if k != "embedding"} for d in body["data"]]
    return {"custom_id": row["custom_id"], "error": row["error"], "response": response,
            "body": body}


async def test_grouped_embeddings_answer_as_one_request_per_item(
        embed_server: asyncio.Task[Launcher], tiny_model: Path, tmp_path: Path) -> None:
    server = await embed_server
    file = lines()
    inp = write(tmp_path / "emb.jsonl", file)
    tokenizer = tiny_model / "tokenizer.json"
    (tmp_path / "grouped").mkdir()
    (tmp_path / "single").mkdir()
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=server.servers[0].base_url, timeout=60) as client:
        before = await embed_requests(client)
        grouped = await through_fabricctl(server, tokenizer, tmp_path / "grouped", inp)
        mid = await embed_requests(client)
        single = await through_fabricctl(server, tokenizer, tmp_path / "single", inp,
                                         group_pooling=False)
        after = await embed_requests(client)
    print(f"\ngrouped: {mid - before:.0f} requests, single: {after - mid:.0f}, for "
          f"{len(file)} lines; both runs in {time.monotonic() - t0:.1f} s")
    assert after - mid == len(file)
    # texts and ids grouped (a batch holds 8); the refused groups resent item by item
    assert mid - before < len(file) - 6, (mid - before, len(file))
    assert set(grouped) == set(single) == {line["custom_id"] for line in file}
    for line in file:
        cid = line["custom_id"]
        g, s = grouped[cid], single[cid]
        assert rest(g) == rest(s), (g, s)
        if s["response"]["status_code"] == 200:
            gb, sb = g["response"]["body"], s["response"]["body"]
            assert gb["id"].startswith("embd-") and gb["id"] != sb["id"]
            [a], [b] = vectors(gb), vectors(sb)
            assert cosine(a, b) >= 0.9999, cid
    assert single["ids-oov"]["response"]["status_code"] == 400
    assert single["dims-0"]["response"]["status_code"] == 400
    assert all(single[f"text-{i}"]["response"]["status_code"] == 200 for i in range(16))
    assert single["ids-1"]["response"]["body"]["usage"]["prompt_tokens"] == 2
