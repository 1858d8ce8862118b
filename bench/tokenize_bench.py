"""Token counting in the producer: the estimate, a tokenizer one line at a time, in batches.

The same generated file for every arm: `--lines` OpenAI chat requests over `--shapes` system
prompts, each user message 5-60 words of prose drawn from a fixed corpus (generated before
any clock starts). The tokenizer: `--tokenizer PATH` (a model's `tokenizer.json`), else a
byte-level BPE of `--vocab` (32,000) tokens trained here, in a second or two, on the text
files of this Python's site-packages (its docs, then its sources): deterministic for a
given venv, nothing downloaded. Phases (`--phases`, all by default):
- read: the reader stage alone (`formats.reader.parse_lines` over `read_lines` of the
  file: parse, count, build every item), lines/s for the estimate, the tokenizer one line
  at a time (the same tokenizer, `TokenizerCounter(batched=False, pieces=False)`: the
  reader's path before batching), in batches of its own encode (`pieces=False`), and as
  the producer counts by default (`pieces`: ASCII text by pre-token pieces,
  `formats.pieces`, the rest in batches); `--repeat` rounds, the arms alternating in each
  round, medians reported. The counts of the three tokenizer arms are checked equal (sum of
  input tokens).
- shapes: the same for `--shape-lines` `/v1/completions` lines without a prefix (the system
  prompt, then the user's words) under `[producer] shapes = "auto"` (the shapes-found pass
  tokenizes each prompt, then counts its two parts).
- submit: `fabricctl submit FILE` (no --wait: the lines are in when it exits) into a fresh
  `fabricctl up --engine sim`, estimate and tokenizer (`[producer] tokenizer` in the
  project's `fabric.toml`), wall time from start to exit net of the start-up (the wall of
  submitting a one-line file into the same daemon just before), lines/s, `--repeat`
  rounds alternating, medians. `--before CHECKOUT` adds an arm: the tokenizer with the
  `submit` of another checkout (the daemon stays this one's), e.g. the commit before
  batching, or before counting by pieces.
Ratios are tokenizer / estimate within the same run. The issue's target is submit with
the tokenizer >= 0.7x the estimate.

    .venv/bin/python bench/tokenize_bench.py                    # a table, 200,000 lines
    .venv/bin/python bench/tokenize_bench.py --json             # exactly one JSON object
    .venv/bin/python bench/tokenize_bench.py --lines 20000 --phases read   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from api_bench import FABRICCTL, Up  # noqa: E402

from fabricctl.formats.autoshape import ShapeFinder  # noqa: E402
from fabricctl.formats.reader import Parsed, parse_lines, read_lines  # noqa: E402
from fabricctl.formats.tokens import EstimateCounter, TokenCounter, TokenizerCounter  # noqa: E402

CHAT = "/v1/chat/completions"
CORPUS_CHARS = 12_000_000


def corpus_texts() -> list[str]:
    """The text files of this Python's site-packages, docs first, up to CORPUS_CHARS."""
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for ext in ("md", "rst", "txt") for p in site.rglob(f"*.{ext}"))
    files += sorted(site.rglob("*.py"))
    out: list[str] = []
    total = 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        total += len(text)
        if total >= CORPUS_CHARS:
            break
    return out


def train_tokenizer(path: Path, texts: list[str], vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def prose_words(texts: list[str]) -> list[str]:
    """The words of the docs (alphabetic, with their punctuation): what user text is made of."""
    words = [w for t in texts[:400] for w in t.split() if w.strip(".,;:!?()").isalpha()]
    return words or ["word"]


def make_file(path: Path, lines: int, shapes: int, words: list[str], chat: bool,
              seed: int = 7) -> None:
    rnd = random.Random(seed)
    systems = [f"You are assistant {s}. " + " ".join(rnd.choice(words) for _ in range(150))
               for s in range(shapes)]
    with path.open("wb") as fp:
        for i in range(lines):
            user = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 60)))
            if chat:
                body: dict[str, Any] = {"model": "fabric-demo", "max_tokens": rnd.randint(4, 32),
                                        "messages": [{"role": "system",
                                                      "content": rnd.choice(systems)},
                                                     {"role": "user", "content": user}]}
                url = CHAT
            else:
                body = {"model": "fabric-demo", "max_tokens": rnd.randint(4, 32),
                        "prompt": rnd.choice(systems) + user}
                url = "/v1/completions"
            row = {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}
            fp.write(json.dumps(row).encode() + b"\n")


def read_rate(path: Path, counter: TokenCounter, auto: bool) -> tuple[float, float, int]:
    """(lines/s, CPU µs a line of this process's threads, total input tokens) of the reader
    over the file."""
    finder = ShapeFinder() if auto else None
    t0, c0 = time.perf_counter(), time.process_time()
    n = tokens = 0
    with path.open("rb") as fp:
        for p in parse_lines(read_lines(fp), counter=counter, finder=finder):
            n += 1
            if isinstance(p, Parsed):
                tokens += p.item.input_tokens
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / wall, cpu / n * 1e6, tokens


def read_phase(path: Path, tok: TokenizerCounter, repeat: int, auto: bool) -> dict[str, Any]:
    path_of = tok.name.removeprefix("tokenizer:")
    one = TokenizerCounter(path_of, batched=False, pieces=False)
    encoded = TokenizerCounter(path_of, pieces=False)
    arms: dict[str, Callable[[], TokenCounter]] = {
        "estimate": EstimateCounter, "one_at_a_time": lambda: one,
        "batched": lambda: encoded, "pieces": lambda: tok}
    rates: dict[str, list[float]] = {a: [] for a in arms}
    cpus: dict[str, list[float]] = {a: [] for a in arms}
    tokens: dict[str, int] = {}
    for r in range(repeat):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for arm in order:
            rate, cpu, tokens[arm] = read_rate(path, arms[arm](), auto)
            rates[arm].append(rate)
            cpus[arm].append(cpu)
    if not tokens["one_at_a_time"] == tokens["batched"] == tokens["pieces"]:
        raise RuntimeError(f"token counts differ: {tokens}")
    med = {a: statistics.median(v) for a, v in rates.items()}
    return {"lines_per_s": {a: round(v) for a, v in med.items()},
            "runs": {a: [round(x) for x in v] for a, v in rates.items()},
            "cpu_us_per_line": {a: round(statistics.median(v), 1) for a, v in cpus.items()},
            "input_tokens": tokens,
            "ratio_one_at_a_time_to_estimate": round(med["one_at_a_time"] / med["estimate"], 3),
            "ratio_batched_to_estimate": round(med["batched"] / med["estimate"], 3),
            "ratio_batched_to_one_at_a_time": round(med["batched"] / med["one_at_a_time"], 3),
            "ratio_pieces_to_estimate": round(med["pieces"] / med["estimate"], 3),
            "ratio_pieces_to_batched": round(med["pieces"] / med["batched"], 3)}


def submit_once(home: Path, path: Path, one: Path, tokenizer: str | None,
                before: str = "") -> float:
    """Seconds `fabricctl submit path` took, less those of `submit one` (a one-line file,
    into the same daemon just before: the start-up); `before`: submit from that checkout."""
    home.mkdir(parents=True)
    if tokenizer is not None:
        (home / "fabric.toml").write_text(f'[producer]\ntokenizer = "{tokenizer}"\n')
    up = Up(home, None)
    env = {**up.env, "PYTHONPATH": before} if before else up.env
    try:
        walls = []
        for what in (one, path):
            t0 = time.perf_counter()
            done = subprocess.run([*FABRICCTL, "submit", str(what), "--new-job", "--data-dir",
                                   str(up.data_dir)], capture_output=True, env=env,
                                  cwd=home, timeout=3600)
            walls.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError(f"submit exited {done.returncode}: {done.stderr[-2000:]!r}")
        return walls[1] - walls[0]
    finally:
        up.stop()


def submit_phase(work: Path, path: Path, lines: int, tokenizer: str,
                 repeat: int, before: str) -> dict[str, Any]:
    one = work / "one.jsonl"
    with path.open("rb") as fp:
        one.write_bytes(fp.readline().replace(b'"req-0"', b'"start-up"'))
    walls: dict[str, list[float]] = {"estimate": [], "tokenizer": []}
    if before:
        walls["tokenizer_before"] = []
    for r in range(repeat):
        order = list(walls) if r % 2 == 0 else list(reversed(walls))
        for arm in order:
            home = work / f"submit-{arm}-{r}"
            walls[arm].append(submit_once(home, path, one,
                                          None if arm == "estimate" else tokenizer,
                                          before if arm == "tokenizer_before" else ""))
    rate = {a: lines / statistics.median(v) for a, v in walls.items()}
    out = {"lines_per_s": {a: round(v) for a, v in rate.items()},
           "net_walls_s": {a: [round(x, 2) for x in v] for a, v in walls.items()},
           "ratio_tokenizer_to_estimate": round(rate["tokenizer"] / rate["estimate"], 3)}
    if before:
        out["ratio_tokenizer_before_to_estimate"] = round(
            rate["tokenizer_before"] / rate["estimate"], 3)
    return out


def table(out: dict[str, Any]) -> str:
    rows = [f"tokenizer: {out['tokenizer']}",
            f"lines: {out['lines']:,} (shapes: {out['shape_lines']:,})  cores: {out['cores']}  "
            f"rounds: {out['repeat']} (medians)",
            f"{'phase':<8} {'arm':<15} {'lines/s':>10}   ratio to the estimate   CPU µs/line"]
    for phase in ("read", "shapes"):
        if phase in out:
            got = out[phase]
            est = got["lines_per_s"]["estimate"]
            for arm, v in got["lines_per_s"].items():
                cpu = got["cpu_us_per_line"][arm]
                rows.append(f"{phase:<8} {arm:<15} {v:>10,}   {v / est:>20.3f}x   {cpu:>11}")
    if "submit" in out:
        got = out["submit"]
        est = got["lines_per_s"]["estimate"]
        for arm, v in got["lines_per_s"].items():
            rows.append(f"{'submit':<8} {arm:<16} {v:>9,}   {v / est:>20.3f}x")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--shapes", type=int, default=8)
    ap.add_argument("--shape-lines", type=int, default=20_000,
                    help="lines of the shapes phase (each tokenizes ~1,200 characters)")
    ap.add_argument("--tokenizer", default="", help="a tokenizer.json (default: train one)")
    ap.add_argument("--vocab", type=int, default=32_000, help="the trained tokenizer's size")
    ap.add_argument("--phases", default="read,shapes,submit")
    ap.add_argument("--repeat", type=int, default=3, help="rounds, arms alternating")
    ap.add_argument("--before", default="", metavar="CHECKOUT", help="also submit with the "
                    "tokenizer from this checkout of fabricctl (e.g. the commit before batching)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = ap.parse_args(argv)
    phases = set(args.phases.split(","))
    with tempfile.TemporaryDirectory(prefix="fabricctl-tokbench-") as tmp:
        work = Path(tmp)
        texts = corpus_texts()
        tokenizer = args.tokenizer
        if not tokenizer:
            tokenizer = str(work / "tokenizer.json")
            train_tokenizer(Path(tokenizer), texts, args.vocab)
        tok = TokenizerCounter(tokenizer)
        words = prose_words(texts)
        out: dict[str, Any] = {
            "lines": args.lines, "shape_lines": args.shape_lines, "cores": os.cpu_count(),
            "repeat": args.repeat,
            "tokenizer": args.tokenizer or f"byte-level BPE, vocab {args.vocab}, trained on "
                                           f"{sum(map(len, texts)):,} chars of site-packages"}
        chat = work / "chat.jsonl"
        make_file(chat, args.lines, args.shapes, words, chat=True)
        if "read" in phases:
            out["read"] = read_phase(chat, tok, args.repeat, auto=False)
        if "shapes" in phases:
            plain = work / "completions.jsonl"
            make_file(plain, args.shape_lines, args.shapes, words, chat=False)
            out["shapes"] = read_phase(plain, tok, args.repeat, auto=True)
        if "submit" in phases:
            out["submit"] = submit_phase(work, chat, args.lines, tokenizer, args.repeat,
                                         args.before)
    print(json.dumps(out) if args.json else table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
