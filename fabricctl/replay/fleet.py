"""What a replay's policies and its report see of the simulation: its GPUs, not its code.

Contract: `SimFleet` is what a policy drives (the items, the GPUs, `submit`, `wants`,
`prewarm`); `SimRecord` is what the report reads once a run ended (costs, GPUs, what each
GPU was handed, what finished, the policy's own figures). `replay.sim.Simulation` is both;
the protocols let the policies and the report depend on them rather than on the simulation,
which depends on them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple, Protocol

from fabricctl.engines.costs import SimCosts
from fabricctl.engines.simgpu import SimGPU
from fabricctl.engines.simrequest import SimRequest
from fabricctl.replay.workload import ReplayItem


class Handed(NamedTuple):
    """Why: what a GPU was handed and when, in order: the report's switches and hits."""

    r: ReplayItem
    req: SimRequest
    prewarm: bool
    t: float


class SimFleet(Protocol):
    """Why: the simulated GPUs as a policy hands them work."""

    items: list[ReplayItem]
    gpus: list[SimGPU]

    def submit(self, g: int, r: ReplayItem, now: float, max_tokens: int | None = None,
               key: Hashable | None = None, tag: object = None) -> None: ...

    def wants(self, g: int, out: int = 1) -> bool: ...

    def prewarm(self, g: int, r: ReplayItem, now: float) -> None: ...


class PolicyFigures(Protocol):
    """Why: the report names the policy and adds the figures only it can count."""

    name: str

    def figures(self) -> dict[str, float | None]: ...


class SimRecord(Protocol):
    """Why: a finished run as the report reads it."""

    costs: SimCosts
    gpus: list[SimGPU]
    handed: list[list[Handed]]
    finished: list[tuple[int, ReplayItem, SimRequest]]
    prewarms: int

    @property
    def policy(self) -> PolicyFigures: ...
