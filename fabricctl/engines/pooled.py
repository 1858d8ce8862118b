"""Embeddings items of a batch that travel as one request, and each one's answer split back.

vLLM's `/v1/embeddings` answers a list of inputs with one vector per input and the usage
summed over them, each input its own engine request (docs/engine-notes.md, section 6), so
items whose bodies differ only in their input can travel together and each get the body a
request of its own would have got.

Contract:
- `pool_input(path, body)`: the one input of an embeddings body that may travel with others
  (a string, or one list of token ids), or None (another endpoint, a list of inputs, chat
  `messages`, `truncate_prompt_tokens`, an `encoding_format` other than float or base64).
  `pool_key(path, body)`: the canonical JSON of the rest of the body and the input's kind.
- Token counts: token ids count themselves; a text is counted by an `InputCounter`
  (`ServedTokenizer`: the served model's `tokenizer.json`, special tokens as the body's
  `add_special_tokens`, as vLLM's renderer does); `served_counter(tokenizer, model)` finds
  it or gives None, and then texts travel one a request.
- `plan_groups(keys, counts, max_inputs, max_tokens)`: indices bucketed by key in batch
  order, cut greedily at `max_inputs` inputs and `max_tokens` tokens (`GROUP_INPUTS`,
  `GROUP_TOKENS`); only runs of two or more are groups.
- `split_answer(content, counts)`: the group's 2xx body cut into one body per input, in
  vLLM's field order: `data` its one entry with `index` 0 (the vector's JSON untouched),
  its own `usage`, the group's `created` and `model`, `id` the group's with `-<i>`. `why` is
  set instead when the body is not `len(counts)` vectors or its usage is not the counts' sum.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

import msgspec

log = logging.getLogger(__name__)

EMBEDDINGS = "/v1/embeddings"
GROUP_INPUTS = 64  # inputs a grouped request carries at most (vLLM runs each as a request)
GROUP_TOKENS = 16384  # and prompt tokens: one answer holds up the group's slowest input
TOKENIZER_FILE = "tokenizer.json"
_JSON_FORMATS = ("float", "base64")

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class InputCounter(Protocol):
    """Why: a text's prompt tokens as the served model's renderer counts them."""

    def counts(self, texts: list[str], special: bool) -> list[int]: ...


class ServedTokenizer:
    """Why: the served model's own tokenizer counts a text as vLLM does, in one batch call."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)
        self.path = path

    def counts(self, texts: list[str], special: bool) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=special)]


def served_counter(tokenizer: str, model: str) -> InputCounter | None:
    """`tokenizer` when set, else `<model>/tokenizer.json` when `model` is a directory that
    holds one, loaded; None when there is none or it does not load (logged)."""
    path = tokenizer
    if not path and model:
        found = Path(model).expanduser() / TOKENIZER_FILE
        path = str(found) if found.is_file() else ""
    if not path:
        return None
    try:
        return ServedTokenizer(path)
    except Exception as e:  # no `tokenizers`, or a file it does not read: no grouping of texts
        log.warning("grouped embeddings: %s does not load (%r); texts go one a request",
                    path, e)
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def pool_input(path: str, body: dict[str, Any]) -> str | list[int] | None:
    """The body's one input when it may travel with others (see the module contract)."""
    if path != EMBEDDINGS or "messages" in body:
        return None
    if body.get("truncate_prompt_tokens") is not None:
        return None
    if body.get("encoding_format", "float") not in _JSON_FORMATS:
        return None
    value = body.get("input")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return value
    return None


def pool_key(path: str, body: dict[str, Any]) -> bytes | None:
    """What items that may travel together share: the body but its input, and its kind."""
    value = pool_input(path, body)
    if value is None:
        return None
    rest = {k: v for k, v in body.items() if k != "input"}
    kind = b"text:" if isinstance(value, str) else b"ids:"
    return kind + _encode(rest, order="sorted")


def special_tokens(body: dict[str, Any]) -> bool:
    """Whether vLLM adds special tokens to the body's text inputs (its default: yes)."""
    return body.get("add_special_tokens", True) is not False


def plan_groups(keys: list[bytes | None], counts: list[int | None], max_inputs: int,
                max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """(groups of indices, indices that travel alone); see the module contract."""
    buckets: dict[bytes, list[list[int]]] = {}
    tokens: dict[bytes, int] = {}
    alone: list[int] = []
    for i, (key, n) in enumerate(zip(keys, counts, strict=True)):
        if key is None or n is None:
            alone.append(i)
            continue
        runs = buckets.setdefault(key, [[]])
        run = runs[-1]
        if run and (len(run) >= max_inputs or tokens[key] + n > max_tokens):
            run = []
            runs.append(run)
            tokens[key] = 0
        run.append(i)
        tokens[key] = tokens.get(key, 0) + n
    groups = []
    for runs in buckets.values():
        for run in runs:
            if len(run) > 1:
                groups.append(run)
            else:
                alone.extend(run)
    alone.sort()
    return groups, alone


class Split(msgspec.Struct):
    """Why: a grouped answer is either each input's own body or the reason it is not."""

    bodies: list[bytes]
    why: str = ""


class _Usage(msgspec.Struct):
    """Why: the group's counts, checked against the inputs' own before the split."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: Any = None  # vLLM's pooling usage has none; one would not split


def split_answer(content: bytes, counts: list[int]) -> Split:
    """Each input's body from the group's answer; see the module contract."""
    try:
        top = _decode(content, type=dict[str, msgspec.Raw])
        data = _decode(top["data"], type=list[dict[str, msgspec.Raw]])
        usage = _decode(top["usage"], type=dict[str, Any])
        index = [_decode(d["index"], type=int) for d in data]
        given = _decode(top["usage"], type=_Usage)
        ident = _decode(top["id"], type=str)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as e:
        return Split([], f"not an embeddings answer: {e}")
    if sorted(index) != list(range(len(counts))):
        return Split([], f"{len(data)} vectors (indices {index[:8]}) for {len(counts)} inputs")
    if given.prompt_tokens != sum(counts):
        return Split([], f"usage.prompt_tokens {given.prompt_tokens} is not the inputs' "
                         f"{sum(counts)}")
    if given.prompt_tokens_details is not None:
        return Split([], "usage.prompt_tokens_details is a sum over the inputs")
    extra = given.completion_tokens or 0
    by_index = dict(zip(index, data, strict=True))
    bodies = []
    for i, n in enumerate(counts):
        entry = dict(by_index[i], index=msgspec.Raw(b"0"))
        own = dict(usage, prompt_tokens=n, total_tokens=n + extra)
        one = dict(top, id=msgspec.Raw(_encode(f"{ident}-{i}")), data=[entry], usage=own)
        bodies.append(_encode(one))
    return Split(bodies)


class Send(msgspec.Struct):
    """Why: an item's request, its place in the batch, and its input's tokens when grouped."""

    index: int
    path: str
    body: dict[str, Any]
    keep: bool
    count: int | None = None


def plan_sends(sends: list[Send], counter: InputCounter | None
               ) -> tuple[list[list[Send]], list[Send]]:
    """(groups that travel as one request, the items that travel alone): each grouped
    item's `count` set, texts counted by `counter` (none: texts travel alone)."""
    keys = [pool_key(s.path, s.body) for s in sends]
    seen = Counter(k for k in keys if k is not None)
    texts: dict[bool, list[Send]] = {}
    for s, key in zip(sends, keys, strict=True):
        if key is None or seen[key] < 2:
            continue
        value = pool_input(s.path, s.body)
        if isinstance(value, list):
            s.count = len(value)
        elif counter is not None:
            texts.setdefault(special_tokens(s.body), []).append(s)
    for special, some in texts.items():
        assert counter is not None
        counts = counter.counts([s.body["input"] for s in some], special)
        for s, n in zip(some, counts, strict=True):
            s.count = n
    groups, alone = plan_groups(keys, [s.count for s in sends], GROUP_INPUTS, GROUP_TOKENS)
    return [[sends[i] for i in g] for g in groups], [sends[i] for i in alone]
