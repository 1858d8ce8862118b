"""Jobs through the CLI, against a real broker (`fabricctl up --engine sim`): a submit is a
job (its id on stderr), `jobs`/`jobs show` report it (with its model and its usage: the sums
of its results' usage, `--json` in the Batch API's shape), `results --job --ordered` gives its
results in input order, the same file submitted again attaches to its job (no duplicate
errors, `--wait` prints every result), the same ids in another job are not duplicates, and
`jobs cancel` cancels the queued items of a slow job with counts that add up."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from cli_helpers import Broker, error_lines

DEADLINE_S = 60.0


def native(ident: str, prefix: str = "JOBS") -> dict:
    return {"id": ident, "model": "fabric-demo", "prefix": [prefix, "FEW"],
            "prompt": f"question {ident}", "max_tokens": 8}


def jsonl(objs: list[dict]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def job_id_of(stderr: bytes) -> str:
    m = re.search(rb"fabricctl: job (batch_[0-9a-z]+)", stderr)
    assert m, stderr
    return m.group(1).decode()


def show(b: Broker, job: str) -> dict:
    out = b.run("jobs", "show", job, "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def settled(b: Broker, job: str) -> dict:
    """The job once its tick has moved it past finalizing (bounded polling)."""
    deadline = time.monotonic() + DEADLINE_S
    while (doc := show(b, job))["job"]["state"] == "finalizing":
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)
    return doc


def test_a_submit_is_a_job_listed_shown_and_its_results_in_input_order(tmp_path: Path) -> None:
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        items = [native(f"q{i}", f"P{i % 3}") for i in range(60)]
        src = tmp_path / "in.jsonl"
        src.write_bytes(jsonl(items) + b'{"bad json\n')
        out = b.run("submit", str(src), "--wait")
        assert out.returncode == 1  # one line refused
        job = job_id_of(out.stderr)
        assert len(out.stdout.splitlines()) == 60
        listed = json.loads(b.run("jobs", "--json").stdout)["jobs"]
        assert [j["id"] for j in listed] == [job]
        doc = settled(b, job)
        rec = doc["job"]
        assert rec["state"] == "completed" and rec["kind"] == "submit"
        assert (rec["total"], rec["completed"], rec["rejected"]) == (60, 60, 1)
        assert rec["lines"] == 61 and rec["errors"] and "line 61" in rec["errors"][0]
        assert rec["name"] == str(src.resolve()) and len(rec["sha256"]) == 64
        # its usage: the sums of its results' usage, in the Batch API's shape
        used = [json.loads(ln)["usage"] for ln in out.stdout.splitlines()]
        p_, c_, o_ = (sum(u[k] or 0 for u in used)
                      for k in ("prompt_tokens", "cached_tokens", "completion_tokens"))
        assert doc["usage"] == {"input_tokens": p_, "input_tokens_details": {"cached_tokens": c_},
                                "output_tokens": o_,
                                "output_tokens_details": {"reasoning_tokens": 0},
                                "total_tokens": p_ + o_}
        assert (rec["input_tokens"], rec["cached_tokens"], rec["output_tokens"]) == (p_, c_, o_)
        assert rec["model"] == "fabric-demo" and p_ > 0 and o_ > 0
        ordered = b.run("results", "--job", job[:10], "--ordered")
        assert ordered.returncode == 0, ordered.stderr
        assert [json.loads(ln)["id"] for ln in ordered.stdout.splitlines()] == \
            [f"q{i}" for i in range(60)]
        text = b.run("jobs", "show", job).stdout.decode()
        for part in (job, "completed", "60 completed", "1 line(s) refused", "fabric-demo",
                     f"{p_:,} input tokens ({c_:,} cached), {o_:,} output"):
            assert part in text, text

        again = b.run("submit", str(src), "--wait", "--ordered")
        assert again.returncode == 1  # the bad line is still bad, once
        assert "attached" in again.stderr.decode()
        assert job_id_of(again.stderr) == job
        assert [ln for ln in error_lines(again.stderr) if "duplicate" in ln] == []
        assert [json.loads(ln)["id"] for ln in again.stdout.splitlines()] == \
            [f"q{i}" for i in range(60)]
        assert show(b, job)["job"]["total"] == 60  # nothing stored twice

        other = b.run("submit", "-", "--wait", input=jsonl(items[:5]))  # same ids, new job
        assert other.returncode == 0, other.stderr
        assert job_id_of(other.stderr) != job and len(other.stdout.splitlines()) == 5
    finally:
        assert b.stop() == 0


def test_cancel_removes_the_queued_items_and_the_counts_add_up(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text("[sim]\ntime_scale = 2.0\n")  # slower than real time
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        items = [native(f"c{i}", f"C{i % 4}") for i in range(3000)]
        out = b.run("submit", "-", input=jsonl(items))
        assert out.returncode == 0, out.stderr
        job = job_id_of(out.stderr)
        cancel = b.run("jobs", "cancel", job)
        assert cancel.returncode == 0, cancel.stderr
        assert re.search(r"cancell(ing|ed)", cancel.stderr.decode()), cancel.stderr
        deadline = time.monotonic() + DEADLINE_S
        while (rec := show(b, job)["job"])["state"] != "cancelled":
            assert rec["state"] == "cancelling", rec
            assert time.monotonic() < deadline, rec
            time.sleep(0.2)
        assert rec["cancelled"] > 0
        assert rec["completed"] + rec["failed"] + rec["cancelled"] == rec["total"] == 3000
        results = b.run("results", "--job", job, "--ordered").stdout.splitlines()
        assert len(results) == 3000  # every line has an outcome
        cancelled = [r for r in map(json.loads, results) if r.get("error") == "cancelled"]
        assert len(cancelled) == rec["cancelled"]
        again = b.run("jobs", "cancel", job)
        assert again.returncode == 0 and "already ended" in again.stderr.decode()
    finally:
        assert b.stop() == 0
