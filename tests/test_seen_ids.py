"""`SeenIds` answers as a dict of every id would, whether its ids are in RAM or spilled to
its temporary LMDB; `drafts` names a repeated id's first line across a spill."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

import fabricctl.formats.seen_ids as seen_ids
from fabricctl.formats.lines import Drafted, LineError, drafts
from fabricctl.formats.seen_ids import SeenIds

ids = st.text(min_size=1, max_size=600)  # past LMDB's 511-byte keys too


@settings(max_examples=60, deadline=None)
@given(st.lists(ids, max_size=60), st.integers(min_value=1, max_value=8))
def test_answers_as_a_dict_of_every_id(seq: list[str], ram_max: int) -> None:
    model: dict[str, int] = {}
    seen = SeenIds(ram_max)
    try:
        for line, id_ in enumerate(seq, 1):
            assert seen.first(id_) == model.get(id_)
            if id_ not in model:
                model[id_] = line
                seen.add(id_, line)
        for id_, line in model.items():
            assert seen.first(id_) == line
        assert seen.first("never-added\x00") is None
    finally:
        seen.close()


def test_a_spilled_reader_keeps_at_most_ram_max_ids_and_close_removes_its_files() -> None:
    seen = SeenIds(3)
    for n in range(10):
        seen.add(f"id{n}", n + 1)
    assert len(seen._ram) < 3 and seen._dir is not None and seen._dir.is_dir()
    where = seen._dir
    assert [seen.first(f"id{n}") for n in range(10)] == list(range(1, 11))
    seen.close()
    assert not where.exists()
    seen.close()  # twice is harmless


def test_a_reader_that_never_spills_makes_no_files() -> None:
    seen = SeenIds(100)
    seen.add("a", 1)
    assert seen._dir is None
    seen.close()


def test_drafts_name_the_first_line_of_an_id_repeated_after_a_spill(monkeypatch) -> None:
    monkeypatch.setattr(seen_ids, "RAM_MAX", 2)
    rows = [json.dumps({"id": f"q{n}", "model": "m", "prompt": "p", "max_tokens": 1}).encode()
            for n in range(6)]
    rows.append(json.dumps({"id": "q1", "model": "m", "prompt": "again", "max_tokens": 1}).encode())
    out = list(drafts(rows))
    assert [o.line_no for o in out if isinstance(o, Drafted)] == [1, 2, 3, 4, 5, 6]
    errors = [o for o in out if isinstance(o, LineError)]
    assert [(e.line_no, e.reason) for e in errors] == [(7, "id 'q1' is a duplicate of line 2")]
