"""What a stop sent back to the lanes, kept for `fabricctl down` to say after the broker is gone.

Contract: a `Departure` is one consumer that left holding work while the stop drained
(`server.drain`): its name, why, the batches and items sent back to their lanes (answered
batches settle and are not counted), when, and how long before it had last been heard from.
The drain writes its `DrainReport` to `<data dir>/drain.json` (`REPORT`) when it has one;
`read_report(data_dir, since)` reads back the one written at or after `since` (wall clock),
else None (none, stale, or unreadable). Light: `down` imports it without the server.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

REPORT = "drain.json"


class Departure(msgspec.Struct, frozen=True):
    """Why: what a consumer leaving during the stop sent back, and why, said exactly."""

    consumer: str
    why: str
    batches: int  # sent back to their lanes (answered ones settle, and are not counted)
    items: int
    at: float  # the broker's clock when it left
    last_heard_s: float | None = None  # how long before leaving it was last heard from


class DrainReport(msgspec.Struct, frozen=True):
    """Why: `fabricctl down` says what the stop sent back, though the broker is gone by then."""

    drain_s: float
    waited_s: float
    departures: list[Departure]


def read_report(data_dir: Path, since: float) -> DrainReport | None:
    """The report of the stop that wrote it at or after `since` (wall clock), else None."""
    path = Path(data_dir) / REPORT
    try:
        if path.stat().st_mtime < since:
            return None
        return msgspec.json.decode(path.read_bytes(), type=DrainReport)
    except (OSError, msgspec.DecodeError):
        return None
