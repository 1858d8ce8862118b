"""Jobs: one submission (a `submit`, a `run`, an OpenAI batch) as a thing with a state.

Contract: a `JobRecord` is the durable record of one job (kept by the store in the same
transactions that change its counts); `JobState` uses the OpenAI Batch API's status names.
The life of a job is pure logic here: `new_job(...)` starts it `validating` (API batches) or
`in_progress`; `seal(job, lines, now)` ends its input; `request_cancel(job, now)` makes it
`cancelling`; `expire_due(job, now)` says its window passed; `settle(job, in_flight, now)`
moves a job whose every item has an outcome on (in_progress -> finalizing -> completed,
cancelling -> cancelled, an expired window -> expired).
Counts: `total` items accepted, each ending in exactly one of `completed`, `failed` or
`cancelled`; `rejected` lines never became items (the first `MAX_ERRORS` messages kept in
`errors`); `queued` is derived. Usage: the sums of the engine's usage over successful
results (`add_usage`), in OpenAI's `BatchUsage` shape by `job_usage(job)`. `model` is the
model its first stored line named; `endpoints` counts accepted items per endpoint
(`core.mix`), each once (none for a job stored before the field existed).
Terms: `priority` (0..`MAX_PRIORITY`, higher first; `set_priority`), `deadline` and `sealed`
are what the shape choice knows of a job (`terms_of(job)`, None once it ended).
`parse_window("24h")` reads a completion window (`<N>h`, `<N>m` or `<N>s`, N > 0 whole).
Times are unix seconds passed in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import re
from enum import StrEnum

import msgspec

from fabricctl.core.terms import JobTerms

MAX_ERRORS = 20  # line errors kept on a job's record; the count goes on past it
MAX_SHAPES = 64  # shapes kept on a job's record (the ones it touched first)
JOB_ID_PREFIX = "batch_"  # every job id, CLI or API, reads like an OpenAI batch id
_WINDOW = re.compile(r"^([1-9][0-9]{0,8})([hms])$")
WINDOW_UNITS = {"h": 3600, "m": 60, "s": 1}


class JobState(StrEnum):
    """Why: the OpenAI Batch API's statuses, so the API and the CLI say the same thing."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = {JobState.FAILED, JobState.COMPLETED, JobState.EXPIRED, JobState.CANCELLED}


class JobShape(msgspec.Struct, array_like=True, frozen=True):
    """Why: `jobs show` names the shapes a job touched, after their segments are gone."""

    model: str
    signature: int
    label: str = ""


class JobRecord(msgspec.Struct, kw_only=True):
    """Why: what `jobs`, `jobs show` and `/v1/batches` report of a job, kept across restarts.

    `number` is the job's key in the store (small, dense); `id` is what users type.
    `times` holds when it entered each state (OpenAI's `*_at` fields come from it).
    """

    number: int
    id: str
    kind: str  # "submit", "run" or "api"
    name: str = ""  # the input: a file path, "-" for stdin, an uploaded file's id
    sha256: str = ""  # of the input, when known (attach: the same file joins its job)
    size: int = 0  # input bytes, when known
    endpoint: str = ""  # the OpenAI endpoint of an API batch ("" for native input)
    metadata: dict[str, str] = {}
    created: float = 0.0
    deadline: float | None = None  # completion window end (unix seconds), None: no window
    priority: int = 0  # higher goes first (0..MAX_PRIORITY); records from before it: 0
    state: JobState = JobState.IN_PROGRESS
    times: dict[str, float] = {}  # state name -> when it was entered
    sealed: bool = False  # its input ended: no more items join it
    lines: int = 0  # input lines read (known once sealed)
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0
    errors: list[str] = []
    input_file_id: str = ""
    output_file_id: str = ""
    error_file_id: str = ""
    expired: bool = False  # its window passed: its queued items were cancelled for it
    shapes: list[JobShape] = []  # the shapes its items joined (the first `MAX_SHAPES`)
    # fields below were added later: records written before them decode with these defaults
    model: str = ""  # the model its first stored line named ("" until a line is stored)
    input_tokens: int = 0  # usage summed over its successful results, as the engine gave it
    cached_tokens: int = 0  # (prompt tokens, of which cached, completion tokens); an error
    output_tokens: int = 0  # result, a refused or a cancelled request adds nothing
    output_expires_s: int = 0  # an API batch's output files expire this long after they
    # were created (`output_expires_after`); 0: never
    endpoints: dict[str, int] = {}  # items accepted per endpoint (`core.mix`): its mix

    @property
    def outcomes(self) -> int:
        """Items with an outcome: a result, an error result, or cancelled."""
        return self.completed + self.failed + self.cancelled

    @property
    def queued(self) -> int:
        """Accepted items without an outcome yet (queued or in flight)."""
        return self.total - self.outcomes

    @property
    def ended(self) -> bool:
        return self.state.ended


class InputTokensDetails(msgspec.Struct):
    """Why: OpenAI's `BatchUsage.input_tokens_details`."""

    cached_tokens: int


class OutputTokensDetails(msgspec.Struct):
    """Why: OpenAI's `BatchUsage.output_tokens_details` (vLLM counts no reasoning apart)."""

    reasoning_tokens: int = 0


class JobUsage(msgspec.Struct):
    """Why: a job's usage in OpenAI's `BatchUsage` shape, which the Batch API and `jobs
    show --json` both report."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


def job_usage(job: JobRecord) -> JobUsage:
    """The job's usage (summed from its successful results) as OpenAI's `BatchUsage`."""
    return JobUsage(
        input_tokens=job.input_tokens,
        input_tokens_details=InputTokensDetails(job.cached_tokens),
        output_tokens=job.output_tokens,
        output_tokens_details=OutputTokensDetails(0),
        total_tokens=job.input_tokens + job.output_tokens)


def add_usage(job: JobRecord, input_tokens: int, cached_tokens: int,
              output_tokens: int) -> None:
    """Add results' usage (`core.records.usage_of`, summed) to the job's."""
    job.input_tokens += input_tokens
    job.cached_tokens += cached_tokens
    job.output_tokens += output_tokens


def add_shapes(job: JobRecord, shapes: set[JobShape] | list[JobShape]) -> None:
    """Note the shapes a job's items joined (new ones, up to `MAX_SHAPES` in all)."""
    have = set(job.shapes)
    new = [s for s in shapes if s not in have]
    room = MAX_SHAPES - len(job.shapes)
    if new and room > 0:
        new.sort(key=lambda s: (s.model, s.signature))
        job.shapes = [*job.shapes, *new[:room]]


def job_id_of(number: int, salt: str) -> str:
    """The id users see: the prefix, the number in hex, and a salt the caller draws (so ids
    of two stores do not collide)."""
    return f"{JOB_ID_PREFIX}{number:x}{salt}"


def new_job(number: int, id: str, kind: str, now: float, *, validating: bool = False,
            window_s: float | None = None, priority: int = 0, **fields: object) -> JobRecord:
    """A new job: `validating` (an API batch whose file is being checked) or in progress."""
    state = JobState.VALIDATING if validating else JobState.IN_PROGRESS
    deadline = now + window_s if window_s else None
    return JobRecord(number=number, id=id, kind=kind, created=now, deadline=deadline,
                     priority=priority, state=state, times={state.value: now},
                     **fields)  # type: ignore[arg-type]


def parse_window(text: object) -> float:
    """A completion window in seconds: "24h", "90m", "30s" (a positive whole number of
    hours, minutes or seconds); anything else raises ValueError saying what is taken."""
    m = _WINDOW.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"a window is a whole number of hours, minutes or seconds above 0, "
                         f"such as \"24h\", \"90m\" or \"30s\", not {text!r}")
    return float(int(m.group(1)) * WINDOW_UNITS[m.group(2)])


def terms_of(job: JobRecord) -> JobTerms | None:
    """What the shape choice knows of a job (`Broker.set_job_terms`): None once it ended."""
    if job.ended:
        return None
    return JobTerms(priority=job.priority, deadline=job.deadline, sealed=job.sealed,
                    reading=not job.sealed and job.size > 0)


def set_priority(job: JobRecord, priority: int) -> bool:
    """A live job's new priority (already checked: `check_priority`); False when it ended."""
    if job.ended:
        return False
    job.priority = priority
    return True


def _enter(job: JobRecord, state: JobState, now: float) -> None:
    job.state = state
    job.times = {**job.times, state.value: now}


def start(job: JobRecord, now: float) -> None:
    """Validation passed: the job runs."""
    if job.state is JobState.VALIDATING:
        _enter(job, JobState.IN_PROGRESS, now)


def fail_validation(job: JobRecord, errors: list[str], now: float) -> None:
    """Its input was refused as a whole (an API batch's file): the job failed, nothing ran."""
    job.errors = errors[:MAX_ERRORS]
    job.sealed = True
    _enter(job, JobState.FAILED, now)


def add_errors(job: JobRecord, errors: list[str]) -> None:
    """Count refused lines, keeping the first `MAX_ERRORS` messages."""
    job.rejected += len(errors)
    room = MAX_ERRORS - len(job.errors)
    if room > 0 and errors:
        job.errors = job.errors + errors[:room]


def seal(job: JobRecord, lines: int, now: float) -> None:
    """The job's input ended after `lines` lines: no more items join it."""
    job.sealed = True
    job.lines = max(job.lines, lines)
    settle(job, 0, now)


def request_cancel(job: JobRecord, now: float) -> bool:
    """Cancel: True when this changed the job (the store then cancels its queued items)."""
    if job.ended or job.state is JobState.CANCELLING:
        return False
    job.sealed = True
    _enter(job, JobState.CANCELLING, now)
    return True


def expire_due(job: JobRecord, now: float) -> bool:
    """Its completion window passed with items still to run (the store then cancels its
    queued items and marks it `expired`)."""
    return (job.deadline is not None and now >= job.deadline and not job.ended
            and not job.expired
            and job.state not in (JobState.CANCELLING, JobState.FINALIZING))  # all outcomes in


def mark_expired(job: JobRecord) -> None:
    job.expired = True
    job.sealed = True


def settle(job: JobRecord, in_flight: int, now: float) -> bool:
    """Move the job on once every item has an outcome (`in_flight` is how many of its items
    an engine holds: a cancelled or expired job waits for them). True when it moved."""
    if job.ended or job.state is JobState.VALIDATING:
        return False
    done = job.sealed and job.queued == 0 and in_flight == 0
    if job.state is JobState.CANCELLING:
        if done:
            _enter(job, JobState.CANCELLED, now)
            return True
        return False
    if job.expired:
        if done:
            _enter(job, JobState.EXPIRED, now)
            return True
        return False
    if job.state is JobState.IN_PROGRESS and done:
        _enter(job, JobState.FINALIZING, now)
        return True
    if job.state is JobState.FINALIZING:
        _enter(job, JobState.COMPLETED, now)
        return True
    return False

