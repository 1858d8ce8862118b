"""A chat batch mixing the base model and two LoRA adapters, on the real vLLM CPU build.

One server (`conftest.lora_server`, started by fabricctl's launcher with its `adapters`) serves
the tiny Llama and two random rank-8 adapters made at test time (`make_lora.py`: "ad-a",
"ad-b"). A batch in the OpenAI batch format whose lines name "tiny", "ad-a" or "ad-b" in
`model` (3 system prompts x 4 users x 3 names, the names interleaved, so each (name, prefix)
recurs) goes through `fabricctl run --engine openai` against it (the engine learns the
adapters' names from /v1/models) and through `vllm run-batch` with the same flags
(`conftest.lora_flags`, checked against the server's command line). Per line: a result; status
and `usage.prompt_tokens` equal run-batch's; the body's `model` is the name the line asked for;
the temperature-0 text (and completion_tokens) equals the same server answering the body alone.
The summary line also counts run-batch's texts equal to those (36/36 in each of 3 runs here),
asserted nowhere: the text reference is the server's answer alone. And the adapters matter: at
least half of each adapter's texts differ from the base model's for the same messages.

Run-batch and the server keep a LoRA slot free (the launcher's `LORA_SPARE_SLOTS`: `--max-loras
3` for two adapters), else the CPU build answers a base request that shares a step with an
adapter's as the last slot's adapter would (its -1 slot index taken as Python's last): with
`--max-loras 2`, one run's base lines came back with exactly "ad-b"'s text on 10 of 12 in
run-batch and 7 of 12 through fabricctl (3 more differing from the base's too): what
docs/engine-notes.md section 5 records as "a batch mixing base and adapter
requests can change ... text for some base lines".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ADAPTERS, LORA_NAMES, LORA_RANK, lora_flags, lora_lines
from runbatch import answered_alone, through_fabricctl, write

from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

def status_and_usage(rec: dict[str, Any]) -> tuple[int, int | None]:
    resp = rec["response"]
    body = resp["body"] if resp else None
    return (resp["status_code"] if resp else 0,
            None if body is None else body["usage"]["prompt_tokens"])


def text(rec: dict[str, Any]) -> str | None:
    body = rec["response"]["body"]
    return None if body is None else body["choices"][0]["message"]["content"]


async def test_lora_lines_answer_as_run_batch_and_the_server_do(
        lora_server: asyncio.Task[Launcher], lora_runbatch: asyncio.Task[dict[str, Any]],
        lora_adapters: dict[str, Path], tiny_model: Path, tmp_path: Path) -> None:
    lines = lora_lines()
    inp = write(tmp_path / "lora.jsonl", lines)
    t0 = time.monotonic()
    ref, server = await asyncio.gather(  # run-batch on core 1 while the server starts on 0
        lora_runbatch, lora_server)
    rb_s = time.monotonic() - t0
    argv = " ".join(server.servers[0].argv())
    flags = lora_flags(lora_adapters)
    assert " ".join(flags[:-len(LORA_RANK)]) in argv and " ".join(LORA_RANK) in argv, argv
    t1 = time.monotonic()
    ours = await through_fabricctl(server, tiny_model / "tokenizer.json", tmp_path, inp)
    ours_s = time.monotonic() - t1
    alone = await answered_alone(server.servers[0].base_url, lines)
    ids = {line["custom_id"] for line in lines}
    assert set(ref) == set(alone) == ids
    assert set(ours) == ids, sorted(ids - set(ours))
    # run-batch and the server answer every line, adapters included: else this proves nothing
    assert all(status_and_usage(ref[cid])[0] == 200 for cid in ids), ref
    assert all(status_and_usage(alone[cid])[0] == 200 for cid in ids), alone
    status = sum(status_and_usage(ours[c]) == status_and_usage(ref[c]) for c in ids)
    same = sum(text(ours[c]) == text(alone[c]) for c in ids)
    rb_same = sum(text(ref[c]) == text(alone[c]) for c in ids)
    print(f"\nLoRA: {len(lines)} items ({', '.join(LORA_NAMES)}); run-batch (and the server's "
          f"start) {rb_s:.1f} s, fabricctl run {ours_s:.1f} s; status and prompt_tokens "
          f"equal run-batch's on {status}/{len(ids)}; texts equal the server's alone on "
          f"{same}/{len(ids)} (run-batch's on {rb_same}/{len(ids)})")
    for line in lines:
        cid, name = line["custom_id"], line["body"]["model"]
        assert status_and_usage(ours[cid]) == status_and_usage(ref[cid]), (ours[cid], ref[cid])
        body = ours[cid]["response"]["body"]
        assert body["model"] == name, ours[cid]
        assert text(ours[cid]) == text(alone[cid]), (cid, ours[cid], alone[cid])
        assert body["usage"]["completion_tokens"] == \
            alone[cid]["response"]["body"]["usage"]["completion_tokens"], cid
    # the adapters change the text: the same messages under another name answer otherwise
    base = {str(line["body"]["messages"]): text(alone[line["custom_id"]])
            for line in lines if line["body"]["model"] == "tiny"}
    for adapter in ADAPTERS:
        differ = [line["custom_id"] for line in lines if line["body"]["model"] == adapter
                  and text(alone[line["custom_id"]]) != base[str(line["body"]["messages"])]]
        assert len(differ) >= 6, (adapter, differ)
