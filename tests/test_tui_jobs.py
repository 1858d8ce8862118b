"""The overview's jobs box: hidden with no job, one line per job (live first) with its
progress and failures when the snapshot carries jobs (its finish is on its place line, the
one forecast) (`Snapshot.jobs`); and each GPU's
line naming the shape its consumer pulls from now and the one warming for it."""

from __future__ import annotations

import time

import msgspec
from textual.pilot import Pilot
from tui_synthetic import make_snapshot

from fabricctl.core.jobs import JobState, new_job, seal
from fabricctl.tui import draw
from fabricctl.tui.app import TopApp
from fabricctl.tui.sources import FixedSource
from fabricctl.tui.widgets.lines import TextBox


async def first_snapshot(app: TopApp, pilot: Pilot) -> None:
    """Until the app drew its first snapshot (it comes from the pump's thread), 10 s at most."""
    deadline = time.monotonic() + 10
    while not app.received:
        assert time.monotonic() < deadline, "no snapshot arrived"
        await pilot.pause(0.01)
    await pilot.pause()


def _jobs(t: float) -> list:
    live = new_job(2, "batch_2aa", "submit", t - 100, name="/data/in.jsonl")
    live.total, live.completed, live.failed = 1000, 250, 3
    done = new_job(1, "batch_1bb", "run", t - 500, name="/data/old.jsonl")
    done.total, done.completed = 10, 10
    seal(done, 10, t - 400)
    seal(done, 10, t - 399)  # finalizing -> completed
    return [done, live]


def test_job_line_shows_progress_and_failures_and_no_second_forecast() -> None:
    j = _jobs(1000.0)[1]
    line = draw.job_line(j).plain
    assert line.startswith("batch_2aa  in_progress")
    assert "253/1,000+ (25.3%)" in line
    assert "failed 3  cancelled 0" in line
    assert "ETA" not in line and "finish" not in line  # the place line has the forecast


def test_jobs_lines_put_live_jobs_first() -> None:
    snap = msgspec.structs.replace(make_snapshot(), jobs=_jobs(1000.0))
    lines = draw.jobs_lines(snap).plain.split("\n")
    assert [ln.split()[0] for ln in lines] == ["batch_2aa", "batch_1bb"]
    assert _jobs(1000.0)[0].state is JobState.COMPLETED


async def test_overview_shows_jobs_only_when_there_are_some() -> None:
    plain = make_snapshot()
    with_jobs = msgspec.structs.replace(plain, jobs=_jobs(plain.t))
    for snap, shown in ((plain, False), (with_jobs, True)):
        app = TopApp(FixedSource([snap]))
        async with app.run_test(size=(140, 50)) as pilot:
            box = app.query_one("#jobs", TextBox)
            await first_snapshot(app, pilot)
            assert box.has_class("-shown") is shown
            assert ("batch_2aa" in box.text.plain) is shown


def test_each_gpu_line_names_the_shape_it_pulls_from_and_the_next_one() -> None:
    from fabricctl.tui.gpu import RateTracker, gpu_panel

    snap = make_snapshot()
    shape = snap.shapes[0]
    first = msgspec.structs.replace(snap.consumers[0], current=shape.signature,
                                    next=snap.shapes[1].signature, model=shape.model)
    snap = msgspec.structs.replace(snap, consumers=[first, *snap.consumers[1:]])
    text = gpu_panel(snap, RateTracker()).plain
    line = next(ln for ln in text.split("\n") if ln.strip().startswith(first.name[:14]))
    assert f"now {draw.short_name(shape.signature, shape.label)[:16]}" in line
    assert " next " in line
    others = [ln for ln in text.split("\n") if " now " in ln]
    assert len(others) == 1 + sum(c.current is not None for c in snap.consumers[1:])


def test_job_line_names_the_endpoint_mix_in_its_colour() -> None:
    from fabricctl.tui.palette import MIX

    j = _jobs(1000.0)[1]
    assert "chat" not in draw.job_line(j).plain  # none counted: no mix
    j.endpoints = {"chat": 750, "embeddings": 250}
    line = draw.job_line(j)
    assert "(25.3%)  chat 75% · embed 25%  failed 3" in line.plain
    at = line.plain.index("chat 75%")
    assert any(s.style == MIX and s.start <= at < s.end for s in line.spans)


async def test_overview_jobs_box_shows_each_jobs_mix() -> None:
    jobs = _jobs(1000.0)
    jobs[0].endpoints = {"rerank": 10}
    jobs[1].endpoints = {"chat": 500, "responses": 250, "score": 250}
    snap = msgspec.structs.replace(make_snapshot(), jobs=jobs)
    app = TopApp(FixedSource([snap]))
    async with app.run_test(size=(160, 50)) as pilot:
        box = app.query_one("#jobs", TextBox)
        await first_snapshot(app, pilot)
        lines = box.text.plain.split("\n")
        assert "chat 50% · responses 25% · +1" in lines[0]  # the live job first
        assert "  rerank  " in lines[1]


def test_top_and_jobs_show_print_one_and_the_same_forecast(monkeypatch, capsys) -> None:
    """For the same snapshot (the job, its place, the time), top's job lines and `jobs show`
    print one finish forecast each, the same one (`core.forecast.finish_in`); `jobs show
    --json`'s `eta_s` is that figure. (They printed `ETA 6m40s` beside `finish in 3m12s`,
    and `eta` beside `predicted ... (in 3m12s)`: the job's own rate and the fleet's.)"""
    import re

    from fabricctl.cli import jobs as jobs_cli
    from fabricctl.config import AppConfig
    from fabricctl.core.forecast import JobView as JobPlace
    from fabricctl.core.forecast import finish_in
    from fabricctl.wire.protocol import JobView

    t = 10_000.0
    live = _jobs(t)[1]  # 253 outcomes in 100 s, 747 to go: 5m at its own rate
    place = JobPlace(live.number, 0, t + 600, 747, 80_000, 42.0, 2, 0.5, t + 192.0)
    snap = msgspec.structs.replace(make_snapshot(t=t), jobs=[live], job_views=[place])
    durations = re.compile(r"(?:ETA|eta|finish in|\(in) +(\d[\dhms.]*)")
    top = durations.findall(draw.jobs_lines(snap).plain)

    view = JobView(live, 3, [], 2.53, finish_in(place, t), place)
    monkeypatch.setattr(jobs_cli, "_fetch_view", lambda cfg, job: (view, {}))
    monkeypatch.setattr(jobs_cli.time, "time", lambda: t)
    jobs_cli.show_job(AppConfig(), live.id, False)
    show = durations.findall(capsys.readouterr().out)
    assert top == show == ["3m12s"]
    assert view.eta_s == 192.0
