"""The reliability suite's history, checker and session totals.

A `History` records what the clients saw, Jepsen style: each submit (`invoke`, then `ok`
per id on its ack, or `info` when the connection died before the ack), each batch a
recording consumer received (`dispatch`), each completion it sent (`complete`, with the
broker's stored count, or None when the answer never came back) and each broker crash. The
`check` function compares that history with the result sink (the broker's result sequence,
read in full after the final drain) and reports:

- lost: acknowledged ids with no result;
- duplicated: ids with more than one entry in the result sequence, or a result whose text is
  not the one its own id produces (a result that belongs to another item);
- unexpected: results (or dispatches) for ids that were never acknowledged (never submitted);
- recovered: ids that were in flight at a crash (dispatched and not confirmed complete, or
  submitted and not acknowledged) and still ended with exactly one result.

Lost, duplicated and unexpected must be zero; `TOTALS` sums every scenario of the session
for the one-line summary the conftest prints.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item
from fabricctl.engines.simrequest import sim_text
from fabricctl.formats.results import ResultRecord

MODEL = "m"
PREFIXES = (
    ("You are a careful assistant.", "Example: 2+2=4."),
    ("You translate English to French.",),
    ("System: terse.", "Shots: a->b, c->d.", "Tools: calc(x)"),
)


def make_item(n: int, tag: str = "r", model: str = MODEL) -> Item:
    """Item n of a reliability workload: deterministic, one of three shapes, varied length."""
    comps = PREFIXES[n % len(PREFIXES)]
    comp_tokens = [40 + 16 * i for i in range(len(comps))]
    prompt_tokens = 8 + (n * 7919) % 200
    payload = Payload(list(comps), f"question {tag}{n}", comp_tokens, prompt_tokens)
    return Item(f"{tag}{n}", model, signature(list(comps)), sum(comp_tokens) + prompt_tokens,
                4 + n % 8, encode_payload(payload))


def sim_text_ok(rec: ResultRecord) -> bool:
    """A simulated result's text is the one its own id produces (or it has none to check)."""
    if rec.error is not None or rec.finish_reason in ("length_exceeded", "error"):
        return True
    return rec.text == sim_text(rec.id, rec.completion_tokens)


@dataclass
class Totals:
    """Why: one line at the end of the session says what the whole suite put the broker through."""

    kills: int = 0
    faults: int = 0  # kills made by an injected fault point (the rest: SIGKILL from outside)
    items: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    scenarios: int = 0
    points: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        return (f"reliability: {self.kills} kills, {self.faults} faults injected, "
                f"{self.items} items, lost {self.lost}, duplicated {self.duplicated}, "
                f"unexpected {self.unexpected}, recovered {self.recovered} "
                f"({self.scenarios} checked histories)")


TOTALS = Totals()


@dataclass
class Report:
    """What `check` found in one history."""

    items: int
    lost: list[str]
    duplicated: list[str]
    unexpected: list[str]
    recovered: int
    wrong_text: list[str]

    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.wrong_text)

    def __str__(self) -> str:
        return (f"{self.items} items: lost {len(self.lost)} {self.lost[:5]}, duplicated "
                f"{len(self.duplicated)} {self.duplicated[:5]}, unexpected "
                f"{len(self.unexpected)} {self.unexpected[:5]}, wrong text "
                f"{len(self.wrong_text)} {self.wrong_text[:5]}, recovered {self.recovered}")


class History:
    """Why: the checker judges the broker by what its clients observed, not by its own word."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.log: list[tuple[float, str, str, object]] = []  # (t, op, type, detail)
        self.invoked: set[str] = set()
        self.acked: set[str] = set()
        self.rejected: dict[str, str] = {}
        self.unacked: set[str] = set()  # invoked, no ack yet
        self.held: dict[int, list[str]] = {}  # batch id -> ids, dispatched, not confirmed
        self.dispatched: Counter[str] = Counter()
        self.in_flight_at_crash: set[str] = set()
        self.crashes = 0

    def _add(self, op: str, kind: str, detail: object) -> None:
        self.log.append((time.monotonic() - self.t0, op, kind, detail))

    # -- producers ----------
    def invoke(self, ids: list[str]) -> None:
        self.invoked.update(ids)
        self.unacked.update(ids)
        self._add("submit", "invoke", len(ids))

    def ok(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        self.acked.update(ids)
        self.unacked.difference_update(ids)
        self._add("submit", "ok", len(ids))

    def refused(self, item_id: str, reason: str) -> None:
        """A reject that is not a duplicate: the item was not stored (not acknowledged)."""
        self.rejected[item_id] = reason
        self.unacked.discard(item_id)
        self._add("submit", "fail", (item_id, reason))

    def info(self, ids: list[str]) -> None:
        """The ack never came: each id may or may not be stored."""
        self._add("submit", "info", len(ids))

    # -- consumers ----------
    def dispatch(self, consumer: str, batch: int, ids: list[str]) -> None:
        self.dispatched.update(ids)
        self.held[batch] = ids
        self._add("dispatch", "ok", (consumer, batch, len(ids)))

    def complete(self, consumer: str, batch: int, stored: int | None) -> None:
        ids = self.held.pop(batch, [])
        kind = "info" if stored is None else "ok"
        if stored is None:  # the answer never came: in flight at the crash
            self.in_flight_at_crash.update(ids)
        self._add("complete", kind, (consumer, batch, len(ids), stored))

    def crash(self, why: str) -> None:
        """The broker died: whatever was held or unacknowledged was in flight."""
        self.crashes += 1
        for ids in self.held.values():
            self.in_flight_at_crash.update(ids)
        self.held.clear()
        self.in_flight_at_crash.update(self.unacked)
        self._add("broker", "crash", why)


def check(history: History, results: list[tuple[int, ResultRecord]],
          text_ok: Callable[[ResultRecord], bool] = sim_text_ok,
          expect_ids: set[str] | None = None) -> Report:
    """Judge one history against the full result sequence; adds it to the session totals."""
    counts = Counter(rec.id for _, rec in results)
    acked = history.acked if expect_ids is None else expect_ids
    lost = sorted(acked - set(counts))
    duplicated = sorted(k for k, n in counts.items() if n > 1)
    seqs = [s for s, _ in results]
    if len(set(seqs)) != len(seqs):
        duplicated.append("<a result sequence number repeats>")
    wrong = sorted({rec.id for _, rec in results if not text_ok(rec)})
    unexpected = sorted((set(counts) | set(history.dispatched)) - acked)
    recovered = len({i for i in history.in_flight_at_crash if counts.get(i) == 1})
    report = Report(len(acked), lost, duplicated + wrong, unexpected, recovered, wrong)
    TOTALS.scenarios += 1
    TOTALS.items += report.items
    TOTALS.lost += len(report.lost)
    TOTALS.duplicated += len(report.duplicated)
    TOTALS.unexpected += len(report.unexpected)
    TOTALS.recovered += report.recovered
    return report
