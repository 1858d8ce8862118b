"""The first run tells the truth calmly: a healthy run raises no alarm, and a figure that reads
as empty or alarming says why.

`make demo` (`python -m fabricctl.cli.demo` at its defaults: 40,000 items over 20 Zipf-popular
shapes on simulated GPUs) once marked 8 of its 20 finished shapes THRASH, a critical event
each: the Zipf tail, shapes that served every item of their prefix in one short run. A run
whose prefixes are all shorter than one KV block read `KV hit rate 0.0% of 0.0% achievable`
with no word of why; the simulated engine, like vLLM, caches nothing of such a prefix.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from cli_helpers import clean_env, fabricctl
from rich.console import Console

from fabricctl.cli.run_summary import AchievableHits, RunSummary, print_run_summary, thrash_note
from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.records import make_record
from fabricctl.core.snapshot import BatchesHistogramView
from fabricctl.core.stats import BATCH_BUCKETS
from fabricctl.core.types import Item, ItemResult
from fabricctl.store.durable import DurableBroker
from fabricctl.tui import charts

BLOCK_NOTE = "no prefix as long as one KV block (16 tokens)"  # the simulated engine's blocks


def test_the_demo_at_its_defaults_raises_no_thrash_alarm(tmp_path: Path) -> None:
    env = clean_env(tmp_path, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "fabricctl.cli.demo", "--dir",
                           str(tmp_path / "demo")], capture_output=True, env=env,
                          cwd=tmp_path, timeout=600)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    [row] = [ln for ln in err.splitlines() if "thrash events" in ln]
    assert re.search(r"thrash events\s*│\s*0\s*│", row), row  # 0, and no reason to give
    store = DurableBroker(tmp_path / "demo" / "broker", time.time())
    try:
        finished = store.finished_shapes()
    finally:
        store.close()
    assert len(finished) >= 15
    # the run held short shapes (the Zipf tail ran well under 100 batches) and none of them
    # is called thrashing: each served every item of its prefix in its one run
    assert sum(v.batches < 100 for v in finished) >= 5
    assert [v.label for v in finished if v.thrashed or v.thrash] == []


def _chat_lines(path: Path) -> Path:
    """20 chat lines over two system prompts of a few tokens each (under one 16-token block),
    as the newcomer's first real-vLLM run had."""
    systems = ("Be brief.", "Answer in French.")
    with path.open("wb") as f:
        for k in range(20):
            f.write(msgspec.json.encode({
                "custom_id": f"c{k}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "fabric-demo", "max_tokens": 8, "messages": [
                    {"role": "system", "content": systems[k % 2]},
                    {"role": "user", "content": f"Question number {k}: what is {k} squared "
                     "and why does it matter for the next question?"}]}}) + b"\n")
    return path


def test_a_run_whose_prefixes_are_under_one_block_says_why_nothing_was_cached(
        tmp_path: Path) -> None:
    chat = _chat_lines(tmp_path / "chat.jsonl")
    env = clean_env(tmp_path)
    done = fabricctl("run", str(chat), "--engine", "sim", "-o", str(tmp_path / "out.jsonl"),
                     "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["items"] == 20
    # the simulated engine, like vLLM, caches nothing of a prefix shorter than a block
    assert (summary["kv_hit_rate"], summary["kv_hit_achievable"]) == (0.0, 0.0)
    assert summary["kv_note"] == BLOCK_NOTE
    assert (summary["thrash_events"], summary["thrash_note"]) == (0, "")
    text = fabricctl("run", str(chat), "--engine", "sim", "-o", str(tmp_path / "out2.jsonl"),
                     env=env, cwd=tmp_path)
    assert text.returncode == 0, text.stderr.decode()
    flat = " ".join(text.stderr.decode().replace("│", " ").split())
    assert f"0.0% of 0.0% achievable: {BLOCK_NOTE}" in flat


def _item(ident: str, prefix_tokens: int, prompt: int) -> Item:
    payload = Payload(["S"] if prefix_tokens else [], "p-" + ident,
                      [prefix_tokens] if prefix_tokens else [], prompt)
    return Item(ident, "m", 7, prefix_tokens + prompt, 4, encode_payload(payload))


def _ran(shapes: AchievableHits, *items: Item) -> None:
    for it in items:
        shapes.add(it)
        shapes.completed(make_record(it, ItemResult(it.id, tokens_out=1), gpu=0))


def test_the_kv_note_names_why_the_achievable_hits_are_zero() -> None:
    assert AchievableHits().kv_note(0, 0, 16) == ""  # nothing ran: nothing to explain
    short = AchievableHits()
    _ran(short, _item("a", 10, 30), _item("b", 10, 30))
    assert short.achievable(16) == 0
    assert short.kv_note(80, 0, 16) == BLOCK_NOTE
    assert short.kv_note(0, 0, 16) == "the server reports no cache statistics"
    bare = AchievableHits()
    _ran(bare, _item("c", 0, 30), _item("d", 0, 30))
    assert bare.kv_note(60, 0, 16) == "no item declares a shared prefix"
    once = AchievableHits()
    _ran(once, _item("e", 64, 30))  # one request: its prefix was computed, never reused
    assert once.achievable(16) == 0 and once.kv_note(94, 0, 16) == (
        "no prefix was asked twice on one GPU")
    long = AchievableHits()
    _ran(long, _item("f", 64, 30), _item("g", 64, 30))
    assert long.achievable(16) > 0 and long.kv_note(188, long.achievable(16), 16) == ""


def _summary(**kw: object) -> RunSummary:
    base: dict[str, object] = dict(
        items=20, rejected=0, tokens_in=400, tokens_out=40, wall_s=1.0, shapes=2,
        shape_switches=1, midstream_switches=0, kv_hit_rate=0.0, kv_hit_achievable=0.0,
        padding_waste=0.0, thrash_events=0, engine="vllm", simulated=False, gpus=1,
        ledger_difference=(0, 0))
    base.update(kw)
    return RunSummary(**base)  # type: ignore[arg-type]


def _printed(s: RunSummary) -> str:
    buf = io.StringIO()
    print_run_summary(s, Console(file=buf, width=200, no_color=True))
    return " ".join(buf.getvalue().replace("│", " ").split())


def test_the_summary_gives_the_reason_beside_a_zero_bound_and_a_thrash_count() -> None:
    note = "the server reports no cache statistics"
    assert f"KV hit rate 0.0% of 0.0% achievable: {note}" in _printed(_summary(kv_note=note))
    assert thrash_note(0) == ""
    why = thrash_note(3)
    assert why == ("shapes ended short while their prefix was staged again; to gather more "
                   "per run, raise [broker] activate_multiple or stage_timeout_s")
    assert f"thrash events 3: {why}" in _printed(_summary(thrash_events=3, thrash_note=why))
    assert "thrash events 0 " in _printed(_summary())  # nothing flagged, nothing to say
    doc = json.loads(msgspec.json.encode(_summary(kv_note=note, thrash_events=3,
                                                  thrash_note=why)))
    assert (doc["kv_note"], doc["thrash_note"]) == (note, why)




def test_the_thrash_histogram_counts_only_the_shapes_that_thrashed() -> None:
    counts = [0] * (len(BATCH_BUCKETS) + 1)
    counts[4] = 8  # eight shapes of 10-19 batches: short, and none of them thrashed
    view = BatchesHistogramView(list(BATCH_BUCKETS), counts, [12] * 8, 100, thrashed=0)
    assert "8 finished, 0 thrashing" in charts.batches_histogram(view, 40).plain
    view.thrashed = 3
    assert "8 finished, 3 thrashing" in charts.batches_histogram(view, 40).plain


def test_a_run_on_the_cpu_build_counts_cpu_servers_not_gpus() -> None:
    from io import StringIO

    from rich.console import Console

    from fabricctl.cli.run_summary import RunSummary, print_run_summary

    def title(device: str) -> str:
        out = StringIO()
        s = RunSummary(items=1, rejected=0, tokens_in=1, tokens_out=1, wall_s=1.0, shapes=1,
                       shape_switches=0, midstream_switches=0, kv_hit_rate=0.0,
                       kv_hit_achievable=0.0, padding_waste=0.0, thrash_events=0,
                       engine="vllm", simulated=False, gpus=1, ledger_difference=(0, 0),
                       device=device)
        print_run_summary(s, Console(file=out, width=100))
        return out.getvalue().splitlines()[0].strip()

    assert title("cpu") == "fabricctl run — vllm, 1 CPU server(s)"
    assert title("gpu") == "fabricctl run — vllm, 1 GPU(s)"
