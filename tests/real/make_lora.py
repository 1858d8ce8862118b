"""Writes a random LoRA adapter (peft layout) for the tiny Llama that make_tiny_model.py builds.

Run with the python of `.venv-vllm` (it has torch and safetensors; peft is not needed):
    .venv-vllm/bin/python tests/real/make_lora.py MODEL_DIR [OUT_DIR ...]
Reads MODEL_DIR/config.json for the layer count and sizes and writes into each OUT_DIR an
adapter_config.json and an adapter_model.safetensors: rank-8 lora_A/lora_B on every layer's
q_proj and v_proj, float32, random from seed 1, 2, ... in the order given. Unlike a fresh
peft adapter (lora_B zero) both factors are random and large next to the base weights (std
0.02), so each adapter changes the text. Deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RANK = 8
ALPHA = 16
STD = 0.05  # each factor's: B @ A * ALPHA / RANK has entries of ~0.03, the base's 0.02
TARGETS = ("q_proj", "v_proj")


def build(model: Path, out: Path, seed: int) -> None:
    """Write the adapter for the model in `model` into `out`."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    outs = {"q_proj": heads * head_dim,
            "v_proj": cfg.get("num_key_value_heads", heads) * head_dim}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name in TARGETS:
            key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen) * STD
            tensors[f"{key}.lora_B.weight"] = torch.randn(outs[name], RANK, generator=gen) * STD
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
              "target_modules": list(TARGETS), "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False,
              "use_dora": False, "base_model_name_or_path": str(model)}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:  # no OUT_DIR: nothing to write (vllm_bench without --lora)
        sys.exit(f"usage: {sys.argv[0]} MODEL_DIR [OUT_DIR ...]")
    for seed, out in enumerate(sys.argv[2:], start=1):
        build(Path(sys.argv[1]), Path(out), seed)
        print(out)
