"""Every host's GPUs, grouped by host: the dashboard's GPU panel and `fabricctl status`.

The broker's own engines come first as before (no host header while no agent is connected,
so the existing views are unchanged); each agent host follows with its name, its GPUs'
NVML lines (from the agent's heartbeats) and its engines. A broker with no local GPUs says
so instead of the NVML line. `status` lists every GPU by host, with NVML figures or
"simulated".
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from tui_synthetic import make_snapshot

from fabricctl.cli.status import gpu_rows, hosts_table
from fabricctl.core.snapshot import Snapshot
from fabricctl.supervisor.consumer import Consumer
from fabricctl.supervisor.gpus import GpuSample
from fabricctl.tui.gpu import RateTracker, gpu_panel


def nvml_sample(index: int) -> dict[str, Any]:
    return {"uuid": f"GPU-b-{index}", "index": index, "name": "NVIDIA B200",
            "utilization_gpu": 70 + index, "memory_used": (100 + index) * 2**30,
            "memory_total": 180 * 2**30, "temperature_c": 55, "power_w": 700.0}


def with_agents(snap: Snapshot, broker_host: str = "head") -> Snapshot:
    """`snap` with the broker on `broker_host` and two agents: gpu-b (NVML) and gpu-c (sim)."""
    engines = snap.extra["engines"]
    assert isinstance(engines, dict)
    for eng in engines.values():
        eng["host"] = broker_host
    for g in (1, 0):
        engines[f"b-gpu{g}"] = {"gpu": g, "engine": "vllm", "simulated": False,
                                "last_seen": snap.t - 0.2, "host": "gpu-b",
                                "nvml": nvml_sample(g),
                                "stats": {"prompt_tokens": 10, "generation_tokens": 5}}
    engines["c-gpu0"] = {"gpu": 0, "engine": "sim0", "simulated": True,
                         "last_seen": snap.t - 0.3, "host": "gpu-c", "nvml": None, "stats": {}}
    snap.extra["host"] = broker_host
    return snap


def test_without_agents_the_panel_is_as_before() -> None:
    plain = gpu_panel(make_snapshot(4, 4, nvml=True), RateTracker()).plain
    snap = make_snapshot(4, 4, nvml=True)
    snap.extra["host"] = "head"
    for eng in snap.extra["engines"].values():  # type: ignore[union-attr]
        eng["host"] = "head"  # what the local consumers of `up` now report
    assert gpu_panel(snap, RateTracker()).plain == plain


def test_agents_are_grouped_by_host_with_their_nvml_lines() -> None:
    snap = with_agents(make_snapshot(4, 4, nvml=True))
    lines = gpu_panel(snap, RateTracker()).plain.splitlines()
    print("\n".join(lines))  # read by eye with -s
    assert lines[0] == "head  (broker)"
    assert lines[1].startswith("GPU0 NVIDIA H200")
    b = lines.index("gpu-b  (2 GPUs)")
    c = lines.index("gpu-c  (1 GPU)")
    assert b < c
    assert lines[b + 1].startswith("GPU0 NVIDIA B200") and "util  70%" in lines[b + 1]
    assert "b-gpu0" in lines[b + 2] and "gpu0" in lines[b + 2]
    assert lines[b + 3].startswith("GPU1 NVIDIA B200")
    assert "b-gpu1" in lines[b + 4]
    assert "c-gpu0" in lines[c + 1] and "simulated" in lines[c + 1]
    assert len(lines) == c + 2


def test_a_broker_with_no_local_gpus_says_so() -> None:
    snap = make_snapshot(4, 4, nvml=False, consumers=0)
    snap.extra["engines"] = {}
    snap.extra["engine"] = {"kind": "none", "reason": "no local GPUs: waiting for agents"}
    assert gpu_panel(snap, RateTracker()).plain.splitlines()[0] == \
        "no local GPUs: waiting for agents"
    snap = with_agents(snap)
    lines = gpu_panel(snap, RateTracker()).plain.splitlines()
    assert lines[:2] == ["head  (broker)", "no local GPUs"]
    assert "gpu-b  (2 GPUs)" in lines and "NVML unavailable" not in "\n".join(lines)


def test_status_lists_every_gpu_by_host() -> None:
    snap = with_agents(make_snapshot(4, 4, nvml=True))
    extra: dict[str, Any] = dict(snap.extra)
    rows = gpu_rows(extra)
    assert [(h, g, n) for h, g, n, _, _ in rows] == [
        ("head", 0, "gpu0-consumer"), ("head", 1, "gpu1-consumer"),
        ("gpu-b", 0, "b-gpu0"), ("gpu-b", 1, "b-gpu1"), ("gpu-c", 0, "c-gpu0")]
    assert rows[0][4] is not None and rows[0][4]["name"] == "NVIDIA H200"  # the broker's NVML
    assert rows[2][4] is not None and rows[2][4]["name"] == "NVIDIA B200"  # the agent's
    assert rows[4][4] is None
    table = hosts_table(extra)
    assert table is not None
    out = io.StringIO()
    Console(file=out, width=120, no_color=True).print(table)
    text = out.getvalue()
    print(text)  # read by eye with -s
    assert "GPUs by host (3 hosts, 5 GPUs)" in text
    assert "70%" in text and "100.0/180.0 GiB" in text and "simulated" in text
    assert hosts_table({"engines": {}}) is None


def test_a_heartbeat_carries_the_host_and_the_gpus_nvml_sample() -> None:
    from fabricctl.engines.sim import SimEngine

    sample = GpuSample(uuid="GPU-x", index=1, name="NVIDIA B200", utilization_gpu=42)
    c = Consumer("127.0.0.1:1", "x-gpu1", "m", SimEngine(name="sim1"), 1, "t",
                 host="gpu-x", gpu_sample=lambda: sample)
    beat = c.beat()
    assert beat["host"] == "gpu-x" and beat["nvml"]["utilization_gpu"] == 42
    assert "prompt_tokens" in beat  # the engine's counters are still there
    none = Consumer("127.0.0.1:1", "y", "m", SimEngine(name="sim0"), 0, "t",
                    gpu_sample=lambda: None)
    assert "host" not in none.beat() and "nvml" not in none.beat()


def test_a_server_over_a_group_reports_and_shows_every_gpu_of_it() -> None:
    """An agent's server over GPUs 0 and 1: its heartbeat carries the group and GPU 1's
    sample beside GPU 0's, and the panel draws both GPUs' NVML lines above its engine."""
    from fabricctl.engines.sim import SimEngine

    samples = {g: GpuSample(uuid=f"GPU-{g}", index=g, name="NVIDIA B200",
                            utilization_gpu=40 + g) for g in (0, 1)}
    c = Consumer("127.0.0.1:1", "tp-gpu0-1", "m", SimEngine(name="sim0"), 0, "t",
                 host="gpu-t", gpu_sample=lambda: samples[0], group=[0, 1],
                 group_sample=lambda: [samples[1]])
    beat = c.beat()
    assert beat["gpus"] == [0, 1] and beat["nvml"]["index"] == 0
    assert [s["index"] for s in beat["nvml_group"]] == [1]
    snap = make_snapshot(4, 4, nvml=True)
    snap.extra["host"] = "head"
    snap.extra["engines"] = {"tp-gpu0-1": {  # type: ignore[index]
        "gpu": 0, "engine": "vllm", "simulated": False, "last_seen": snap.t, "host": "gpu-t",
        "nvml": beat["nvml"], "nvml_group": beat["nvml_group"], "gpus": beat["gpus"],
        "stats": {}}}
    lines = gpu_panel(snap, RateTracker()).plain.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("gpu-t"))
    assert lines[at + 1].startswith("GPU0") and "40%" in lines[at + 1]
    assert lines[at + 2].startswith("GPU1") and "41%" in lines[at + 2]
    assert "tp-gpu0-1" in lines[at + 3] and "gpu0,1" in lines[at + 3]
