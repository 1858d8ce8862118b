"""The dashboard's pure renderers: exact text, and colours where colour is the message.

Promises: the five states with counts and arrows; critical things (thrash events, bars
below the 100-batch line, starving lanes) in `palette.CRITICAL`; quiescing lanes dimmed;
"NVML unavailable: <reason>" and "simulated" in the GPU panel; the shapes table fits 80
columns; `top --once` and `--json` print the same snapshot.
"""

from __future__ import annotations

import io

import msgspec
from rich.console import Console
from rich.text import Text
from tui_synthetic import make_snapshot

from fabricctl import fmt
from fabricctl.cli.top import write_once
from fabricctl.core.events import Event, EventKind
from fabricctl.core.snapshot import BatchesHistogramView, LaneView, Snapshot
from fabricctl.tui import charts, draw, table
from fabricctl.tui.gpu import RateTracker, gpu_panel, kv_hit_rate
from fabricctl.tui.palette import CRITICAL, DIM, LINE
from fabricctl.tui.render import print_snapshot


def styles_at(text: Text, needle: str) -> set[str]:
    at = text.plain.index(needle)
    return {str(s.style) for s in text.spans if s.start <= at < s.end}


def test_state_machine_draws_five_states_with_counts_and_arrows() -> None:
    text = draw.state_machine({"staged": 3, "warming": 1, "active": 1, "finished": 12})
    top, bypass = text.plain.split("\n")
    assert top == "staged 3 ─▶ warming 1 ─▶ active 1 ─▶ draining 0 ─▶ finished 12"
    assert bypass.index("└") == top.index("staged") + len("staged 3") // 2
    assert bypass.index("▲") == top.index("active") + len("active 1") // 2


def test_formatters() -> None:
    assert [fmt.si(12), fmt.si(1234), fmt.si(56_789), fmt.si(3_400_000)] == \
        ["12", "1.2k", "56.8k", "3.4M"]
    assert [fmt.age(4.25), fmt.age(75), fmt.age(7300)] == ["4.2s", "1m15s", "2h01m"]
    assert fmt.pct(None) == "n/a" and fmt.pct(0.0125) == "1.2%"
    assert fmt.sparkline([0, 5, 10], 5) == "  ▁▅█"


def test_the_table_fits_80_columns_and_keeps_the_model_when_there_are_several() -> None:
    assert table.fit(200, 1) == table.COLUMN_KEYS
    narrow = table.fit(78, 1)
    assert "model" not in narrow and {"signature", "state", "tokens", "waste"} <= set(narrow)
    assert "model" in table.fit(78, 3)



def test_a_long_label_takes_the_room_a_wide_terminal_leaves() -> None:
    m = {"model": 5, "signature": 16, "label": 30, "state": 6, "epoch": 2, "tokens": 6,
         "lanes": 10, "batches": 7, "waste": 5, "age": 5}
    assert table.widths(m, 120, 1)["label"] == 30  # room for all of it
    assert table.widths(m, 100, 1)["label"] == 18  # what is left after every column
    assert tuple(table.widths(m, 80, 1)) == table.fit(80, 1, 1, {**m, "label": 14})
    assert table.widths({**m, "label": 9}, 120, 1)["label"] == 9  # never wider than needed
    assert all(sum(w + 2 for w in table.widths(m, n, 1).values()) <= n for n in (80, 100, 120))


def test_rows_filter_by_every_word_and_sort() -> None:
    snap = make_snapshot(8, 4)
    rows = table.rows(snap.shapes, "tokens", True)
    tokens = [next(s.tokens for s in snap.shapes if table.row_key(s) == k) for k, _ in rows]
    assert tokens == sorted(tokens, reverse=True)
    assert [k for k, _ in table.rows(snap.shapes, query="SHAPE-003 staged")] == \
        [table.row_key(snap.shapes[3])]
    assert table.rows(snap.shapes, query="shape-003 active") == []


def test_thrash_events_are_drawn_in_the_critical_colour() -> None:
    thrash = Event(7, 99.0, EventKind.THRASH, "m", 0xA11CE, "alpha", value=12, critical=True,
                   reason="finished after 12 batches (< 100)")
    line = draw.event_line(thrash, 100.0)
    assert line.plain == "  1.0s ago  THRASH      m 00000000000a11ce alpha  finished after " \
                         "12 batches"
    assert any(str(s.style) == CRITICAL and s.start == 0 and s.end == len(line.plain)
               for s in line.spans)
    joined = draw.event_line(Event(8, 100.0, EventKind.CONSUMER_JOINED, "m", reason="w0"), 100)
    assert "consumer w0 joined" in joined.plain and CRITICAL not in styles_at(joined, "w0")


def test_a_force_drain_of_many_lanes_is_one_line_with_the_count() -> None:
    many = Event(9, 99.0, EventKind.FORCE_DRAIN, "m", 0xA11CE, "alpha", value=3, count=37,
                 reason="force-drained 37 lanes, 80 items")
    assert draw.event_line(many, 100.0).plain.endswith(
        "m 00000000000a11ce alpha  force-drained 37 lanes, 80 items")
    one = Event(10, 99.0, EventKind.FORCE_DRAIN, "m", 0xA11CE, "alpha", value=3, count=1,
                reason="2 items")
    assert draw.event_line(one, 100.0).plain.endswith("lane 3 force-drained (2 items)")


def test_histogram_marks_buckets_below_the_thrash_line_and_draws_the_line() -> None:
    counts = [0] * 14
    counts[4], counts[7] = 2, 3  # 10-19 batches (thrashing), 100-199 batches
    view = BatchesHistogramView([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
                                counts, [12, 150], 100, thrashed=2)
    text = charts.batches_histogram(view, 40)
    lines = text.split("\n")
    labels = [line.plain.split()[0] for line in lines[2:]]
    rule = next(k for k, label in enumerate(labels) if label.startswith("──"))
    assert labels.index("50-99") + 1 == rule  # the thrash line right after 50-99
    assert "100 batches: thrash line" in text.plain
    assert "2 thrashing" in text.plain
    assert CRITICAL in styles_at(lines[labels.index("10-19") + 2], "█")
    assert CRITICAL not in styles_at(lines[labels.index("100-199") + 2], "█")
    recent = charts.recent_shapes([12, 150], 100, 40, 10)
    bars = recent.plain.split("\n")[2:]
    assert bars[0].index("│") == bars[1].index("│")  # one vertical thrash line
    assert CRITICAL in styles_at(recent.split("\n")[2], "█")


def lane(**kw: object) -> LaneView:
    base = {"id": 3, "target": 128, "items": 5, "tokens": 600, "waste": 0.02,
            "oldest_age": 2.0, "starving": False, "quiescing": False, "inflight": 0}
    base.update(kw)
    return LaneView(**base)  # type: ignore[arg-type]


def test_lane_bars_against_the_threshold_line_starving_marked_quiescing_dimmed() -> None:
    low, high = charts.lane_line(lane(waste=0.005), 0.02, 80), charts.lane_line(
        lane(waste=0.035), 0.02, 80)
    assert low.plain.index("│") == high.plain.index("│")  # the threshold, one column
    assert low.cell_len == high.cell_len
    assert LINE in styles_at(low, "│")
    starving = charts.lane_line(lane(starving=True, oldest_age=42.0), 0.02, 80)
    assert "STARVING" in starving.plain and CRITICAL in styles_at(starving, "STARVING")
    quiet = charts.lane_line(lane(quiescing=True, items=2), 0.02, 80)
    assert "quiescing" in quiet.plain
    assert any(str(s.style) == DIM and s.start == 0 and s.end == len(quiet.plain)
               for s in quiet.spans)


def test_gpu_panel_without_nvml_names_the_reason_and_labels_simulated_engines() -> None:
    snap = make_snapshot(4, 4, nvml=False)
    text = gpu_panel(snap, RateTracker()).plain
    assert text.splitlines()[0] == "NVML unavailable: NVML Shared Library Not Found"
    assert text.count("simulated") == 2
    snap.extra.pop("gpus")
    assert gpu_panel(snap, RateTracker()).plain.startswith("NVML unavailable: ")


def test_gpu_panel_with_nvml_and_rates() -> None:
    a, b = make_snapshot(4, 4, nvml=True, t=100.0), make_snapshot(4, 4, nvml=True, t=102.0)
    for eng in b.extra["engines"].values():  # type: ignore[union-attr]
        eng["stats"]["prompt_tokens"] = 0
        eng["stats"]["generation_tokens"] = 0
    for eng in a.extra["engines"].values():  # type: ignore[union-attr]
        eng["stats"]["prompt_tokens"] = 0
        eng["stats"]["generation_tokens"] = 0
    b.extra["engines"]["gpu0-consumer"]["stats"]["prompt_tokens"] = 5000  # type: ignore[index]
    rates = RateTracker()
    rates.update(a)
    rates.update(b)
    assert rates.latest("gpu0-consumer") == 2500.0
    lines = gpu_panel(b, rates).plain.splitlines()
    assert lines[0].startswith("GPU0 NVIDIA H200") and "util  87%" in lines[0]
    assert "141.0 GiB" in lines[0] and "61°C" in lines[0] and "512 W" in lines[0]
    assert "KV  99.1%" in lines[1] and "2.5k tok/s" in lines[1]
    assert "simulated" not in "\n".join(lines)
    assert kv_hit_rate({"prefix_cache_queries": 4, "prefix_cache_hits": 3}) == 0.75
    assert kv_hit_rate({}) is None


def test_gpu_panel_marks_a_server_in_a_crash_loop_and_one_still_starting() -> None:
    snap = make_snapshot(4, 4, nvml=True)
    view = {"index": 1, "gpus": "1", "model": "emb", "restarts": 2, "failed_starts": 3,
            "last_exit": 1, "log": "/d/logs/engine-1.log",
            "reason": "crash loop: 3 starts in a row failed before it was ever ready (last: "
                      "exited with 1); see /d/logs/engine-1.log"}
    snap.extra["servers"] = [{**view, "index": 0, "gpus": "0", "model": "tiny",
                              "state": "ready", "failed_starts": 0, "reason": ""},
                             {**view, "state": "failed"},
                             {**view, "index": 2, "gpus": "2", "state": "starting",
                              "failed_starts": 0, "last_exit": None, "reason": ""}]
    panel = gpu_panel(snap, RateTracker())
    lines = panel.plain.splitlines()
    failed = [ln for ln in lines if "engine 1 gpu1" in ln]
    assert failed == [" engine 1 gpu1 emb  FAILED crash loop, exit 1  log engine-1.log"]
    assert any(s.style == CRITICAL and panel.plain[s.start:s.end].startswith("FAILED")
               for s in panel.spans)
    assert [ln for ln in lines if "engine 2 gpu2" in ln] == [" engine 2 gpu2 emb  starting"]
    assert not any("engine 0 gpu0" in ln for ln in lines)  # ready: its consumer's line says it


def test_once_prints_the_overview_and_json_round_trips() -> None:
    snap = make_snapshot(6, 4)
    out = io.StringIO()
    print_snapshot(snap, Console(file=out, width=120, color_system=None), "data")
    text = out.getvalue()
    assert "staged 4 ─▶ warming 1 ─▶ active 1 ─▶ draining 0 ─▶ finished 40" in text
    assert f"{snap.shapes[0].signature:016x}" in text and "shape-000" in text
    assert "NVML unavailable" in text and "ledger" in text and "THRASH" in text
    buf = io.StringIO()
    write_once(snap, True, buf)
    assert msgspec.json.decode(buf.getvalue(), type=Snapshot) == snap
