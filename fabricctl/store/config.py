"""The durable store's settings.

Contract: `StoreConfig` holds every knob of the store (map size and ceiling, segment size,
disk reserve, delivery limit, finished shapes kept) with defaults that are safe for a
single-host broker; it is frozen, so one value can be shared by every part of the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricctl.store.env import MiB


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB
    map_ceiling: int = 64 * 1024 * MiB
    segment_entries: int = 1024  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)
    max_deliveries: int = 5  # an entry handed out this often without a result is quarantined
    finished_shapes_kept: int = 1000  # the records of the last N finished shapes kept on disk
