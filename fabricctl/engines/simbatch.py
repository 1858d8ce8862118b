"""Batch mode on a simulated GPU: a whole Work run on it, each item as its request asks.

SIMULATED. Contract: `run_work(gpu, work)` returns the Work's ItemResults in its item order
and the simulated seconds it took. Each item runs as `simanswer.plan_item` says (n choices,
each a request of its own with a drawn output length unless ignore_eos; a pooling request's
prompt alone) and is answered by `simanswer.item_answer`; an item longer than the Work's or
the GPU's maximum input is a `length_exceeded` result, and one the server would refuse gets
its error result: neither runs.
"""

from __future__ import annotations

from fabricctl.core.types import ItemResult, Work
from fabricctl.engines.blocks import decode_item_payload, item_blocks
from fabricctl.engines.simanswer import SimPlan, item_answer, plan_item
from fabricctl.engines.simgpu import SimGPU
from fabricctl.engines.simrequest import SimRequest, item_result


def run_work(gpu: SimGPU, work: Work, adapter: str = "") -> tuple[list[ItemResult], float]:
    """Every item of `work` run to completion on `gpu`: results in order, and seconds;
    `adapter`: the LoRA adapter the batch's name is ("": the base model), whose blocks hash
    apart from the base model's."""
    start, key, bs = gpu.now, (work.lane, work.epoch), gpu.block_size
    cap = work.max_tokens if work.max_tokens > 0 else None
    runs: list[tuple[SimPlan, list[SimRequest]] | ItemResult] = []
    for item in work.items:
        chain = (item_blocks(item, bs, adapter) if item.input_tokens <= work.max_input_len
                 else None)
        if chain is None or chain.tokens > gpu.max_input_len:
            gpu.counters.length_exceeded += 1
            runs.append(item_result(item.id, None))
            continue
        plan = plan_item(item, decode_item_payload(item), cap, gpu.endpoints)
        if isinstance(plan, ItemResult):
            runs.append(plan)
            continue
        reqs = [gpu.add(item.id if j == 0 else f"{item.id}#{j}", chain.hashes,
                         chain.tokens, tokens, key=key, pooling=plan.pooling)
                for j, (tokens, _) in enumerate(plan.choices)]
        runs.append((plan, reqs))
    gpu.finish({r for run in runs if not isinstance(run, ItemResult) for r in run[1]})
    results = [
        run if isinstance(run, ItemResult) else item_answer(
            item, *run, block_size=bs, max_model_len=gpu.max_model_len)
        for item, run in zip(work.items, runs, strict=True)
    ]
    gpu.counters.batches += 1
    gpu.counters.items += len(work.items)
    return results, gpu.now - start
