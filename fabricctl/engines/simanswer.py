"""What the simulated engine answers to one item's request, as vLLM would. SIMULATED.

Contract:
- `sim_spec(item)` reads the item's request as a real engine receives it: `n` choices
  (default 1) and `ignore_eos`. Each choice `j` has a natural length drawn deterministically
  from the item id: `output_len(id, j, max_tokens)` is uniform over 1 .. max_tokens + ceil(
  max_tokens / 4), so about four choices in five stop before max_tokens (finish_reason
  "stop", as when a model emits its end of sequence) and the rest are cut at max_tokens
  ("length"). With `ignore_eos` every choice runs to max_tokens ("length"). `stop` strings
  are not simulated (the text is made up).
- `sim_body(item, spec, choices, prompt_tokens, cached)` is the response body vLLM would
  send for it (JSON): a `text_completion`, or a `chat.completion` for a chat payload, with
  one choice per `(text, finish_reason)` and vLLM's usage (completion tokens summed over the
  choices, `prompt_tokens_details.cached_tokens`). Ids are derived from the item id.
- `item_answer(item, run)` is the ItemResult of an item's finished requests (one per
  choice): choice 0's text and finish_reason, the tokens of all choices, and the body for
  an OpenAI batch item or several choices; None stands for an item refused as too long.
"""

from __future__ import annotations

from typing import Any

import msgspec
import xxhash

from fabricctl.core.payload import Payload
from fabricctl.core.types import Item, ItemResult
from fabricctl.engines.simrequest import SimRequest, item_result, sim_text

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class SimSpec(msgspec.Struct, frozen=True):
    """Why: the request fields that change what the simulated engine generates."""

    n: int = 1
    ignore_eos: bool = False
    chat: bool = False


def sim_spec(payload: Payload | None) -> SimSpec:
    """The spec of an item's request; a payload without a readable body asks for defaults."""
    if payload is None or not payload.body:
        return SimSpec(chat=bool(payload and payload.chat))
    try:
        body: Any = _decode(payload.body)
    except msgspec.DecodeError:
        return SimSpec(chat=payload.chat)
    if not isinstance(body, dict):
        return SimSpec(chat=payload.chat)
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return SimSpec(n=n, ignore_eos=body.get("ignore_eos") is True, chat=payload.chat)


def output_len(item_id: str, choice: int, max_tokens: int) -> int:
    """The natural length of one choice: uniform over 1 .. max_tokens + ceil(max_tokens/4)."""
    span = max_tokens + -(-max_tokens // 4)
    h = xxhash.xxh3_64_intdigest(f"{item_id}\x00{choice}".encode())
    return 1 + h % max(1, span)


def choice_plan(item: Item, spec: SimSpec, max_tokens: int) -> list[tuple[int, str]]:
    """(tokens to generate, finish_reason) for each choice of the item's request."""
    if spec.ignore_eos:
        return [(max_tokens, "length")] * spec.n
    plan = []
    for j in range(spec.n):
        natural = output_len(item.id, j, max_tokens)
        plan.append((natural, "stop") if natural < max_tokens else (max_tokens, "length"))
    return plan


def sim_body(item: Item, spec: SimSpec, choices: list[tuple[str, str, int]],
             prompt_tokens: int, cached: int) -> bytes:
    """vLLM's response body for the item; `choices` are (text, finish_reason, tokens)."""
    h = xxhash.xxh3_64_hexdigest(item.id.encode())
    out: list[dict[str, Any]] = []
    for j, (text, reason, _) in enumerate(choices):
        if spec.chat:
            out.append({"index": j, "message": {"role": "assistant", "content": text,
                                                "tool_calls": []},
                        "logprobs": None, "finish_reason": reason, "stop_reason": None})
        else:
            out.append({"index": j, "text": text, "logprobs": None, "finish_reason": reason,
                        "stop_reason": None})
    completion = sum(n for *_, n in choices)
    return _encode({
        "id": f"{'chatcmpl' if spec.chat else 'cmpl'}-sim-{h}",
        "object": "chat.completion" if spec.chat else "text_completion",
        "created": 0,
        "model": item.model,
        "choices": out,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                  "completion_tokens": completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    })


def item_answer(item: Item, run: tuple[SimSpec, list[tuple[int, str]], list[SimRequest]] | None
            ) -> ItemResult:
    """The ItemResult of one item's finished requests (None: refused as too long)."""
    if run is None:
        return item_result(item.id, None)
    spec, plan, reqs = run
    choices = [(sim_text(r.rid, r.out), reason if r.out == tokens else "length", r.out)
               for (tokens, reason), r in zip(plan, reqs, strict=True)]
    first = reqs[0]
    body = b""
    if item.source or spec.n > 1:  # an OpenAI batch line, or several choices
        body = sim_body(item, spec, choices, first.prompt_len, first.cached_tokens)
    return ItemResult(id=item.id, text=choices[0][0], finish_reason=choices[0][1],
                      tokens_out=sum(n for *_, n in choices), cached_tokens=first.cached_tokens,
                      body=body)
