"""Two servers under one `fabricctl up`, launched from a `[[servers]]` fleet on vLLM's CPU
build: a chat model with two LoRA adapters on GPU group [0], the same weights as an
embedding model (`--runner pooling --convert embed`) on group [1].

1. `up` launches one server per group (each tethered, pinned to its own core); `status
   --json` lists both consumers, the first with its adapters' names.
2. `submit FILE --wait` of the LoRA chat batch (`conftest.lora_lines`: the base model and
   both adapters) mixed with embeddings lines for the embedder: every chat line's status
   and `usage.prompt_tokens` equal `vllm run-batch`'s with the same LoRA flags
   (`lora_runbatch`) and its temperature-0 text the chat server's answer to its body alone,
   every embeddings line is answered 200, each body's `model` is the name
   its line asked for, and each result came from the server that serves that name (its GPU).
3. A second batch of the same mix, submitted without waiting while the embedder's engine is
   stopped (SIGSTOP, so the batch cannot end first); once some of its chat results are
   stored, SIGKILL of `up` (its servers die with it: the tether); `up` again relaunches both;
   every line of both batches ends with exactly one result, none lost, none doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import EMBED, LORA_NAMES, LORA_RANK, SERVER_ARGS, VENV, lora_lines
from ports import free_port_pair
from runbatch import answered_alone

from fabricctl.wire.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the multi-host helpers

from agent_helpers import Child, all_gone, child_env, fabricctl_cmd, query, results, wait_until

from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings, to_toml
from fabricctl.config.fleetspec import ServerSpec
from fabricctl.errors import BackendMissing
from fabricctl.supervisor.launch_spec import vllm_cpu_spec

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]
CHAT_NAMES = LORA_NAMES  # the chat server's: its base model's, then its adapters'
EMBEDDER = "tiny-embed"


def fleet_config(tmp: Path, model: Path, adapters: dict[str, Path]) -> tuple[Path, int]:
    """The fleet's config file, and its first server's port (the chat model's)."""
    cpu = vllm_cpu_spec(VENV, str(model), "tiny", tmp / "data" / "logs")
    port = free_port_pair()
    cfg = AppConfig(
        data_dir=tmp / "data", engine="vllm",
        servers=[ServerSpec(str(model), "tiny", {n: str(d) for n, d in adapters.items()},
                            [[0]], extra_args=list(LORA_RANK)),
                 ServerSpec(str(model), EMBEDDER, gpus=[[1]], extra_args=list(EMBED))],
        vllm=VllmSettings(command=list(cpu.command), model_flag=cpu.model_flag,
                          port_base=port, ready_timeout_s=240.0,
                          restart_backoff_s=[1.0], extra_args=list(SERVER_ARGS),
                          env=dict(cpu.env)),
        consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=8 * 512,
                                  max_input_len=400))
    path = tmp / "fleet.toml"
    path.write_text(to_toml(cfg))
    return path, port


def lines(tag: str, n: int) -> list[dict[str, Any]]:
    """n lines cycling over the chat names and the embedder, two system prompts each."""
    out = []
    names = (*CHAT_NAMES, EMBEDDER)
    for k in range(n):
        name = names[k % len(names)]
        system = f"System {k % 2}: the broker routes each request by its model name. " * 3
        if name == EMBEDDER:
            out.append({"custom_id": f"{tag}{k}", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": name, "input": system + f"text {k}"}})
        else:
            out.append({"custom_id": f"{tag}{k}", "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {"model": name, "max_tokens": 4, "temperature": 0,
                                 "messages": [{"role": "system", "content": system},
                                              {"role": "user", "content": f"question {k}"}]}})
    return out


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def embeddings(tag: str, n: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}{k}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": EMBEDDER, "input": f"System {k % 2}: the broker routes. "
                                                  f"text {k}"}} for k in range(n)]


async def test_two_models_on_two_servers_under_one_up(
        tiny_model: Path, lora_adapters: dict[str, Path],
        lora_runbatch: asyncio.Task[dict[str, Any]], tmp_path: Path) -> None:
    cfg, chat_port = fleet_config(tmp_path, tiny_model, lora_adapters)
    data = tmp_path / "data"
    env = child_env(tmp_path)

    def up() -> Child:
        return Child([*fabricctl_cmd(), "up", "--config", str(cfg)], env, tmp_path,
                     tmp_path / "up.log")

    async def both_served() -> bool:
        try:
            return len(await query(data, Client.consumers)) == 2
        except BackendMissing:  # its socket is not there yet
            return False

    broker = up()
    servers: list[psutil.Process] = []
    frozen: list[psutil.Process] = []
    try:
        await broker.start()
        await wait_until(both_served, 300, "both servers' consumers")
        doc = json.loads(await _cli(tmp_path, env, "status", "--json"))
        views = {c["model"]: c for c in doc["consumers"]}
        assert set(views) == {"tiny", EMBEDDER}
        assert views["tiny"]["names"] == ["ad-a", "ad-b"] and views[EMBEDDER]["names"] == []
        gpu_of = {name: 0 for name in CHAT_NAMES} | {EMBEDDER: 1}

        chat = lora_lines()
        first = chat + embeddings("e", 12)
        done = await _cli(tmp_path, env, "submit", str(write(tmp_path / "a.jsonl", first)),
                          "--wait")
        rows = {r["custom_id"]: r for r in map(json.loads, done.splitlines())}
        assert set(rows) == {r["custom_id"] for r in first}
        ref = await lora_runbatch
        for line in first:
            row = rows[line["custom_id"]]
            assert row["response"]["status_code"] == 200, row
            assert row["response"]["body"]["model"] == line["body"]["model"], row
        alone = await answered_alone(f"http://127.0.0.1:{chat_port}", chat)
        for line in chat:
            ours, theirs = rows[line["custom_id"]], ref[line["custom_id"]]
            assert theirs["response"]["status_code"] == 200, theirs
            assert (ours["response"]["body"]["usage"]["prompt_tokens"]
                    == theirs["response"]["body"]["usage"]["prompt_tokens"]), (ours, theirs)
            assert (ours["response"]["body"]["choices"][0]["message"]["content"]
                    == alone[line["custom_id"]]["response"]["body"]["choices"][0]["message"][
                        "content"]), (ours, alone[line["custom_id"]])

        second = lines("b", 120)
        assert broker.proc is not None
        frozen += _engine_of(psutil.Process(broker.proc.pid), EMBEDDER)
        for p in frozen:  # the embedder's engine, stopped: its lines cannot end before the kill
            p.suspend()
        await _cli(tmp_path, env, "submit", str(write(tmp_path / "b.jsonl", second)))

        async def some_done() -> int:
            n = sum(r.id.startswith("b") for r in await results(data))
            return n if n >= 12 else 0

        seen = await wait_until(some_done, 240, "the second batch's first results", every=0.02)
        assert seen < len(second), "the second batch ended before the kill: nothing to test"
        servers += psutil.Process(broker.proc.pid).children(recursive=True)
        broker.kill()
        await broker.wait(60)
        for p in frozen:  # resumed, so the tether's SIGTERM can end it
            with contextlib.suppress(psutil.Error):
                p.resume()
        await wait_until(lambda: all_gone(servers), 60, "the killed up's vLLM processes")

        broker = up()
        await broker.start()
        total = len(first) + len(second)

        async def all_done() -> bool:
            try:
                return len({r.id for r in await results(data)}) >= total
            except BackendMissing:  # the new `up` is not listening yet
                return False

        t_up = time.monotonic()
        await wait_until(all_done, 400, "every line of both batches", every=0.5)
        print(f"\nfleet: {len(servers)} processes of the killed up gone; {seen} of the second "
              f"batch's {len(second)} results stored when it was killed; the new up finished "
              f"both batches in {time.monotonic() - t_up:.1f} s")
        recs = await results(data)
        counts = Counter(r.id for r in recs)
        assert not [i for i, n in counts.items() if n > 1], "doubled"
        want = {r["custom_id"] for r in (*first, *second)}
        assert set(counts) == want
        asked = {r["custom_id"]: r["body"]["model"] for r in (*first, *second)}
        for r in recs:
            assert r.error is None and not r.status, r
            assert r.model == asked[r.id] and r.gpu == gpu_of[r.model], r
            assert json.loads(r.response)["model"] == asked[r.id], r
    finally:
        broker.kill()
        with contextlib.suppress(Exception):
            await broker.wait(30)
        for p in (*servers, *frozen):
            with contextlib.suppress(psutil.Error):
                p.kill()


def _engine_of(up: psutil.Process, name: str) -> list[psutil.Process]:
    """The processes under the vLLM server that serves `name` (its engine core), or that
    server itself when it has none."""
    tree = up.children(recursive=True)
    serving = [p for p in tree if name in " ".join(p.cmdline())]
    top = [p for p in serving if p.ppid() not in {q.pid for q in serving}]
    assert len(top) == 1, [p.cmdline() for p in serving]
    return top[0].children(recursive=True) or top


async def _cli(tmp: Path, env: dict[str, str], *args: str) -> str:
    """A `fabricctl` command against the fleet's data dir: its stdout (exit 0 asserted)."""
    proc = await asyncio.create_subprocess_exec(
        *fabricctl_cmd(), *args, "--data-dir", str(tmp / "data"), cwd=tmp, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()
    return out.decode()
