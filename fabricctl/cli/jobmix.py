"""The endpoint mix as `jobs` and `status` print it (issue 26).

Contract: `mix_cell(job)` is the list's ENDPOINTS cell (`fmt.endpoint_mix`: `chat 80% ·
embed 20%`, `-` for none counted); `endpoints_tsv(job)` its TSV cell (`chat=80,embeddings=20`,
most first, "" for none); `endpoints_text(job)` the `jobs show` line (every endpoint with
its items and share, and the items taken before the counts existed; None with no items);
`fleet_line(counts, jobs)` is `status`'s line of the live jobs' mix (the answer's
`endpoints`: `chat 75.0% (3,000) · embeddings 25.0% (1,000) of 4,000 items in 2 live
job(s)`). Counts come from the job records (`core.mix`); nothing here talks to the broker.
"""

from __future__ import annotations

from fabricctl.core.jobs import JobRecord
from fabricctl.core.mix import mix
from fabricctl.fmt import endpoint_mix, pct


def mix_cell(j: JobRecord) -> str:
    """The `jobs` list's ENDPOINTS cell."""
    return endpoint_mix(j.endpoints)


def endpoints_tsv(j: JobRecord) -> str:
    """`chat=80,embeddings=20`: the job's items per endpoint, most first ("" for none)."""
    return ",".join(f"{p.endpoint}={p.items}" for p in mix(j.endpoints))


def endpoints_text(j: JobRecord) -> str | None:
    """`jobs show`'s endpoints line: `chat 20 (50.0%), embeddings 10 (25.0%)`, and the items
    not counted (taken before the counts existed); None for a job with no items."""
    counted = sum(j.endpoints.values())
    if not j.total and not counted:
        return None
    text = ", ".join(f"{p.endpoint} {p.items:,} ({pct(p.share)})" for p in mix(j.endpoints))
    missing = j.total - counted
    if missing > 0:
        text += ("; " if text else "") + f"{missing:,} item(s) stored before endpoints were counted"
    return text


def fleet_line(counts: dict[str, int], jobs: int) -> str:
    """`status`'s line of the live jobs' mix: every endpoint, its share and items."""
    parts = mix(counts)
    if not parts:
        return f"none counted ({jobs} live job(s))"
    total = sum(p.items for p in parts)
    return (" · ".join(f"{p.endpoint} {pct(p.share)} ({p.items:,})" for p in parts)
            + f" of {total:,} items in {jobs} live job(s)")
