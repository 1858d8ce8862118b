"""A synthetic multi-shape producer: realistic native JSONL items, deterministic per seed.

Contract: `generate(items, shapes, seed, ...)` yields `items` native item dicts (`id`,
`model`, `prefix`, `prompt`, `max_tokens`, `input_tokens`, `label`), the same sequence for
the same arguments. Each of the `shapes` shapes is a distinct ordered triple (system prompt,
few-shot block, tool schema) drawn from shared pools, so shapes share some components as
real template families do. Shape k (0-based, in popularity order) is picked with
probability proportional to 1 / (k + 1) ** zipf_s; the varying prompt has a lognormal
length in tokens with median `median_tokens` and log-space sigma `sigma` (clipped to
1..`max_prompt_tokens`). Texts are ASCII sized to exactly 4 bytes a token, so
`input_tokens` equals what `fabricctl.formats.tokens.estimate_tokens` counts. With
`prefix_tokens` every shape's prefix totals exactly that many tokens (half system prompt,
three tenths few-shot, the rest tools); otherwise sizes are drawn per pool member.
Shape k's model is `models[k % len(models)]`. An argument out of range (no shape, no model, a
prefix under 3 tokens, negative items, a length under 1) is a `UsageError`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence

import msgspec

from fabricctl.errors import UsageError

BYTES_PER_TOKEN = 4  # matches the estimate, so declared and estimated counts agree

DOMAINS = (
    "support",
    "legal",
    "code-review",
    "sql",
    "medical",
    "travel",
    "finance",
    "retail",
    "security",
    "hr",
    "logistics",
    "education",
)


class ShapeSpec(msgspec.Struct, frozen=True):
    """Why: one workload shape: its model, human label and ordered components."""

    model: str
    label: str
    components: tuple[str, ...]
    tokens: int  # the prefix's size in estimated tokens


class _Text:
    """Why: cheap deterministic filler text, sliced from one corpus built per seed."""

    def __init__(self, rng: random.Random, size: int = 1 << 18) -> None:
        letters = "etaoinshrdlucmfwypvbgkqjxz"
        weights = [26 - i for i in range(26)]
        words = ["".join(rng.choices(letters, weights, k=rng.randint(2, 9))) for _ in range(2048)]
        parts: list[str] = []
        n = 0
        while n < size:
            w = rng.choice(words)
            parts.append(w)
            n += len(w) + 1
        self.corpus = " ".join(parts)[:size]
        self.rng = rng

    def fill(self, header: str, tokens: int) -> str:
        """`header` followed by corpus text, exactly `tokens * 4` bytes in all."""
        nbytes = tokens * BYTES_PER_TOKEN
        if len(header) >= nbytes:
            return header[:nbytes]
        need = nbytes - len(header)
        chunks = [header]
        while need > 0:
            off = self.rng.randrange(len(self.corpus))
            piece = self.corpus[off : off + need]
            chunks.append(piece)
            need -= len(piece)
        return "".join(chunks)


def make_shapes(
    shapes: int,
    seed: int = 0,
    *,
    models: Sequence[str] = ("fabric-demo",),
    prefix_tokens: int | None = None,
) -> list[ShapeSpec]:
    """The workload's shapes in popularity order (the first is the most popular)."""
    if shapes < 1:
        raise UsageError("shapes must be at least 1")
    if prefix_tokens is not None and prefix_tokens < 3:
        raise UsageError("prefix_tokens must be at least 3 (one per component)")
    if not models:
        raise UsageError("models must name at least one model")
    rng = random.Random(f"shapes:{seed}")
    text = _Text(rng)
    n_sys, n_few, n_tools = max(1, math.ceil(shapes / 4)), 3, 2
    if prefix_tokens is None:
        sys_sizes = [_size(rng, 200) for _ in range(n_sys)]
        few_sizes = [_size(rng, 300) for _ in range(n_few)]
        tool_sizes = [_size(rng, 150) for _ in range(n_tools)]
    else:
        sizes = [prefix_tokens // 2, max(1, prefix_tokens * 3 // 10)]
        sizes.append(prefix_tokens - sum(sizes))
        sys_sizes = [sizes[0]] * n_sys
        few_sizes = [sizes[1]] * n_few
        tool_sizes = [sizes[2]] * n_tools
    systems = [
        text.fill(
            f"You are the {DOMAINS[i % len(DOMAINS)]} assistant #{i}. "
            "Answer precisely and follow the policy below.\n",
            sys_sizes[i],
        )
        for i in range(n_sys)
    ]
    fewshots = [text.fill(f"\nWorked examples, set {j}:\nQ: ", few_sizes[j]) for j in range(n_few)]
    tools = [
        text.fill(f'\nTools: [{{"name": "tool_{k}", "description": "', tool_sizes[k])
        for k in range(n_tools)
    ]
    combos = list(itertools.product(range(n_sys), range(n_few), range(n_tools)))
    rng.shuffle(combos)
    out = []
    for k, (i, j, t) in enumerate(combos[:shapes]):
        out.append(
            ShapeSpec(
                model=models[k % len(models)],
                label=f"{DOMAINS[i % len(DOMAINS)]}-{i}/fewshot-{j}/tools-{t}",
                components=(systems[i], fewshots[j], tools[t]),
                tokens=sys_sizes[i] + few_sizes[j] + tool_sizes[t],
            )
        )
    return out


def _size(rng: random.Random, median: int) -> int:
    return max(8, round(rng.lognormvariate(math.log(median), 0.5)))


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalised Zipf popularity of ranks 1..n with exponent s."""
    raw = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def generate(
    items: int = 1000,
    shapes: int = 8,
    seed: int = 0,
    *,
    zipf_s: float = 1.1,
    median_tokens: int = 256,
    sigma: float = 0.6,
    models: Sequence[str] = ("fabric-demo",),
    max_tokens: int = 128,
    prefix_tokens: int | None = None,
    max_prompt_tokens: int = 32768,
    id_prefix: str = "q",
) -> Iterator[dict]:
    """Native item dicts of a Zipf-popular, lognormal-length multi-shape workload."""
    if median_tokens < 1 or max_tokens < 1 or items < 0:
        raise UsageError("items must be >= 0, median_tokens and max_tokens >= 1")
    specs = make_shapes(shapes, seed, models=models, prefix_tokens=prefix_tokens)
    cum = list(itertools.accumulate(zipf_weights(len(specs), zipf_s)))
    rng = random.Random(f"items:{seed}")
    text = _Text(random.Random(f"text:{seed}"))
    mu = math.log(median_tokens)
    width = len(str(max(items - 1, 0)))
    for i in range(items):
        spec = specs[rng.choices(range(len(specs)), cum_weights=cum)[0]]
        n = min(max_prompt_tokens, max(1, round(rng.lognormvariate(mu, sigma))))
        ident = f"{id_prefix}{i:0{width}d}"
        yield {
            "id": ident,
            "model": spec.model,
            "prefix": list(spec.components),
            "prompt": text.fill(f"\n[{ident}] ", n),
            "max_tokens": max_tokens,
            "input_tokens": spec.tokens + n,
            "label": spec.label,
        }
