"""`vllm run-batch` and `fabricctl run` on one file, for the real-vLLM parity tests.

Helpers (not a test module):
- `run_batch(model, inp, out, core, *flags)`: vLLM's own batch runner on `inp` with the
  session's engine flags (`conftest.SERVER_ARGS`) plus `flags`, pinned to one core; its
  output rows by custom_id.
- `through_fabricctl(servers, tokenizer, tmp, inp, refused=0, group_pooling=True)`:
  `fabricctl run` (its `run_job`, engine openai) on `inp` against the launched servers,
  with exactly `refused` lines refused by its reader (each still a row), embeddings items
  grouped into one request or not (`[consumer] group_pooling`); its output rows by
  custom_id.
- `answered_alone(server, lines)`: each line's body POSTed alone to the server at its url,
  one after another; a row per custom_id in run-batch's form (`response.body` None and
  `error` the server's answer when it refuses).
- `write(path, lines)`: a JSONL file of the lines.
- `vectors(body)`: an embeddings body's vectors as floats (base64 ones decoded);
  `cosine(a, b)`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import httpx
from conftest import SERVER_ARGS, VENV

from fabricctl.cli.run import run_job
from fabricctl.config import AppConfig, ConsumerSettings, ProducerSettings, VllmSettings
from fabricctl.supervisor.launcher import Launcher


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def vectors(body: dict[str, Any]) -> list[list[float]]:
    out = []
    for d in body["data"]:
        e = d["embedding"]
        if isinstance(e, str):
            raw = base64.b64decode(e)
            e = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        out.append(e)
    return out


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def by_id(lines: list[str]) -> dict[str, Any]:
    recs = [json.loads(line) for line in lines]
    out = {r["custom_id"]: r for r in recs}
    assert len(out) == len(recs)
    return out


async def run_batch(model: Path, inp: Path, out: Path, core: int, *flags: str
                    ) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core))
    iomp = VENV / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    proc = await asyncio.create_subprocess_exec(
        str(VENV / "bin" / "python"), "-W", "ignore", "-m", "vllm.entrypoints.openai.run_batch",
        "-i", str(inp), "-o", str(out), "--model", str(model),
        "--served-model-name", "tiny", *SERVER_ARGS, *flags, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    log, _ = await asyncio.wait_for(proc.communicate(), 400)
    assert proc.returncode == 0, log.decode(errors="replace")[-3000:]
    return by_id(out.read_text().splitlines())


async def through_fabricctl(servers: Launcher, tokenizer: Path, tmp: Path, inp: Path,
                            refused: int = 0, group_pooling: bool = True) -> dict[str, Any]:
    cfg = AppConfig(
        data_dir=tmp / "data", engine="openai", model="tiny",
        vllm=VllmSettings(endpoints=[s.base_url for s in servers.servers]),
        consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=8 * 512,
                                  max_input_len=500, group_pooling=group_pooling),
        producer=ProducerSettings(tokenizer=str(tokenizer)))
    for s in servers.servers:
        await s.wait_ready(240)
    out = io.BytesIO()
    errors: list[str] = []
    await run_job(cfg, inp, out, errors=errors.append, keep_data=True)
    assert len(errors) == refused, errors
    return by_id(out.getvalue().decode().splitlines())


async def answered_alone(base_url: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for line in lines:
            resp = await client.post(line["url"], json=line["body"])
            out[line["custom_id"]] = {
                "custom_id": line["custom_id"], "error": None if resp.is_success else resp.json(),
                "response": {"status_code": resp.status_code,
                             "body": resp.json() if resp.is_success else None}}
    return out
