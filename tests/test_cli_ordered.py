"""`--ordered`: `run`, `submit --wait` and `results` write results in input (ingest) order.

Promises checked: with several shapes interleaved the completion order differs from the
input order (the precondition: without `--ordered` output is in completion order, every
line once); `run --ordered` and `submit --wait --ordered` give exactly the accepted lines'
results in input order, refused native lines skipped (`run` exits 1; refused OpenAI lines'
rows: test_run_refused.py) (after a `--timeout`, what came is still
written, in input order); the reorder buffer writes each result the moment every earlier
one is out and holds only the early ones; `results --ordered` lists
every stored result once in entry-key order (commit by commit, grouped by shape within a
commit, input order within a shape); flags that cannot combine are usage errors (exit 2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path

import msgspec
import pytest
from cli_helpers import Broker, clean_env, error_lines, fabricctl

from fabricctl.formats.results import ResultRecord
from fabricctl.producer import InputOrder


def j(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def interleaved(tag: str, n: int = 300, shapes: int = 3) -> list[dict]:
    """`n` native items cycling through `shapes` prefixes, with varied lengths."""
    return [{"id": f"{tag}-{i:04d}", "model": "fabric-demo",
             "prefix": [f"SYS-{tag}-{i % shapes}", "FEW"], "prompt": "q" * (i * 37 % 700),
             "max_tokens": 2 + i * 7 % 40} for i in range(n)]


def ids_of(stdout: bytes) -> list[str]:
    return [json.loads(x)["id"] for x in stdout.splitlines()]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("cli-ordered")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


# ---- the reorder buffer ---------------------------------------------------------------------


def rec(ident: str) -> ResultRecord:
    return ResultRecord(ident, "m")


def test_input_order_streams_and_holds_only_early_results() -> None:
    out: list[str] = []
    order = InputOrder(lambda r: out.append(r.id))
    order.expect(["a", "b", "c", "d", "e"])
    order.add(rec("a"))
    assert out == ["a"] and order.held == 0  # its turn: written at once
    order.add(rec("c"))
    order.add(rec("e"))
    assert out == ["a"] and order.held == 2  # b is missing: c and e wait
    order.drop("d")  # refused after all: no result will come
    order.add(rec("b"))
    assert out == ["a", "b", "c", "e"] and order.held == 0
    order.expect(["f", "g"])
    order.add(rec("g"))
    order.finish()  # f never came (a timeout): g still goes out
    assert out == ["a", "b", "c", "e", "g"] and order.written == 5


# ---- run ------------------------------------------------------------------------------------


def test_run_ordered_writes_input_order_and_unordered_completion_order(tmp_path: Path) -> None:
    items = interleaved("run")
    lines = [j(x) for x in items]
    lines.insert(5, b"[1]\n")  # refused: in native input, no row (stderr), and exit 1
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    want = [x["id"] for x in items]
    got = {}
    for mode in ("plain", "ordered"):
        out_file = tmp_path / f"{mode}.jsonl"
        out = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                        *(["--ordered"] if mode == "ordered" else []),
                        env=clean_env(tmp_path), cwd=tmp_path, timeout=180)
        assert out.returncode == 1, out.stderr
        assert json.loads(out.stdout)["rejected"] == 1
        assert error_lines(out.stderr) == [
            "line 6: line must be a JSON object, not an array"]
        got[mode] = ids_of(out_file.read_bytes())
        assert sorted(got[mode]) == sorted(want)  # every accepted line exactly once
    assert got["plain"] != want  # completion order is not input order here...
    assert got["ordered"] == want  # ...and --ordered restores it


# ---- submit --wait --------------------------------------------------------------------------


def test_submit_wait_ordered_gives_input_order(broker: Broker) -> None:
    plain_items, ordered_items = interleaved("sp"), interleaved("so")
    plain = broker.run("submit", "-", "--wait", "--timeout", "120",
                       input=b"".join(j(x) for x in plain_items))
    assert plain.returncode == 0, plain.stderr
    assert sorted(ids_of(plain.stdout)) == sorted(x["id"] for x in plain_items)
    assert ids_of(plain.stdout) != [x["id"] for x in plain_items]  # completion order

    lines = [j(x) for x in ordered_items]
    lines.insert(3, b"[1]\n")  # refused by the reader
    lines.insert(10, j(plain_items[0]))  # another job's id: an item of this job too
    out = broker.run("submit", "-", "--wait", "--ordered", "--timeout", "120",
                     input=b"".join(lines))
    assert out.returncode == 1  # a line refused
    assert error_lines(out.stderr) == [
        "fabricctl: error: line 4: line must be a JSON object, not an array"]
    want = [x["id"] for x in ordered_items]
    want.insert(9, plain_items[0]["id"])  # line 11, after the refused line 4
    assert ids_of(out.stdout) == want


def test_submit_ordered_timeout_still_writes_what_came(broker: Broker) -> None:
    stuck = {"id": "to-stuck", "model": "no-consumer-serves-this-model", "prompt": "p",
             "max_tokens": 2}
    served = interleaved("to", 3)
    out = broker.run("submit", "-", "--wait", "--ordered", "--timeout", "3",
                     input=b"".join(j(x) for x in [stuck, *served]))
    assert out.returncode == 4
    assert ids_of(out.stdout) == [x["id"] for x in served]  # held behind the stuck one
    warning, *rest = error_lines(out.stderr)
    assert warning == ("fabricctl: warning: no consumer serves model "
                       "'no-consumer-serves-this-model' (served: fabric-demo): its 1 item "
                       "waits until one joins")
    assert len(rest) == 1 and rest[0].startswith(
        "fabricctl: error: timed out after 3 s with 1 result(s) missing (3 written); "
        "`fabricctl results --job batch_")


def test_submit_ordered_needs_wait(broker: Broker) -> None:
    out = broker.run("submit", "-", "--ordered", input=j(interleaved("nw", 1)[0]))
    assert out.returncode == 2 and out.stdout == b""
    assert error_lines(out.stderr) == [
        "fabricctl: error: --ordered orders the results that --wait prints; add --wait"]


class _TwoSources:
    """A broker stand-in: the job already has results (the sweep), the result stream (pushed:
    its job's rows only) repeats some of them, and its last push carries the ended job."""

    def __init__(self) -> None:
        mine = [msgspec.structs.replace(rec(f"x{i}"), job=7, line=i) for i in range(1, 6)]
        self.swept = mine[:2]
        self.stream = [(1, mine[1]), (3, mine[3]), (4, mine[2]), (5, mine[4])]

    async def job_results(self, job: str, after_line: int = 0, limit: int = 1000) -> list:
        return sorted((r for r in self.swept if r.line > after_line),
                      key=lambda r: r.line)[:limit]

    async def follow_results(self, job: int = 0, since: int = -1) -> AsyncGenerator:
        from fabricctl.core.jobs import JobRecord, JobState
        from fabricctl.wire.queries import ResultsPush

        yield ResultsPush(1, 0)  # the stream starts: the sweep follows
        for s, r in self.stream:
            yield ResultsPush(1, s, [(s, r)])
        yield ResultsPush(1, 6, [], JobRecord(number=7, id="batch_7", kind="submit", total=5,
                                              completed=5, sealed=True,
                                              state=JobState.COMPLETED))


def test_the_follower_writes_each_result_of_its_job_once() -> None:
    from fabricctl.producer import JobFollower

    written: list[str] = []

    async def go() -> None:
        f = JobFollower(_TwoSources(), "batch_7", 7, lambda r: written.append(r.id))
        job = await asyncio.wait_for(f.run(), 30)
        assert job.state.value == "completed" and f.written == 5

    asyncio.run(go())
    assert written == ["x1", "x2", "x4", "x3", "x5"]  # the sweep, then the stream, once each


# ---- results --ordered ----------------------------------------------------------------------


def test_results_ordered_is_entry_key_order(broker: Broker) -> None:
    single = [{**x, "prefix": ["SYS-single", "FEW"]} for x in interleaved("one", 200)]
    multi = interleaved("multi", 300)  # one chunk: one commit, three shapes
    for batch in (single, multi):
        out = broker.run("submit", "-", "--wait", "--timeout", "120",
                         input=b"".join(j(x) for x in batch))
        assert out.returncode == 0, out.stderr
    stored = ids_of(broker.run("results").stdout)
    listing = broker.run("results", "--ordered")
    assert listing.returncode == 0 and listing.stderr == b""
    ordered = ids_of(listing.stdout)
    assert sorted(ordered) == sorted(stored)  # an id may repeat: in another job
    assert ordered != stored  # storage (completion) order differs

    def block(batch: list[dict]) -> list[str]:
        mine = {x["id"] for x in batch}
        pos = [i for i, ident in enumerate(ordered) if ident in mine]
        assert pos == list(range(pos[0], pos[0] + len(batch)))  # contiguous: its commits
        return [ordered[i] for i in pos]

    assert block(single) == [x["id"] for x in single]  # one shape: input order
    by_shape = [[x["id"] for x in multi if x["prefix"][0] == f"SYS-multi-{s}"]
                for s in range(3)]  # shapes in the order they first came
    assert block(multi) == by_shape[0] + by_shape[1] + by_shape[2]

    doc = json.loads(broker.run("results", "--ordered", "--json").stdout)
    assert [r["id"] for r in doc["results"]] == ordered
    assert doc["since"] == 0 and doc["next"] == len(stored)


@pytest.mark.parametrize("flags", [["--since", "3"], ["--follow"]])
def test_results_ordered_refuses_since_and_follow(broker: Broker, flags: list[str]) -> None:
    out = broker.run("results", "--ordered", *flags)
    assert out.returncode == 2 and out.stdout == b""
    assert len(error_lines(out.stderr)) == 1
