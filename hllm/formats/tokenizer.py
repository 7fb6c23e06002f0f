"""Does a ``tokenizer.json`` belong to the model it is served with? (torch-free, tokenizer-library-free)

A tokenizer from another model is not an error anywhere downstream: its ids are valid integers, the
graph gathers embedding rows for them (ids past the embedding are clamped or wrap, depending on the
runtime) and the rankings are garbage with exit 0. Two checks catch it:

* **fingerprint** — the export sidecar records ``tokenizer_sha256`` (the bytes ``hllm export``
  copied from the backbone); the file found at load time must hash the same;
* **vocabulary** — every id the tokenizer can emit must be a row of the model's embedding:
  ``max id + 1 ≤ vocab_size`` (the sidecar's ``backbone.vocab_size``; a checkpoint's backbone
  ``config.json``). Models pad their embedding (Qwen: 151936 rows, 151669 tokens), so a smaller
  tokenizer is fine; a larger one is not.

The ids are read from the ``tokenizer.json`` format of Hugging Face ``tokenizers``
(https://huggingface.co/docs/tokenizers/api/tokenizer — ``model.vocab``: a ``{token: id}`` object for
BPE / WordPiece / WordLevel, a ``[[token, score], ...]`` list for Unigram whose ids are the positions;
``added_tokens``: ``[{"id", "content", ...}]``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hllm.errors import HllmError
from hllm.reading import read_json, sha256_file


def tokenizer_id_count(path: str | os.PathLike, error: type[Exception] = HllmError) -> int:
    """``max id + 1`` over the tokenizer's vocabulary and added tokens.

    Raises: ``error`` when the file is not a readable ``tokenizer.json`` (not JSON, not an object,
        no ``model.vocab``, ids that are not integers).
    """
    p = Path(path)
    d = read_json(p, error, "{path} is not a readable tokenizer.json: {reason}")
    model = d.get("model") if isinstance(d, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids = list(vocab.values())
    elif isinstance(vocab, list):
        ids = [len(vocab) - 1] if vocab else []
    else:
        raise error(f"{p} is not a tokenizer.json: it has no model.vocab")
    added = d.get("added_tokens") or []
    if not isinstance(added, list):
        raise error(f"{p}: added_tokens must be a list")
    ids += [t.get("id") for t in added if isinstance(t, dict)]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise error(f"{p}: token ids must be non-negative integers")
    return max(ids, default=-1) + 1


def check_tokenizer(path: str | os.PathLike, vocab_size: object = None, sha256: object = None,
                    where: str = "tokenizer", error: type[Exception] = HllmError) -> None:
    """Refuse a tokenizer that is not the model's.

    Args:
        path: the ``tokenizer.json`` found. vocab_size: the model's embedding rows (None: not
            checked). sha256: the recorded fingerprint (None: not checked). where: for the
            message (the sidecar's path). error: the exception class.
    Raises: ``error`` naming the file, what was recorded and what was found.
    """
    if sha256 is not None:
        if not isinstance(sha256, str):
            raise error(f"{where}: tokenizer_sha256 must be a hex string, got {sha256!r}")
        found = sha256_file(path)
        if found != sha256:
            raise error(f"{where}: {Path(path).name} is not the tokenizer this model was exported with "
                        f"(sha256 {found[:12]}…, recorded {sha256[:12]}…): a tokenizer from another model gives "
                        "garbage rankings; restore the exported tokenizer.json or re-export")
    if vocab_size is not None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise error(f"{where}: backbone.vocab_size must be a positive integer, got {vocab_size!r}")
        n = tokenizer_id_count(path, error)
        if n > vocab_size:
            raise error(f"{where}: {Path(path).name} has token ids up to {n - 1} but the model's embedding has "
                        f"{vocab_size} rows: this tokenizer belongs to another model")
