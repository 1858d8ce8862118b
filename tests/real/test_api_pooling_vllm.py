"""The Batch API in front of a real vLLM pooling server, the official `openai` SDK as the client.

`fabricctl up --api --engine openai` whose one endpoint (`[vllm] endpoints`) is the tiny Llama
served as an embedding model (`--runner pooling --convert embed`, `conftest.embed_server`): a
dozen `/v1/embeddings` lines as written for run-batch (instructions inside `input`, float and
base64) are uploaded and run as a batch for /v1/embeddings, which completes with one row per
line, each vLLM's own embedding body with one vector (all of one size); `batch.model` is the
lines' model; `batch.usage` equals the sum of the output lines' usage
(`test_api_pooling_e2e.line_usage`: their `prompt_tokens`; vLLM's pooling usage has no output
tokens, and `prompt_tokens_details` is null even with `--enable-prompt-tokens-details` and a
prefix cache hit: no cached tokens, so the batch reports none either); and with
`output_expires_after`, `up` restarted an hour on (`FABRICCTL_API_CLOCK_SKEW_S`) serves the
batch with its ids and usage and answers its output file 404.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the API test helpers

from test_api_e2e import ApiBroker
from test_api_pooling_e2e import EXPIRES, embedding_lines, run_batch, vector

from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]


def _embeddings_batch(endpoint: str, tokenizer: Path, tmp: Path) -> None:
    """`up --api --engine openai` on `endpoint`, one embeddings batch through it (blocking)."""
    toml = (f'[vllm]\nendpoints = ["{endpoint}"]\n'
            "[consumer]\nmax_batch_size = 8\nmax_batch_tokens = 4096\nmax_input_len = 500\n"
            f'[producer]\ntokenizer = "{tokenizer}"\n')
    b = ApiBroker(tmp / "d", tmp, toml=toml, env={"FABRICCTL_MODEL": "tiny"},
                  engine="openai", consumers=1)
    try:
        c = b.client()
        rows = embedding_lines(12, model="tiny")
        done, out = run_batch(c, rows, "/v1/embeddings", model="tiny",
                              output_expires_after=EXPIRES)
        for row, given in zip(out, rows, strict=True):
            body = row["response"]["body"]
            assert (body["object"], body["model"]) == ("list", "tiny"), body
            [data] = body["data"]
            assert isinstance(data["embedding"], str) is (
                given["body"].get("encoding_format") == "base64")
            vec = vector(data)
            assert len(vec) == len(vector(out[0]["response"]["body"]["data"][0]))
            assert all(math.isfinite(x) for x in vec) and any(vec), vec
            assert body["usage"]["prompt_tokens"] > 0
            assert body["usage"]["completion_tokens"] == 0
            assert body["usage"]["prompt_tokens_details"] is None  # vLLM 0.32: no cache count
        assert done.usage is not None
        assert done.usage.input_tokens == sum(r["response"]["body"]["usage"]["prompt_tokens"]
                                              for r in out)
        assert done.usage.output_tokens == 0
        shown = b.run("jobs", "show", done.id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["usage"] == done.usage.model_dump()
    finally:
        assert b.stop() == 0, b.logs()
    # an hour and a minute on (the API's clock only): the output file is gone, the batch kept
    later = ApiBroker(tmp / "d", tmp, toml=toml, env={"FABRICCTL_MODEL": "tiny",
                                                      "FABRICCTL_API_CLOCK_SKEW_S": "3660"},
                      engine="openai", consumers=1)
    try:
        c = later.client()
        again = c.batches.retrieve(done.id)
        assert again.output_file_id == done.output_file_id and again.usage == done.usage
        with pytest.raises(openai.NotFoundError):
            c.files.content(done.output_file_id)
    finally:
        assert later.stop() == 0, later.logs()


async def test_an_embeddings_batch_through_the_api_on_real_vllm(
        embed_server: asyncio.Task[Launcher], tiny_model: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    # the SDK, `up` and its polling block: off this loop, which the server's launcher runs on
    server = await embed_server
    await asyncio.to_thread(_embeddings_batch, server.servers[0].base_url,
                            tiny_model / "tokenizer.json", tmp_path)
    print(f"\nembeddings batch through `up --api --engine openai` in "
          f"{time.monotonic() - t0:.1f} s")
