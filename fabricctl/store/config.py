"""The durable store's settings: `StoreConfig`, the configuration's `[store]` section.

Contract: re-exports `fabricctl.core.defaults` (`StoreConfig`, `MiB`, `GiB`), where the
settings are declared so that `fabricctl.config` can embed them without importing the store;
the store's modules import them from here.
"""

from __future__ import annotations

from fabricctl.core.defaults import GiB, MiB, StoreConfig

__all__ = ["GiB", "MiB", "StoreConfig"]
