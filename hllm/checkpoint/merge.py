"""``hllm merge``: fold the LoRA adapter into the backbone (peft ``merge_and_unload``).

Nothing is written outside ``out_dir``: the manifest's ``head.file`` is checked to lie inside the
source checkpoint when it is loaded and again inside the output when copied
(:func:`hllm.reading.contained_path`). The merged checkpoint is standalone: ``CKPT_OUT/backbone`` is a plain Hugging Face directory with
no adapter files (a stray ``adapter_config.json`` would make some loaders silently re-apply an
adapter), the head is copied, and the manifest has ``adapter: null``. The merge proves itself: the
score matrix M of the merged model, reloaded from disk, is compared with the adapter model's on
sample slates and must agree to ``tol`` (default 1e-4, float32; peft merging in float32 is exact to
~1e-6, bf16 merging is not), otherwise nothing is written.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.formats.checkpoint import load_manifest, manifest_dict, write_manifest
from hllm.errors import CheckpointError, ParityError
from hllm.files import atomic_dir
from hllm.reading import contained_path, sha256_tree
from hllm.engines.reference import TorchEngine
from hllm.model.adapter import lora_b_norm
from hllm.model.hllm import load_model
from hllm.verify.scoring import score_slates
from hllm.checkpoint.init import copy_tokenizer_files
from hllm.runtime.prompt import PromptBuilder, load_tokenizer

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


@dataclass
class MergeReport:
    """Result of a merge: where it went and how close merged and adapter models are.

    ``max_abs_diff`` is max |M_merged − M_adapter| over the sample slates (float32); ``adapter_effect``
    is max |M_adapter − M_bare| (the same model with the adapter disabled): what the adapter changes;
    ``lora_b_max`` the largest |value| of its lora_B matrices (0: peft's initial state, a no-op adapter).
    """

    out_dir: str
    slates: int
    max_abs_diff: float
    tol: float
    adapter_effect: float
    lora_b_max: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def merge_checkpoint(
    ckpt: str | os.PathLike,
    out_dir: str | os.PathLike,
    slates: Sequence[dict],
    tol: float = 1e-4,
    overwrite: bool = False,
) -> MergeReport:
    """Merge the adapter of ``ckpt`` into its backbone and write a standalone checkpoint.

    Args:
        ckpt: checkpoint with an adapter.
        out_dir: new checkpoint directory (written atomically; backbone in ``out_dir/backbone``).
        slates: sample slates for the self-check (at least one).
        tol: max allowed |ΔM|.
    Raises:
        CheckpointError: no adapter, adapter files left in the merged backbone, or an adapter with
            non-zero lora_B whose scores equal the bare backbone's (it did not apply).
        ParityError: merged and adapter models differ by more than ``tol`` (nothing written).
    """
    m = load_manifest(ckpt)
    if m.adapter_path is None:
        raise CheckpointError(f"{m.root} has no adapter: nothing to merge (it can be exported as is)")
    if not slates:
        raise CheckpointError("merge needs at least one sample slate for its self-check")
    builder = PromptBuilder(load_tokenizer(m.tokenizer_path), m.prompt, max_items=m.num_positions)
    with TorchEngine(m.root) as adapter_engine:  # the adapter, unmerged: the reference
        (ref,) = score_slates([adapter_engine], builder, slates)
        peft_model = adapter_engine.model.backbone
        with peft_model.disable_adapter():  # peft: the same modules with LoRA off = the bare backbone
            (bare,) = score_slates([adapter_engine], builder, slates)
        b_max = lora_b_norm(peft_model)
    effect = max(float(np.abs(a - b).max()) for a, b in zip(ref, bare))
    if b_max > 0 and not effect > 0:
        raise CheckpointError(f"the adapter {m.adapter_path} has non-zero lora_B (max |B| {b_max:.3g}) but the "
                              "adapter model scores exactly as the bare backbone: it did not apply")
    merged_backbone = load_model(m, merge=True).backbone
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        bdir = tmp / "backbone"
        merged_backbone.save_pretrained(str(bdir))
        copy_tokenizer_files(m.backbone_path, bdir)
        leftovers = [p.name for p in bdir.rglob("*") if p.name in ADAPTER_FILES]
        if leftovers:
            raise CheckpointError(f"merged backbone still holds adapter files {leftovers}")
        head_out = contained_path(tmp, m.head.file, "head.file", CheckpointError)  # never outside out_dir
        head_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(m.head_path, head_out)
        extra = dict(m.extra)
        extra["merged_from"] = {"checkpoint": str(m.root), "adapter_sha256": sha256_tree(m.adapter_path)}
        write_manifest(tmp, manifest_dict("backbone", m.head, m.prompt, None, extra))
        with TorchEngine(tmp) as merged_engine:  # reload from disk: proves the files, not the in-memory model
            (got,) = score_slates([merged_engine], builder, slates)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
        if not diff <= tol:
            raise ParityError(f"merged model differs from the adapter model: max|ΔM|={diff:.3g} > tol={tol:g}")
    return MergeReport(str(Path(out_dir)), len(slates), diff, tol, effect, b_max)
