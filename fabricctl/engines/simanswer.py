"""What the simulated engine answers to one item's request, as vLLM would. SIMULATED.

Contract:
- `sim_spec(item)` reads the request as a real engine receives it: its endpoint
  (`simendpoints.endpoint_of`), `n` choices (1 beyond completions and chat) and
  `ignore_eos`. Choice `j`'s natural length is drawn from the item id: `output_len(id, j,
  max_tokens)` is uniform over 1 .. max_tokens + ceil(max_tokens / 4), so about four choices
  in five "stop" and the rest are cut at max_tokens ("length"); with `ignore_eos` all run to
  max_tokens. `stop` strings are not simulated.
- `plan_item(item, payload, cap, endpoints)` is a `SimPlan` (one request per choice with its
  tokens to generate; a pooling request is its prompt with no output), or the error
  ItemResult of a request the server refuses: an endpoint outside `endpoints` or unknown is
  a 400 "Model does not support endpoint: <path>", a body vLLM refuses its 400
  (`simendpoints.parse_ask`). Output is `max_tokens` (responses: `max_output_tokens`), at
  most `cap`.
- `sim_body(...)` is the completion body vLLM would send: a `text_completion` or
  `chat.completion` with one choice per `(text, finish_reason)` and vLLM's usage; ids derive
  from the item id.
- `item_answer(item, plan, reqs, ...)` is the ItemResult of the finished requests:
  completions and chat as a real engine reads them (`engines.request`); other endpoints
  carry their body and counts from its usage. Pooling claims no cached tokens (vLLM's
  pooling usage has none; the simulated cache still counts the hit); a Responses answer has
  the simulated hit as `cached_tokens` and `cache_write_tokens` = full prompt blocks - hit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import xxhash

from fabricctl.core.payload import Payload
from fabricctl.core.types import Item, ItemResult
from fabricctl.engines.simbodies import Refusal, refusal, unsupported
from fabricctl.engines.simendpoints import (
    CHAT,
    COMPLETIONS,
    GENERATION,
    SIMULATED,
    Ask,
    ResponsesAsk,
    TranscriptionAsk,
    endpoint_of,
    parse_ask,
)
from fabricctl.engines.simrequest import SimRequest, sim_text

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class SimSpec(msgspec.Struct, frozen=True):
    """Why: the request fields that change what the simulated engine generates."""

    n: int = 1
    ignore_eos: bool = False
    chat: bool = False
    endpoint: str = COMPLETIONS  # canonical (`simendpoints.endpoint_of`)


def sim_spec(payload: Payload | None) -> SimSpec:
    """The spec of an item's request; a payload without a readable body asks for defaults."""
    if payload is None:
        return SimSpec()
    endpoint = endpoint_of(payload.path, payload.chat)
    chat = endpoint == CHAT
    if not payload.body:
        return SimSpec(chat=chat, endpoint=endpoint)
    try:
        body: Any = _decode(payload.body)
    except msgspec.DecodeError:
        return SimSpec(chat=chat, endpoint=endpoint)
    if not isinstance(body, dict):
        return SimSpec(chat=chat, endpoint=endpoint)
    n = body.get("n") if endpoint in GENERATION else 1
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return SimSpec(n=n, ignore_eos=body.get("ignore_eos") is True, chat=chat, endpoint=endpoint)


class SimPlan(NamedTuple):
    """Why: what one item runs on the simulated GPU, and what its answer is built from."""

    spec: SimSpec
    choices: list[tuple[int, str]]  # per request: (tokens to generate, finish_reason)
    ask: Ask | None  # the request as the server reads it, beyond completions and chat
    limit: int  # the output limit its choices ran under

    @property
    def pooling(self) -> bool:
        """A pooling request: its prompt's prefill and no output token."""
        return self.ask is not None and not isinstance(self.ask, ResponsesAsk)


def refused(item_id: str, answer: Refusal) -> ItemResult:
    """The ItemResult of a request the server refuses, as the HTTP engine reads one."""
    return ItemResult(id=item_id, finish_reason="error",
                      error=f"HTTP {answer.status}: {answer.message}", status=answer.status,
                      body=answer.body)


def plan_item(item: Item, payload: Payload | None, cap: int | None,
              endpoints: frozenset[str] | None) -> SimPlan | ItemResult:
    """What the item runs, or its refusal (see the module contract)."""
    spec = sim_spec(payload)
    path = payload.path if payload is not None and payload.path else spec.endpoint
    if spec.endpoint not in SIMULATED or (endpoints is not None and spec.endpoint not in endpoints):
        return refused(item.id, unsupported(path))
    limit = item.max_tokens if cap is None else min(item.max_tokens, cap)
    if spec.endpoint in GENERATION:
        return SimPlan(spec, choice_plan(item, spec, limit), None, limit)
    try:
        request: Any = _decode(payload.body if payload is not None else b"")
    except msgspec.DecodeError:
        return refused(item.id, refusal("the request body is not valid JSON"))
    ask = parse_ask(spec.endpoint, request, item.model)
    if isinstance(ask, Refusal):
        return refused(item.id, ask)
    if isinstance(ask, ResponsesAsk):
        if ask.limit is not None:
            limit = ask.limit if cap is None else min(ask.limit, cap)
        return SimPlan(spec, choice_plan(item, spec, limit), ask, limit)
    return SimPlan(spec, [(0, "stop")], ask, 0)


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


def item_answer(item: Item, plan: SimPlan, reqs: list[SimRequest], *, block_size: int,
                max_model_len: int) -> ItemResult:
    """The ItemResult of one item's finished requests (see the module contract)."""
    first = reqs[0]
    spec, ask = plan.spec, plan.ask
    if ask is None:
        choices = [(sim_text(r.rid, r.out), reason if r.out == tokens else "length", r.out)
                   for (tokens, reason), r in zip(plan.choices, reqs, strict=True)]
        body = b""
        if item.source or spec.n > 1:  # an OpenAI batch line, or several choices
            body = sim_body(item, spec, choices, first.prompt_len, first.cached_tokens)
        return ItemResult(id=item.id, text=choices[0][0], finish_reason=choices[0][1],
                          tokens_out=sum(n for *_, n in choices),
                          cached_tokens=first.cached_tokens, body=body)
    prompt, cached = first.prompt_len, first.cached_tokens
    if isinstance(ask, ResponsesAsk):
        tokens, reason = plan.choices[0]
        reason = reason if first.out == tokens else "length"
        text = sim_text(first.rid, first.out)
        body = ask.body(item.model, item.id, text=text, finish_reason=reason,
                        prompt_tokens=prompt, cached_tokens=cached,
                        cache_write_tokens=max(0, prompt // block_size * block_size - cached),
                        output_tokens=first.out,
                        max_output_tokens=max(1, min(plan.limit, max_model_len - prompt)))
        return ItemResult(id=item.id, text=text, finish_reason=reason, tokens_out=first.out,
                          cached_tokens=cached, prompt_tokens=prompt, body=body)
    # vLLM's pooling usage reports no cached tokens: neither does the result (its body's)
    text = ask.text if isinstance(ask, TranscriptionAsk) else ""
    return ItemResult(id=item.id, text=text, tokens_out=0, cached_tokens=None,
                      prompt_tokens=prompt, body=ask.body(item.model, item.id, prompt))
