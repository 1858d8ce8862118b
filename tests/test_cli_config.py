"""`fabricctl config show|default` and the configuration precedence, through the CLI.

Promises checked: flag > FABRICCTL_* env > project fabric.toml > user file > defaults, with
the user file at $XDG_CONFIG_HOME/fabricctl/config.toml unless FABRICCTL_CONFIG names
another; `show` marks where each set key came from; both outputs are TOML `--config`
accepts; a bad config is exit 2 with one error line naming the file and the key. The
environment variables are one list (`config.ENV_VARS`): the loader reads it, and the README's
table and the man pages' ENVIRONMENT are made from it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from cli_helpers import ROOT, clean_env, error_lines, fabricctl

from fabricctl.config import ENV_VARS, load_config


def _show(tmp_path: Path, *args: str, **env: str) -> tuple[dict, str]:
    e = clean_env(tmp_path, **env)
    as_json = fabricctl("config", "show", "--json", *args, env=e, cwd=tmp_path)
    as_toml = fabricctl("config", "show", *args, env=e, cwd=tmp_path)
    assert as_json.returncode == 0 and as_toml.returncode == 0, as_json.stderr
    return json.loads(as_json.stdout), as_toml.stdout.decode()


def _line(text: str, key: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"{key} = ")]
    return line


def test_precedence_flag_env_project_user_default(tmp_path: Path) -> None:
    user = tmp_path / "config" / "fabricctl" / "config.toml"
    doc, text = _show(tmp_path)
    assert doc["data_dir"] == str(tmp_path / "data" / "fabricctl")  # default: XDG_DATA_HOME
    assert _line(text, "data_dir") == f'data_dir = "{tmp_path / "data" / "fabricctl"}"'

    user.parent.mkdir(parents=True)
    user.write_text('data_dir = "/from/user"\nmodel = "user-model"\n[consumer]\n'
                    "max_batch_size = 7\n")
    doc, text = _show(tmp_path)
    assert (doc["data_dir"], doc["model"], doc["consumer"]["max_batch_size"]) == (
        "/from/user", "user-model", 7)
    assert _line(text, "data_dir").endswith(f"# from {user}")

    (tmp_path / "fabric.toml").write_text('data_dir = "/from/project"\n')
    doc, text = _show(tmp_path)
    assert doc["data_dir"] == "/from/project" and doc["model"] == "user-model"
    assert _line(text, "data_dir").endswith(f"# from {tmp_path / 'fabric.toml'}")
    assert _line(text, "model").endswith(f"# from {user}")
    assert _line(text, "max_batch_size").endswith(f"# from {user}")

    doc, text = _show(tmp_path, FABRICCTL_DATA_DIR="/from/env", FABRICCTL_MODEL="env-model")
    assert (doc["data_dir"], doc["model"]) == ("/from/env", "env-model")
    assert _line(text, "data_dir").endswith("# from environment")

    doc, text = _show(tmp_path, FABRICCTL_TOKEN="s3cret")
    assert doc["server"]["token"] == "s3cret"
    assert _line(text, "token") == 'token = "s3cret"  # from environment'
    assert doc["set_by"]["server.token"] == "environment"

    doc, text = _show(tmp_path, "--data-dir", "/from/flag", FABRICCTL_DATA_DIR="/from/env")
    assert doc["data_dir"] == "/from/flag"
    assert _line(text, "data_dir").endswith("# from flags")
    assert text.startswith("# fabricctl configuration in effect\n")


def test_fabricctl_config_names_the_user_file(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('engine = "sim"\n')
    doc, text = _show(tmp_path, FABRICCTL_CONFIG=str(other))
    assert doc["engine"] == "sim"
    assert _line(text, "engine") == f'engine = "sim"  # from {other}'


def test_default_and_show_are_toml_that_config_accepts(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    default = fabricctl("config", "default", env=env, cwd=tmp_path)
    assert default.returncode == 0
    parsed = tomllib.loads(default.stdout.decode())
    assert parsed["engine"] == "auto" and parsed["broker"]["thrash_batches"] == 100
    assert parsed["store"]["map_size"] == 256 << 20 and parsed["store"]["max_deliveries"] == 5
    assert "sources" not in parsed and "set_by" not in parsed
    path = tmp_path / "copy.toml"
    path.write_bytes(default.stdout)
    again = fabricctl("config", "show", "--config", str(path), env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    tomllib.loads(again.stdout.decode())
    assert json.loads(fabricctl("config", "default", "--json", env=env,
                                cwd=tmp_path).stdout)["engine"] == "auto"


def test_a_bad_config_is_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text("[consumer]\nmax_batch_sise = 3\n")
    for args in (["config", "show"], ["status"], ["shapes", "list"], ["submit", "-"]):
        out = fabricctl(*args, env=clean_env(tmp_path), cwd=tmp_path, input=b"")
        assert out.returncode == 2, args
        (line,) = error_lines(out.stderr)
        assert line.startswith(f"fabricctl: error: {tmp_path / 'fabric.toml'}: unknown key "
                               "consumer.max_batch_sise")
    (tmp_path / "fabric.toml").write_text("engine = \n")
    out = fabricctl("config", "show", env=clean_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and "not valid TOML" in out.stderr.decode()


def test_the_data_dir_from_the_config_finds_the_broker(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text(f'data_dir = "{tmp_path / "nowhere"}"\n')
    out = fabricctl("status", env=clean_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 3
    assert f"no broker at {tmp_path / 'nowhere'}" in out.stderr.decode()


def test_a_setting_of_the_wrong_type_is_named() -> None:
    import tempfile

    import pytest

    from fabricctl.config import load_config
    from fabricctl.errors import UsageError
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "c.toml"
        for bad, said in (('[broker]\nsweep = "no"', "broker.sweep must be bool, not 'no'"),
                          ("[broker]\nfair_share = 1", "broker.fair_share must be bool"),
                          ("[broker]\namortise_batches = 2.5", "amortise_batches must be int"),
                          ('[sim]\ntime_scale = "fast"', "sim.time_scale must be a number")):
            f.write_text(bad + "\n")
            with pytest.raises(UsageError, match=said):
                load_config(config_file=f)
        f.write_text("[broker]\nsweep = false\nwait_bound_s = 3\n")  # an int is a number
        cfg = load_config(config_file=f)
        assert (cfg.broker.sweep, cfg.broker.wait_bound_s) == (False, 3)


def test_provenance_is_recorded_while_loading(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text('model = "u"\n[store]\nsegment_entries = 64\n[vllm]\nport_base = 9000\n')
    (tmp_path / "fabric.toml").write_text('model = "p"\n[vllm]\nhost = "0.0.0.0"\n')
    cfg = load_config(None, {"data_dir": str(tmp_path / "d"), "engine": None}, cwd=tmp_path,
                      env={"FABRICCTL_CONFIG": str(user), "FABRICCTL_ENGINE": "sim"})
    project = str(tmp_path / "fabric.toml")
    assert cfg.sources == (str(user), project, "environment", "flags")
    assert cfg.set_by == {"model": project, "store.segment_entries": str(user),
                          "vllm.port_base": str(user), "vllm.host": project,
                          "engine": "environment", "data_dir": "flags"}


def test_the_environment_variables_are_listed_once(tmp_path: Path) -> None:
    rows = "\n".join(f"| `{v.name}` | {v.doc} |" for v in ENV_VARS)
    assert "| variable | what it does |\n|---|---|\n" + rows + "\n" in (
        ROOT / "README.md").read_text()
    page = (ROOT / "man" / "fabricctl.1").read_text()
    env_section = page.split(".SH ENVIRONMENT")[1].split(".SH ")[0]
    assert [v.name for v in ENV_VARS] == [
        line.split()[1] for line in env_section.splitlines() if line.startswith(".B FABRICCTL_")]
    for v in ENV_VARS:  # each that names a setting sets it
        env = {"FABRICCTL_CONFIG": str(tmp_path / "none.toml"),
               v.name: "sim" if v.key == "engine" else "x"}
        assert v.key == "" or load_config(cwd=tmp_path, env=env).set_by[v.key] == "environment"
