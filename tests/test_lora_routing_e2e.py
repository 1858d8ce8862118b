"""Lines for a server's LoRA adapters through `fabricctl run --engine openai` (in-process,
against `fake_vllm.FakeVllm` on a real socket, which lists its adapters on /v1/models and
refuses a model it does not serve as vLLM does): the consumer learns the names from the
server, each line goes out under the name it asked for and comes back answered by it, and a
name nobody serves is still the line's 404 error, named with what is served."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeVllm, run_through


@pytest.fixture
def lora() -> Iterator[FakeVllm]:
    server = FakeVllm(adapters=["ad-a", "ad-b"])
    yield server
    server.close()


def chat(i: int, model: str, system: str) -> dict[str, Any]:
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 4, "temperature": 0,
                     "messages": [{"role": "system", "content": system},
                                  {"role": "user", "content": f"question {i}"}]}}


async def test_adapter_lines_go_out_under_their_own_name(tmp_path: Path,
                                                         lora: FakeVllm) -> None:
    models = ["m", "ad-a", "ad-b"]
    lines = [chat(i, models[i % 3], f"system {i % 2} " * 8) for i in range(30)]
    recs = {r["custom_id"]: r for r in await run_through(tmp_path, lora.url, lines)}
    assert len(recs) == 30
    for line in lines:
        rec = recs[line["custom_id"]]
        assert rec["response"]["status_code"] == 200, rec
        assert rec["response"]["body"]["model"] == line["body"]["model"]
    sent = Counter(b["model"] for b in lora.bodies("/v1/chat/completions"))
    assert sent == {"m": 10, "ad-a": 10, "ad-b": 10}
    assert "/v1/models" in lora.gets  # the names came from the server


async def test_a_name_nobody_serves_is_the_lines_404(tmp_path: Path, lora: FakeVllm) -> None:
    lines = [chat(0, "ad-a", "s " * 8), chat(1, "ad-c", "s " * 8)]
    errors: list[str] = []
    recs = {r["custom_id"]: r for r in await run_through(tmp_path, lora.url, lines, errors)}
    assert recs["r0"]["response"]["status_code"] == 200
    bad = recs["r1"]
    assert bad["response"]["status_code"] == 404
    assert "no consumer serves model 'ad-c' (served: ad-a, ad-b, m)" in str(bad["error"])
    assert any("'ad-c', which no consumer serves" in e for e in errors), errors
    assert {b["model"] for b in lora.bodies("/v1/chat/completions")} == {"ad-a"}


async def test_configured_names_are_all_a_consumer_serves(tmp_path: Path,
                                                        lora: FakeVllm) -> None:
    """`[vllm] endpoint_names` says what the endpoint answers: the server's /v1/models is not
    asked, and a name left out is unserved (its line's 404), though the server answers it."""
    import dataclasses
    import io
    import json

    from fabricctl.cli.run import run_job
    from fabricctl.config import load_config

    cfg_file = tmp_path / "f.toml"
    cfg_file.write_text(f'engine = "openai"\nmodel = "m"\n[vllm]\nendpoints = ["{lora.url}"]\n'
                        'endpoint_names = ["ad-a"]\n')
    cfg = dataclasses.replace(load_config(cfg_file, cwd=tmp_path, env={}),
                              data_dir=tmp_path / "data")
    assert cfg.vllm.endpoint_names == ["ad-a"]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(chat(k, name, "s " * 8)) + "\n"
                            for k, name in enumerate(("m", "ad-a", "ad-b"))))
    out, errors = io.BytesIO(), []
    await run_job(cfg, path, out, errors=errors.append, keep_data=True)
    recs = {r["custom_id"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert [recs[f"r{k}"]["response"]["status_code"] for k in range(3)] == [200, 200, 404]
    assert "(served: ad-a, m)" in str(recs["r2"]["error"])
    assert "/v1/models" not in lora.gets
