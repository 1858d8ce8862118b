"""The tables a user reads and copies from, as a subprocess against a real broker
(`fabricctl up --engine sim`): on a terminal of 80 and 120 columns `jobs`, `shapes list` and
`status` show whole job ids, signatures, states and numbers under headers that are never
blank, hiding other columns first (and saying so); through a pipe `status` is not laid out
for a terminal at all (nothing cut with "…", no number cut); `shapes inspect LABEL` for a
label several jobs gave lists the shapes with their state and jobs and says how to pick one.
The widths themselves (`fit_widths`) are checked directly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cli_helpers import Broker, error_lines, fabricctl_tty
from rich.cells import cell_len

from fabricctl.cli.common import Col, fit_widths, table_width

DEADLINE_S = 60.0


def native(ident: str, prefix: str, label: str) -> dict:
    return {"id": ident, "model": "fabric-demo", "prefix": [prefix, "FEW"],
            "prompt": f"question {ident}", "max_tokens": 8, "label": label}


def chat(ident: str, system: str) -> dict:
    """One OpenAI Batch API line (what `submit` takes from an OpenAI batch file)."""
    return {"custom_id": ident, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fabric-demo", "max_tokens": 8,
                     "messages": [{"role": "system", "content": system},
                                  {"role": "user", "content": f"question {ident}"}]}}


def jsonl(objs: list[dict]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def submitted(b: Broker, data: bytes, *args: str) -> str:
    """Submit and wait; the job's id, once it has settled past finalizing (bounded polling)."""
    out = b.run("submit", *args, "--wait", input=data)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stderr.decode().splitlines() if ln.startswith("fabricctl: job ")]
    job = line.split()[2]
    deadline = time.monotonic() + DEADLINE_S
    while json.loads(b.run("jobs", "show", job, "--json").stdout)["job"]["state"] == "finalizing":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return job


@dataclass
class Fleet:
    """Why: the tests share one broker and the ids of the three jobs it ran."""

    broker: Broker
    jobs: list[str]  # the OpenAI batch file's, then two that gave one label to two shapes


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("tables")
    b = Broker(home / "broker", home)
    # an OpenAI batch file from a long path: the INPUT column is what used to squeeze the id
    src = home / "a-directory-with-a-rather-long-name" / "and-another-one" / "openai_batch.jsonl"
    src.parent.mkdir(parents=True)
    src.write_bytes(jsonl([chat(f"support-{i}", f"You are assistant {i % 2}.")
                           for i in range(12)]))
    yield Fleet(b, [
        submitted(b, b"", str(src)),
        submitted(b, jsonl([native(f"a{i}", "SYS-A", "twice") for i in range(30)]), "-"),
        submitted(b, jsonl([native(f"b{i}", "SYS-B", "twice") for i in range(30)]), "-")])
    assert b.stop() == 0


def tty(b: Broker, *args: str, columns: int) -> list[str]:
    """`fabricctl ARGS` on a terminal `columns` wide: its lines (exit 0)."""
    out = fabricctl_tty(*args, "--data-dir", str(b.data_dir), env=b.env, cwd=b.home,
                        columns=columns)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.decode().splitlines()
    for ln in lines:
        assert cell_len(ln) <= columns, (columns, ln)
    return lines


def cells(line: str) -> list[str]:
    """The cells of one table row or header line (`┃ A ┃ B ┃`, `│ a │ b │`)."""
    sep = "┃" if "┃" in line else "│"
    return [c.strip() for c in line.strip().strip(sep).split(sep)]


def headers(lines: list[str]) -> list[str]:
    (head,) = [ln for ln in lines if ln.startswith("┃")]
    return cells(head)


def rows(lines: list[str]) -> list[list[str]]:
    return [cells(ln) for ln in lines if ln.startswith("│")]


@pytest.mark.parametrize("columns", [80, 120])
def test_jobs_on_a_terminal_show_whole_ids_and_states_under_headers(fleet: Fleet,
                                                                   columns: int) -> None:
    broker = fleet.broker
    lines = tty(broker, "jobs", columns=columns)
    head = headers(lines)
    assert head[:2] == ["JOB", "STATE"] and "PROGRESS" in head
    assert all(h and "…" not in h for h in head), head
    listed = {r[0]: r for r in rows(lines)}
    states = {j["id"]: j["state"] for j in json.loads(broker.run("jobs", "--json").stdout)["jobs"]}
    for job in fleet.jobs:
        row = listed[job]  # the whole id, in its own cell
        assert row[1] == states[job] == "completed"
        assert "…" not in row[head.index("PROGRESS")]
    hidden = [ln for ln in lines if ln.startswith("hidden at ")]
    if columns == 80:  # fifteen columns do not fit in 80: the note names those hidden
        assert hidden and "see jobs show ID" in " ".join(lines)


@pytest.mark.parametrize("columns", [80, 120])
def test_shapes_list_and_status_on_a_terminal_show_whole_signatures(fleet: Fleet,
                                                                    columns: int) -> None:
    broker = fleet.broker
    shapes = json.loads(broker.run("shapes", "list", "--all", "--json").stdout)["shapes"]
    lines = tty(broker, "shapes", "list", "--all", columns=columns)
    assert all(h and "…" not in h for h in headers(lines))
    assert {r[0] for r in rows(lines)} == {s["shape"] for s in shapes}
    assert {r[headers(lines).index("STATE")] for r in rows(lines)} == {s["state"] for s in shapes}

    st = json.loads(broker.run("status", "--json").stdout)
    text = "\n".join(tty(broker, "status", columns=columns))
    for c in st["consumers"]:
        assert c["name"] in text and f"{c['items_done']:,}" in text
        assert c["current"] is None or c["current"] in text


@pytest.mark.parametrize("columns", ["80", ""])  # "": no COLUMNS at all
def test_status_through_a_pipe_cuts_nothing(fleet: Fleet, columns: str) -> None:
    broker = fleet.broker
    out = broker.run("status", COLUMNS=columns)  # stdout is a pipe: `fabricctl status | cat`
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "…" not in text
    st = json.loads(broker.run("status", "--json").stdout)
    led = st["ledger"]
    assert f"{led['items_received']:,} items, {led['tokens_received']:,} tokens" in text
    first = text.splitlines()[0]  # the broker's title line, not wrapped at its table's width
    assert first.startswith(f"broker {st['version']} at ") and "engine sim" in first
    (head,) = [ln for ln in text.splitlines() if "NAME" in ln and "ITEMS" in ln]
    assert cells(head) == ["NAME", "MODEL", "SHAPE", "NEXT", "BATCH", "TOKENS/BATCH",
                           "IN FLIGHT", "BATCHES", "ITEMS"]  # every column, one header line
    for c in st["consumers"]:
        (row,) = [cells(ln) for ln in text.splitlines() if ln.startswith(f"│ {c['name']} ")]
        assert row[0] == c["name"] and row[2] == (c["current"] or "-")
        assert row[5:] == [f"{c['max_batch_tokens']:,}", str(c["batches_inflight"]),
                           f"{c['batches_done']:,}", f"{c['items_done']:,}"]


def test_shapes_inspect_an_ambiguous_label_lists_its_shapes_and_how_to_pick_one(
        fleet: Fleet) -> None:
    broker = fleet.broker
    shapes = [s for s in json.loads(broker.run("shapes", "list", "--all", "--json").stdout)
              ["shapes"] if s["label"] == "twice"]
    assert len(shapes) == 2  # two jobs, two prefixes, one label
    _, job_a, job_b = fleet.jobs
    for args in (["twice"], ["twice", "--json"]):
        out = broker.run("shapes", "inspect", *args)
        assert out.returncode == 1 and out.stdout == b""  # Ambiguous: exit 1, as documented
        first, head, *listed = error_lines(out.stderr)
        assert first.startswith("fabricctl: error: 'twice' names 2 shapes; inspect one by its "
                                "signature, e.g. fabricctl shapes inspect ")
        assert head.split() == ["SHAPE", "LABEL", "MODEL", "STATE", "JOBS"]
        by_shape = {ln.split()[0]: ln.split() for ln in listed}
        assert set(by_shape) == {s["shape"] for s in shapes}
        for s in shapes:
            assert by_shape[s["shape"]][1:4] == ["twice", "fabric-demo", s["state"]]
        assert {by_shape[s["shape"]][4] for s in shapes} == {job_a, job_b}
        example = first.rsplit(" ", 1)[1]  # the command it suggests works
        assert example in by_shape
        picked = broker.run("shapes", "inspect", example, "--json")
        assert picked.returncode == 0 and json.loads(picked.stdout)["shape"] == example


# ---- the widths ----------------------------------------------------------------------------


COLS = [Col("JOB"), Col("INPUT", shrink=8, drop=2), Col("N", True), Col("NOTE", drop=1),
        Col("EMPTY", drop=3)]


def test_kept_columns_are_never_cut_and_others_give_way_in_order() -> None:
    natural, blank = [14, 40, 6, 10, 5], [False, False, False, False, True]
    # everything fits: natural widths
    assert fit_widths(COLS, natural, blank, 200) == natural
    # a blank column goes first (as soon as the input would be cut), then shrink, then drop
    assert fit_widths(COLS, natural, blank, table_width([14, 40, 6, 10])) == [14, 40, 6, 10,
                                                                              None]
    assert fit_widths(COLS, natural, blank, table_width([14, 20, 6, 10])) == [14, 20, 6, 10,
                                                                              None]
    assert fit_widths(COLS, natural, blank, table_width([14, 8, 6, 10])) == [14, 8, 6, 10, None]
    # the input is never cut below its shrink width: with less room it is hidden (its drop
    # is the higher), the note stays whole
    assert fit_widths(COLS, natural, blank, table_width([14, 8, 6, 10]) - 1) == [
        14, None, 6, 10, None]
    # narrower still: only the kept columns, whole
    assert fit_widths(COLS, natural, blank, 30) == [14, None, 6, None, None]
    assert fit_widths(COLS, natural, blank, 10) == [14, None, 6, None, None]  # Rich folds


def test_a_shrinkable_column_is_never_narrower_than_its_header() -> None:
    cols = [Col("ID"), Col("A-LONG-HEADER", shrink=4)]
    assert fit_widths(cols, [10, 30], [False, False], table_width([10, 5])) == [10, 13]
