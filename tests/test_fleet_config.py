"""The fleet in the configuration (`[[servers]]`), what `up` builds of it, and `doctor`'s check.

Promises checked: the single-model form is the shorthand of one server with one one-GPU
group per GPU; a `[[servers]]` list loads with its names, adapters (directories read
against the file's directory), groups and tensor-parallel sizes, `config show`/`default`
print it as TOML that loads back; each bad input is a `UsageError` naming the entry; `up`'s
fleet (`Fleet.build`) launches one stand-in `vllm` per group and each consumer registers
its server's served name and adapters, but refuses a missing adapter directory or a group
larger than the GPUs NVML finds before any server starts; the simulated engine rehearses a
`[[servers]]` fleet (one simulated GPU per group, its server's names); `doctor` fails a
group naming a GPU twice or one NVML does not have, and says it skipped the GPU checks
without NVML; Ray places one worker per group with `num_gpus` the group's size.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from pathlib import Path

import pytest
from cli_helpers import clean_env, fabricctl
from server_helpers import result_sequence
from test_launcher import free_port

from fabricctl.cli import doctor
from fabricctl.config import AppConfig, load_config, to_toml
from fabricctl.config.fleetspec import ServerSpec, replicas
from fabricctl.errors import UsageError
from fabricctl.supervisor import ray_placement
from fabricctl.supervisor.fleet import Fleet
from fabricctl.supervisor.gpus import GpuReport, GpuSample

FAKE = str(Path(__file__).with_name("fake_engine_server.py"))

FLEET = """\
[[servers]]
model = "/models/base"
name = "base"
adapters = {{ "ad-a" = "{a}", "ad-b" = "adapters/b" }}
gpus = [[0, 1]]

[[servers]]
model = "/models/emb"
gpus = [[2], [3]]
extra_args = ["--max-num-seqs", "8"]
env = {{ X = "1" }}
"""


def load(tmp_path: Path, text: str) -> AppConfig:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return load_config(path, cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "none")})


def adapter(directory: Path) -> str:
    """A LoRA adapter directory as PEFT writes one (its config is what is checked)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text("{}")
    return str(directory)


def nvml(*indices: int) -> GpuReport:
    return GpuReport(available=True, driver_version="1",
                     gpus=[GpuSample(uuid=f"GPU-{i}", index=i, name="H") for i in indices])


NO_NVML = GpuReport(available=False, reason="NVML unavailable: driver not loaded")


# ---- the configuration --------------------------------------------------------------------


def test_the_single_model_form_is_one_server_with_a_group_per_gpu() -> None:
    cfg = AppConfig(model="/m", served_model_name="tiny", gpus=[0, 1])
    assert cfg.fleet == [ServerSpec(model="/m", name="tiny", gpus=[[0], [1]])]
    assert [r.group for r in replicas(cfg.fleet)] == [(0,), (1,)]
    assert AppConfig().fleet == [ServerSpec(model="fabric-demo")]


def test_a_servers_list_loads_with_names_adapters_groups(tmp_path: Path) -> None:
    cfg = load(tmp_path, FLEET.format(a="/abs/a"))
    base, emb = cfg.servers
    assert base.names == ("base", "ad-a", "ad-b")
    assert base.adapters == {"ad-a": "/abs/a", "ad-b": str(tmp_path / "adapters" / "b")}
    assert (base.gpus, base.tp(base.gpus[0])) == ([[0, 1]], 2)
    assert (emb.served_name, emb.names, emb.gpus) == ("/models/emb", ("/models/emb",),
                                                      [[2], [3]])
    assert (emb.extra_args, emb.env) == (["--max-num-seqs", "8"], {"X": "1"})
    assert cfg.model_name == "base" and cfg.set_by["servers"] == str(tmp_path / "fleet.toml")
    assert [(r.server.served_name, r.group, r.index) for r in replicas(cfg.fleet)] == [
        ("base", (0, 1), 0), ("/models/emb", (2,), 1), ("/models/emb", (3,), 2)]


def test_config_show_prints_the_fleet_as_toml_that_loads_back(tmp_path: Path) -> None:
    cfg = load(tmp_path, FLEET.format(a="/abs/a"))
    text = to_toml(cfg)
    assert "[[servers]]" in text and "\nmodel = " not in text.split("[[servers]]")[0]
    again = tmp_path / "again"
    again.mkdir()
    assert load(again, text).servers == cfg.servers
    default = tomllib.loads(to_toml(AppConfig()))
    assert "servers" not in default  # the default is the single-model form
    env = clean_env(tmp_path)
    shown = fabricctl("config", "show", "--config", str(tmp_path / "fleet.toml"), env=env,
                      cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert tomllib.loads(shown.stdout.decode())["servers"][0]["adapters"]["ad-a"] == "/abs/a"
    as_json = fabricctl("config", "show", "--json", "--config", str(tmp_path / "fleet.toml"),
                        env=env, cwd=tmp_path)
    assert json.loads(as_json.stdout)["servers"][1]["gpus"] == [[2], [3]]


BAD = [
    ('[[servers]]\nmodel = "a"\n[[servers]]\nmodel = "b"\nname = "a"\n',
     r"servers\[1\] \(a\) and servers\[0\] \(a\) both serve the name 'a'"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0]]\nadapters = { x = "/x" }\n'
     '[[servers]]\nmodel = "b"\ngpus = [[1]]\nadapters = { x = "/y" }\n',
     r"servers\[1\] \(b\): adapter 'x' has the name servers\[0\] \(a\) adapter is served"),
    ('[[servers]]\nmodel = "org/base"\nname = "base"\nadapters = { base = "/x" }\n',
     r"servers\[0\] \(base\): adapter 'base' has the name servers\[0\] \(base\) is served"),
    ('[[servers]]\nmodel = "org/base"\nname = "b"\nadapters = { "org/base" = "/x" }\n',
     r"adapter 'org/base' has the name of the model of servers\[0\]"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0, 1]]\n[[servers]]\nmodel = "b"\ngpus = [[1]]\n',
     r"GPU 1 is in two groups: servers\[0\] \(a\) \[0, 1\] and servers\[1\] \(b\) \[1\]"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0, 0]]\n',
     r"servers\[0\] \(a\): group \[0, 0\] names GPU 0 twice"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0], []]\n',
     r"servers\[0\] \(a\): gpus has an empty group"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0, 1]]\ntensor_parallel_size = 3\n',
     r"tensor_parallel_size 3 does not divide its group \[0, 1\] of 2 GPU"),
    ('[[servers]]\nmodel = "a"\ngpus = [0, 1]\n', r"gpus must be a list of GPU groups"),
    ('[[servers]]\nmodel = "a"\ngpus = [[0]]\n[[servers]]\nmodel = "b"\n',
     r"servers\[1\] \(b\): gpus is missing"),
    ('[[servers]]\nname = "a"\n', r"servers\[0\] \(a\): model must be a non-empty string"),
    ('[[servers]]\nmodel = "a"\ngpu = [[0]]\n', r"unknown key 'gpu'"),
    ('[[servers]]\nmodel = "a"\nextra_args = ["--tensor-parallel-size", "2"]\n',
     r"extra_args must not give --tensor-parallel-size"),
    ('[[servers]]\nmodel = "a"\ntensor_parallel_size = -1\n', r"integer >= 0"),
    ('servers = { model = "a" }\n', r"servers must be a list of tables"),
    ('gpus = [0]\n[[servers]]\nmodel = "a"\n', r"gpus is the single-model form"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_each_bad_fleet_is_a_usage_error_naming_the_entry(tmp_path: Path, text: str,
                                                          message: str) -> None:
    with pytest.raises(UsageError, match=message) as e:
        load(tmp_path, text)
    assert str(tmp_path / "fleet.toml") in str(e.value)


# ---- what `up` builds of it -----------------------------------------------------------------


def vllm_config(tmp_path: Path, text: str) -> AppConfig:
    stand_in = (f'engine = "vllm"\n[vllm]\ncommand = ["{sys.executable}", "{FAKE}"]\n'
                f'port_base = {free_port(4)}\nready_timeout_s = 20.0\n'
                f'extra_args = ["--record={tmp_path}/rec-{{index}}.jsonl"]\n')
    cfg = load(tmp_path, stand_in + text)
    return dataclasses.replace(cfg, data_dir=tmp_path / "data")


async def test_up_launches_a_server_per_group_and_consumers_register_its_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fabricctl.supervisor.gpus.detect_gpus", lambda: nvml(0, 1, 2))
    a, b = adapter(tmp_path / "a"), adapter(tmp_path / "b")
    cfg = vllm_config(tmp_path, f"""
[[servers]]
model = "/models/base"
name = "base"
adapters = {{ "ad-a" = "{a}", "ad-b" = "{b}" }}
gpus = [[0, 1]]

[[servers]]
model = "/models/emb"
name = "emb"
gpus = [[2]]
""")
    fleet = await Fleet.build(cfg, "vllm")
    try:
        assert (fleet.gpus, fleet.groups, fleet.models) == ([0, 2], [[0, 1], [2]],
                                                            ["base", "emb"])
        started = [json.loads((tmp_path / f"rec-{i}.jsonl").read_text()) for i in (0, 1)]
        assert [s["cuda"] for s in started] == ["0,1", "2"]
        argv = started[0]["argv"]
        tail = argv[argv.index("--tensor-parallel-size"):]
        assert tail[:8] == ["--tensor-parallel-size", "2", "--enable-lora", "--lora-modules",
                            f"ad-a={a}", f"ad-b={b}", "--max-loras", "3"]
        assert "--enable-lora" not in started[1]["argv"]
        assert "--tensor-parallel-size" not in started[1]["argv"]
        fleet.start(tmp_path / "no-broker.sock")
        contracts = [(c.name, c.contract().model, c.contract().names) for c in fleet.consumers]
        assert contracts == [("vllm-gpu0-1", "base", ("ad-a", "ad-b")),
                             ("vllm-gpu2", "emb", ())]
    finally:
        await fleet.stop(timeout=5)


@pytest.mark.parametrize(("gpus", "adapters", "message"), [
    ("[[0, 1]]", '{ a = "missing" }', "adapter 'a': directory .*missing does not exist"),
    ("[[0, 1]]", '{ a = "empty" }', "empty holds no adapter_config.json"),
    ("[[0, 1, 2]]", "{}", r"group \[0, 1, 2\] needs 3 GPUs and this host has 2; names GPU 2"),
])
async def test_up_refuses_a_fleet_the_host_cannot_serve_before_any_server_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: str, adapters: str,
        message: str) -> None:
    monkeypatch.setattr("fabricctl.supervisor.gpus.detect_gpus", lambda: nvml(0, 1))
    (tmp_path / "empty").mkdir()
    cfg = vllm_config(tmp_path, f'[[servers]]\nmodel = "m"\ngpus = {gpus}\n'
                                f"adapters = {adapters}\n")
    with pytest.raises(UsageError, match=message):
        await Fleet.build(cfg, "vllm")
    assert not list(tmp_path.glob("rec-*.jsonl"))  # no server was started


def test_up_exits_2_naming_the_bad_adapter_before_any_server_starts(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(
        f'engine = "vllm"\n[vllm]\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        f'extra_args = ["--record={tmp_path}/rec.jsonl"]\n'
        '[[servers]]\nmodel = "m"\nname = "base"\nadapters = { ad-a = "nope" }\n'
        "gpus = [[0]]\n")
    up = fabricctl("up", "--config", "fleet.toml", "--data-dir", str(tmp_path / "data"),
                   env=clean_env(tmp_path), cwd=tmp_path)
    assert up.returncode == 2, up.stderr
    assert (f"the fleet cannot start on this host: servers[0] (base): adapter 'ad-a': "
            f"directory {tmp_path / 'nope'} does not exist") in up.stderr.decode()
    assert not (tmp_path / "rec.jsonl").exists()


async def test_the_sim_rehearses_a_fleet_one_simulated_gpu_per_group(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'engine = "sim"\n' + FLEET.format(a="/abs/a"))
    fleet = await Fleet.build(cfg, "sim")
    try:
        assert len(fleet.engines) == 3 and fleet.gpus == [0, 2, 3]
        assert fleet.models == ["base", "/models/emb", "/models/emb"]
        assert [e.limits().names for e in fleet.engines] == [("ad-a", "ad-b"), (), ()]
    finally:
        await fleet.stop(timeout=5)
    shorthand = await Fleet.build(AppConfig(engine="sim"), "sim")
    assert len(shorthand.engines) == 2 and shorthand.models == ["fabric-demo"] * 2


# ---- doctor -------------------------------------------------------------------------------


def checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
           report: GpuReport) -> dict[str, doctor.Check]:
    monkeypatch.setattr("fabricctl.supervisor.gpus.detect_gpus", lambda: report)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return {c.name: c for c in doctor.run_checks(path, {"data_dir": tmp_path / "data"})}


def test_doctor_fails_a_group_naming_a_gpu_nvml_does_not_have(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by = checks(tmp_path, monkeypatch, 'engine = "vllm"\n[[servers]]\nmodel = "m"\n'
                'gpus = [[0, 1]]\n', nvml(0))
    assert by["fleet"].status == "fail"
    assert "group [0, 1] needs 2 GPUs and this host has 1; names GPU 1, which NVML does " \
           "not find (GPUs present: 0)" in by["fleet"].detail
    ok = checks(tmp_path, monkeypatch, 'engine = "vllm"\n[[servers]]\nmodel = "m"\n'
                'gpus = [[0, 1]]\n', nvml(0, 1))
    assert ok["fleet"].status == "ok" and ok["fleet"].detail == "1 server(s): m on [0,1] tp 2"


def test_doctor_fails_a_group_naming_a_gpu_twice(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    by = checks(tmp_path, monkeypatch, '[[servers]]\nmodel = "m"\ngpus = [[0, 0]]\n', nvml(0))
    assert by["config"].status == "fail" and "names GPU 0 twice" in by["config"].detail
    assert by["fleet"].status == "fail" and "did not load" in by["fleet"].detail


def test_doctor_checks_adapter_directories_and_skips_gpus_without_nvml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = adapter(tmp_path / "a")
    fleet = (f'engine = "vllm"\n[[servers]]\nmodel = "m"\ngpus = [[0], [1]]\n'
             f'adapters = {{ a = "{a}", b = "{tmp_path / "b"}" }}\n')
    by = checks(tmp_path, monkeypatch, fleet, NO_NVML)
    assert by["fleet"].status == "fail"
    assert by["fleet"].detail == f"servers[0] (m): adapter 'b': directory {tmp_path / 'b'} " \
                                 "does not exist"
    adapter(tmp_path / "b")
    by = checks(tmp_path, monkeypatch, fleet, NO_NVML)
    assert by["fleet"].status == "ok", by["fleet"]
    assert by["fleet"].detail == ("1 server(s): m on [0] [1] adapters a, b; GPU groups not "
                                  "checked: no NVML (NVML unavailable: driver not loaded)")
    sim = checks(tmp_path, monkeypatch, "", NO_NVML)
    assert sim["fleet"].status == "ok" and "GPU groups not checked" in sim["fleet"].detail


# ---- Ray ------------------------------------------------------------------------------------


def test_ray_places_one_worker_per_group_with_its_size(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'engine = "sim"\n[[servers]]\nmodel = "m"\ngpus = [[0, 1]]\n')
    (only,) = ray_placement.placements(cfg, "sim")
    assert (only.group, only.num_gpus, only.server) == ((0, 1), 2, 0)
    assert ray_placement.placements(cfg, "vllm", cluster_gpus=8) == [only]  # the fleet decides
    fleet = load(tmp_path, FLEET.format(a="/abs/a"))
    assert [(p.group, p.server) for p in ray_placement.placements(fleet, "vllm")] == [
        ((0, 1), 0), ((2,), 1), ((3,), 1)]
    shorthand = AppConfig(engine="sim")
    assert [p.num_gpus for p in ray_placement.placements(shorthand, "sim")] == [1, 1]
    assert len(ray_placement.placements(shorthand, "vllm", cluster_gpus=3)) == 3
    lone = load(tmp_path, '[[servers]]\nmodel = "m"\nadapters = { a = "/a" }\n')
    assert ray_placement.placements(lone, "vllm", cluster_gpus=2) == [
        ray_placement.Placement((0,), 0), ray_placement.Placement((1,), 0)]
    narrowed = ray_placement.group_config(fleet, "vllm", [5, 6], 0, "w", server=0)
    assert narrowed.servers == [ServerSpec(model="/models/base", name="base",
                                           adapters=fleet.servers[0].adapters, gpus=[[5, 6]])]
    assert narrowed.vllm.port_base == fleet.vllm.port_base + 5


def test_the_readme_fleets_load(tmp_path: Path) -> None:
    """The quick start's LoRA fleet and TP server are configurations that load."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = {b.split("\n", 1)[0].removeprefix("# fleet: "): b
              for b in (part.split("```", 1)[0] for part in readme.split("```toml\n")[1:])
              if b.startswith("# fleet: ")}
    lora = load(tmp_path, blocks["lora"])
    (base,) = lora.servers
    assert base.names == ("base", "ad-a", "ad-b") and base.gpus == [[0], [1]]
    tp = load(tmp_path, blocks["tp"])
    assert [(s.served_name, s.gpus, s.tp(s.gpus[0])) for s in tp.servers] == [
        ("qwen3-32b", [[0, 1]], 2), ("qwen3-embed", [[2]], 1)]


def test_an_agent_runs_the_groups_of_the_fleet_inside_its_gpus() -> None:
    from fabricctl.cli.consume import agent_config
    from fabricctl.config.fleetspec import within

    fleet = [ServerSpec("big", gpus=[[0, 1]]), ServerSpec("small", gpus=[[2], [3]]),
             ServerSpec("any")]
    mine = within(fleet, [2, 3])
    assert [(s.model, s.gpus) for s in mine] == [("small", [[2], [3]]), ("any", [[2], [3]])]
    with pytest.raises(UsageError, match=r"group \[0, 1\] lies only partly in --gpus 1,2"):
        within(fleet, [1, 2])
    with pytest.raises(UsageError, match="no \\[\\[servers\\]\\] GPU group lies in --gpus 5"):
        within(fleet[:2], [5])
    cfg = agent_config(AppConfig(servers=fleet[:2]), "sim", [0, 1], None)
    assert [s.gpus for s in cfg.servers] == [[[0, 1]]] and cfg.sim.gpus == 2


async def test_a_sim_fleet_routes_each_name_to_its_server_and_shows_its_group(
        tmp_path: Path) -> None:
    """`up --engine sim` of a fleet: a base model with two adapters over a group of two GPUs,
    an embedder on a third. Every item lands on the server of its name; the snapshot shows
    the group's GPUs (from its consumer's heartbeat) and the names each consumer serves."""
    import asyncio
    import time

    from fabricctl.core.payload import Payload, encode_payload
    from fabricctl.core.types import Item
    from fabricctl.daemon.assembly import Daemon
    from fabricctl.wire.client import Client

    cfg = dataclasses.replace(
        AppConfig(data_dir=tmp_path / "data", engine="sim",
                  servers=[ServerSpec("/m/base", "base", {"ad-a": "/a", "ad-b": "/b"},
                                      [[0, 1]]),
                           ServerSpec("/m/emb", "emb", gpus=[[2]])]),
        sim=dataclasses.replace(AppConfig().sim, time_scale=0.0))
    names = ("base", "ad-a", "ad-b", "emb")
    items = [Item(f"i{k}", names[k % 4], 1 + k % 2, 40, 2,
                  encode_payload(Payload([f"system {k % 2}"], f"q{k}", [32], 8)))
             for k in range(80)]
    daemon = await Daemon.start(cfg)
    try:
        await daemon.fleet.wait_connected()
        client = await Client.connect(daemon.server.state.cfg.socket_path, "producer", "t")
        try:
            assert (await client.submit(items)).accepted == len(items)
            deadline = time.monotonic() + 60
            while (await client.ledger())["persisted"]["items_completed"] < len(items):
                assert time.monotonic() < deadline, "the fleet did not finish"  # polled
                await asyncio.sleep(0.02)
            seen = {r.id: (r.model, r.gpu) for _, r in await result_sequence(client)}
            assert seen == {it.id: (it.model, 2 if it.model == "emb" else 0) for it in items}
            snap = await client.snapshot()
            views = {c.model: c for c in snap.consumers}
            assert views["base"].names == ["ad-a", "ad-b"] and views["emb"].names == []
            group = snap.extra["engines"][views["base"].name]
            assert group["gpus"] == [0, 1] and group["gpu"] == 0
            assert snap.extra["engines"][views["emb"].name]["gpus"] is None
        finally:
            await client.close()
    finally:
        await daemon.stop()

