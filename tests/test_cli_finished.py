"""Finished shapes through the CLI, against a real broker (`fabricctl up --engine sim`):
`shapes list --all` lists them, `shapes inspect` shows their record (also after the broker
restarts on the same data dir), and a shape is named by hex, label or unique hex prefix."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cli_helpers import Broker, error_lines

DEADLINE_S = 30.0


def native(ident: str, prefix: str) -> dict:
    return {"id": ident, "model": "fabric-demo", "prefix": [prefix, "FEW"],
            "prompt": f"question {ident}", "max_tokens": 8, "label": f"label-{prefix}"}


def jsonl(objs: list[dict]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def listed(b: Broker, *flags: str) -> list[dict]:
    out = b.run("shapes", "list", "--json", *flags)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["shapes"])


def finished(b: Broker) -> dict:
    """The first finished record, polled for (the broker finishes a shape on its tick).

    A consumer keeps its exhausted shape until it takes another, so which of three
    one-after-another shapes on two GPUs finishes depends on which GPU took the next one;
    that one of the first two does is certain (the third shape displaces one of them)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        done = [s for s in listed(b, "--all") if s["state"] == "finished"]
        if done:
            assert done[0]["label"] in ("label-FIN-A", "label-FIN-B"), done
            return done[0]
        assert time.monotonic() < deadline, listed(b, "--all")
        time.sleep(0.2)


def test_a_finished_shape_is_listed_inspected_and_kept_across_a_restart(tmp_path: Path) -> None:
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        for prefix in ("FIN-A", "FIN-B", "FIN-C"):  # a successor finishes each held shape
            items = [native(f"{prefix}-{i}", prefix) for i in range(30)]
            out = b.run("submit", "-", "--wait", input=jsonl(items))
            assert out.returncode == 0, out.stderr
        rec = finished(b)
        label = rec["label"]
        assert rec["shape"] == f"{rec['signature']:016x}" and isinstance(rec["signature"], int)
        assert all(s["state"] != "finished" for s in listed(b))  # the default: live only
        doc = json.loads(b.run("shapes", "inspect", rec["shape"], "--json").stdout)
        assert doc["state"] == "finished" and doc["live"] is False
        assert doc["served_items"] == 30 and doc["batches"] >= 1 and doc["served_tokens"] > 0
        assert [st for _, st in doc["history"]][-1] == "finished" and doc["consumers"]
        text = b.run("shapes", "inspect", label).stdout.decode()
        for part in ("state history", "finished", "served", "30 items", rec["shape"]):
            assert part in text
    finally:
        assert b.stop() == 0
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        for arg in (rec["shape"], rec["shape"][:12], label):
            out = b.run("shapes", "inspect", arg, "--json")
            assert out.returncode == 0, (arg, out.stderr)
            doc = json.loads(out.stdout)
            assert (doc["shape"], doc["state"], doc["served_items"]) == (rec["shape"],
                                                                         "finished", 30)
            assert doc["history"] == rec["history"] and doc["batches"] == rec["batches"]
        assert any(s["shape"] == rec["shape"] for s in listed(b, "--all"))
        twins = [{**native(f"twin-{m}", "TWIN"), "model": m, "label": "twin"}
                 for m in ("fabric-demo", "nobody-serves-this")]
        assert b.run("submit", "-", input=jsonl(twins)).returncode == 0
        out = b.run("shapes", "inspect", "twin")
        assert out.returncode == 1 and out.stdout == b""
        line, _, *twin_lines = error_lines(out.stderr)
        assert line == ("fabricctl: error: 'twin' names 2 shapes; they share one signature "
                        "under several models, which no name tells apart: fabricctl shapes "
                        "list --all --json shows each")
        assert sorted(ln.split()[2] for ln in twin_lines) == ["fabric-demo",
                                                             "nobody-serves-this"]
    finally:
        assert b.stop() == 0
