"""`wire.questions.pages`: a paged question read to its end, every row once, in order."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from fabricctl.wire.questions import pages


def _read(rows: list[int], size: int) -> tuple[list[list[int]], list[int]]:
    """The pages `pages` gives over `rows` (cursor: the row itself), and the cursors asked."""
    asked: list[int] = []

    async def fetch(after: int, limit: int) -> list[int]:
        asked.append(after)
        return [r for r in rows if r > after][:limit]

    async def collect() -> list[list[int]]:
        return [page async for page in pages(fetch, -1, lambda r: r, size)]

    return asyncio.run(collect()), asked


@given(st.lists(st.integers(0, 10_000), unique=True).map(sorted), st.integers(1, 7))
def test_every_row_once_in_order_no_empty_page(rows: list[int], size: int) -> None:
    got, asked = _read(rows, size)
    assert [r for page in got for r in page] == rows
    assert all(page and len(page) <= size for page in got)
    # one question per full page, and one more that comes back short (possibly empty)
    assert len(asked) == len(rows) // size + 1
