"""Items for a model no consumer serves: `run` says so and finishes, `status` shows them.

Promises checked: `fabricctl run` on a workload with items for a model its engines do not
serve ends within seconds (it does not wait for them), names the model, the number of
items and what is served on stderr, writes every other item's result and an error result
for each of those items, and exits 1.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from cli_helpers import clean_env, fabricctl

UNSERVED_LINE = ("fabricctl: error: 5 items are for model 'nope', which no consumer serves "
                 "(served: fabric-demo); each gets an error result")


def native(ident: str, model: str = "fabric-demo") -> dict:
    return {"id": ident, "model": model, "prefix": ["SYS", "FEW"], "prompt": f"hi {ident}",
            "max_tokens": 4}


def workload() -> list[dict]:
    items = [native(f"ok-{i}") for i in range(200)]
    for k in range(5):  # spread through the input
        items.insert(k * 37 + 3, native(f"nope-{k}", model="nope"))
    return items


def test_run_answers_unserved_items_with_errors_and_runs_the_rest(tmp_path: Path) -> None:
    items = workload()
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    out_file = tmp_path / "out.jsonl"
    t0 = time.monotonic()
    out = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stderr
    assert took < 30
    assert UNSERVED_LINE in out.stderr.decode().splitlines()
    summary = json.loads(out.stdout)
    assert (summary["items"], summary["unserved"], summary["rejected"]) == (200, 5, 0)
    results = [json.loads(x) for x in out_file.read_bytes().splitlines()]
    by_id = {r["id"]: r for r in results}
    assert len(results) == len(by_id) == len(items)  # one line per input line
    assert sorted(by_id) == sorted(i["id"] for i in items)
    for i in items:
        r = by_id[i["id"]]
        if i["model"] == "nope":
            assert r["error"] == "no consumer serves model 'nope' (served: fabric-demo)"
            assert r["finish_reason"] == "error" and r["model"] == "nope"
        else:
            assert r["error"] is None and r["finish_reason"] != "error", r


def test_run_ordered_puts_the_error_results_at_their_place(tmp_path: Path) -> None:
    items = workload()
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    out = fabricctl("run", str(path), "--ordered", "--engine", "sim", "--json",
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=60)
    assert out.returncode == 1, out.stderr
    results = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["id"] for r in results] == [i["id"] for i in items]
    assert [r["id"] for r in results if r["error"]] == [f"nope-{k}" for k in range(5)]
