"""The state the parts of the durable broker share, named once.

Contract: `DurableBroker` builds one `StoreState` and hands it to each of its parts (ingest,
dispatch, completion, commit) and to recovery; no part reaches another part's state except
through it. Everything here but `meta` is fixed for the store's life (the tables are
changed in place, never replaced), so a part may keep a reference to it; `meta` is replaced
once, by recovery, so parts read it through the state. Who writes what:

- `segs` (live segment id -> header): ingest adds segments and grows their counts,
  completion counts their results and drops the whole ones, recovery fills it;
- `work` (in-flight batch id -> its items): dispatch adds a batch when it hands it out and
  drops it when it comes back undone, completion drops it once settled;
- `undone` (entry key -> (times back undone, last reason)): dispatch counts, completion
  forgets an entry once it has its result;
- `jobs` (the `JobTable`): the commit writes the records of the jobs it changes and makes
  them current once durable; recovery loads them;
- `meta`: the counters that move with the commits (ingest: next segment; completion:
  result sequence, epochs; the commit: the persisted ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fabricctl.store.meta import Meta

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker
    from fabricctl.core.types import Item
    from fabricctl.store.config import StoreConfig
    from fabricctl.store.env import StoreEnv
    from fabricctl.store.jobs import JobTable
    from fabricctl.store.keys import SegHeader


@dataclass(eq=False, slots=True)
class StoreState:
    """Why: what ingest, dispatch and completion all touch is handed to each explicitly."""

    cfg: StoreConfig
    env: StoreEnv
    core: Broker
    jobs: JobTable
    meta: Meta = field(default_factory=Meta)
    segs: dict[int, SegHeader] = field(default_factory=dict)
    work: dict[int, list[Item]] = field(default_factory=dict)  # in-flight batch id -> items
    undone: dict[int, tuple[int, str]] = field(default_factory=dict)  # key -> (times, why)
