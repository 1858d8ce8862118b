"""The GPU panel: NVML samples joined with each engine's stats and heartbeat, as Rich text.

Contract: `gpu_panel(snap, rates)` reads `snap.extra["gpus"]` (a `GpuReport` as builtins)
and `snap.extra["engines"]` (consumer -> gpu, engine, simulated, last_seen, stats). One line
per GPU (utilisation, memory, temperature, power) followed by one line per engine on it (KV
hit rate = prefix-cache hits / queries, tokens/s sparkline, heartbeat age, "simulated" when
the engine is the simulated one, then `now <shape> next <shape>`: the shape its consumer
pulls from and the one warming for it, from `snap.consumers`). Without NVML the first line
is "NVML unavailable: <reason>" and the engines are still listed. Engines are grouped by
host (`snap.extra["host"]` is the broker's; each engine's `host` comes with its heartbeats):
the broker host's first, as above, then one block per agent host, its name, then per GPU its
NVML line (from the agent's heartbeats, when it has NVML) and its engine line; with agents
connected the broker's block is headed by its host name too. A broker with no local GPUs
(engine kind "none") says "no local GPUs: waiting for agents" instead of the NVML line.
A consumer whose server answers several names (a base model and its LoRA adapters) gets a
second line, `serves <names>`, the one it pulls from now in bold; a server spanning a group
of GPUs (its heartbeat's `gpus`) shows them all (`gpu0,1`). `RateTracker` turns the
engines' cumulative token counters into tokens/s, keyed by consumer, against snapshot time.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.text import Text

from fabricctl import fmt
from fabricctl.core.snapshot import Snapshot
from fabricctl.tui.draw import labels, short_name
from fabricctl.tui.palette import CRITICAL, MUTED, OK, WARN

HISTORY = 60
SPARK_WIDTH = 8


def engines(snap: Snapshot) -> dict[str, dict[str, Any]]:
    raw = snap.extra.get("engines")
    return raw if isinstance(raw, dict) else {}


def _tokens(stats: Any) -> int:
    if not isinstance(stats, dict):
        return 0
    return int(stats.get("prompt_tokens", 0) or 0) + int(stats.get("generation_tokens", 0) or 0)


class RateTracker:
    """Why: engines report cumulative counters; operators read throughput."""

    def __init__(self, history: int = HISTORY) -> None:
        self.history = history
        self._last: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, deque[float]] = {}

    def update(self, snap: Snapshot) -> None:
        seen = engines(snap)
        for name, eng in seen.items():
            tokens = _tokens(eng.get("stats"))
            prev = self._last.get(name)
            if prev is not None and snap.t > prev[0]:
                rate = max(0.0, (tokens - prev[1]) / (snap.t - prev[0]))
                self.rates.setdefault(name, deque(maxlen=self.history)).append(rate)
            if prev is None or snap.t > prev[0]:
                self._last[name] = (snap.t, tokens)
        for gone in set(self._last) - set(seen):
            self._last.pop(gone, None)
            self.rates.pop(gone, None)

    def latest(self, name: str) -> float | None:
        h = self.rates.get(name)
        return h[-1] if h else None


def kv_hit_rate(stats: Any) -> float | None:
    if not isinstance(stats, dict):
        return None
    q = stats.get("prefix_cache_queries") or 0
    return (stats.get("prefix_cache_hits") or 0) / q if q else None


def engine_line(name: str, eng: dict[str, Any], snap: Snapshot, rates: RateTracker) -> Text:
    stats = eng.get("stats")
    line = Text(" ")
    line.append(f"{fmt.shorten(name, 14):<14} ", style="bold")
    line.append(f"{gpu_label(eng):<5} ", style=MUTED)
    line.append(f"{fmt.shorten(str(eng.get('engine') or '?'), 6):<6} ")
    line.append("KV ", style=MUTED)
    line.append(f"{fmt.pct(kv_hit_rate(stats)):>6} ")
    line.append(fmt.sparkline(rates.rates.get(name, ()), SPARK_WIDTH), style=OK)
    line.append(f" {fmt.si(rates.latest(name)):>5} tok/s ")
    seen = eng.get("last_seen")
    hb = snap.t - seen if isinstance(seen, int | float) else None
    line.append("hb ", style=MUTED)
    line.append(f"{fmt.age(hb):>5}", style=WARN if hb is not None and hb > 5 else "")
    if eng.get("simulated"):
        line.append(" simulated", style=WARN)
    line.append_text(shape_part(name, snap))
    served = served_line(name, snap)
    return line if served is None else Text("\n").join([line, served])


def gpu_label(eng: dict[str, Any]) -> str:
    """`gpu0`, or for a server spanning a group of GPUs (its heartbeat's `gpus`) `gpu0,1`."""
    group = eng.get("gpus")
    if isinstance(group, list) and len(group) > 1:
        return "gpu" + ",".join(str(g) for g in group)
    gpu = eng.get("gpu")
    return "" if gpu is None else f"gpu{gpu}"


def served_line(consumer: str, snap: Snapshot) -> Text | None:
    """`   serves base · ad-a · ad-b`, the name it pulls from now in bold, for a consumer
    whose server answers several names (LoRA adapters); None for one of a single name."""
    view = next((c for c in snap.consumers if c.name == consumer), None)
    if view is None or not view.names:
        return None
    line = Text("   serves ", style=MUTED)
    now = view.serving or view.model
    for k, name in enumerate((view.model, *view.names)):
        if k:
            line.append(" · ", style=MUTED)
        line.append(name, style="bold" if name == now else "")
    if view.name_switches:
        line.append(f"  {view.name_switches:,} switches between them", style=MUTED)
    return line


def shape_part(consumer: str, snap: Snapshot) -> Text:
    """`  now <shape> next <shape>`: the shape the consumer pulls from and the one warming
    for it (labels when given, else hex); empty for a consumer the snapshot does not list."""
    view = next((c for c in snap.consumers if c.name == consumer), None)
    if view is None or (view.current is None and view.next is None):
        return Text()
    names = labels(snap)
    model = view.serving or view.model  # the name its shapes are under now
    part = Text("  now ", style=MUTED)
    part.append(fmt.shorten(short_name(view.current, names.get((model, view.current or 0),
                                                                  "")), 16))
    if view.next is not None:
        part.append(" next ", style=MUTED)
        part.append(fmt.shorten(short_name(view.next, names.get((model, view.next), "")),
                                16))
    return part


def gpu_line(g: dict[str, Any]) -> Text:
    line = Text(f"GPU{g.get('index', '?')} ", style="bold")
    line.append(f"{fmt.shorten(str(g.get('name') or ''), 18):<18} ")
    util = g.get("utilization_gpu")
    line.append("util ", style=MUTED)
    line.append(f"{fmt.NA if util is None else f'{util}%':>4}  ")
    line.append("mem ", style=MUTED)
    line.append(f"{fmt.gib(g.get('memory_used'))}/{fmt.gib(g.get('memory_total'))} GiB  ")
    temp, power = g.get("temperature_c"), g.get("power_w")
    line.append(f"{fmt.NA if temp is None else f'{temp}°C'}  ",
                style=CRITICAL if isinstance(temp, int) and temp >= 85 else "")
    line.append(fmt.NA if power is None else f"{power:.0f} W")
    return line


def unavailable_reason(report: Any) -> str | None:
    """Why there are no GPU figures, or None when NVML answered."""
    if not isinstance(report, dict):
        return "NVML unavailable: this broker runs no GPU monitor"
    if "error" in report:
        return f"NVML unavailable: {report['error']}"
    if not report.get("available"):
        reason = str(report.get("reason") or "no reason given")
        return reason if reason.startswith("NVML unavailable") else f"NVML unavailable: {reason}"
    return None


def by_host(snap: Snapshot) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the broker host's engines, {other host: its engines}); an engine that reports no
    host is the broker's."""
    here = snap.extra.get("host")
    local: dict[str, dict[str, Any]] = {}
    remote: dict[str, dict[str, Any]] = {}
    for name, eng in engines(snap).items():
        host = eng.get("host")
        if not host or host == here:
            local[name] = eng
        else:
            remote.setdefault(str(host), {})[name] = eng
    return local, remote


def host_lines(host: str, engs: dict[str, dict[str, Any]], snap: Snapshot,
               rates: RateTracker) -> list[Text]:
    """An agent's block: its name, then per GPU its NVML line (when its heartbeats carry
    one; for a server over a group, every GPU of the group) and its engine's line."""
    lines = [Text(f"{host}  ({len(engs)} GPU{'s' if len(engs) != 1 else ''})", style="bold")]
    for name, eng in sorted(engs.items(), key=lambda kv: (kv[1].get("gpu") is None,
                                                          kv[1].get("gpu") or 0, kv[0])):
        sample = eng.get("nvml")
        if isinstance(sample, dict):
            lines.append(gpu_line(sample))
        for other in eng.get("nvml_group") or ():  # the rest of a server's GPU group
            if isinstance(other, dict):
                lines.append(gpu_line(other))
        lines.append(engine_line(name, eng, snap, rates))
    return lines


def gpu_panel(snap: Snapshot, rates: RateTracker) -> Text:
    report = snap.extra.get("gpus")
    engs, remote = by_host(snap)
    lines: list[Text] = []
    if remote and snap.extra.get("host"):
        lines.append(Text(f"{snap.extra['host']}  (broker)", style="bold"))
    placed: set[str] = set()
    reason = unavailable_reason(report)
    engine = snap.extra.get("engine")
    if isinstance(engine, dict) and engine.get("kind") == "none":
        lines.append(Text("no local GPUs" + ("" if remote else ": waiting for agents"),
                          style=MUTED))
    elif reason is not None:
        lines.append(Text(reason, style=WARN))
    else:
        assert isinstance(report, dict)
        for g in report.get("gpus") or []:
            lines.append(gpu_line(g))
            for name, eng in sorted(engs.items()):
                if eng.get("gpu") == g.get("index"):
                    lines.append(engine_line(name, eng, snap, rates))
                    placed.add(name)
                elif g.get("index") in (eng.get("gpus") or ()):
                    lines.append(Text(f" {fmt.shorten(name, 14):<14} {gpu_label(eng)} "
                                      "(one server over the group)", style=MUTED))
        for lost in report.get("lost") or []:
            lines.append(Text(f"GPU{lost.get('index')} lost: {lost.get('reason')}",
                              style=CRITICAL))
    for name, eng in sorted(engs.items()):
        if name not in placed:
            lines.append(engine_line(name, eng, snap, rates))
    if not engs and not remote:
        lines.append(Text("  no consumers connected", style=MUTED))
    for host in sorted(remote):
        lines += host_lines(host, remote[host], snap, rates)
    return Text("\n").join(lines)
