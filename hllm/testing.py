"""Tiny offline backbones and slates for tests and smoke runs (imports torch and transformers).

Builds random Qwen3 / Qwen2 / Llama decoders from configs in code (no hub access) and a small
byte-level BPE ``tokenizer.json`` trained in memory with ``tokenizers``. Qwen3's head_dim is set
unequal to hidden/heads on purpose.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = (
    "argan oil hair shampoo conditioner nail polish lacquer top coat serum cream lotion spf sunscreen "
    "brush comb curling iron mascara eyeliner lipstick gloss palette matte shimmer rose lavender "
    "vanilla coconut shea butter mineral foundation powder blush bronzer primer cleanser toner mask "
    "ounce pack bottle jar tube set kit women men travel size organic natural vegan"
).split()


def tiny_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """Train a byte-level BPE tokenizer on synthetic product titles; save as ``path`` (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


def tiny_config(family: str, vocab_size: int, **overrides):
    """A 2-layer config of ``family`` (qwen3, qwen2, llama): hidden 32, 4 heads, 2 KV heads;
    ``overrides`` replace any of these (e.g. ``head_dim=16``)."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    own = {"qwen3": dict(head_dim=16, tie_word_embeddings=False), "qwen2": dict(tie_word_embeddings=False),
           "llama": dict(head_dim=8, tie_word_embeddings=True)}
    if family in own:
        return AutoConfig.for_model(family, **{**common, **own[family], **overrides})
    raise ValueError(f"unknown family {family!r}")


def tiny_backbone(out_dir: Path, family: str = "qwen3", seed: int = 0, **overrides) -> Path:
    """Write a random tiny causal LM of ``family`` (config :func:`tiny_config` with ``overrides``) with a
    tokenizer.json to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer(out_dir / "tokenizer.json")
    vocab = Tokenizer.from_file(str(out_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab, **overrides), dtype=torch.float32)
    model.save_pretrained(str(out_dir))
    return out_dir


def tiny_slates(n: int, n_items: int | tuple[int, int] = 5, seed: int = 0, history: int = 3) -> list[dict]:
    """``n`` synthetic slates with ``n_items`` candidates (or a random count in a (lo, hi) range)."""
    rng = random.Random(seed)
    out = []
    for s in range(n):
        k = n_items if isinstance(n_items, int) else rng.randint(*n_items)
        titles = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(k)]
        labels = [0] * k
        labels[rng.randrange(k)] = 1
        out.append({
            "slate_id": f"tiny-{s}",
            "history": [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(history)],
            "candidates": [{"item_id": f"I{s}-{i}", "title": t} for i, t in enumerate(titles)],
            "labels": labels,
        })
    return out


def tiny_encoder(out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny BERT encoder (2 layers, hidden 32) with a fast tokenizer to ``out_dir``: a
    stand-in for a sentence-embedding model directory (the embedding teacher's input)."""
    import torch
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer(out_dir / "tokenizer.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"), pad_token="<|endoftext|>")
    tok.save_pretrained(str(out_dir))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, pad_token_id=tok.pad_token_id)
    BertModel(cfg).save_pretrained(str(out_dir))
    return out_dir


def tiny_export(root: Path, seed: int = 0) -> Path:
    """The tests' tiny export, built under ``root``: random Qwen3 backbone → untrained self-attention
    checkpoint (K = 8, LoRA r = 4) → merged → ONNX fp32 (``ort-cpu`` flavour). Returns ``root/export``.

    For smoke runs of the runtime without a real model (CI's wheel checks, Ray benchmarks): it measures
    overhead, not a real model's speed or quality. Needs the export extra (torch, transformers, peft).
    """
    from hllm.checkpoint.init import init_checkpoint
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.exporter.onnx import export_onnx

    root = Path(root)
    bb = tiny_backbone(root / "backbone", "qwen3", seed=seed)
    ck = init_checkpoint(bb, root / "ckpt", "self_attention", 8, seed=seed, lora_rank=4,
                         head_kwargs=dict(d_model=32, num_heads=4, ff_dim=64))
    merge_checkpoint(ck, root / "merged", tiny_slates(2, (2, 8)))
    export_onnx(root / "merged", root / "export")
    return root / "export"
