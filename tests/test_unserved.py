"""Items for a model no consumer serves: `run` says so and finishes, `status` shows them.

Promises checked: `fabricctl run` on a workload with items for a model its engines do not
serve ends within seconds (it does not wait for them), names the model, the number of
items and what is served on stderr, writes every other item's result and an error result
for each of those items (in its place with --ordered), and exits 1. Against `fabricctl up`,
`submit` lets such items in and warns once per model; `status` (text and --json) and
`top --once` say "N items wait for model 'X': no consumer". The pure parts
(`core.unserved`, `tui.draw.waiting`) on literal data.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_helpers import Broker, clean_env, error_lines, fabricctl

from fabricctl.core.snapshot import ConsumerView
from fabricctl.core.unserved import Waiting, unserved, waiting_line

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


# ---- against a running broker -----------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("unserved")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


def test_submit_warns_once_per_unserved_model_and_status_and_top_say_so(
        broker: Broker) -> None:
    lines = [native(f"s-{i}") for i in range(4)]
    lines += [native(f"w-{i}", model="nope") for i in range(3)]
    lines += [native(f"t-{i}", model="tiny") for i in range(1200)]  # more than one chunk
    lines += [native(f"s-{i}") for i in range(4, 8)]
    out = broker.run("submit", "-", input="".join(json.dumps(x) + "\n" for x in lines).encode())
    assert out.returncode == 0, out.stderr
    assert error_lines(out.stderr) == [
        "fabricctl: warning: no consumer serves model 'nope' (served: fabric-demo): its 3 "
        "items wait until one joins",
        "fabricctl: warning: no consumer serves model 'tiny' (served: fabric-demo): its 1,200 "
        "items wait until one joins",
    ]

    st = json.loads(broker.run("status", "--json").stdout)
    assert [(w["model"], w["items"]) for w in st["unserved"]] == [("tiny", 1200), ("nope", 3)]
    text = broker.run("status").stdout.decode()
    assert "1,200 items wait for model 'tiny': no consumer" in text
    assert "3 items wait for model 'nope': no consumer" in text
    top = broker.run("top", "--once").stdout.decode()
    assert ("⚠ 1,200 items wait for model 'tiny': no consumer  (and 1 more model with no "
            "consumer: nope)") in top

    served_only = broker.run("submit", "-", input=json.dumps(native("s-late")).encode())
    assert served_only.returncode == 0 and error_lines(served_only.stderr) == []  # no warning


# ---- the pure parts ---------------------------------------------------------------------


class _Shape:
    def __init__(self, model: str, items: int, tokens: int) -> None:
        self.model, self.items, self.tokens = model, items, tokens


def consumer(model: str) -> ConsumerView:
    return ConsumerView(f"c-{model}", model, 8, 4096, 2048, 0, 0, 0, 0, 0.0)


def test_unserved_counts_queued_items_of_models_without_a_consumer() -> None:
    shapes = [_Shape("a", 5, 50), _Shape("b", 2, 20), _Shape("b", 3, 30), _Shape("c", 7, 70),
              _Shape("d", 0, 0)]
    assert unserved(shapes, [consumer("a")]) == [Waiting("c", 7, 70), Waiting("b", 5, 50)]
    assert unserved(shapes, [consumer("a"), consumer("b"), consumer("c")]) == []
    assert unserved([], []) == []
    assert unserved([_Shape("y", 4, 1), _Shape("x", 4, 2)], []) == [Waiting("x", 4, 2),
                                                                     Waiting("y", 4, 1)]


def test_waiting_line() -> None:
    assert waiting_line(Waiting("tiny", 2976, 1)) == ("2,976 items wait for model 'tiny': "
                                                      "no consumer")
    assert waiting_line(Waiting("m", 1, 1)) == "1 item waits for model 'm': no consumer"


def test_dashboard_line_names_the_biggest_and_counts_the_rest() -> None:
    from tui_synthetic import make_snapshot

    from fabricctl.tui.draw import waiting

    snap = make_snapshot(t=1000.0, shapes=30)  # consumers serve model-0 only
    found = unserved(snap.shapes, snap.consumers)
    assert [w.model for w in found] == ["model-1"]
    line = waiting(snap)
    assert line.plain == f"⚠ {found[0].items:,} items wait for model 'model-1': no consumer"
    assert waiting(make_snapshot(t=1000.0, shapes=20)).plain == ""  # all served: no line
