"""`--ordered`: `run`, `submit --wait` and `results` write results in input (ingest) order.

Promises checked: with several shapes interleaved the completion order differs from the
input order (the precondition: without `--ordered` output is in completion order, every
line once); `run --ordered` and `submit --wait --ordered` give exactly the accepted lines'
results in input order, refused lines skipped (after a `--timeout`, what came is still
written, in input order); the reorder buffer writes each result the moment every earlier
one is out and holds only the early ones; `results --ordered` lists
every stored result once in entry-key order (commit by commit, grouped by shape within a
commit, input order within a shape); flags that cannot combine are usage errors (exit 2).
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from cli_helpers import Broker, clean_env, error_lines, fabricctl

from fabricctl.cli.ordered import InputOrder
from fabricctl.formats.results import ResultRecord


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
    lines.insert(5, b"[1]\n")  # a rejected line has no result and no place
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    want = [x["id"] for x in items]
    got = {}
    for mode in ("plain", "ordered"):
        out_file = tmp_path / f"{mode}.jsonl"
        out = fabricctl("run", str(path), "-o", str(out_file), "--engine", "sim", "--json",
                        *(["--ordered"] if mode == "ordered" else []),
                        env=clean_env(tmp_path), cwd=tmp_path, timeout=180)
        assert out.returncode == 0, out.stderr
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
    lines.insert(10, j(plain_items[0]))  # refused by the broker: a stored id
    out = broker.run("submit", "-", "--wait", "--ordered", "--timeout", "120",
                     input=b"".join(lines))
    assert out.returncode == 1  # some lines refused
    assert error_lines(out.stderr) == [
        "fabricctl: error: line 4: line must be a JSON object, not an array",
        f"fabricctl: error: line 11: duplicate id {plain_items[0]['id']!r}"]
    assert ids_of(out.stdout) == [x["id"] for x in ordered_items]


def test_submit_ordered_timeout_still_writes_what_came(broker: Broker) -> None:
    stuck = {"id": "to-stuck", "model": "no-consumer-serves-this-model", "prompt": "p",
             "max_tokens": 2}
    served = interleaved("to", 3)
    out = broker.run("submit", "-", "--wait", "--ordered", "--timeout", "3",
                     input=b"".join(j(x) for x in [stuck, *served]))
    assert out.returncode == 4
    assert ids_of(out.stdout) == [x["id"] for x in served]  # held behind the stuck one
    assert error_lines(out.stderr) == [
        "fabricctl: warning: no consumer serves model 'no-consumer-serves-this-model' "
        "(served: fabric-demo): its 1 item waits until one joins",
        "fabricctl: error: timed out after 3 s with 1 result(s) missing (3 written)"]


def test_submit_ordered_needs_wait(broker: Broker) -> None:
    out = broker.run("submit", "-", "--ordered", input=j(interleaved("nw", 1)[0]))
    assert out.returncode == 2 and out.stdout == b""
    assert error_lines(out.stderr) == [
        "fabricctl: error: --ordered orders the results that --wait prints; add --wait"]


class _EarlyClient:
    """A broker stand-in whose results beat their acks and come back to front."""

    def __init__(self) -> None:
        self.stored: list[tuple[int, ResultRecord]] = []
        self.served = asyncio.Event()

    async def submit(self, items: list) -> object:
        from fabricctl.wire.protocol import Ack, Reject

        for it in reversed(items):  # completion order: last first
            if it.id != "refused":
                self.stored.append((len(self.stored) + 1, rec(it.id)))
        self.served.clear()
        await self.served.wait()  # the ack only after the poller saw the results
        return Ack(0, len(items) - 1, [Reject(i, "duplicate id 'refused'")
                                       for i, it in enumerate(items) if it.id == "refused"])

    async def query(self, what: str, since: int = 0, limit: int = 1000, **_: object) -> list:
        page = [(s, r) for s, r in self.stored if s > since][:limit]
        self.served.set()
        return page


def test_submitter_orders_results_that_beat_their_ack() -> None:
    from fabricctl.cli.submit import Submitter
    from fabricctl.config import AppConfig

    ids = ["x1", "x2", "refused", "x3", "x4"]
    data = b"".join(j({"id": i, "model": "m", "prompt": "p", "max_tokens": 1}) for i in ids)
    out, err = io.BytesIO(), io.StringIO()

    async def go() -> Submitter:
        sub = Submitter(_EarlyClient(), AppConfig(), wait=True, out=out, err=err,  # type: ignore[arg-type]
                        ordered=True)
        collector = asyncio.ensure_future(sub.collect(0))
        await sub.feed(io.BytesIO(data))
        await asyncio.wait_for(collector, 30)
        return sub

    sub = asyncio.run(go())
    assert err.getvalue() == "fabricctl: error: line 3: duplicate id 'refused'\n"
    assert ids_of(out.getvalue()) == ["x1", "x2", "x3", "x4"] and sub.written == 4


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
    assert sorted(ordered) == sorted(stored) and len(set(ordered)) == len(ordered)
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
