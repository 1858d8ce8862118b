"""Injectable crash points for the kill -9 tests.

Contract: `fault_point(name)` does nothing unless the environment variable FABRICCTL_FAULTS
names it, as `name:probability[,name:probability...]` (probability 0..1, seeded by
FABRICCTL_FAULT_SEED); then it kills its own process with SIGKILL at that probability, so a
test can stop the broker exactly between two steps of a commit.
"""

from __future__ import annotations

import os
import random
import signal

_spec = os.environ.get("FABRICCTL_FAULTS", "")
FAULTS: dict[str, float] = {}
for part in filter(None, _spec.split(",")):
    name, _, p = part.partition(":")
    FAULTS[name.strip()] = float(p or 1.0)
_rng = random.Random(int(os.environ.get("FABRICCTL_FAULT_SEED", "0")) or None)

POINTS = (
    "ingest_before_commit",
    "ingest_after_commit",
    "dispatch_step1",
    "dispatch_step2",
    "dispatch_step3",
    "complete_results",
    "complete_after_commit",
    "segment_delete",
    "map_grow",
)


def fault_point(name: str) -> None:
    """Kill this process here if the test asked for it."""
    p = FAULTS.get(name)
    if p and _rng.random() < p:
        os.kill(os.getpid(), signal.SIGKILL)
