"""The defaults and figures README.md and ARCHITECTURE.md state are the code's and the benches'.

Three checks, each a function of the docs' text and of the facts it checks them against, so a
test can hand it a changed text or a changed fact and see it fail:
- `default_claims`: every "`[section] key` (default V)", "`key`, default V", "`key = V` (the
  default)", "`key` (V)" ... the docs write about a setting, checked against the settings
  model (`fabricctl.config.AppConfig`, with the consumer window's derived default);
- `constant_claims`: the figures the docs quote of the code's constants (chunk size, pool
  sizes, the auto-shape table...), each found by a short pattern that must still match;
- `bench_claims`: the bench figures, against the runs recorded in `bench/results/`.
Module docstrings stay short (`test_module_docstrings_are_short`, counted as
`scripts/docstring_share.py` counts them).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabricctl.config import AppConfig
from fabricctl.config.loading import _NESTED
from fabricctl.core.defaults import MAX_BATCH_SIZE, MAX_BATCH_TOKENS
from fabricctl.core.table_pilot import PILOT_CELLS
from fabricctl.core.terms import MAX_PRIORITY
from fabricctl.engines.base import request_window
from fabricctl.engines.pool import KEEPALIVE_S, POOL_SHARD
from fabricctl.engines.pooled import GROUP_INPUTS, GROUP_TOKENS
from fabricctl.formats import autoshape
from fabricctl.formats.batched import BATCH_LINES
from fabricctl.producer.feed import CHUNK
from fabricctl.supervisor.engine_log import LOG_TAIL_LINES
from fabricctl.supervisor.vllm_fleet import CPU_GPUS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from docstring_share import count_file, count_tree  # noqa: E402

DOCS = ("README.md", "ARCHITECTURE.md")
RESULTS = ROOT / "bench" / "results"


def read(name: str) -> str:
    """A doc as one line of prose: block-quote marks dropped, whitespace runs made one space."""
    text = (ROOT / name).read_text()
    text = re.sub(r"(?m)^> ?", "", text)
    return re.sub(r"\s+", " ", text)


def number(s: str) -> float:
    return float(s.replace(",", ""))


# -- defaults of settings -------------------------------------------------------------------


def settings_defaults() -> dict[str, Any]:
    """Each setting's default as an operator meets it, by `section.key` (top level: `key`).
    A setting whose 0 stands for a derived value has the derived one."""
    out: dict[str, Any] = {}
    app = AppConfig()
    for f in dataclasses.fields(AppConfig):
        if f.name in _NESTED:
            for g in dataclasses.fields(_NESTED[f.name]):
                out[f"{f.name}.{g.name}"] = getattr(getattr(app, f.name), g.name)
        elif f.name not in ("sources", "set_by", "data_dir"):
            out[f.name] = getattr(app, f.name)
    out["consumer.window"] = request_window(app.consumer.window, app.consumer.max_batch_size)
    return out


# a default that holds in one setting's context, which the doc names beside it
IN_CONTEXT = {"gpus": ("one server on the CPU", list(CPU_GPUS))}


_SPAN = r"`(?:\[(?P<sec>\w+)\] )?(?P<key>[a-z_][\w.]*)(?: = (?P<inline>[^`]+))?`"
_AFTER = [  # what follows the span when it states the default; `v`: the value
    r"(?: \w+)? \(default (?P<v>[^),;]+)",
    r" \((?P<v>on|off) by default",
    r", default (?P<v>[^),;]+?)\)",
    r"(?: set)? ?[(;,] ?(?P<v>[^(),;`]+|`[^`]+`), the default",
    r" \((?P<v>\d[\d,.]*(?: s)?)\)",
]
_WORDS = {"twice": "2 x", "three times": "3 x", "four times": "4 x"}


@dataclass(frozen=True)
class Claim:
    """Why: one default or figure a doc states, where, and what the code or bench has."""

    doc: str
    text: str  # the words it was read from
    stated: Any
    actual: Any

    @property
    def holds(self) -> bool:
        return bool(self.stated == self.actual)


def _resolve(sec: str | None, key: str, defaults: Mapping[str, Any]) -> str | None:
    """The settings key a doc's span names, or None (not a setting, or ambiguous)."""
    if sec:
        return f"{sec}.{key}" if f"{sec}.{key}" in defaults else None
    if key in defaults:
        return key
    found = [k for k in defaults if k.endswith(f".{key}")]
    return found[0] if len(found) == 1 else None


def _value(raw: str, defaults: Mapping[str, Any], sec: str | None) -> Any:
    """A stated value as the code would hold it; None when it is prose, not a value."""
    raw = raw.strip()
    for word, times in _WORDS.items():
        raw = re.sub(rf"^{word} ", f"{times} ", raw)
    if m := re.fullmatch(r"(\d+) x `(\w+)`", raw):
        other = _resolve(sec, m[2], defaults)
        return None if other is None else int(m[1]) * defaults[other]
    raw = raw.strip("`")
    if m := re.fullmatch(r'"([^"]*)"', raw):
        return m[1]
    if raw in ("true", "false", "on", "off"):
        return raw in ("true", "on")
    if m := re.fullmatch(r"(\d[\d,]*(?:\.\d+)?)(?: s)?", raw):
        return number(m[1])
    if m := re.fullmatch(r"\[([\d, ]*)\]", raw):
        return [int(x) for x in m[1].split(",") if x.strip()]
    return None


def default_claims(doc: str, text: str, defaults: Mapping[str, Any]) -> list[Claim]:
    """Every default of a setting `text` states, with the settings model's."""
    claims: list[Claim] = []
    for m in re.finditer(_SPAN, text):
        key = _resolve(m["sec"], m["key"], defaults)
        if key is None:
            continue
        sec = key.split(".")[0] if "." in key else None
        rest = text[m.end():m.end() + 80]
        if m["inline"] is not None:
            if re.match(r" ?[(,] ?the default", rest):
                stated = _value(m["inline"], defaults, sec)
                claims.append(Claim(doc, m[0] + rest[:16], stated, defaults[key]))
            continue
        actual = defaults[key]
        if key in IN_CONTEXT and IN_CONTEXT[key][0] in rest:
            actual = IN_CONTEXT[key][1]
        for after in _AFTER:
            if a := re.match(after, rest):
                stated = _value(a["v"], defaults, sec)
                if stated is not None:
                    claims.append(Claim(doc, m[0] + a[0], stated, actual))
                break
    return claims


def test_every_default_the_docs_state_is_the_settings_model_s() -> None:
    defaults = settings_defaults()
    claims = [c for d in DOCS for c in default_claims(d, read(d), defaults)]
    assert len(claims) >= 16, f"the parser found too few defaults: {claims}"
    wrong = [c for c in claims if not c.holds]
    assert not wrong, "\n".join(f"{c.doc}: {c.text!r} states {c.stated}, the code has "
                                f"{c.actual}" for c in wrong)


# -- figures of the code's constants ---------------------------------------------------------


CONSTANTS: list[tuple[str, str, float]] = [  # doc, pattern whose groups state it, the value
    ("README.md", r"reads its input in chunks of ([\d,]+) items", CHUNK),
    ("README.md", r"the last ([\d,]+) lines of its log", LOG_TAIL_LINES),
    ("README.md", r"a table of 2\^(\d+) block hashes", math.log2(autoshape.TABLE_SLOTS)),
    ("README.md", r"only once (\d+) lines share it", autoshape.PROMOTE),
    ("README.md", r"longer than ([\d,]+) blocks is cut", autoshape.MAX_BLOCKS),
    ("README.md", r"at most ([\d,]+) inputs and", GROUP_INPUTS),
    ("README.md", r"inputs and ([\d,]+) tokens\)", GROUP_TOKENS),
    ("README.md", r"kept alive for ([\d.]+) s", KEEPALIVE_S),
    ("README.md", r"httpx clients of ([\d,]+) connections", POOL_SHARD),
    ("README.md", r"in groups of up to ([\d,]+)", BATCH_LINES),
    ("README.md", r"from 0, the default, to ([\d,]+);", MAX_PRIORITY),
    ("README.md", r"thrash line at ([\d,]+) batches", AppConfig().broker.thrash_batches),
    ("README.md", r"waited more than ([\d,]+) s is marked", AppConfig().broker.starve_s),
    ("README.md", r"a group of at most ([\d,]+) cells is split", PILOT_CELLS),
    ("ARCHITECTURE.md", r"the default contract \(([\d,]+) tokens", MAX_BATCH_TOKENS),
    ("ARCHITECTURE.md", r"the default contract \([\d,]+ tokens / ([\d,]+) items\)",
     MAX_BATCH_SIZE),
    ("ARCHITECTURE.md", r"\| ([\d,]+) \| ~[\d,]+ \| \*\*~[\d,]+\*\* \|",
     MAX_BATCH_TOKENS / MAX_BATCH_SIZE),
]


def constant_claims(texts: Mapping[str, str],
                    constants: list[tuple[str, str, float]]) -> list[Claim]:
    """Each constant's figure wherever its pattern matches; a pattern that matches nowhere is
    a claim of None (the doc's wording moved: update the pattern with it)."""
    claims = []
    for doc, pattern, value in constants:
        found = list(re.finditer(pattern, texts[doc]))
        claims += [Claim(doc, m[0], number(m[1]), float(value)) for m in found]
        if not found:
            claims.append(Claim(doc, pattern, None, float(value)))
    return claims


def test_the_constants_the_docs_quote_are_the_code_s() -> None:
    texts = {d: read(d) for d in DOCS}
    wrong = [c for c in constant_claims(texts, CONSTANTS) if not c.holds]
    assert not wrong, "\n".join(f"{c.doc}: {c.text!r} states {c.stated}, the code has "
                                f"{c.actual}" for c in wrong)


# -- figures of the benches' recorded runs ---------------------------------------------------


def _about(stated: float, actual: float, rel: float) -> bool:
    return abs(stated - actual) <= rel * abs(actual)


def bench_claims(texts: Mapping[str, str], policy: Mapping[str, Any],
                 run: Mapping[str, Any]) -> list[str]:
    """What the docs quote of the recorded runs and does not match them (empty: all do)."""
    bad: list[str] = []

    def need(doc: str, pattern: str) -> re.Match[str] | None:
        m = re.search(pattern, texts[doc])
        if m is None:
            bad.append(f"{doc}: no longer says {pattern!r}: update the check with the text")
        return m

    def same(doc: str, what: str, stated: float, actual: float, rel: float = 0.0) -> None:
        if not (stated == actual or (rel and _about(stated, actual, rel))):
            bad.append(f"{doc}: {what} is {stated}, the recorded run has {actual}")

    regimes = {r["pressure"]: r["policies"] for r in policy["regimes"]}
    hot, cold = regimes[3.0], regimes[0.1]
    fab = hot["fabric"]
    if m := need("README.md", r"runs ([\d.]+)k tok/s against ([\d.]+)k for round-robin and "
                 r"([\d.]+)k for prefix affinity \(([\d.]+)x and ([\d.]+)x\), at (\d+)% of "
                 r"the achievable KV hit rate with (\d+) mid-stream"):
        tps = {p: v["tokens_per_s"] for p, v in hot.items()}
        same("README.md", "fabric's tok/s", number(m[1]), round(tps["fabric"] / 1e3))
        same("README.md", "round-robin's tok/s", number(m[2]), round(tps["round-robin"] / 1e3))
        same("README.md", "prefix affinity's", number(m[3]), round(tps["prefix-affinity"] / 1e3))
        same("README.md", "x round-robin", number(m[4]),
             round(tps["fabric"] / tps["round-robin"], 1))
        same("README.md", "x prefix affinity", number(m[5]),
             round(tps["fabric"] / tps["prefix-affinity"], 1))
        same("README.md", "% of achievable", number(m[6]),
             round(100 * fab["kv_hit_rate"] / fab["kv_hit_achievable"]))
        same("README.md", "mid-stream switches", number(m[7]), fab["midstream_switches"])
    if m := need("README.md", r"leads the best baseline by ([\d.]+)x"):
        best = max(v["tokens_per_s"] for p, v in cold.items() if p not in ("fabric", "oracle"))
        same("README.md", "lead at pressure 0.1", number(m[1]),
             round(cold["fabric"]["tokens_per_s"] / best, 2))

    core, store, e2e = run["core_bench"], run["store_bench"], run["e2e_bench"]
    readme = [(r"broker core moves ~(\d+)k items/s", core["items_per_s"] / 1e3),
              (r"the store ingests ~(\d+)k items/s", store["ingest_items_per_s"] / 1e3),
              (r"and completes ~(\d+)k/s", store["complete_items_per_s"] / 1e3),
              (r"the daemon carries ~(\d+)k items/s", e2e["items_per_s"] / 1e3),
              (r"([\d.]+) ms at the median", e2e["pull_p50_ms"]),
              (r"and ([\d.]+) ms at p99", e2e["pull_p99_ms"])]
    arch = [(r"carried \*\*([\d,]+) items/s\*\*", e2e["items_per_s"]),
            (r"\(([\d,]+) items, \d+ producers", e2e["items"]),
            (r"items, (\d+) producers", e2e["producers"]),
            (r"producers, (\d+) consumers\)", e2e["consumers"]),
            (r"answered in ([\d.]+) ms at the median", e2e["pull_p50_ms"]),
            (r"and ([\d.]+) ms at p99", e2e["pull_p99_ms"]),
            (r"the broker at ([\d.]+) µs of CPU per item", e2e["broker_us_per_item"]),
            (r"store alone ingests ~([\d,]+) items/s", store["ingest_items_per_s"]),
            (r"and completes ~([\d,]+) items/s", store["complete_items_per_s"]),
            (r"core alone moves ~([\d,]+) items/s", core["items_per_s"])]
    for doc, checks in (("README.md", readme), ("ARCHITECTURE.md", arch)):
        for pattern, actual in checks:
            if m := need(doc, pattern):
                same(doc, pattern, number(m[1]), actual, rel=0.02)

    # ARCHITECTURE's capacity table and every "~N GPUs" it quotes follow from the run
    cap = run["capacity"]
    per_gpu = {"bench": cap["gpu_tokens_per_s"] / cap["bench_tokens_per_item"],
               "smallest": cap["gpu_tokens_per_s"] / (MAX_BATCH_TOKENS / MAX_BATCH_SIZE)}
    gpus = {k: e2e["items_per_s"] / v for k, v in per_gpu.items()}
    if m := need("ARCHITECTURE.md", r"\| ~(\d+) \| ~([\d,]+) \| \*\*~(\d+)\*\* \| \| the "
                 r"smallest .*? \| [\d,]+ \| ~([\d,]+) \| \*\*~(\d+)\*\* \|"):
        for i, (what, actual) in enumerate((("tokens per item", cap["bench_tokens_per_item"]),
                                            ("items/s a GPU", per_gpu["bench"]),
                                            ("GPUs", gpus["bench"]),
                                            ("items/s a GPU (smallest)", per_gpu["smallest"]),
                                            ("GPUs (smallest)", gpus["smallest"])), 1):
            same("ARCHITECTURE.md", what, number(m[i]), actual, rel=0.05)
    for m in re.finditer(r"(?:~|about )([\d,]+) GPUs", texts["ARCHITECTURE.md"]):
        if not any(_about(number(m[1]), g, 0.05) for g in gpus.values()):
            bad.append(f"ARCHITECTURE.md: {m[0]!r}, the recorded run gives "
                       f"~{gpus['bench']:.0f} (or ~{gpus['smallest']:.0f} at 64 tokens)")
    return bad


def recorded() -> tuple[dict[str, Any], dict[str, Any]]:
    return (json.loads((RESULTS / "policy_bench.json").read_text()),
            json.loads((RESULTS / "2026-12-02.json").read_text()))


def test_the_bench_figures_the_docs_quote_are_the_recorded_runs() -> None:
    policy, run = recorded()
    assert bench_claims({d: read(d) for d in DOCS}, policy, run) == []


def test_the_docs_cite_the_recorded_runs() -> None:
    assert "bench/results/policy_bench.json" in read("README.md")
    for doc in DOCS:
        assert "bench/results/2026-12-02.json" in read(doc)


def table_claims(readme: str, table: Mapping[str, Any]) -> list[str]:
    """What the README's *Tables* section quotes of `bench/results/table_bench.json` (the
    real server's whole-job ratios) and does not match it (empty: all do)."""
    real = table["real"]
    wall = real["median_wall_s"]
    m = re.search(r"the job took ([\d.]+) s in the table's order, ([\d.]+) s in GGR's "
                  r"\(Liu et al.\) and ([\d.]+) s\s+in fabricctl's \(medians of (\w+) "
                  r"runs\): \*\*([\d.]+)x\*\* the table's order and ([\d.]+)x GGR's",
                  readme)
    if m is None:
        return ["README.md: no longer quotes the real server's table run: update the check"]
    stated = [number(m[i]) for i in (1, 2, 3, 5, 6)]
    actual = [round(wall["original"], 1), round(wall["ggr"], 1), round(wall["fabric"], 1),
              round(real["vs_original"], 2), round(real["vs_ggr"], 2)]
    bad = [f"README.md: {s} where the recorded table run has {a}"
           for s, a in zip(stated, actual, strict=True) if s != a]
    rounds = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}.get(m[4])
    if rounds != len(real["runs"]["fabric"]):
        bad.append(f"README.md: {m[4]} runs, the recorded one has "
                   f"{len(real['runs']['fabric'])}")
    plan = re.search(r"Planning 1M rows takes ([\d.]+) s, ([\d.]+)% of the time", readme)
    if plan is None or [number(plan[1]), number(plan[2])] != [
            table["plan_s_per_million_rows"], round(100 * table["plan_of_serving_1m"], 2)]:
        bad.append("README.md: the planning figures are not the recorded run's")
    searched = [t["exhaustive"] for t in table["simulated"]["tables"].values()
                if t["exhaustive"]["windows"]]
    ex = re.search(r"fabricctl's order reaches \*\*([\d.]+)\*\* of the optimum's prefix share "
                   r"on the worst slice \(GGR's: ([\d.]+)\), and ([\d.]+) summed over each "
                   r"table's slices \(GGR's: ([\d.]+)-([\d.]+)\)", readme)
    want = [table["fabric_of_exhaustive_min"], min(e["ggr_min"] for e in searched),
            table["fabric_of_exhaustive_total"], min(e["ggr_total"] for e in searched),
            max(e["ggr_total"] for e in searched)]
    if ex is None or [number(ex[i]) for i in range(1, 6)] != want:
        bad.append(f"README.md: the exhaustive comparison is not the recorded run's {want}")
    return bad


def recorded_table() -> dict[str, Any]:
    return json.loads((RESULTS / "table_bench.json").read_text())


def test_the_table_figures_are_the_recorded_run() -> None:
    assert "bench/results/table_bench.json" in read("README.md")
    assert table_claims(read("README.md"), recorded_table()) == []


def test_a_table_figure_the_run_does_not_have_fails() -> None:
    readme, table = read("README.md"), recorded_table()
    assert "**1.59x**" in readme
    assert table_claims(readme.replace("**1.59x**", "**1.69x**"), table) != []
    slower = {**table, "real": {**table["real"], "vs_ggr": 0.9}}
    assert table_claims(readme, slower) != []
    assert table_claims(readme, {**table, "fabric_of_exhaustive_min": 0.9}) != []
    assert table_claims(readme, {**table, "plan_s_per_million_rows": 99.0}) != []


def explain_claims(readme: str) -> list[str]:
    """The README's table example (`fabricctl table examples/products.csv ... --explain`) run
    with --emit: each `--explain` line the README quotes and the command no longer prints
    (empty: all match)."""
    block = re.search(r"```sh\n(fabricctl table examples/products\.csv.*?)\n[^\n]*\n```",
                      readme, re.S)
    if block is None:
        return ["README.md: the table example is gone: update the check"]
    args = shlex.split(block[1].replace("\\\n", " "))[1:]
    args = [*args[:args.index("-o")], "--emit", "-o", os.devnull]
    quoted = re.findall(r"^    (fabricctl: .*)$", readme[block.end():], re.M)
    quoted = quoted[:quoted.index(next(q for q in quoted if "instruction" in q)) + 1]
    run = subprocess.run([sys.executable, "-m", "fabricctl", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    printed = run.stderr.splitlines()
    return [f"README.md: {q!r} is not what --explain prints ({printed})" for q in quoted
            if q not in printed] or ([] if quoted else ["README.md: no --explain lines"])


def test_the_table_examples_explain_lines_are_what_it_prints() -> None:
    assert explain_claims((ROOT / "README.md").read_text()) == []


def test_an_explain_line_the_command_does_not_print_fails() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(45.6%)" in readme
    assert explain_claims(readme.replace("(45.6%)", "(45.4%)")) != []


# -- the checks fail when a doc or the code moves --------------------------------------------

@pytest.mark.parametrize("doc, old, new", [
    ("README.md", "default 3 x `max_batch_size`", "default twice `max_batch_size`"),
    ("README.md", "`[vllm] start_attempts` (default 3)", "`[vllm] start_attempts` (default 4)"),
    ("README.md", "`[metrics] prometheus_port` set (0, the default",
     "`[metrics] prometheus_port` set (9090, the default"),
    ("README.md", '`[producer] shapes = "auto"` (the default',
     '`[producer] shapes = "declared"` (the default'),
    ("ARCHITECTURE.md", "`amortise_batches` (8)", "`amortise_batches` (16)"),
])
def test_a_default_the_code_no_longer_has_fails(doc: str, old: str, new: str) -> None:
    defaults = settings_defaults()
    text = read(doc)
    assert old in text
    assert all(c.holds for c in default_claims(doc, text, defaults))
    assert any(not c.holds
               for c in default_claims(doc, text.replace(old, new), defaults))


def test_a_default_changed_in_the_code_fails() -> None:
    defaults = settings_defaults()
    for key, value in (("consumer.window", 2 * defaults["consumer.max_batch_size"]),
                       ("vllm.start_attempts", 5), ("broker.aging_s", 300.0)):
        changed = {**defaults, key: value}
        assert any(not c.holds for d in DOCS
                   for c in default_claims(d, read(d), changed)), key


def test_a_constant_changed_in_the_code_or_the_doc_fails() -> None:
    texts = {d: read(d) for d in DOCS}
    changed = [(d, p, v + 1 if p.startswith("reads its input") else v) for d, p, v in CONSTANTS]
    assert any(not c.holds for c in constant_claims(texts, changed))
    edited = {**texts, "README.md": texts["README.md"].replace("chunks of 512", "chunks of 256")}
    assert any(not c.holds for c in constant_claims(edited, CONSTANTS))


@pytest.mark.parametrize("doc, old, new", [
    ("ARCHITECTURE.md", "needs more than ~300 GPUs", "needs more than ~200 GPUs"),
    ("README.md", "runs 606k tok/s", "runs 650k tok/s"),
    ("README.md", "(3.3x and 2.5x)", "(3.3x and 2.1x)"),
    ("ARCHITECTURE.md", "carried **38,300 items/s**", "carried **48,300 items/s**"),
    ("ARCHITECTURE.md", "| ~125 | **~300** |", "| ~125 | **~400** |"),
])
def test_a_figure_the_run_does_not_have_fails(doc: str, old: str, new: str) -> None:
    policy, run = recorded()
    texts = {d: read(d) for d in DOCS}
    assert old in texts[doc]
    assert bench_claims({**texts, doc: texts[doc].replace(old, new)}, policy, run) != []


def test_a_new_recorded_run_fails_the_old_figures() -> None:
    policy, run = recorded()
    texts = {d: read(d) for d in DOCS}
    slower = {**run, "e2e_bench": {**run["e2e_bench"], "items_per_s": 25_000}}
    assert bench_claims(texts, policy, slower) != []


# -- module docstrings -----------------------------------------------------------------------

DOCSTRING_LINES = 25


def test_module_docstrings_are_short(tmp_path: Path) -> None:
    """A module docstring states the contract in a few lines; the story is ARCHITECTURE's."""
    counts = count_tree(ROOT / "fabricctl")
    assert len(counts) > 100  # the whole package was counted, not an empty tree
    long = {str(c.path.relative_to(ROOT)): c.module_docstring_lines
            for c in counts if c.module_docstring_lines > DOCSTRING_LINES}
    assert long == {}
    # the count the limit is held to sees a docstring one line over it
    over = tmp_path / "over.py"
    over.write_text('"""' + "\n" * DOCSTRING_LINES + '"""\n\nX = 1\n')
    assert count_file(over).module_docstring_lines == DOCSTRING_LINES + 1


def doc_sections(name: str) -> set[str]:
    """The headings of a doc and its bold paragraph leads (`**Jobs.**`, `**core**`)."""
    text = (ROOT / name).read_text()
    heads = {m[1].strip() for m in re.finditer(r"(?m)^#+ (.+)$", text)}
    return heads | {m[1].strip() for m in re.finditer(r"\*\*([^*\n]+?)\.?\*\*", text)}


def test_the_sections_modules_cite_exist() -> None:
    """A module that sends its reader to `README.md, "Section"` or `ARCHITECTURE.md, "..."`
    names a section that is there (a renamed section fails here, not in a reader's hands)."""
    sections = {d: doc_sections(d) for d in DOCS}
    cited = 0
    missing = []
    for path in sorted((ROOT / "fabricctl").rglob("*.py")):
        text = re.sub(r"\s+", " ", path.read_text())
        for m in re.finditer(r"(README|ARCHITECTURE)\.md[,:]? \(?\"([^\"]+)\"", text):
            cited += 1
            ref = m[2].removesuffix("...").strip()
            if not any(s.startswith(ref) for s in sections[f"{m[1]}.md"]):
                missing.append(f"{path.relative_to(ROOT)}: {m[0]}")
    assert cited >= 10
    assert missing == []


# -- one default per knob --------------------------------------------------------------------


def test_the_writer_takes_its_group_commit_defaults_from_the_server_settings() -> None:
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.writer import Writer

    server = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    writer = inspect.signature(Writer).parameters
    for param, setting in (("max_items", "commit_items"), ("max_batches", "complete_batches"),
                           ("max_wait_s", "commit_wait_s")):
        assert writer[param].default == server[setting], (param, setting)


def test_the_consumer_window_default_is_computed_in_one_place() -> None:
    from fabricctl.supervisor.fleet import consumer_window

    cfg = AppConfig()
    assert consumer_window(cfg, "vllm") == settings_defaults()["consumer.window"]
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "fabricctl").rglob("*.py")
             if re.search(r"WINDOW_BATCHES\s*\*", p.read_text())]
    assert users == ["fabricctl/engines/base.py"]
