"""The job operations and the plan that carries them to the commit (`fabricctl.store.jobs`).

Contract: `OpenOp`, `SealOp`, `CancelOp` (expired: the completion window's cancel),
`PriorityOp`, `FinalizeOp` and `FlushOp` are the operations a `JobPlan` carries from
`JobOps.prepare` (jobops.py) to the commit (`JobTable.write`: its `changes` applied in order)
and to `JobTable.replies`. Plain data; `fabricctl.store.jobs` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fabricctl.core.jobs import JobRecord
from fabricctl.core.terms import JobTerms


@dataclass(slots=True)
class OpenOp:
    """Why: a new job's fields travel from the request to the commit that makes it."""

    kind: str
    name: str = ""
    sha256: str = ""
    size: int = 0
    endpoint: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    window_s: float = 0.0
    validating: bool = False
    salt: str = ""  # the id's salt; "" draws one
    priority: int = 0  # checked by the caller (`core.terms.check_priority`)
    output_expires_s: int = 0  # an API batch's output files' lifetime (0: none)


@dataclass(slots=True)
class SealOp:
    """Why: the end of a job's input (or its refusal as a whole) is one durable change."""

    job: int
    lines: int
    errors: list[str] = field(default_factory=list)
    failed: bool = False
    sha256: str = ""
    refused: int = 0  # refused lines beyond `errors` (a submit sends only the first few)


@dataclass(slots=True)
class CancelOp:
    """Why: a cancel (or a window's expiry) withdraws the queued items in the same commit."""

    job: int
    expired: bool = False  # the completion window's: the items' error is "expired"


@dataclass(slots=True)
class PriorityOp:
    """Why: a live job's priority is changed by its owner; the shape choice follows it."""

    job: int
    priority: int  # checked by the caller (`core.terms.check_priority`)


@dataclass(slots=True)
class FinalizeOp:
    """Why: finalizing -> completed is a settle of its own, on the tick."""

    job: int
    in_flight: int = 0


@dataclass(slots=True)
class FlushOp:
    """Why: a broker gone idle right after a shape finished would keep its record in memory
    only (until the next commit); the tick sends this to commit what is pending."""


JobOp = OpenOp | SealOp | CancelOp | PriorityOp | FinalizeOp | FlushOp
Change = Callable[[JobRecord], None]
TermsHook = Callable[[int, JobTerms | None], None]  # `Broker.set_job_terms`


@dataclass(slots=True)
class JobPlan:
    """Why: job operations are prepared, committed and answered like ingests."""

    now: float
    new: dict[int, JobRecord] = field(default_factory=dict)  # opened by this plan
    changes: list[tuple[int, Change]] = field(default_factory=list)  # applied in order
    answers: list[int | str] = field(default_factory=list)  # per op: job number, or why not
    busy: set[int] = field(default_factory=set)  # jobs whose tick op this plan carries

    def writes(self) -> bool:
        return bool(self.new or self.changes)
