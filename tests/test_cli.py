"""Every client command as a subprocess against a real broker (`fabricctl up --engine sim`).

Promises checked: data on stdout, one `fabricctl: error: ...` line on stderr, the documented
exit codes, `--json` on every read command, a closed pipe ends quietly, several brokers run
side by side in their own data dirs, and `fabricctl down` stops a broker.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from cli_helpers import FABRICCTL, Broker, clean_env, error_lines, fabricctl

from fabricctl import __version__


def native(ident: str, prefix: str = "SYS", **over: object) -> dict:
    obj = {"id": ident, "model": "fabric-demo", "prefix": [prefix, "FEW"],
           "prompt": f"question {ident}", "max_tokens": 8, "label": f"label-{prefix}"}
    obj.update(over)
    return obj


def jsonl(objs: list[dict]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("cli")
    b = Broker(home / "broker-a", home)
    first = [native(f"a{i}", "SYS-A") for i in range(40)] + [native(f"b{i}", "SYS-B")
                                                              for i in range(20)]
    out = b.run("submit", "-", "--wait", input=jsonl(first))
    assert out.returncode == 0, out.stderr
    yield b
    assert b.stop() == 0


# ---- no broker ------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["status"], ["shapes", "list"], ["shapes", "inspect", "x"],
                                  ["results"], ["down"], ["submit", "-"]])
def test_without_a_broker_every_client_command_exits_3_with_one_error_line(
        tmp_path: Path, args: list[str]) -> None:
    out = fabricctl(*args, "--data-dir", str(tmp_path / "none"), env=clean_env(tmp_path),
                    cwd=tmp_path, input=b"")
    assert out.returncode == 3
    assert out.stdout == b""
    (line,) = error_lines(out.stderr)
    assert line.startswith("fabricctl: error: no broker at ")


# ---- help and version -----------------------------------------------------------------------


def test_help_lists_the_exit_codes_and_version_prints(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    out = fabricctl("--help", env=env, cwd=tmp_path)
    assert out.returncode == 0
    text = " ".join(out.stdout.decode().split())
    assert "Exit status: 0 ok, 1 runtime error, 2 usage or config error, 3 backend" in text
    assert "4 timeout, 5 engine failed, 6 inference server did not start, 130 interrupted" in text
    version = fabricctl("--version", env=env, cwd=tmp_path)
    assert version.stdout.decode() == f"fabricctl {__version__}\n"


@pytest.mark.parametrize("args", [["submit"], ["results"], ["shapes", "list"],
                                  ["shapes", "inspect"], ["status"], ["doctor"],
                                  ["config", "show"], ["config", "default"], ["down"], ["top"],
                                  ["up"], ["run"], ["consume"]])
def test_every_command_has_help(args: list[str]) -> None:
    from typer.testing import CliRunner

    from fabricctl.cli.app import app

    out = CliRunner().invoke(app, [*args, "--help"], prog_name="fabricctl")
    assert out.exit_code == 0, out.output
    assert "Usage: fabricctl " in out.stdout
    if args not in (["run"], ["consume"], ["config", "default"]):
        assert "--data-dir" in out.stdout  # every broker client finds its broker the same way


def test_a_bad_flag_is_a_usage_error(tmp_path: Path) -> None:
    out = fabricctl("results", "--follow", "--json", env=clean_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "fabricctl: error: --json prints one document and cannot follow; drop one of them"]


# ---- results --------------------------------------------------------------------------------


def test_results_prints_every_stored_result_as_jsonl(broker: Broker) -> None:
    out = broker.run("results")
    assert out.returncode == 0 and out.stderr == b""
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids)) >= 60
    assert {f"a{i}" for i in range(40)} <= set(ids)
    assert set(lines[0]) == {"id", "model", "text", "finish_reason", "usage", "shape", "lane",
                             "epoch", "gpu", "error"}


def test_results_since_and_json_document(broker: Broker) -> None:
    doc = json.loads(broker.run("results", "--json").stdout)
    assert doc["since"] == 0 and doc["next"] == len(doc["results"])
    later = broker.run("results", "--since", "50")
    assert [json.loads(x)["id"] for x in later.stdout.splitlines()] == [
        r["id"] for r in doc["results"][50:]]
    empty = json.loads(broker.run("results", "--json", "--since", str(doc["next"])).stdout)
    assert empty == {"results": [], "since": doc["next"], "next": doc["next"]}


def test_a_closed_pipe_exits_quietly(broker: Broker) -> None:
    cmd = " ".join([*FABRICCTL, "results", "--data-dir", str(broker.data_dir)])
    out = subprocess.run(f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}", shell=True,
                         executable="/bin/bash", capture_output=True, env=broker.env,
                         cwd=broker.home, timeout=60)
    assert len(out.stdout.splitlines()) == 1
    assert out.stderr == b""  # no traceback, no "Exception ignored"
    assert out.returncode in (0, 1)  # 1: Click's own EPIPE handling; never a crash


def test_results_follow_prints_new_results_until_interrupted(broker: Broker) -> None:
    proc = subprocess.Popen([*FABRICCTL, "results", "--follow", "--data-dir",
                             str(broker.data_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=broker.env, cwd=broker.home)
    assert proc.stdout is not None
    try:
        first = json.loads(proc.stdout.readline())
        assert first["id"]
        sub = broker.run("submit", "-", input=jsonl([native("follow-1", "SYS-F")]))
        assert sub.returncode == 0
        seen = set()
        while "follow-1" not in seen:
            seen.add(json.loads(proc.stdout.readline())["id"])
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"Traceback" not in err


# ---- shapes ---------------------------------------------------------------------------------


def test_shapes_list_json_and_tsv(broker: Broker) -> None:
    doc = json.loads(broker.run("shapes", "list", "--json").stdout)
    assert isinstance(doc["shapes"], list)
    for s in doc["shapes"]:
        assert s["shape"] == f"{s['signature']:016x}"
        assert s["state"] in ("staged", "warming", "active", "draining")
    tsv = broker.run("shapes", "list").stdout.decode().splitlines()
    assert tsv[0].split("\t")[:4] == ["shape", "label", "model", "state"]
    assert len(tsv) == 1 + len(doc["shapes"])


def _a_shape(broker: Broker) -> dict:
    """A live shape: items of a model no consumer serves stay queued for good."""
    items = [native(f"staged-{i}", "SYS-STAGED", model="nobody-serves-this") for i in range(5)]
    assert broker.run("submit", "-", input=jsonl(items)).returncode == 0
    doc = json.loads(broker.run("shapes", "list", "--json").stdout)
    (shape,) = [s for s in doc["shapes"] if s["label"] == "label-SYS-STAGED"]
    return shape


def test_shapes_inspect_by_signature_0x_or_label(broker: Broker) -> None:
    shape = _a_shape(broker)
    for arg in (shape["shape"], "0x" + shape["shape"], shape["shape"].lstrip("0"),
                "label-SYS-STAGED"):
        doc = json.loads(broker.run("shapes", "inspect", arg, "--json").stdout)
        assert doc["shape"] == shape["shape"] and doc["live"]
        assert doc["state"] in ("staged", "warming", "active")  # no consumer: never drains
        assert doc["items"] == 5 and len(doc["lanes"]) >= 1 and doc["batches"] == 0
        assert set(doc["percentiles"]) == {"p50", "p90", "p99"}
        assert doc["history"][0][1] == "staged"
        assert doc["thrash_line"] == 100
        assert doc["thrash"].startswith(("not dispatched", "at risk: 0 batches"))
    human = broker.run("shapes", "inspect", "label-SYS-STAGED")
    assert human.returncode == 0
    text = human.stdout.decode()
    for part in ("state history", "lanes (", "input length percentiles", "thrash", "epoch"):
        assert part in text
    assert "\x1b[" not in text


def test_a_drained_shape_can_still_be_inspected(broker: Broker) -> None:
    doc = json.loads(broker.run("shapes", "inspect", "label-SYS-A", "--json").stdout)
    assert doc["label"] == "label-SYS-A" and doc["history"] and doc["thrash"]
    assert doc["live"] or doc["state"] == "finished"


def test_shapes_inspect_unknown_exits_1(broker: Broker) -> None:
    out = broker.run("shapes", "inspect", "no-such-label")
    assert out.returncode == 1 and out.stdout == b""
    assert error_lines(out.stderr) == [
        "fabricctl: error: no shape matches 'no-such-label' (not live, and not in the broker's "
        "event log); see `fabricctl shapes list`"]


# ---- status, doctor -------------------------------------------------------------------------


def test_status_json_and_table(broker: Broker) -> None:
    doc = json.loads(broker.run("status", "--json").stdout)
    assert doc["difference"] == [0, 0]
    assert doc["ledger"]["items_received"] >= 60
    assert [c["name"] for c in doc["consumers"]] == ["sim-gpu0", "sim-gpu1"]
    assert set(doc["states"]) == {"staged", "warming", "active", "draining", "finished"}
    assert doc["extra"]["store"]["data_dir"] == str(broker.data_dir)
    assert doc["extra"]["store"]["recovery"]["ledger_ok"] is True
    assert doc["extra"]["loop"] == "uvloop"  # `fabricctl up` serves on uvloop
    assert doc["token_counter"] == "estimate"  # what a submit with this config counts with
    text = broker.run("status").stdout.decode()
    for part in ("ledger difference", "0 items, 0 tokens (ok)", "consumers (2)", "LMDB used",
                 "last recovery", "token counts"):
        assert part in text


def test_doctor_reports_each_check(broker: Broker) -> None:
    out = broker.run("doctor", "--json")
    assert out.returncode == 0, out.stdout
    doc = json.loads(out.stdout)
    assert [c["name"] for c in doc["checks"]] == ["config", "nvml", "fleet", "vllm", "data_dir",
                                                  "broker"]
    by = {c["name"]: c for c in doc["checks"]}
    assert by["broker"]["status"] == "ok" and "answering" in by["broker"]["detail"]
    assert by["data_dir"]["status"] == "ok" and "free" in by["data_dir"]["detail"]
    assert doc["ok"] is True
    human = broker.run("doctor").stdout.decode().splitlines()
    assert [ln.split()[1] for ln in human] == ["config", "nvml", "fleet", "vllm", "data_dir",
                                               "broker"]


def test_doctor_fails_on_a_bad_config(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    (tmp_path / "fabric.toml").write_text("engine = 'warp-drive'\n")
    out = fabricctl("doctor", "--json", env=env, cwd=tmp_path)
    assert out.returncode == 1
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert by["config"]["status"] == "fail" and "engine must be one of" in by["config"]["detail"]


def test_no_colour_is_forced(broker: Broker) -> None:
    for args in (["status"], ["doctor"], ["shapes", "inspect", "label-SYS-A"]):
        out = broker.run(*args, FORCE_COLOR="1")  # a terminal as far as Rich knows; NO_COLOR=1
        assert b"\x1b[3" not in out.stdout and b"\x1b[9" not in out.stdout, args


# ---- top ------------------------------------------------------------------------------------


def test_top_once_json_and_plain(broker: Broker) -> None:
    doc = json.loads(broker.run("top", "--once", "--json").stdout)
    assert doc["difference"] == [0, 0] and "shapes" in doc and "batches_histogram" in doc
    plain = broker.run("top")  # stdout is a pipe: one snapshot, no TUI
    assert plain.returncode == 0 and plain.stdout and b"\x1b[?" not in plain.stdout


def test_top_without_a_broker_exits_3(tmp_path: Path) -> None:
    out = fabricctl("top", "--once", "--data-dir", str(tmp_path), env=clean_env(tmp_path),
                    cwd=tmp_path)
    assert out.returncode == 3 and out.stdout == b""
    assert error_lines(out.stderr)[0].startswith("fabricctl: error: ")


# ---- several brokers side by side, down -----------------------------------------------------


def test_two_brokers_run_side_by_side(broker: Broker, tmp_path: Path) -> None:
    other = Broker(tmp_path / "broker-b", tmp_path)
    try:
        out = other.run("submit", "-", "--wait", input=jsonl([native("only-in-b", "SYS-B2")]))
        assert out.returncode == 0 and json.loads(out.stdout)["id"] == "only-in-b"
        b_ids = [json.loads(x)["id"] for x in other.run("results").stdout.splitlines()]
        assert b_ids == ["only-in-b"]
        a_ids = {json.loads(x)["id"] for x in broker.run("results").stdout.splitlines()}
        assert "only-in-b" not in a_ids
        via_env = fabricctl("results", env={**other.env,
                                             "FABRICCTL_DATA_DIR": str(other.data_dir)},
                            cwd=tmp_path)
        assert [json.loads(x)["id"] for x in via_env.stdout.splitlines()] == ["only-in-b"]
    finally:
        assert other.stop() == 0
    gone = other.run("status")
    assert gone.returncode == 3
