"""The examples: produce.py's workload, the OpenAI batch sample, fabric.toml, the README."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import msgspec

from fabricctl.core.config import CoreConfig
from fabricctl.core.payload import decode_payload
from fabricctl.formats.reader import LineError, Parsed, Source, parse_lines, parse_stream
from fabricctl.formats.workload import generate, make_shapes, zipf_weights

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PRODUCE = EXAMPLES / "produce.py"


def _load_produce():
    spec = importlib.util.spec_from_file_location("produce_example", PRODUCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_produce(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, str(PRODUCE), *args], capture_output=True, check=True, timeout=60
    )


# ---- produce.py ------------------------------------------------------------------------------


def test_produce_exports_the_generator() -> None:
    module = _load_produce()
    assert module.generate is generate
    assert list(module.generate(5, 3, 9)) == list(generate(5, 3, 9))


def test_produce_is_deterministic_with_a_seed() -> None:
    a = _run_produce("--items", "200", "--shapes", "5", "--seed", "3")
    b = _run_produce("--items", "200", "--shapes", "5", "--seed", "3")
    c = _run_produce("--items", "200", "--shapes", "5", "--seed", "4")
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout
    assert a.stderr == b""
    assert a.stdout.count(b"\n") == 200
    assert list(generate(50, 4, 11)) == list(generate(50, 4, 11))


def test_produced_lines_parse_and_declared_counts_match_the_estimate() -> None:
    out = _run_produce("--items", "300", "--shapes", "6", "--seed", "1", "--models", "a,b")
    results = list(parse_lines(out.stdout.splitlines()))
    assert all(isinstance(r, Parsed) for r in results), [
        r for r in results if isinstance(r, LineError)
    ]
    rows = [msgspec.json.decode(line) for line in out.stdout.splitlines()]
    # Dropping input_tokens and counting with the estimate gives the same numbers.
    undeclared = b"\n".join(
        msgspec.json.encode({k: v for k, v in row.items() if k != "input_tokens"}) for row in rows
    )
    recounted = list(parse_lines(undeclared.splitlines()))
    for declared, counted in zip(results, recounted, strict=True):
        assert isinstance(declared, Parsed) and isinstance(counted, Parsed)
        assert declared.item.input_tokens == counted.item.input_tokens
        assert decode_payload(declared.item.payload) == decode_payload(counted.item.payload)
    sigs = {r.item.signature for r in results if isinstance(r, Parsed)}
    assert 0 not in sigs
    assert {row["model"] for row in rows} == {"a", "b"}
    assert all(row["max_tokens"] == 128 for row in rows)


def test_shapes_are_distinct_share_components_and_follow_models_round_robin() -> None:
    specs = make_shapes(12, seed=5, models=("a", "b", "c"))
    assert len({s.components for s in specs}) == 12
    assert len({s.label for s in specs}) == 12
    assert [s.model for s in specs] == ["a", "b", "c"] * 4
    systems = Counter(s.components[0] for s in specs)
    assert max(systems.values()) > 1  # template families: shapes share a system prompt


def test_prefix_tokens_sizes_every_shape_exactly() -> None:
    for row in generate(40, 6, 2, prefix_tokens=500, median_tokens=30):
        payload_tokens = sum(math.ceil(len(c.encode()) / 4) for c in row["prefix"])
        assert payload_tokens == 500
        assert row["input_tokens"] == 500 + math.ceil(len(row["prompt"].encode()) / 4)


def test_zipf_skew_is_visible() -> None:
    shapes, items, s = 10, 20_000, 1.1
    specs = make_shapes(shapes, seed=0)
    rank = {spec.label: k for k, spec in enumerate(specs)}
    counts = Counter(rank[row["label"]] for row in generate(items, shapes, 0, zipf_s=s))
    expected = zipf_weights(shapes, s)
    for k in range(shapes):
        assert abs(counts[k] / items - expected[k]) < 0.015, (k, counts[k])
    assert counts[0] > 5 * counts[9]  # 10 ** 1.1 = 12.6 in expectation
    assert counts[0] > counts[1] > counts[3] > counts[9]
    flat = Counter(row["label"] for row in generate(items, shapes, 0, zipf_s=0.0))
    assert max(flat.values()) < 1.15 * min(flat.values())


def test_prompt_lengths_are_lognormal_around_the_requested_median() -> None:
    median, sigma = 300, 0.5
    lengths = [
        row["input_tokens"] - sum(math.ceil(len(c.encode()) / 4) for c in row["prefix"])
        for row in generate(20_000, 4, 7, median_tokens=median, sigma=sigma)
    ]
    assert abs(statistics.median(lengths) - median) / median < 0.03
    logs = [math.log(n) for n in lengths]
    assert abs(statistics.pstdev(logs) - sigma) / sigma < 0.05
    assert statistics.fmean(lengths) > statistics.median(lengths)  # right-skewed
    # Symmetric in log space: as many items below median / e**sigma as above median * e**sigma.
    low = sum(n < median / math.exp(sigma) for n in lengths)
    high = sum(n > median * math.exp(sigma) for n in lengths)
    assert abs(low - high) < 0.1 * (low + high)


def test_produce_rejects_bad_options_and_survives_a_closed_pipe() -> None:
    bad = subprocess.run(
        [sys.executable, str(PRODUCE), "--shapes", "0"], capture_output=True, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith(b"produce.py: error:")
    piped = subprocess.run(
        f"'{sys.executable}' '{PRODUCE}' --items 200000 | head -n 1",
        shell=True,
        capture_output=True,
        timeout=120,
    )
    assert piped.stdout.count(b"\n") == 1
    assert b"Traceback" not in piped.stderr


# ---- openai_batch.jsonl ------------------------------------------------------------------------


def test_openai_batch_example_parses_and_shares_shapes() -> None:
    with open(EXAMPLES / "openai_batch.jsonl", "rb") as fp:
        results = list(parse_stream(fp))
    assert not [r for r in results if isinstance(r, LineError)]
    parsed = {r.item.id: r for r in results if isinstance(r, Parsed)}
    assert 10 <= len(parsed) <= 16
    sources = Counter(p.source for p in parsed.values())
    assert sources[Source.CHAT] >= 4 and sources[Source.COMPLETIONS] >= 4

    def sig(ident: str) -> int:
        return parsed[ident].item.signature

    assert sig("support-1") == sig("support-2") == sig("support-3") != 0
    assert sig("sql-1") == sig("sql-2") == sig("sql-3") != 0
    assert sig("support-raw-1") == sig("support-raw-2") != sig("support-1")
    assert sig("sql-raw-1") == sig("sql-raw-2")
    assert sig("plain-1") == sig("plain-2") == 0
    assert parsed["plain-2"].item.max_tokens == 16
    assert parsed["sql-1"].item.label == "sql-fewshot"


# ---- fabric.toml and README ----------------------------------------------------------------------


def test_fabric_toml_describes_two_vllm_gpus() -> None:
    with open(EXAMPLES / "fabric.toml", "rb") as fp:
        cfg = tomllib.load(fp)
    assert cfg["engine"] == "vllm"
    assert isinstance(cfg["model"], str) and cfg["model"]
    assert cfg["gpus"] == [0, 1]
    assert cfg["data_dir"]
    vllm = cfg["vllm"]
    assert vllm["command"][-1] == "serve"
    assert isinstance(vllm["port_base"], int)
    assert "--enable-prompt-tokens-details" in vllm["extra_args"]
    assert set(cfg["consumer"]) == {"max_batch_size", "max_batch_tokens", "max_input_len"}
    core_fields = {f.name for f in dataclasses.fields(CoreConfig)}
    assert set(cfg["broker"]) <= core_fields
    assert cfg["producer"]["max_line_bytes"] == 1 << 20


def test_readme_shows_the_pipeline() -> None:
    text = (EXAMPLES / "README.md").read_text()
    assert "python examples/produce.py --items 1000" in text
    assert "fabricctl submit - --wait" in text
    assert "| jq" in text
