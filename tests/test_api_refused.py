"""Refused lines of a Batch API batch: `errors` on the Batch, as OpenAI writes them.

Promises checked against a real `up --api` subprocess with the official `openai` SDK: a
line that passes the upload's checks but that the broker refuses (a custom_id of 200
characters but 800 bytes: an id in a job may have 506) is listed in the Batch's
`errors` (`{"object": "list", "data": [{"code", "line", "message", "param"}]}`) with its
line, counts as failed in `request_counts`, and the rest of the batch runs and completes;
a batch whose every line is refused ends `failed` with each line in `errors`, as a batch
whose file fails validation does at OpenAI. (A line the upload's checks refuse never makes
a batch: the upload is a 400, tests/test_api_e2e.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

from test_api_e2e import ApiBroker, jsonl, request, wait_ended

LONG_ID = "\U0001f600" * 200  # 800 bytes; in a job an id may have 506 (511 the key)


def test_refused_lines_are_the_batch_errors(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b.client()
        f = c.files.create(file=("a.jsonl", jsonl([request("a"), request(LONG_ID),
                                                   request("c")])), purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
        wait_ended(c, batch.id)
        done = c.batches.retrieve(batch.id)
        assert done.status == "completed"
        assert done.errors is not None and done.errors.object == "list"
        assert done.errors.data is not None
        [e] = done.errors.data
        assert (e.code, e.line, e.param) == ("invalid_request", 2, None)
        assert e.message is not None and e.message.startswith("id is longer than")
        counts = done.request_counts
        assert counts is not None and (counts.total, counts.completed, counts.failed) == \
            (3, 2, 1)
        assert done.output_file_id is not None
        out = c.files.content(done.output_file_id).text.splitlines()
        assert [json.loads(x)["custom_id"] for x in out] == ["a", "c"]

        f = c.files.create(file=("b.jsonl", jsonl([request(LONG_ID), request(LONG_ID + "x")])),
                           purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
        assert wait_ended(c, batch.id)[-1] == "failed"
        failed = c.batches.retrieve(batch.id)
        assert failed.errors is not None and failed.errors.data is not None
        assert [(e.code, e.line) for e in failed.errors.data] == [("invalid_request", 1),
                                                                  ("invalid_request", 2)]
        assert failed.output_file_id is None
    finally:
        assert b.stop() == 0, b.logs()
