"""The snapshot's extras are typed fields, sent as they were when they were string-keyed: each
under its name, in the order the daemon used to add them, the engine note as the same map."""

from __future__ import annotations

import functools

import msgspec

from fabricctl.server.state import EngineNote, Extras


def test_extras_keep_their_names_and_order_and_skip_those_unset() -> None:
    ex = Extras()
    assert ex.items() == []
    ex.servers = list
    ex.engine = functools.partial(EngineNote, "vllm", "NVML shows 2 GPUs")
    ex.host = lambda: "head"
    ex.processes = list
    ex.gpus = dict
    assert [name for name, _ in ex.items()] == ["gpus", "processes", "host", "engine",
                                                "servers"]
    ex.ray = list
    assert [name for name, _ in ex.items()][-1] == "ray"


def test_the_engine_note_is_the_map_it_replaced() -> None:
    assert msgspec.to_builtins(EngineNote("none", "no local GPUs")) == {
        "kind": "none", "reason": "no local GPUs"}
    ray = msgspec.to_builtins(EngineNote("sim", "why", "auto"))
    assert ray == {"kind": "sim", "reason": "why", "ray": "auto"}
    assert list(ray) == ["kind", "reason", "ray"]
