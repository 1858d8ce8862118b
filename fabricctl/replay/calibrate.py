"""Calibration: simulated-GPU costs fitted to a live server's timings, and their file form.

Contract: `fit_costs(probes, server)` turns four timed probes of one idle server (`Probes`,
measured by `fabricctl calibrate`) and what the server reports of itself (`ServerShape`) into
a `SimCosts` whose replay takes about as long as that server would:
- `request_s` = front-end probe seconds / its requests (tiny prompts, one output token, so
  the API server, not the engine, sets the pace);
- `step_overhead_s` = (one request decoding `decode_tokens` - `request_s`) / its tokens, the
  cost of a step that only decodes (the weights pass is in it: `forward_s` = 0);
- `decode_seq_s` = the extra time per step and per sequence when `batch` requests decode at
  once (>= 0);
- `prefill_token_s` = (the prefill probe - the same requests with tiny prompts - the extra
  steps x `step_overhead_s`) / the extra prompt tokens, where the steps are the
  chunked-prefill steps its tokens need beyond the first (the budget, or the KV pool when
  smaller, per step);
- `cached_token_s` = (the cached probe - the tiny one) / its cached tokens: what a prompt
  token found in the prefix cache still costs (the new tokens attend to it);
- KV reads of decodes and graph builds cost nothing on such a server (`--enforce-eager`);
the KV pool, scheduler limits and block size are the server's. Every fitted cost is clamped
to >= 0 and `prefill_token_s` to > 0. `costs_toml(costs, note)` writes a flat TOML table of
every `SimCosts` field; `load_costs(text)` reads one back (missing fields keep the default
GPU profile's value; an unknown field or a non-number is a `ValueError` naming it).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib

from fabricctl.engines.costs import SimCosts


@dataclasses.dataclass(frozen=True, slots=True)
class Probes:
    """Why: the fit needs each probe's shape beside its seconds."""

    front_s: float  # `front_requests` tiny requests, max_tokens 1, `batch` at a time
    front_requests: int
    decode_one_s: float  # one tiny request decoding `decode_tokens` tokens
    decode_batch_s: float  # `batch` tiny requests at once, `decode_tokens` tokens each
    decode_tokens: int
    prefill_s: float  # `batch` requests of `prefill_len` uncached tokens, max_tokens 1
    prefill_len: int
    tiny_s: float  # `batch` requests of `tiny_len` tokens, max_tokens 1
    tiny_len: int
    cached_s: float  # `batch` requests of a cached `cached_len`-token prefix + `tiny_len` new
    cached_len: int
    batch: int


@dataclasses.dataclass(frozen=True, slots=True)
class ServerShape:
    """Why: what the server says of itself bounds the simulated GPU exactly."""

    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int


def fit_costs(p: Probes, server: ServerShape) -> SimCosts:
    """Costs that make a simulated GPU take as long as the probed server (module docstring)."""
    if min(p.front_requests, p.decode_tokens, p.tiny_len, p.cached_len, p.batch) < 1:
        raise ValueError("every probe needs at least one request and one token")
    if p.prefill_len <= p.tiny_len:
        raise ValueError("the prefill probe's prompts must be longer than the tiny ones")
    request_s = max(0.0, p.front_s / p.front_requests)
    step_s = max(0.0, (p.decode_one_s - request_s) / p.decode_tokens)
    # the batch's requests pass the front end one after another before all of them decode
    batch_step_s = (p.decode_batch_s - p.batch * request_s) / p.decode_tokens
    decode_seq_s = max(0.0, (batch_step_s - step_s) / p.batch)
    per_step = max(1, min(server.max_num_batched_tokens,
                          (server.num_blocks - 1) * server.block_size))
    steps = math.ceil(p.batch * p.prefill_len / per_step)
    extra = p.batch * (p.prefill_len - p.tiny_len)
    prefill_token_s = max(1e-9, (p.prefill_s - p.tiny_s - (steps - 1) * step_s) / extra)
    cached_token_s = max(0.0, (p.cached_s - p.tiny_s) / (p.batch * p.cached_len))
    return SimCosts(
        block_size=server.block_size, num_blocks=server.num_blocks,
        max_num_seqs=server.max_num_seqs,
        max_num_batched_tokens=server.max_num_batched_tokens,
        step_overhead_s=step_s, forward_s=0.0, prefill_token_s=prefill_token_s,
        cached_token_s=cached_token_s, decode_seq_s=decode_seq_s, kv_token_s=0.0, graph_build_s=0.0,
        request_s=request_s,
    )


def costs_toml(costs: SimCosts, note: str = "") -> str:
    """Every field of `costs` as a flat TOML table (`note`: comment lines above it)."""
    lines = [f"# {line}" for line in note.splitlines()]
    for f in dataclasses.fields(SimCosts):
        value = getattr(costs, f.name)
        lines.append(f"{f.name} = {value!r}")
    return "\n".join(lines) + "\n"


def load_costs(text: str) -> SimCosts:
    """A `costs_toml` table (or any subset of its fields) as `SimCosts`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not TOML: {e}") from None
    fields = {f.name: f for f in dataclasses.fields(SimCosts)}
    kwargs: dict[str, int | float] = {}
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            raise ValueError(f"unknown cost {key!r}; known: {', '.join(fields)}")
        want_int = isinstance(f.default, int)
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                want_int and not isinstance(value, int)):
            raise ValueError(f"{key} must be {'an integer' if want_int else 'a number'}, "
                             f"not {value!r}")
        if value < 0:
            raise ValueError(f"{key} must be >= 0, not {value!r}")
        kwargs[key] = value
    return SimCosts(**kwargs)  # type: ignore[arg-type]
