"""Multi-job replay workloads: which job each line belongs to, and each job's terms.

Contract (the workload form, README "fabricctl replay"):
- a workload line may carry `"job": "<name>"` (a non-empty string of at most 256
  characters); `fabricctl submit` ignores the field, so the file stays a valid input. Lines
  without it belong to the unnamed job "" (shown as "(no job)"). `line_job(raw)` reads it:
  None when absent or null, a `WorkloadError` naming the rule when it is not such a string;
- the jobs' terms come from a jobs file (`replay --jobs FILE`), JSON Lines, one object per
  job: `{"job": "<name>", "arrival": 0.0, "window_s": 60.0, "priority": 0}`: `job`
  required; `arrival` (simulated seconds >= 0, default 0) is when the job's first item may
  arrive; `window_s` (> 0, or null: no deadline) makes its deadline arrival + window_s;
  `priority` (0..1,000,000, default 0; higher goes first, strictly). Blank lines are
  skipped. `read_jobs(lines)` parses one: a `WorkloadError` "line N: ..." for a line that is
  not an object, an unknown key, a bad value or a job named twice;
- `number_jobs(names, specs)` gives every job a number (1.., in order of first appearance in
  the workload, the core's `Item.job`), with the file's terms or the defaults; a job of the
  jobs file with no item is a `WorkloadError`.
A workload with neither a `job` field nor a jobs file is a single-job workload, replayed
exactly as before (job 0 on every item, no terms).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from fabricctl.core.terms import JobTerms, check_priority
from fabricctl.errors import WorkloadError

JOB_KEYS = ("job", "arrival", "window_s", "priority")
MAX_JOB_NAME = 256


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Why: a job's arrival, window and priority are what a multi-job replay is about."""

    name: str
    number: int = 0  # the core's job number (Item.job), 1.. in a multi-job workload
    arrival: float = 0.0  # simulated seconds
    window_s: float | None = None  # its deadline is arrival + window_s
    priority: int = 0

    @property
    def deadline(self) -> float | None:
        return None if self.window_s is None else self.arrival + self.window_s

    @property
    def label(self) -> str:
        return self.name or "(no job)"

    def terms(self, sealed: bool = False) -> JobTerms:
        """What the shape choice is told of the job (`Broker.set_job_terms`)."""
        return JobTerms(priority=self.priority, deadline=self.deadline, sealed=sealed)

    def alone(self) -> JobSpec:
        """The same job arriving at t = 0 (its standalone replay)."""
        return replace(self, arrival=0.0)


def check_job_name(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_JOB_NAME:
        raise WorkloadError(f"job must be a non-empty string of at most {MAX_JOB_NAME} "
                            f"characters, not {value!r}")
    return value


def line_job(raw: bytes) -> str | None:
    """The `job` field of a workload line (already parsed as an item), or None."""
    if b'"job"' not in raw:
        return None
    try:
        obj = msgspec.json.decode(raw.removeprefix(b"\xef\xbb\xbf"))
    except msgspec.DecodeError:
        return None  # not a line the reader parsed
    value = obj.get("job") if isinstance(obj, dict) else None
    return None if value is None else check_job_name(value)


def _number(obj: dict[str, Any], key: str, default: float | None, *, positive: bool
            ) -> float | None:
    value = obj.get(key, default)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0 or (positive and value == 0)):
        rule = "> 0" if positive else ">= 0"
        raise WorkloadError(f"{key} must be a number {rule}, not {value!r}")
    return float(value)


def parse_job(obj: object) -> JobSpec:
    """One jobs-file object as a `JobSpec` (unnumbered); `WorkloadError` naming the fault."""
    if not isinstance(obj, dict):
        raise WorkloadError("a job line must be a JSON object like "
                            '{"job": "name", "arrival": 0, "window_s": 60, "priority": 0}')
    unknown = [k for k in obj if k not in JOB_KEYS]
    if unknown:
        raise WorkloadError(f"unknown key {unknown[0]!r}; known: {', '.join(JOB_KEYS)}")
    if "job" not in obj:
        raise WorkloadError("missing job (its name, as the workload's lines give it)")
    name = check_job_name(obj["job"])
    arrival = _number(obj, "arrival", 0.0, positive=False)
    window = _number(obj, "window_s", None, positive=True)
    try:
        priority = check_priority(obj.get("priority", 0))
    except ValueError as e:  # core's refusal, in this module's kind
        raise WorkloadError(str(e)) from None
    return JobSpec(name, 0, arrival or 0.0, window, priority)


def read_jobs(lines: Iterable[bytes]) -> dict[str, JobSpec]:
    """A jobs file's jobs by name; `WorkloadError` "line N: reason" at the first bad line."""
    out: dict[str, JobSpec] = {}
    first: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            try:
                obj = msgspec.json.decode(line)
            except msgspec.DecodeError as e:
                raise WorkloadError(f"not JSON: {e}") from None
            spec = parse_job(obj)
            if spec.name in first:
                raise WorkloadError(f"job {spec.name!r} is already given on line "
                                    f"{first[spec.name]}")
        except WorkloadError as e:
            raise WorkloadError(f"line {n}: {e}") from None
        first[spec.name] = n
        out[spec.name] = spec
    return out


def number_jobs(names: Sequence[str], specs: dict[str, JobSpec]) -> dict[str, JobSpec]:
    """Every job of the workload (`names`: each item's job, "" for none), numbered 1.. in order
    of first appearance, with its terms from `specs` (else the defaults)."""
    present = dict.fromkeys(names)
    missing = [n for n in specs if n not in present]
    if missing:
        raise WorkloadError(f"the jobs file names job {missing[0]!r}, which has no item in "
                            "the workload")
    return {n: replace(specs.get(n) or JobSpec(n), number=i)
            for i, n in enumerate(present, 1)}
