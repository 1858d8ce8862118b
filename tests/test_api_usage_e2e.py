"""The Batch object's `model`, `usage` and `output_expires_after` against `fabricctl up --api`
on simulated GPUs, the official `openai` SDK as the client (issue 26).

Promises checked:
- a batch run end to end has `model` (its lines' model) and `usage` equal to the sums over
  its output file's lines' usage (prompt, cached and completion tokens; cached > 0: the lines
  share a long system prompt; reasoning 0; total = input + output); `jobs show --json` gives
  the same usage object (and the record's `model` and token counts), `jobs show` the same
  numbers in words;
- `output_expires_after` (anchor `created_at`, the smallest allowed 3600 s) is on the output
  and error files' `expires_at` (their creation, when the batch ended, + seconds); after a
  restart of `up` whose API clock runs past it (`FABRICCTL_API_CLOCK_SKEW_S`, the test seam
  of `daemon.serve.api_clock`: no waiting an hour), both files are 404s while the batch keeps
  their ids, its usage and its model; a batch created without it keeps its files;
- a bad `output_expires_after` (seconds under 3600 or over 30 days, another anchor, not a
  whole number) is a 400 naming the field, and no batch is made. (The error file's expiry,
  the same code path, is checked in `test_api_units.py`.)
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from test_api_e2e import CHAT, ApiBroker, jsonl, wait_ended

SYSTEM = "You answer in one word. " + "Context: the answer is always brief. " * 60
EXPIRES = {"anchor": "created_at", "seconds": 3600}


def request(cid: str, prompt: str) -> dict:
    body: dict = {"model": "fabric-demo", "max_tokens": 4 + len(cid) % 5,
                  "messages": [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": prompt}]}
    return {"custom_id": cid, "method": "POST", "url": CHAT, "body": body}


def output_usage(text: str) -> dict:
    """The sums over an output file's lines' usage, in the Batch's usage shape."""
    p = c = o = 0
    for line in text.splitlines():
        u = json.loads(line)["response"]["body"]["usage"]
        p += u["prompt_tokens"]
        c += (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        o += u["completion_tokens"]
    return {"input_tokens": p, "input_tokens_details": {"cached_tokens": c},
            "output_tokens": o, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + o}


def test_usage_model_and_output_files_that_expire(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b.client()
        rows = [request(f"u{i}", f"question {i}") for i in range(60)]
        f = c.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
        expiring = c.batches.create(input_file_id=f.id, endpoint=CHAT,
                                    completion_window="24h",
                                    output_expires_after=EXPIRES)  # type: ignore[arg-type]
        kept = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert wait_ended(c, expiring.id)[-1] == "completed"
        assert wait_ended(c, kept.id)[-1] == "completed"
        done = c.batches.retrieve(expiring.id)
        assert done.model == "fabric-demo" and done.output_file_id and done.usage
        text = c.files.content(done.output_file_id).text
        assert len(text.splitlines()) == 60
        want = output_usage(text)
        assert want["input_tokens_details"]["cached_tokens"] > 0, want
        assert done.usage.model_dump() == want
        meta = c.files.retrieve(done.output_file_id)
        assert done.completed_at is not None
        assert meta.created_at == done.completed_at
        assert meta.expires_at == done.completed_at + 3600
        other = c.batches.retrieve(kept.id)
        assert other.output_file_id and other.usage is not None
        assert other.usage.model_dump() == output_usage(
            c.files.content(other.output_file_id).text)
        assert c.files.retrieve(other.output_file_id).expires_at is None

        shown = b.run("jobs", "show", done.id, "--json")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["usage"] == want
        assert doc["job"]["model"] == "fabric-demo"
        assert (doc["job"]["input_tokens"], doc["job"]["cached_tokens"],
                doc["job"]["output_tokens"]) == (
            want["input_tokens"], want["input_tokens_details"]["cached_tokens"],
            want["output_tokens"])
        words = b.run("jobs", "show", done.id).stdout.decode()
        assert (f"{want['input_tokens']:,} input tokens "
                f"({want['input_tokens_details']['cached_tokens']:,} cached), "
                f"{want['output_tokens']:,} output, {want['total_tokens']:,} total") in words
        assert "fabric-demo" in words
    finally:
        assert b.stop() == 0, b.logs()

    # `up` again, its API clock an hour and a minute on: the expiring batch's files are gone
    later = ApiBroker(tmp_path / "d", tmp_path, env={"FABRICCTL_API_CLOCK_SKEW_S": "3660"})
    try:
        c = later.client()
        again = c.batches.retrieve(expiring.id)
        assert again.output_file_id == done.output_file_id  # the batch keeps the ids
        assert again.usage is not None and again.usage.model_dump() == want  # a restart
        assert again.model == "fabric-demo"
        with pytest.raises(openai.NotFoundError):
            c.files.retrieve(done.output_file_id)
        with pytest.raises(openai.NotFoundError):
            c.files.content(done.output_file_id)
        still = c.batches.retrieve(kept.id)
        assert still.output_file_id
        assert len(c.files.content(still.output_file_id).text.splitlines()) == 60
    finally:
        assert later.stop() == 0, later.logs()


def test_a_bad_output_expires_after_is_a_400_and_no_batch(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b.client()
        f = c.files.create(file=("in.jsonl", jsonl([request("a1", "one")])), purpose="batch")
        for bad, param in (({"anchor": "created_at", "seconds": 3599}, "seconds"),
                           ({"anchor": "created_at", "seconds": 2_592_001}, "seconds"),
                           ({"anchor": "created_at", "seconds": "3600"}, "seconds"),
                           ({"anchor": "completed_at", "seconds": 3600}, "anchor")):
            with pytest.raises(openai.BadRequestError) as e:
                c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                                 output_expires_after=bad)  # type: ignore[arg-type]
            err = e.value.response.json()["error"]
            assert err["param"] == f"output_expires_after.{param}", err
            assert err["type"] == "invalid_request_error"
        assert c.batches.list().data == []
    finally:
        assert b.stop() == 0, b.logs()
