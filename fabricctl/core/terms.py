"""What the shape choice knows of a job: its priority, its deadline and whether it can grow.

Contract: a `JobTerms` is set by whoever owns job records (the durable store, the replay)
through `Broker.set_job_terms(job, terms)` whenever a job opens, seals, changes priority or
is restored; items carry their job's number (`Item.job`, `Entry.job`). Job 0 (items with no
job) has the default terms: priority 0, no deadline, never sealed. Higher `priority` goes
first at every choice; `deadline` is unix seconds (the job's `expires_at`) or None; `sealed`
says its input ended, so its shapes can gain no more items and need not wait to grow;
`reading` that its input is a file of known size not yet read to its end (its queued items
are not yet the job: no finish is forecast for it until it is sealed, a moment later).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PRIORITY = 1_000_000  # priorities are 0..MAX_PRIORITY (a bound users can type and read)


@dataclass(frozen=True, slots=True)
class JobTerms:
    """Why: priority, window and completeness are per job, and shapes mix jobs."""

    priority: int = 0
    deadline: float | None = None
    sealed: bool = False
    reading: bool = False  # a file of known size still being read (see the contract)


NO_TERMS = JobTerms()


def check_priority(value: object) -> int:
    """A priority as given by a user (an int, or text of one): 0..MAX_PRIORITY, else
    ValueError naming the rule."""
    if isinstance(value, bool):
        raise ValueError(f"priority must be a whole number from 0 to {MAX_PRIORITY}, not {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise ValueError(
                f"priority must be a whole number from 0 to {MAX_PRIORITY}, not {value!r}")
        value = int(text)
    if not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise ValueError(f"priority must be a whole number from 0 to {MAX_PRIORITY}, not {value!r}")
    return value
