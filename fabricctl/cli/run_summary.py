"""What `fabricctl run` reports: its summary and the achievable KV hit bound behind it.

Contract: `RunSummary` is the one figure set of a run (`fabricctl run --json` prints it;
`print_run_summary` draws it as a Rich table on stderr). A figure that reads as alarming or
empty carries its reason in the summary, printed beside it and in `--json`: `kv_note` says
why the achievable KV hit rate is 0 (`AchievableHits.kv_note`: the engines gave no cache
statistics, no item declared a shared prefix, no prefix is as long as one KV block, or no
prefix was asked twice on one GPU), `thrash_note` why shapes thrashed and what to change
(`thrash_note`, when any did). `AchievableHits` is the bound on the KV cache hits the
engines could have made on the requests they ran: `add` each item sent, `completed` each
result, `prewarmed` each pre-warm an engine took, then `achievable(block)` (the class says
how it is counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from fabricctl import fmt
from fabricctl.core.stats import THRASH_FIX
from fabricctl.core.types import Item, Prewarm
from fabricctl.engines.blocks import (
    achievable_cached_tokens,
    decode_item_payload,
    prefix_block_hashes,
    prefix_sources,
)
from fabricctl.engines.simanswer import sim_spec
from fabricctl.formats.results import ResultRecord

if TYPE_CHECKING:
    from rich.console import Console


class RunSummary(msgspec.Struct):
    """What one batch job did, from the broker's and the engines' counters."""

    items: int
    rejected: int
    tokens_in: int
    tokens_out: int
    wall_s: float
    shapes: int
    shape_switches: int
    midstream_switches: int
    kv_hit_rate: float
    kv_hit_achievable: float
    padding_waste: float
    thrash_events: int
    engine: str
    simulated: bool
    gpus: int
    ledger_difference: tuple[int, int]
    token_counter: str = "estimate"  # "estimate" or "tokenizer:<path>" (choose_counter)
    unserved: int = 0  # items for a model no consumer serves: not sent, an error result each
    serve_s: float = 0.0  # the job alone: from opening it to its last result (no start-up)
    kv_note: str = ""  # why the achievable KV hit rate is 0 ("" when it is not)
    thrash_note: str = ""  # why shapes thrashed and what to change ("" when none did)
    device: str = "gpu"  # where the engines ran: "cpu" for vLLM's CPU build (vllm.device)


def thrash_note(thrash_events: int) -> str:
    """The reason beside a run's thrash count: what thrashing was and what to change."""
    if thrash_events <= 0:
        return ""
    return f"shapes ended short while their prefix was staged again; {THRASH_FIX}"


def print_run_summary(s: RunSummary, console: Console | None = None) -> None:
    """The summary as a Rich table on stderr (or `console`)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console(stderr=True)
    pct = fmt.pct
    label = " (simulated)" if s.simulated else ""
    where = "CPU server(s)" if s.device == "cpu" else "GPU(s)"
    t = Table(title=f"fabricctl run — {s.engine}{label}, {s.gpus} {where}", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("items", f"{s.items:,}" + (f" ({s.rejected:,} rejected)" if s.rejected else "")
         + (f" ({s.unserved:,} for a model no consumer serves)" if s.unserved else "")),
        ("tokens in / out", f"{s.tokens_in:,} / {s.tokens_out:,}"),
        ("wall time", f"{s.wall_s:.2f} s"),
        ("shapes", f"{s.shapes}"),
        ("shape switches (mid-stream)", f"{s.shape_switches} ({s.midstream_switches})"),
        (f"KV hit rate{label}", f"{pct(s.kv_hit_rate)} of {pct(s.kv_hit_achievable)} achievable"
         + (f": {s.kv_note}" if s.kv_note else "")),
        ("padding waste", pct(s.padding_waste)),
        ("thrash events", f"{s.thrash_events}" + (f": {s.thrash_note}" if s.thrash_note else "")),
        ("ledger difference", f"{s.ledger_difference[0]} items, {s.ledger_difference[1]} tokens"),
    ]
    for k, v in rows:
        t.add_row(k, Text(v))  # plain text: a "[broker]" in a reason is not markup
    console.print(t)


class _Ran(msgspec.Struct):
    """Why: what one GPU ran of one shape, enough to bound its hits at any block size."""

    longer: int = 0  # item requests whose prompt is longer than the prefix (all its blocks)
    short: list[int] = msgspec.field(default_factory=list)  # prompt lengths of the others
    prewarms: int = 0  # pre-warm requests: the prefix alone, max_tokens 1
    siblings: list[tuple[int, int]] = msgspec.field(default_factory=list)  # (prompt, n - 1)


class AchievableHits:
    """Why: achievable hits need each shape's prefix blocks and what each GPU ran of it.

    The bound, per GPU, over every request its engine counted (the items' and the pre-warms'
    alike: the engine's queries hold both): each request can hit at most its leading prefix
    blocks below its last token (`achievable_cached_tokens`), and every distinct prefix block
    is computed once on that GPU, a miss for the first request that asks it, unless some
    request holds it past what it could hit itself (a pre-warm's last block) and runs first.
    Blocks are the engine's (`blocks.prefix_block_hashes`), so shapes whose components start
    alike share their leading blocks, as they do in the engine's cache (of one name: a LoRA
    adapter's blocks are not its base model's); a pre-warm pays the
    one prefill of its shape on its GPU and the items after it hit every prefix block; the
    n - 1 sibling requests of an item asking n choices can hit its whole prompt."""

    def __init__(self) -> None:
        self.prefix: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}  # input shapes
        self.unlisted: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        self.choices: dict[str, int] = {}  # item id -> n, only for the items asking n > 1
        self.ran: dict[tuple[str, int, int | None], _Ran] = {}

    def add(self, item: Item) -> None:
        payload = decode_item_payload(item)
        key = (item.model, item.signature)
        if key not in self.prefix:
            self.prefix[key] = prefix_sources(payload) if payload else ()
        n = sim_spec(payload).n if payload is not None and payload.body else 1
        if n > 1:
            self.choices[item.id] = n

    def completed(self, rec: ResultRecord) -> None:
        """Count the requests an item's result says its engine ran (none when refused)."""
        if rec.error is not None or rec.status or rec.finish_reason == "length_exceeded":
            return
        ran = self.ran.get((rec.model, rec.signature, rec.gpu))
        if ran is None:
            ran = self.ran[(rec.model, rec.signature, rec.gpu)] = _Ran()
        sources = self.prefix.get((rec.model, rec.signature), ())
        if rec.prompt_tokens > sum(max(0, n) for _, n in sources):
            ran.longer += 1
        else:
            ran.short.append(rec.prompt_tokens)
        n = self.choices.get(rec.id, 1)
        if n > 1:
            ran.siblings.append((rec.prompt_tokens, n - 1))

    def prewarmed(self, gpu: int | None, signal: Prewarm) -> None:
        """A consumer's engine took a pre-warm (it sends a request only with a sample)."""
        if signal.sample is None:
            return
        key = (signal.model, signal.signature)
        if key not in self.prefix and key not in self.unlisted:
            payload = decode_item_payload(signal.sample)
            self.unlisted[key] = prefix_sources(payload) if payload else ()
        ran = self.ran.get((*key, gpu))
        if ran is None:
            ran = self.ran[(*key, gpu)] = _Ran()
        ran.prewarms += 1

    def kv_note(self, queries: int, achievable: int, block: int) -> str:
        """Why the achievable hits are 0 when they are ("" otherwise): `queries` is what the
        engines counted, `achievable` this bound at their `block` size."""
        if not self.ran:
            return ""  # no request ran: nothing to explain
        if queries <= 0:
            return "the server reports no cache statistics"
        if achievable > 0:
            return ""
        longest = max((sum(max(0, n) for _, n in src)
                       for src in (*self.prefix.values(), *self.unlisted.values())), default=0)
        if longest <= 0:
            return "no item declares a shared prefix"
        if longest < block:
            return f"no prefix as long as one KV block ({block} tokens)"
        return "no prefix was asked twice on one GPU"

    def achievable(self, block: int) -> int:
        """The most prompt tokens the engines' caches could have hit (see the class)."""
        total = 0
        # (gpu, model) -> (asked, held past): a name's blocks are its own. Hashed as the
        # simulated engine hashes a base model's, so its memo of each shape's chain answers.
        blocks: dict[tuple[int | None, str], tuple[set[int], set[int]]] = {}
        for (model, signature, gpu), ran in self.ran.items():
            sources = self.prefix.get((model, signature)) or self.unlisted.get(
                (model, signature), ())
            p = sum(max(0, n) for _, n in sources)
            asks = [(a // block, k) for a, k in (
                (achievable_cached_tokens(p, p + 1, block), ran.longer),
                (achievable_cached_tokens(p, p, block), ran.prewarms),
                *((achievable_cached_tokens(p, n, block), 1) for n in ran.short)) if k]
            total += sum(a * k for a, k in asks) * block
            total += sum(achievable_cached_tokens(n, n, block) * k for n, k in ran.siblings)
            if p < block or not asks:
                continue
            chain = prefix_block_hashes(sources, block)
            asked, held = blocks.setdefault((gpu, model), (set(), set()))
            asked.update(chain[:max(a for a, _ in asks)])
            held.update(chain[min(a for a, _ in asks):])
        return max(0, total - sum(len(a - h) for a, h in blocks.values()) * block)
