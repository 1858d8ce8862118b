"""The GPU panel: NVML samples joined with each engine's stats and heartbeat, as Rich text.

Contract: `gpu_panel(snap, rates)` reads `snap.extra["gpus"]` (a `GpuReport` as builtins)
and `snap.extra["engines"]` (consumer -> gpu, engine, simulated, last_seen, stats). One line
per GPU (utilisation, memory, temperature, power), then one per engine on it (KV hit rate =
prefix-cache hits / queries, tokens/s sparkline, heartbeat age, "simulated", `now <shape>
next <shape>` from `snap.consumers`). Without NVML the first line is "NVML unavailable:
<reason>" and the engines are still listed; a broker with no local GPUs says "no local GPUs:
waiting for agents". Engines are grouped by host (`snap.extra["host"]`, each engine's
`host`): the broker's first, then one block per agent host with its NVML lines. A consumer
serving several names gets a `serves <names>` line (the current one bold); a server over a
group of GPUs shows them all (`gpu0,1`). Each launched vLLM server not ready
(`snap.extra["servers"]`) gets a `server_line`: starting, restarting, or FAILED with its
exit and log. `RateTracker` turns cumulative token counters into tokens/s per consumer.
With a `width`, no line is longer (`draw.fit`): an engine line drops parts of its head in
turn (`COMPACT`: sparkline, "simulated", engine name, padding), then is cut from the right
(`next`, then `now`), never the consumer's name or its GPU. What the dashboard shows:
README.md, "Reading the dashboard".
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from rich.text import Text

from fabricctl import fmt
from fabricctl.core.colocate import shared_note
from fabricctl.core.snapshot import Snapshot
from fabricctl.tui.draw import fit, fit_lines, labels, short_name
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


NOW_KEPT = 22  # cells of `now <shape>` an engine line keeps before its head loses parts
# what an engine line's head drops, in turn, to leave `NOW_KEPT` cells to its shapes: its
# sparkline, the "simulated" flag, the engine's name, the padding of its consumer's name
COMPACT: tuple[frozenset[str], ...] = (
    frozenset(), frozenset({"spark"}), frozenset({"spark", "simulated"}),
    frozenset({"spark", "simulated", "engine"}),
    frozenset({"spark", "simulated", "engine", "padding"}))


def engine_line(name: str, eng: dict[str, Any], snap: Snapshot, rates: RateTracker,
                width: int | None = None) -> Text:
    """The engine's line (and its `serves` line, if any), each at most `width` cells."""
    shapes = shape_part(name, snap)
    line = _engine_head(name, eng, snap, rates, COMPACT[0])
    for drop in COMPACT[1:]:
        if width is None or line.cell_len + min(shapes.cell_len, NOW_KEPT) <= width:
            break
        line = _engine_head(name, eng, snap, rates, drop)
    line.append_text(shapes)
    line = fit(line, width, words=True)
    more = [fit(x, width) for x in (served_line(name, snap), shared_line(eng)) if x is not None]
    return Text("\n").join([line, *more]) if more else line


def shared_line(eng: dict[str, Any]) -> Text | None:
    """`   shared: batch 10 of 16 slots, live 5, ...` for a server shared with live traffic
    (its last reading, `core.colocate.shared_note`); None otherwise."""
    stats = eng.get("stats")
    shared = stats.get("shared") if isinstance(stats, dict) else None
    if not isinstance(shared, dict):
        return None
    return Text("   " + shared_note(**shared), style=WARN if shared["window"] == 0 else MUTED)


def _engine_head(name: str, eng: dict[str, Any], snap: Snapshot, rates: RateTracker,
                 drop: frozenset[str]) -> Text:
    stats = eng.get("stats")
    line = Text(" ")
    pad = 0 if "padding" in drop else 14
    line.append(f"{fmt.shorten(name, 14):<{pad}} ", style="bold")
    line.append(f"{gpu_label(eng):<{0 if 'padding' in drop else 5}} ", style=MUTED)
    if "engine" not in drop:
        line.append(f"{fmt.shorten(str(eng.get('engine') or '?'), 6):<6} ")
    line.append("KV ", style=MUTED)
    line.append(f"{fmt.pct(kv_hit_rate(stats)):>6} ")
    if "spark" not in drop:
        line.append(fmt.sparkline(rates.rates.get(name, ()), SPARK_WIDTH) + " ", style=OK)
    line.append(f"{fmt.si(rates.latest(name)):>5} tok/s ")
    seen = eng.get("last_seen")
    hb = snap.t - seen if isinstance(seen, int | float) else None
    line.append("hb ", style=MUTED)
    line.append(f"{fmt.age(hb):>5}", style=WARN if hb is not None and hb > 5 else "")
    if eng.get("simulated") and "simulated" not in drop:
        line.append(" simulated", style=WARN)
    return line


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


def server_line(view: dict[str, Any]) -> Text | None:
    """` engine 1 gpu1 emb  FAILED crash loop, exit 1  log engine-1.log` for a launched
    server that is not ready (None for one that is): starting, restarting, or failed (the
    log's name only: the line must fit a GPU row; `status` gives its path)."""
    state = str(view.get("state") or "?")
    if state == "ready":
        return None
    line = Text(f" engine {view.get('index')} gpu{view.get('gpus')} "
                f"{fmt.shorten(str(view.get('model') or ''), 14)}  ", style=MUTED)
    code = view.get("last_exit")
    if state == "failed":
        reason = str(view.get("reason") or "")
        what = ("crash loop" if reason.startswith("crash loop") else "not ready in time"
                if reason.startswith("not ready") else fmt.shorten(reason.partition(";")[0], 32))
        line.append("FAILED " + what, style=CRITICAL)
        if code is not None:
            line.append(f", exit {code}", style=CRITICAL)
        line.append(f"  log {Path(str(view.get('log'))).name}", style=MUTED)  # status: its path
    elif view.get("failed_starts"):
        line.append(f"restarting: {view.get('failed_starts')} failed start(s), last "
                    f"{view.get('reason')}", style=WARN)
    else:
        line.append(state, style=WARN if state == "restarting" else MUTED)
    return line


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
               rates: RateTracker, width: int | None = None) -> list[Text]:
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
        lines.append(engine_line(name, eng, snap, rates, width))
    return lines


def gpu_panel(snap: Snapshot, rates: RateTracker, width: int | None = None) -> Text:
    """The panel's lines (see the module's contract), none longer than `width`."""
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
                    lines.append(engine_line(name, eng, snap, rates, width))
                    placed.add(name)
                elif g.get("index") in (eng.get("gpus") or ()):
                    lines.append(Text(f" {fmt.shorten(name, 14):<14} {gpu_label(eng)} "
                                      "(one server over the group)", style=MUTED))
        for lost in report.get("lost") or []:
            lines.append(Text(f"GPU{lost.get('index')} lost: {lost.get('reason')}",
                              style=CRITICAL))
    for name, eng in sorted(engs.items()):
        if name not in placed:
            lines.append(engine_line(name, eng, snap, rates, width))
    servers = snap.extra.get("servers")
    for view in servers if isinstance(servers, list) else ():
        server = server_line(view) if isinstance(view, dict) else None
        if server is not None:
            lines.append(server)
    if not engs and not remote:
        lines.append(Text("  no consumers connected", style=MUTED))
    for host in sorted(remote):
        lines += host_lines(host, remote[host], snap, rates, width)
    return fit_lines(Text("\n").join(lines), width)
