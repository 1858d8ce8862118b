"""The durable store's settings, declared below the store so the configuration can hold them.

Contract: `StoreConfig` holds every knob of the store (map size and ceiling, segment size,
disk reserve, delivery limit, finished shapes kept) with defaults that are safe for a
single-host broker; it is frozen, so one value can be shared by every part of the store.
It is the configuration's `[store]` section as it stands (`fabricctl.config` embeds it, as it
embeds `CoreConfig` for `[broker]`), so these are the one place its defaults live. It sits in
core, not in `fabricctl.store`, because the layers that read the configuration (the
supervisor among them) may not import the store; `fabricctl.store.config` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB  # the LMDB map a new store starts with
    map_ceiling: int = 64 * GiB  # the map grows (doubling) up to this
    segment_entries: int = 1024  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)
    max_deliveries: int = 5  # an entry handed out this often without a result is quarantined
    finished_shapes_kept: int = 1000  # the records of the last N finished shapes kept on disk
