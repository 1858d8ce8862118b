"""A job's priority and window through the CLI, against a real broker (`up --engine sim`).

Promises checked: `submit --priority N --window DUR` gives the job that priority and a
deadline DUR after its creation (`jobs show --json`, `jobs --json`, the table and TSV), and
`jobs priority ID N` changes a live job's (an id prefix works as for `jobs show`); bad input
is a usage error (exit 2) naming the flag, and nothing is submitted: a negative, non-integer
or too-large priority, an unparseable or zero window, for `submit`, `run` and `jobs
priority` alike; `jobs priority` of an unknown id or of a job that ended is exit 1 with the
broker's reason and leaves the record as it was; the wire refuses an out-of-range priority
itself (`bad_priority`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from cli_helpers import Broker, clean_env, error_lines, fabricctl

from fabricctl.core.terms import MAX_PRIORITY
from fabricctl.errors import BrokerError
from fabricctl.wire.client import Client

DEADLINE_S = 60.0


def line(ident: str, model: str = "fabric-demo") -> bytes:
    return json.dumps({"id": ident, "model": model, "prefix": ["TERMS"], "prompt": "hi",
                       "max_tokens": 4}).encode() + b"\n"


def job_of(stderr: bytes) -> str:
    m = re.search(rb"fabricctl: job (batch_\w+)", stderr)
    assert m, stderr
    return m.group(1).decode()


def show(b: Broker, job: str) -> dict:
    out = b.run("jobs", "show", job, "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["job"])


def job_ids(b: Broker) -> list[str]:
    out = b.run("jobs", "--json")
    assert out.returncode == 0, out.stderr
    return [j["id"] for j in json.loads(out.stdout)["jobs"]]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("cli-terms")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


BAD_PRIORITIES = ["-1", "abc", "1.5", "", str(MAX_PRIORITY + 1), "99999999999999999999"]
BAD_WINDOWS = ["0h", "0s", "soon", "1d", "1.5h", "-2h", "24"]


@pytest.mark.parametrize("value", BAD_PRIORITIES)
def test_submit_refuses_a_bad_priority_and_sends_nothing(broker: Broker, value: str) -> None:
    before = job_ids(broker)
    out = broker.run("submit", "-", f"--priority={value}", input=line("p-bad"))
    assert out.returncode == 2, out.stderr
    [err] = error_lines(out.stderr)
    assert err.startswith("fabricctl: error: --priority: priority must be a whole number "
                          f"from 0 to {MAX_PRIORITY}"), err
    assert out.stdout == b"" and job_ids(broker) == before  # no job opened, nothing sent


@pytest.mark.parametrize("value", BAD_WINDOWS)
def test_submit_refuses_a_bad_window_and_sends_nothing(broker: Broker, value: str) -> None:
    before = job_ids(broker)
    out = broker.run("submit", "-", "--window", value, input=line("w-bad"))
    assert out.returncode == 2, out.stderr
    [err] = error_lines(out.stderr)
    assert err.startswith("fabricctl: error: --window: a window is a whole number of hours, "
                          "minutes or seconds above 0"), err
    assert repr(value) in err
    assert job_ids(broker) == before


def test_a_negative_priority_is_taken_as_the_value_of_the_flag(broker: Broker) -> None:
    out = broker.run("submit", "-", "--priority", "-3", input=line("p-neg"))
    assert out.returncode == 2 and "--priority: priority must be" in out.stderr.decode()


@pytest.mark.parametrize("args", [["--priority", "-1"], ["--priority", "x"],
                                  ["--window", "0m"], ["--window", "tomorrow"]])
def test_run_refuses_bad_terms_before_starting_anything(tmp_path: Path, args: list[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(line("r1"))
    data = tmp_path / "kept"
    out = fabricctl("run", str(src), "--engine", "sim", "--data-dir", str(data), *args,
                    env=clean_env(tmp_path), cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == b""
    [err] = error_lines(out.stderr)
    assert err.startswith(f"fabricctl: error: {args[0]}: "), err
    assert not data.exists()  # no broker was started, no job kept


def test_run_takes_a_priority_and_a_window(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(line(f"r{i}") for i in range(5)))
    data = tmp_path / "kept"
    out = fabricctl("run", str(src), "--engine", "sim", "--data-dir", str(data),
                    "--priority", "6", "--window", "90m", env=clean_env(tmp_path),
                    cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 5
    b = Broker(data, tmp_path)  # the kept data dir, opened again by `up`
    try:
        [job] = json.loads(b.run("jobs", "--json").stdout)["jobs"]
        assert job["kind"] == "run" and job["priority"] == 6
        assert job["deadline"] == pytest.approx(job["created"] + 5400)
    finally:
        assert b.stop() == 0


def test_submit_priority_window_and_jobs_priority_show_in_jobs(broker: Broker) -> None:
    # items for a model no consumer serves wait: the job stays live
    src = broker.home / "waiting.jsonl"
    src.write_bytes(b"".join(line(f"wait{i}", model="nobody-serves-this") for i in range(4)))
    out = broker.run("submit", str(src), "--priority", "5", "--window", "2h")
    assert out.returncode == 0, out.stderr
    job = job_of(out.stderr)
    rec = show(broker, job)
    assert rec["priority"] == 5 and rec["state"] == "in_progress" and rec["total"] == 4
    assert rec["deadline"] == pytest.approx(rec["created"] + 7200)

    changed = broker.run("jobs", "priority", job[:-1], "9")  # a unique prefix, as `show`
    assert changed.returncode == 0, changed.stderr
    assert changed.stderr.decode().strip() == f"{job}: priority 9"
    rec = show(broker, job)
    assert rec["priority"] == 9 and rec["deadline"] == pytest.approx(rec["created"] + 7200)
    as_json = broker.run("jobs", "priority", job, "0", "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["priority"] == 0
    broker.run("jobs", "priority", job, "9")

    listed = {j["id"]: j for j in json.loads(broker.run("jobs", "--json").stdout)["jobs"]}
    assert listed[job]["priority"] == 9
    tsv = broker.run("jobs").stdout.decode().splitlines()
    head = tsv[0].split("\t")
    row = next(r.split("\t") for r in tsv[1:] if r.startswith(job))
    assert row[head.index("priority")] == "9"
    text = broker.run("jobs", "show", job).stdout.decode()
    assert re.search(r"priority\s+9", text), text

    # a bad value changes nothing; an ended job's priority no longer changes
    bad = broker.run("jobs", "priority", job, "-1")
    assert bad.returncode == 2 and "N: priority must be a whole number" in bad.stderr.decode()
    assert show(broker, job)["priority"] == 9
    cancel = broker.run("jobs", "cancel", job)
    assert cancel.returncode == 0, cancel.stderr
    deadline = time.monotonic() + DEADLINE_S
    while show(broker, job)["state"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ended = broker.run("jobs", "priority", job, "3")
    assert ended.returncode == 1, ended.stderr
    assert error_lines(ended.stderr) == [
        f"fabricctl: error: job {job} has ended (cancelled): its priority can no longer change"]
    assert show(broker, job)["priority"] == 9


def test_jobs_priority_of_an_unknown_job_is_exit_1(broker: Broker) -> None:
    out = broker.run("jobs", "priority", "batch_nosuchjob", "3")
    assert out.returncode == 1
    assert error_lines(out.stderr) == [
        "fabricctl: error: no job matches 'batch_nosuchjob'"]


def test_the_wire_refuses_an_out_of_range_priority(broker: Broker) -> None:
    async def go() -> None:
        c = await Client.connect(broker.data_dir, "producer", "terms-test")
        try:
            j = (await c.open_job("submit", name="wire", attach=False, priority=2)).job
            assert j.priority == 2
            for bad in (-1, MAX_PRIORITY + 1):
                with pytest.raises(BrokerError) as e:
                    await c.set_job_priority(j.id, bad)
                assert e.value.code == "bad_priority"
                with pytest.raises(BrokerError) as e:
                    await c.open_job("submit", name="wire-bad", attach=False, priority=bad)
                assert e.value.code == "bad_priority"
            assert (await c.job(j.id)).job.priority == 2
            assert (await c.set_job_priority(j.id, MAX_PRIORITY)).job.priority == MAX_PRIORITY
        finally:
            await c.close()

    asyncio.run(go())
