"""A durable store for job tests: LMDB under `path/data`, the lifecycle off (shapes dispatch
as they fill), 16-entry segments, and one consumer "gpu0" of model `MODEL` registered."""

from __future__ import annotations

from pathlib import Path

from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract
from fabricctl.store.durable import DurableBroker, StoreConfig

MODEL = "m"
CORE = CoreConfig(lifecycle=False)


def store(path: Path, now: float = 100.0) -> DurableBroker:
    s = DurableBroker(path / "data", now, CORE, StoreConfig(segment_entries=16))
    s.core.register("gpu0", Contract(MODEL, 8, 100_000, 4096), now)
    return s
