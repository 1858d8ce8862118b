"""Builds the random Llama `bench/vllm_bench.py` serves: ~12M parameters, prefill-bound.

Run with the python of `.venv-vllm` (it has torch, transformers and tokenizers):
    .venv-vllm/bin/python bench/make_bench_model.py OUT_DIR CORPUS_FILE
Writes a HF model dir (~47 MB): a byte-level BPE tokenizer (vocab 2048) trained in-process
on CORPUS_FILE (one passage per line) and a LlamaForCausalLM (hidden 384, 6 layers, 6 heads
of head_dim 64, 2 KV heads, MLP 1152, untied embeddings), float32, random weights from seed
0. Nothing is downloaded; deterministic for a given corpus. Prints one JSON line
`{"out", "params", "vocab", "seconds"}` on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

VOCAB = 2048
HIDDEN = 384
LAYERS = 6
HEADS = 6  # head_dim 64: a size vLLM's CPU attention supports
KV_HEADS = 2
MLP = 1152


def build(out: Path, corpus: Path) -> dict[str, object]:
    """Write the tokenizer and the random model into `out`; return what was built."""
    t0 = time.monotonic()
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    lines = [ln for ln in corpus.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB,
                                  special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}assistant:")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=HIDDEN, intermediate_size=MLP,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"out": str(out), "params": params, "vocab": len(fast),
            "seconds": round(time.monotonic() - t0, 1)}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR CORPUS_FILE")
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
