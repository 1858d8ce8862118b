"""Each job's place in the fleet, as its readers show it: the formatters, `jobs show` and the
jobs table (rendered from literal `JobView`s), `top`'s jobs box; and through a live broker, a
job whose deadline is too short for the measured rate is at risk in `jobs show --json`, the
snapshot, `status` and the Prometheus exposition, whose per-job label sets leave with the job.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from rich.text import Text
from server_helpers import CONTRACT, MODEL, SIG_A, WireConsumer, running_server, wait_until
from store_helpers import keep_pace
from tui_synthetic import make_snapshot

from fabricctl import fmt
from fabricctl.cli import jobs as jobs_cli
from fabricctl.cli.common import settings
from fabricctl.core.events import EventKind
from fabricctl.core.forecast import JobView
from fabricctl.core.jobs import JobState, new_job
from fabricctl.core.types import Item
from fabricctl.tui import draw, render
from fabricctl.tui.palette import CRITICAL
from fabricctl.wire.client import Client

NOW = 10_000.0


def test_relative_times_and_finish_against_deadline() -> None:
    assert [fmt.relative(192), fmt.relative(-45), fmt.relative(0.2), fmt.relative(None)] == \
        ["in 3m12s", "45s ago", "now", "n/a"]
    assert fmt.finish_vs_deadline(192, None) == "in 3m12s"
    assert fmt.finish_vs_deadline(192, 600) == "in 3m12s, 6m48s before its deadline"
    assert fmt.finish_vs_deadline(720, 600) == "in 12m0s, 2m0s after its deadline"
    assert fmt.finish_vs_deadline(None, 600) == "n/a"


def _record(number: int = 7, deadline_in: float | None = 600.0):
    j = new_job(number, f"batch_{number:x}aa", "submit", NOW - 100, name="/d/in.jsonl",
                window_s=None)
    j.deadline = None if deadline_in is None else NOW + deadline_in
    j.total, j.completed = 1000, 200
    return j


def _late(number: int = 7) -> JobView:
    return JobView(number, 0, NOW + 600, queued_items=800, queued_tokens=80_000,
                   oldest_wait_s=42.0, holders=2, share=0.5, predicted_finish=NOW + 720,
                   at_risk=True)


def _on_time(number: int = 7) -> JobView:
    return JobView(number, 0, NOW + 600, queued_items=800, queued_tokens=80_000,
                   oldest_wait_s=3.5, holders=1, share=0.25, predicted_finish=NOW + 192)


def _plain(rows: list[tuple[str, object]]) -> dict[str, str]:
    return {k: v.plain if isinstance(v, Text) else str(v) for k, v in rows}


def test_jobs_show_rows_of_a_job_at_risk_and_on_time() -> None:
    late = jobs_cli.place_rows(_record(), _late(), NOW)
    rows = _plain(late)
    assert rows["oldest wait"] == "42s  (800 items, 80.0k tokens queued)"
    assert rows["share"] == "2 consumer(s) on its shapes: 50% of the fleet"
    assert rows["finish"].startswith("predicted ")
    assert rows["finish"].endswith("(in 12m0s, 2m0s after its deadline)")
    assert rows["risk"] == "AT RISK: predicted to finish 2m0s after its deadline"
    risk = dict(late)["risk"]
    assert isinstance(risk, Text) and risk.style == CRITICAL
    ok = _plain(jobs_cli.place_rows(_record(), _on_time(), NOW))
    assert ok["finish"].endswith("(in 3m12s, 6m48s before its deadline)") and "risk" not in ok
    unmeasured = msgspec.structs.replace(_on_time(), predicted_finish=None)
    assert _plain(jobs_cli.place_rows(_record(), unmeasured, NOW))["finish"] == \
        "n/a (no rate measured yet)"
    assert jobs_cli.place_rows(_record(), None, NOW) == []


def test_jobs_table_cells_and_json_carry_every_field() -> None:
    wait, share, finish, deadline = jobs_cli.place_cells(_record(), _late(), NOW)
    assert (wait, share, deadline) == ("42s", "50% (2)", "in 10m0s")
    assert isinstance(finish, Text) and finish.plain == "in 12m0s (2m0s late)"
    assert finish.spans and finish.spans[0].style == CRITICAL
    _, _, on_time, _ = jobs_cli.place_cells(_record(), _on_time(), NOW)
    assert on_time.plain == "in 3m12s" and not on_time.spans
    assert jobs_cli.place_cells(_record(deadline_in=None), None, NOW) == ["-", "-", "-", "-"]
    doc = jobs_cli.place_doc(_on_time())
    assert doc is not None and doc["at_risk"] is False and doc["holders"] == 1
    assert set(jobs_cli.PLACE_COLUMNS) - {"deadline"} <= set(doc)
    assert jobs_cli.place_tsv(_record(), _late())[-1] == 1


def test_top_jobs_box_marks_the_job_at_risk() -> None:
    snap = msgspec.structs.replace(make_snapshot(t=NOW), jobs=[_record(7), _record(8)],
                                   job_views=[_late(7), _on_time(8)])
    lines = draw.jobs_lines(snap)
    text = lines.plain.split("\n")
    assert len(text) == 4  # each job, and its place under it
    late = next(ln for ln in text if "AT RISK" in ln)
    assert "finish in 12m0s, 2m0s after its deadline  AT RISK  wait 42s  share 50% (2)  " \
        "800 queued" in late
    assert any("finish in 3m12s, 6m48s before its deadline" in ln for ln in text)
    assert draw.jobs_at_risk(snap) == 1
    risky = draw.place_line(_late(), NOW)
    assert risky.spans[-1].style == CRITICAL and risky.spans[-1].end == len(risky)
    console = Console(width=160, record=True, color_system=None)
    console.print(render.snapshot_renderable(snap))
    assert "AT RISK" in console.export_text()


def test_an_ended_job_has_no_place_line() -> None:
    done = _record(7)
    done.state = JobState.COMPLETED
    snap = msgspec.structs.replace(make_snapshot(t=NOW), jobs=[done], job_views=[_late(7)])
    assert "\n" not in draw.jobs_lines(snap).plain


def _items(n: int) -> list[Item]:
    return [Item(f"r{k}", MODEL, SIG_A, 100, 8, f"p{k}".encode(), line=k + 1)
            for k in range(n)]


def _metric(text: str, name: str, job_id: str | None = None) -> float | None:
    label = "" if job_id is None else f'{{job_id="{job_id}"}}'
    for line in text.splitlines():
        if line.startswith(f"{name}{label} "):
            return float(line.split()[-1])
    return None


async def test_a_deadline_too_short_is_at_risk_everywhere(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    # the pace the last run kept: 1,000 tokens/s per consumer, so 200,000 tokens take 200 s;
    # one batch measured is no rate to go by yet
    keep_pace(tmp_path / "data", MODEL, 1000.0)
    async with running_server(tmp_path) as server:
        state = server.state
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        job = (await c.open_job("submit", name="in.jsonl", window_s=60.0)).job
        assert job.deadline is not None
        await c.submit(_items(2000), job=job.number)
        await c.seal_job(job.number, 2000)
        wc = await WireConsumer.connect(server.state.cfg.socket_path, "gpu0", CONTRACT)
        work = None
        while work is None:
            work = await wc.pull(0.5)
        assert await wc.complete(work, "ok") > 0  # one batch: the fleet's rate is measured

        async def risky() -> bool:
            place = (await c.job(job.id)).place
            return place is not None and place.at_risk
        await wait_until(risky)
        view = await c.job(job.id)
        place = view.place
        assert place is not None and place.job == job.number
        assert place.predicted_finish is not None and place.predicted_finish > job.deadline
        assert place.holders == 1 and place.share == 1.0 and place.oldest_wait_s >= 0.0
        assert place.queued_items == 2000 - len(work.items)

        snap = await c.snapshot()
        [snap_view] = [v for v in snap.job_views if v.job == job.number]
        assert snap_view.at_risk
        status = await c.status()
        [summary] = status["jobs"]
        assert summary["at_risk"] is True and summary["holders"] == 1
        assert summary["predicted_finish"] > summary["deadline"]

        async def warned() -> bool:
            events = await c.events(0, 1000)
            return any(e.kind is EventKind.JOB_AT_RISK for e in events)
        await wait_until(warned)

        exposition = state.metrics.render().decode()
        assert _metric(exposition, "fabricctl_jobs_at_risk") == 1.0
        assert _metric(exposition, "fabricctl_job_holders", job.id) == 1.0
        assert _metric(exposition, "fabricctl_job_share", job.id) == 1.0
        age = _metric(exposition, "fabricctl_job_queue_age_seconds", job.id)
        assert age is not None and age >= 0.0
        assert _metric(exposition, "fabricctl_job_queued_items", job.id) == place.queued_items

        cfg = settings(server.state.cfg.data_dir, None)
        capsys.readouterr()
        await asyncio.to_thread(jobs_cli.show_job, cfg, job.id, True)
        doc = json.loads(capsys.readouterr().out)
        assert doc["place"]["at_risk"] is True and doc["place"]["holders"] == 1
        await asyncio.to_thread(jobs_cli.show_job, cfg, job.id, False)
        text = capsys.readouterr().out
        assert "AT RISK: predicted to finish" in text and "after its deadline" in text
        assert "oldest wait" in text and "of the fleet" in text
        await asyncio.to_thread(jobs_cli.show_list, cfg, True)
        listed = json.loads(capsys.readouterr().out)
        assert [v["job"] for v in listed["job_views"]] == [job.number]

        # the job ends: its label sets leave the exposition, the count drops
        await c.cancel_job(job.id)

        async def ended() -> bool:
            return (await c.job(job.id)).job.ended
        await wait_until(ended)
        exposition = state.metrics.render().decode()
        assert job.id not in exposition
        assert _metric(exposition, "fabricctl_jobs_at_risk") == 0.0
        assert (await c.job(job.id)).place is None
        await wc.close()
        await c.close()
