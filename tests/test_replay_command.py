"""`run_replay`, the body of `fabricctl replay WORKLOAD.jsonl`: table, JSON, bad input (a
`UsageError`, which the command ends with as every command does)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import clean_env, fabricctl
from workload_files import write_workload

from fabricctl.cli.replay import run_replay
from fabricctl.errors import UsageError
from fabricctl.replay.run import ABLATIONS, POLICIES


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_workload(tmp_path_factory.mktemp("replay") / "w.jsonl", items=300, shapes=6,
                          seed=2, prefix_tokens=512, median_tokens=40, max_tokens=4)


def args(path: Path, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"workload": path, "gpus": 2, "policy": "all", "json_out": False,
                               "kv_tokens": None, "pressure": None, "rate": 0.0, "seed": 0,
                               "max_num_seqs": 32}
    base.update(kw)
    return base


def test_table(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_replay(**args(workload, pressure=2.0)) == 0  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    for name in POLICIES:
        assert name in out
    assert "simulated" in out
    got = re.search(r"cache pressure ([0-9.]+)", err)
    assert got is not None and float(got.group(1)) == pytest.approx(2.0, rel=0.05)
    assert "300 items" in err


def test_json_keyed_by_policy(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_replay(**args(workload, json_out=True, kv_tokens=20_000))  # type: ignore[arg-type]
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(POLICIES)
    for name, fig in out.items():
        assert fig["policy"] == name
        assert fig["items"] == 300
        for key in ("tokens_per_s", "kv_hit_rate", "kv_hit_achievable", "switches_per_gpu",
                    "midstream_switches", "padding_waste", "graph_builds", "thrash_events",
                    "p50_latency_s", "p99_latency_s"):
            assert key in fig
    assert out["fabric"]["midstream_switches"] == 0


def test_one_policy_ablations_and_streaming(workload: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    names = ",".join(("fabric", *ABLATIONS))
    kw = args(workload, policy=names, json_out=True, rate=50.0, seed=4)
    code = run_replay(**kw)  # type: ignore[arg-type]
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["fabric", *ABLATIONS]
    assert out["fabric"]["makespan_s"] > 5.0  # 300 arrivals at 50/s


@pytest.mark.parametrize("bad", [
    {"policy": "fastest"},
    {"policy": ""},
    {"gpus": 0},
    {"kv_tokens": 10_000, "pressure": 1.0},
    {"pressure": -1.0},
    {"kv_tokens": 4},
    {"rate": -1.0},
    {"max_num_seqs": 0},
])
def test_bad_arguments(workload: Path, bad: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        run_replay(**args(workload, **bad))  # type: ignore[arg-type]


def test_missing_and_empty_workloads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="no such file"):
        run_replay(**args(tmp_path / "nope.jsonl"))  # type: ignore[arg-type]
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n{not json\n")
    with pytest.raises(UsageError, match="no readable item"):
        run_replay(**args(empty))  # type: ignore[arg-type]
    assert "line 2" in capsys.readouterr().err


def test_the_command_ends_a_usage_error_as_every_command_does(tmp_path: Path) -> None:
    out = fabricctl("replay", "nope.jsonl", env=clean_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == b"fabricctl: error: nope.jsonl: no such file\n"


def test_bad_lines_are_reported_and_skipped(workload: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    mixed = tmp_path / "mixed.jsonl"
    lines = workload.read_bytes().splitlines()[:40]
    mixed.write_bytes(b"\n".join([*lines[:10], b'{"id": 1}', *lines[10:]]) + b"\n")
    code = run_replay(**args(mixed, policy="fabric", json_out=True))  # type: ignore[arg-type]
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["fabric"]["items"] == 40
    assert "line 11" in captured.err
