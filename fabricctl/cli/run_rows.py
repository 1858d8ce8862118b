"""The rows `fabricctl run` writes itself, for lines no engine answers.

Contract: items for a model none of the run's own consumers serves (`Unserved`) are not
sent: each gets an error result line at once (its error names the model and what is served; OpenAI
form: status 404), stderr gets one `fabricctl: error: N items are for model 'M', which no
consumer serves (served: ...)` per such model when the input has been read, the rest runs,
and the command exits 1 (`RunSummary.unserved` counts them); with `ordered` an unserved
item's error result takes its place in the input order.
Refused lines (`RefusedRows`): every line the reader or the broker refuses is reported on
stderr as `line N: reason` (as before), and an OpenAI batch line also gets a row in the
output, in `vllm run-batch`'s form for a line it does not run (`formats.results.
refused_line`: status 400, no body, the message as `error`; `custom_id` "" when the line
has none that reads as a string). A line whose form cannot be told (not JSON, not an
object, too long) takes the input's form: that of the input's first line whose form can be
told (rows for such lines at the start wait until it is read; with none, they get no row).
A native line gets no row: native output has one line per item, errors on stderr. Rows go
out as the line is read, or with `ordered` at the line's place in the input order. The
command then exits 1, as `submit` does (`RunSummary.rejected` counts the lines).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable

from fabricctl.core.types import Item, ItemResult
from fabricctl.formats.reader import LineError
from fabricctl.formats.results import ResultRecord, Source, make_record, refused_line
from fabricctl.producer import Chunk


class Unserved:
    """Why: an item for a model no consumer of this run serves would wait forever; it gets
    an error result at once instead, and the run says which model and what is served."""

    def __init__(self, served: Iterable[str], write: Callable[[ResultRecord], object]) -> None:
        self.served = sorted(set(served))
        self._served = set(self.served)
        self.write = write
        self.counts: dict[str, int] = {}  # model -> items not sent, in order of first sight

    def take(self, item: Item) -> ResultRecord | None:
        """None for an item a consumer serves; else its error result (it is not sent)."""
        if item.model in self._served:
            return None
        self.counts[item.model] = self.counts.get(item.model, 0) + 1
        result = ItemResult(item.id, finish_reason="error", error=self.reason(item.model),
                            status=404)  # 404: what OpenAI answers for an unknown model
        return make_record(item, result, created=int(time.time()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reason(self, model: str) -> str:
        return f"no consumer serves model {model!r} (served: {self._listed()})"

    def messages(self) -> list[str]:
        """One line per unserved model, for stderr."""
        return [f"{n:,} item{'s are' if n != 1 else ' is'} for model {m!r}, which no "
                f"consumer serves (served: {self._listed()}); each gets an error result"
                for m, n in self.counts.items()]

    def _listed(self) -> str:
        return ", ".join(self.served) or "none"


class RefusedRows:
    """Why: `vllm run-batch` writes a row for every line it does not run, so a refused
    OpenAI batch line gets one too (see the module's contract): at once, or with `ordered`
    held until every earlier line's row is out (`before`, `finish`)."""

    def __init__(self, write: Callable[[bytes], object], ordered: bool) -> None:
        self.write, self.ordered = write, ordered
        self.openai: bool | None = None  # the input's form, once a line of known form came
        self.rows = 0  # rows made
        self._unknown: list[LineError] = []  # lines of unknown form before `openai` is known
        self._held: list[tuple[int, bytes]] = []  # ordered: (line, row), a heap

    def chunk(self, chunk: Chunk) -> None:
        """A chunk read: learn the input's form from it, then row its refused lines."""
        if self.openai is None:
            error = next((e for e in chunk.errors if e.openai is not None), None)
            item = chunk.items[0] if chunk.items else None
            if item is not None and (error is None or item.line < error.line_no):
                self._learn(item.source != Source.NATIVE)
            elif error is not None:
                self._learn(bool(error.openai))
        for e in chunk.errors:
            if e.openai is None and self.openai is None:
                self._unknown.append(e)
            else:
                self._refused(e)

    def rejected(self, item: Item, reason: str) -> None:
        """An item the broker refused."""
        if item.source != Source.NATIVE:
            self._row(item.line, reason, item.id)

    def before(self, line: int) -> None:
        """Ordered: write the held rows of the lines before `line` (its result goes next)."""
        held = self._held
        while held and held[0][0] < line:
            self.write(heapq.heappop(held)[1])

    def finish(self) -> None:
        """The input is read and every result written: the rows still held go."""
        self._unknown.clear()  # no line of known form: native, no row
        while self._held:
            self.write(heapq.heappop(self._held)[1])

    def _learn(self, openai: bool) -> None:
        self.openai = openai
        waiting, self._unknown = self._unknown, []
        for e in waiting:
            self._refused(e)

    def _refused(self, e: LineError) -> None:
        openai = self.openai if e.openai is None else e.openai
        if openai:
            self._row(e.line_no, e.reason, e.id)

    def _row(self, line: int, reason: str, custom_id: str | None) -> None:
        row = refused_line(line, reason, custom_id)
        self.rows += 1
        if self.ordered:
            heapq.heappush(self._held, (line, row))
        else:
            self.write(row)
