"""Calibration: simulated-GPU costs fitted to a live server's timings, and their file form.

Contract: `fit_costs(probes, server)` turns six timed probes of one idle server (`Probes`,
measured by `fabricctl calibrate`) and what the server reports of itself (`ServerShape`) into
a `SimCosts` whose replay takes about as long as that server would: `request_s` from the
front-end probe, `step_overhead_s` (with `forward_s` 0) from one decoding request,
`decode_seq_s` from `batch` decoding at once, `prefill_token_s` from the prefill probe net
of the tiny-prompt one and its extra chunked-prefill steps, and `cached_token_s` (or, when
the short probes read slow, a common scale of the first three) from the cached probe, a
grouped-workload burst simulated on those costs (`simulate_burst`) until it agrees with the
server (bisection). KV reads and graph builds cost nothing more (`--enforce-eager`); the KV
pool, scheduler limits and block size are the server's. Every fitted cost is clamped to >= 0
and `prefill_token_s` to > 0; probes it cannot fit (no request or token, a prefill no longer
than the tiny prompts) are a `UsageError`. `costs_toml(costs, note)` writes a flat TOML table
of every `SimCosts` field; `load_costs(text)` reads one back (missing fields keep the default
profile's; an unknown field, a non-number, a negative value or bad TOML is a `UsageError`
naming it). `cost_pace(costs, requests, at_once)`: the pace the cost model gives a burst, the
prior a replay's broker forecasts by before it has measured. ARCHITECTURE.md, "Calibration".
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable

from fabricctl.engines.costs import SimCosts
from fabricctl.engines.simgpu import SimGPU
from fabricctl.errors import UsageError


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
    cached_s: float  # `cached_requests` requests: a cached `cached_len`-token prefix, each
    cached_len: int  # with `cached_new` tokens of its own and `cached_out` output tokens
    cached_new: int
    cached_out: int
    cached_requests: int
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
    if min(p.front_requests, p.decode_tokens, p.tiny_len, p.cached_len, p.cached_new,
           p.cached_out, p.cached_requests, p.batch) < 1:
        raise UsageError("every probe needs at least one request and one token")
    if p.prefill_len <= p.tiny_len:
        raise UsageError("the prefill probe's prompts must be longer than the tiny ones")
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
    costs = SimCosts(
        block_size=server.block_size, num_blocks=server.num_blocks,
        max_num_seqs=server.max_num_seqs,
        max_num_batched_tokens=server.max_num_batched_tokens,
        step_overhead_s=step_s, forward_s=0.0, prefill_token_s=prefill_token_s,
        cached_token_s=0.0, decode_seq_s=decode_seq_s, kv_token_s=0.0, graph_build_s=0.0,
        request_s=request_s,
    )
    if cached_probe_s(p, costs) > p.cached_s:  # the short probes read slow: scale them down
        return _scaled(costs, bisect(lambda a: cached_probe_s(p, _scaled(costs, a)),
                                     p.cached_s, 0.0, 1.0))
    hi = prefill_token_s
    if cached_probe_s(p, dataclasses.replace(costs, cached_token_s=hi)) <= p.cached_s:
        return dataclasses.replace(costs, cached_token_s=hi)  # a hit never costs more
    return dataclasses.replace(costs, cached_token_s=bisect(
        lambda c: cached_probe_s(p, dataclasses.replace(costs, cached_token_s=c)),
        p.cached_s, 0.0, hi))


def _scaled(costs: SimCosts, a: float) -> SimCosts:
    """`costs` with the overheads the short probes measured (front end, step, per sequence)
    times `a`."""
    return dataclasses.replace(costs, request_s=costs.request_s * a,
                               step_overhead_s=costs.step_overhead_s * a,
                               decode_seq_s=costs.decode_seq_s * a)


def bisect(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target, for f increasing (40 halvings)."""
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def cached_probe_s(p: Probes, costs: SimCosts) -> float:
    """Simulated seconds of the cached probe on a GPU of `costs`."""
    bs = costs.block_size
    blocks = p.cached_len // bs
    shared = list(range(1, blocks + 1))
    length = p.cached_len + p.cached_new
    own = [[1_000_000 * (k + 1) + j for j in range(blocks, length // bs)]
           for k in range(p.cached_requests + 1)]  # each request's own full blocks
    gpu, _ = simulate_burst(costs, [(shared + own[-1], length, 1)], 1)
    return simulate_burst(costs, [(shared + own[k], length, p.cached_out)
                                  for k in range(p.cached_requests)], p.batch, gpu)[1]


def simulate_burst(costs: SimCosts, requests: list[tuple[list[int], int, int]], at_once: int,
                   gpu: SimGPU | None = None) -> tuple[SimGPU, float]:
    """A client sending `requests` (block hashes, prompt tokens, max tokens) `at_once` in
    flight to a simulated GPU (a fresh one, or `gpu` as left by an earlier burst): the GPU
    and the burst's simulated seconds."""
    if gpu is None:
        gpu = SimGPU(costs, max_input_len=costs.kv_tokens - 2,
                     max_model_len=costs.kv_tokens - 1)
    start = gpu.now
    todo = iter(requests)
    live = 0
    for hashes, tokens, out in todo:
        gpu.add("probe", hashes, tokens, out)
        live += 1
        if live == at_once:
            break
    while live:
        for _ in gpu.step():
            live -= 1
            nxt = next(todo, None)
            if nxt is not None:
                gpu.add("probe", *nxt)
                live += 1
    return gpu, gpu.now - start


def cost_pace(costs: SimCosts, requests: list[tuple[list[int], int, int]],
              at_once: int) -> float | None:
    """What the cost model says one GPU does: `requests` (block hashes, prompt tokens, max
    tokens: a shape's first items) burst `at_once` on a fresh simulated GPU, in prompt
    tokens per simulated second (a broker's pace, `Broker.restore_paces`); None for none."""
    if not requests:
        return None
    _, seconds = simulate_burst(costs, requests, max(1, at_once))
    return sum(tokens for _, tokens, _ in requests) / seconds if seconds > 0 else None


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
        raise UsageError(f"not TOML: {e}") from None
    fields = {f.name: f for f in dataclasses.fields(SimCosts)}
    kwargs: dict[str, int | float] = {}
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            raise UsageError(f"unknown cost {key!r}; known: {', '.join(fields)}")
        want_int = isinstance(f.default, int)
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                want_int and not isinstance(value, int)):
            raise UsageError(f"{key} must be {'an integer' if want_int else 'a number'}, "
                             f"not {value!r}")
        if value < 0:
            raise UsageError(f"{key} must be >= 0, not {value!r}")
        kwargs[key] = value
    return SimCosts(**kwargs)  # type: ignore[arg-type]
