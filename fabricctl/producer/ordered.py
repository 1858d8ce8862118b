"""`--ordered`: results written in input order, as `vllm run-batch` writes them.

Contract: an `InputOrder` is told the ids of the accepted items in input order (`expect`),
the ones the broker refused after all (`drop`), and each result as it completes (`add`,
only results of expected ids). It writes a result the moment every earlier input's result
has been written, so output still streams when completions come roughly in input order;
it holds only the results that came early (out of order), plus the ids not yet written
(ids, never records). `finish()` writes what it still holds in input order, skipping ids
whose result never came (a timeout); `written` counts the results written so far.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from fabricctl.formats.results import ResultRecord


class InputOrder:
    """Why: completions come in any order; `--ordered` readers want their input's order."""

    def __init__(self, write: Callable[[ResultRecord], object]) -> None:
        self._write = write
        self._order: deque[str] = deque()  # ids in input order, result not written yet
        self._held: dict[str, ResultRecord] = {}  # results whose turn has not come
        self._dropped: set[str] = set()  # ids still in `_order` that will have no result
        self.written = 0

    def expect(self, ids: Iterable[str]) -> None:
        """The next accepted (or sent, see `drop`) ids, in input order."""
        self._order.extend(ids)
        self._drain()

    def drop(self, item_id: str) -> None:
        """An expected id that will have no result (the broker refused it)."""
        self._dropped.add(item_id)
        self._drain()

    def add(self, rec: ResultRecord) -> None:
        """A result of an expected id: written now if its turn has come, else held."""
        if self._order and self._order[0] == rec.id:
            self._order.popleft()
            self._emit(rec)
            self._drain()
        else:
            self._held[rec.id] = rec

    @property
    def held(self) -> int:
        """Results waiting for an earlier input's result."""
        return len(self._held)

    def finish(self) -> None:
        """Write every held result in input order; ids with no result are skipped."""
        while self._order and self._held:
            rec = self._held.pop(self._order.popleft(), None)
            if rec is not None:
                self._emit(rec)
        self._order.clear()
        self._dropped.clear()
        self._held.clear()  # results of ids never expected: the caller's to avoid

    def _drain(self) -> None:
        order, held, dropped = self._order, self._held, self._dropped
        while order:
            head = order[0]
            if head in dropped:
                dropped.discard(head)
            elif head in held:
                self._emit(held.pop(head))
            else:
                return
            order.popleft()

    def _emit(self, rec: ResultRecord) -> None:
        self._write(rec)
        self.written += 1
