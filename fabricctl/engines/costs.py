"""The simulated GPU's parameters: KV pool, scheduler limits and per-step costs. SIMULATED.

Contract: one frozen `SimCosts` holds every number the simulated engine uses; nothing else in
`sim`/`simgpu` hard-codes one. Defaults describe, loosely, a 7B dense model (Llama-2-7B-like:
32 layers, hidden 4096, full multi-head KV, bf16) served by vLLM 0.32 on one 80 GB
H100-class GPU. They are order-of-magnitude estimates from public specs and vLLM's
defaults, not measurements: every figure the simulator reports is labelled simulated.

Step time (seconds) of one scheduler step, as `step_seconds` computes it:
  step_overhead_s
  + max(forward_s, uncached_prefill_tokens * prefill_token_s)   # weights pass vs compute
  + cached_tokens * cached_token_s                               # cache hits: bookkeeping
  + decode_seqs * decode_seq_s + decode_context_tokens * kv_token_s
  + new_graph_keys * graph_build_s                               # first use of (lane, epoch)
A request reaches the scheduler `request_s` after the server's front end is free (one request
at a time, beside the steps). `fabricctl calibrate` fits these numbers to a live server
(`fabricctl.replay.calibrate`); `fabricctl replay --costs FILE` uses them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimCosts:
    """Why: one documented place for every simulated-GPU number, so runs are reproducible."""

    # KV pool -------------------------------------------------------------------------------
    block_size: int = 16
    """Tokens per KV block: vLLM's DEFAULT_BLOCK_SIZE on CUDA (docs/engine-notes.md, 1)."""
    num_blocks: int = 7168
    """KV blocks incl. the null block. 80 GB x 0.92 (gpu_memory_utilization, engine-notes 1)
    - 13.5 GB bf16 weights - ~4 GB activations/graphs ~= 56 GB; at 512 KiB/token
    (2 x 32 layers x 4096 x 2 bytes) that is ~115k tokens = ~7200 blocks of 16."""

    # scheduler (vLLM's API-server defaults on a >= 70 GiB GPU, docs/engine-notes.md, 1) ----
    max_num_seqs: int = 1024
    """--max-num-seqs: running sequences at most."""
    max_num_batched_tokens: int = 8192
    """--max-num-batched-tokens: the chunked-prefill token budget of one step."""

    # per-step costs ------------------------------------------------------------------------
    step_overhead_s: float = 5e-4
    """CPU side of a step (scheduling, input preparation, detokenising): ~0.5 ms in vLLM V1."""
    forward_s: float = 5e-3
    """One forward pass that only reads the weights: 13.5 GB / 3.35 TB/s HBM3 ~= 4 ms, at
    ~80% of peak bandwidth ~= 5 ms. The floor of every step, decode-only steps included."""
    prefill_token_s: float = 3.5e-5
    """One uncached prompt token: 2 x 6.7e9 = 13.4 GFLOP at ~40% of 989 TFLOP/s dense bf16
    (~400 TFLOP/s) ~= 34 us, i.e. ~29k prefill tokens/s."""
    cached_token_s: float = 2e-7
    """One prompt token found in the prefix cache: block-table bookkeeping only (~1/175 of
    an uncached token); vLLM skips its compute entirely."""
    decode_seq_s: float = 1e-5
    """Per running decode sequence per step: sampling, logits and metadata (~10 us)."""
    kv_token_s: float = 2e-7
    """Per context token of a decode sequence per step: attention reads its 512 KiB of KV;
    512 KiB / (3.35 TB/s x 0.8) ~= 0.2 us."""
    graph_build_s: float = 0.3
    """Capturing the CUDA graphs for a new (lane, epoch) key: vLLM captures ~67 batch sizes
    in 5-20 s at start-up, i.e. ~0.1-0.3 s per captured shape; we charge one per key."""
    graph_cache_size: int = 512
    """(lane, epoch) keys kept before the least recently used graph is dropped (graph pool
    memory is finite); 0 keeps every key."""

    # the server's front end ----------------------------------------------------------------
    request_s: float = 0.0
    """The API server's own time per request (HTTP, tokenising, detokenising), one request
    after another and beside the engine's steps: a request reaches the scheduler that long
    after the front end is free. 0 (not modelled) in this GPU profile, where the engine
    dominates; on a small model it caps req/s at 1 / request_s, and `fabricctl calibrate`
    measures it."""

    @property
    def kv_tokens(self) -> int:
        """Token capacity of the KV pool (the null block excluded)."""
        return (self.num_blocks - 1) * self.block_size

    def step_seconds(
        self,
        prefill_tokens: int,
        cached_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        new_graphs: int = 0,
    ) -> float:
        """Simulated seconds of one scheduler step (see the module docstring)."""
        compute = prefill_tokens * self.prefill_token_s
        return (
            self.step_overhead_s
            + (compute if compute > self.forward_s else self.forward_s)
            + cached_tokens * self.cached_token_s
            + decode_seqs * self.decode_seq_s
            + context_tokens * self.kv_token_s
            + new_graphs * self.graph_build_s
        )


DEFAULT_COSTS = SimCosts()
