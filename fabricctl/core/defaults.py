"""The defaults of the knobs that layers below the configuration own, in one place.

Contract: the configuration (`fabricctl.config`) is read by the server and the supervisor,
so it may import nothing they may not: core, not the store, the engines or the formats. A
knob one of those owns has its default here, where both it and the configuration read it,
and nowhere else:
- `StoreConfig`, every knob of the durable store (map size and ceiling, segment size, disk
  reserve, delivery limit, finished shapes kept) with defaults safe for a single-host broker,
  frozen so one value is shared by every part of the store. It is the configuration's
  `[store]` section as it stands (as `CoreConfig` is `[broker]`); `fabricctl.store.config`
  re-exports it.
- `MAX_BATCH_SIZE`, `MAX_BATCH_TOKENS`, `MAX_INPUT_LEN`: the contract a consumer registers
  unless `[consumer]` says otherwise, also the simulated engine's and the replay's.
- `SIM_TIME_SCALE`: real seconds a simulated engine sleeps per modelled GPU second
  (`[sim] time_scale`).
- `MAX_LINE_BYTES`: the longest input line a reader parses (`[producer] max_line_bytes`).
- `SHAPES`, `SHAPE_MODES`, `BLOCK_TOKENS`: whether producers find the shared prefix of lines
  that declare none (`[producer] shapes`) and the block size it is cut at (`[producer]
  block_size`, vLLM's default on GPUs); see `fabricctl.formats.autoshape`.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30

MAX_BATCH_SIZE = 256
MAX_BATCH_TOKENS = 16384
MAX_INPUT_LEN = 8192
SIM_TIME_SCALE = 0.001
MAX_LINE_BYTES = 1 * MiB
SHAPE_MODES = ("auto", "declared")
SHAPES = "auto"
BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB  # the LMDB map a new store starts with
    map_ceiling: int = 64 * GiB  # the map grows (doubling) up to this
    segment_entries: int = 1024  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)
    max_deliveries: int = 5  # an entry handed out this often without a result is quarantined
    finished_shapes_kept: int = 1000  # the records of the last N finished shapes kept on disk
