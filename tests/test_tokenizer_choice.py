"""Which token counter lanes get: `[producer] tokenizer`, the model dir's, or the estimate.

Promises checked: `choose_counter` picks `[producer] tokenizer` when set; else the configured
model's `tokenizer.json` when the model is a local directory holding one and `tokenizers`
imports; else the 4-bytes-a-token estimate (missing dir, no file, a hub name, no package,
a file that does not load), its `name` saying which. `run` and `submit` count with it (a
tokenizer that makes "one two three" 3 tokens where the estimate says 4), `run --json`
names it, and `status` / `status --json` say what a submit with that configuration uses.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from cli_helpers import Broker, clean_env, fabricctl

from fabricctl.formats.tokens import choose_counter, estimate_tokens

TEXT = "one two three"  # 3 words; the estimate says ceil(13 / 4) = 4


def model_dir(root: Path, name: str = "model") -> Path:
    """A model directory with a WordLevel tokenizer.json trained here (no download)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import WordLevelTrainer

    tok = tokenizers.Tokenizer(WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.train_from_iterator(["one two three four", "five six seven"],
                            WordLevelTrainer(special_tokens=["[UNK]"]))
    path = root / name
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text("{}")  # as a model dir has; not read
    return path


def test_a_model_dir_with_tokenizer_json_is_used(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    counter = choose_counter("", str(model))
    assert counter.name == f"tokenizer:{model / 'tokenizer.json'}"
    assert counter.count(TEXT) == 3 != estimate_tokens(TEXT)


def test_producer_tokenizer_wins_over_the_model_dir(tmp_path: Path) -> None:
    model, other = model_dir(tmp_path), model_dir(tmp_path, "other")
    counter = choose_counter(str(other / "tokenizer.json"), str(model))
    assert counter.name == f"tokenizer:{other / 'tokenizer.json'}"


@pytest.mark.parametrize("model", ["", "fabric-demo", "meta-llama/Llama-3.1-8B", "missing"])
def test_no_model_dir_falls_back_to_the_estimate(tmp_path: Path, model: str) -> None:
    arg = str(tmp_path / model) if model == "missing" else model
    counter = choose_counter("", arg)
    assert counter.name == "estimate" and counter.count(TEXT) == 4


def test_a_dir_without_tokenizer_json_is_the_estimate(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    assert choose_counter("", str(tmp_path / "bare")).name == "estimate"


def test_without_the_tokenizers_package_it_is_the_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = model_dir(tmp_path)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now fails
    assert choose_counter("", str(model)).name == "estimate"


def test_a_tokenizer_json_that_does_not_load_warns_and_estimates(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not a tokenizer")
    with caplog.at_level(logging.WARNING, logger="fabricctl.tokens"):
        assert choose_counter("", str(tmp_path / "broken")).name == "estimate"
    assert "does not load" in caplog.text


# ---- through the commands -------------------------------------------------------------------


def _items(model: str, n: int = 5) -> bytes:
    return b"".join(json.dumps({"id": f"t{i}", "model": model, "prompt": TEXT,
                                "max_tokens": 2}).encode() + b"\n" for i in range(n))


def test_run_counts_with_the_model_dir_tokenizer(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    path = tmp_path / "in.jsonl"
    path.write_bytes(_items(str(model)))
    out = fabricctl("run", str(path), "-o", str(tmp_path / "out.jsonl"), "--engine", "sim",
                    "--model", str(model), "--json", env=clean_env(tmp_path), cwd=tmp_path,
                    timeout=180)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["token_counter"] == f"tokenizer:{model / 'tokenizer.json'}"
    assert summary["tokens_in"] == 5 * 3  # the tokenizer's count, not the estimate's 5 * 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("tokenizer-choice")
    b = Broker(home / "broker", home)
    yield b
    assert b.stop() == 0


def test_submit_and_status_use_the_configured_model_dir(broker: Broker, tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    name = f"tokenizer:{model / 'tokenizer.json'}"
    # the broker serves fabric-demo; this submit's configuration names the model dir
    out = broker.run("submit", "-", "--wait", "--timeout", "60", input=_items("fabric-demo"),
                     FABRICCTL_MODEL=str(model))
    assert out.returncode == 0, out.stderr
    assert {json.loads(x)["usage"]["prompt_tokens"] for x in out.stdout.splitlines()} == {3}

    doc = json.loads(broker.run("status", "--json", FABRICCTL_MODEL=str(model)).stdout)
    assert doc["token_counter"] == name
    text = broker.run("status", FABRICCTL_MODEL=str(model), COLUMNS="400").stdout.decode()
    assert any("token counts" in ln and name in ln for ln in text.splitlines())
    plain = json.loads(broker.run("status", "--json").stdout)
    assert plain["token_counter"] == "estimate"


# ---- the rehearsal counts what the engine counts ----------------------------------------------

PREFIX = " ".join(["one two three four five six seven"] * 20)  # 140 words; estimate: 170


def _replay_lines(model: str, n: int = 40) -> bytes:
    return b"".join(json.dumps({"id": f"r{i}", "model": model, "prefix": [PREFIX],
                                "prompt": f"{TEXT} {i}", "max_tokens": 2}).encode() + b"\n"
                    for i in range(n))


def test_replay_sizes_prefixes_with_the_model_dir_tokenizer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fabricctl.cli.replay import counter_for, read_workload, run_replay
    from fabricctl.engines.blocks import decode_item_payload, prefix_tokens

    model = model_dir(tmp_path)
    path = tmp_path / "w.jsonl"
    path.write_bytes(_replay_lines(str(model)))
    counter = counter_for("", str(model))
    sized = {prefix_tokens(decode_item_payload(it)) for it in read_workload(path, counter)}
    assert sized == {140} and estimate_tokens(PREFIX) == 170
    estimated = {prefix_tokens(decode_item_payload(it)) for it in read_workload(path)}
    assert estimated == {170}  # the estimate stays the fallback

    kw = dict(workload=path, gpus=1, policy="fabric", json_out=True, kv_tokens=None,
              pressure=None, rate=0.0, seed=0, max_num_seqs=8)
    assert run_replay(**kw, model=str(model)) == 0  # type: ignore[arg-type]
    fig = json.loads(capsys.readouterr().out)["fabric"]
    assert fig["token_counter"] == f"tokenizer:{model / 'tokenizer.json'}"
    assert run_replay(**kw) == 0  # type: ignore[arg-type]
    assert json.loads(capsys.readouterr().out)["fabric"]["token_counter"] == "estimate"
    assert run_replay(**{**kw, "json_out": False}, model=str(model)) == 0  # type: ignore[arg-type]
    assert f"token counts: tokenizer:{model / 'tokenizer.json'}" in capsys.readouterr().err


def test_replay_command_reads_the_configured_model(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    path = tmp_path / "w.jsonl"
    path.write_bytes(_replay_lines("fabric-demo", n=10))
    out = fabricctl("replay", str(path), "--policy", "fabric", "--gpus", "1", "--json",
                    "--model", str(model), env=clean_env(tmp_path), cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["fabric"]["token_counter"] == f"tokenizer:{model / 'tokenizer.json'}"


def test_replay_with_a_tokenizer_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    from fabricctl.cli.replay import run_replay
    from fabricctl.errors import UsageError

    path = tmp_path / "w.jsonl"
    path.write_bytes(_replay_lines("fabric-demo", n=3))
    with pytest.raises(UsageError, match=r"^tokenizer "):
        run_replay(path, 1, "fabric", True, None, None, 0.0, 0, 8,
                   tokenizer=str(tmp_path / "missing.json"))
