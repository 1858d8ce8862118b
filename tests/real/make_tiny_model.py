"""Builds a tiny random Llama that vLLM's CPU build can serve, with no download.

Run with the python of `.venv-vllm` (it has torch, transformers and tokenizers):
    .venv-vllm/bin/python tests/real/make_tiny_model.py OUT_DIR [--classify]
Writes a HF model dir (~0.5 MB): a byte-level BPE tokenizer trained in-process on a fixed
corpus and a LlamaForCausalLM (hidden 64, 2 layers, 2 heads, 1 KV head: head_dim 32, the
smallest vLLM's CPU attention supports), float32, random weights from seed 0. Deterministic.
With `--classify`, the same tokenizer and sizes as a LlamaForSequenceClassification with one
label (seed 1): what vLLM's score and rerank endpoints serve with `--runner pooling`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

SUBJECTS = ["the broker", "a lane", "the shape", "every consumer", "the engine", "a batch",
            "the cache", "one prompt", "the supervisor", "a token"]
VERBS = ["routes", "packs", "warms", "drains", "reads", "writes", "keeps", "sends",
         "counts", "evicts"]
OBJECTS = ["the items", "a prefix", "its blocks", "the queue", "the results", "each request",
           "the segment", "a few tokens", "the system prompt", "the tools"]


def corpus() -> list[str]:
    """About 150 short sentences plus digits and punctuation, in a fixed order."""
    lines = [f"{s} {v} {o}." for i, s in enumerate(SUBJECTS) for j, v in enumerate(VERBS)
             for o in OBJECTS[(i + j) % 3::4]]
    lines += ["0 1 2 3 4 5 6 7 8 9", "You are a helpful assistant.", "Question: Answer:",
              '{"name": "tool", "arguments": {}}']
    return lines


def build(out: Path, classify: bool = False) -> None:
    """Write the tokenizer and the random model into `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512,
                                  special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}assistant:")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=2048, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      dtype="float32")
    if classify:
        cfg.num_labels = 1
        torch.manual_seed(1)
        LlamaForSequenceClassification(cfg).to(torch.float32).save_pretrained(out)
        return
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2) or (len(args) == 2 and args[1] != "--classify"):
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR [--classify]")
    build(Path(args[0]), classify=len(args) == 2)
    print(args[0])
