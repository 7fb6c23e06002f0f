"""Validation of a written export, kept apart from the export itself (as Hugging Face Optimum separates
``export`` from ``validate_model_outputs``): synthetic batches at shapes the tracer never saw, PyTorch vs
ONNX Runtime score matrices, and the ranking-level check of the FP16 graph's CPU emulation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.engines.ort import OnnxRuntimeEngine
from hllm.errors import ExportError
from hllm.formats.export import ShapeCheck
from hllm.runtime.prompt import Batch
from hllm.verify.parity import compare_slate


def synthetic_batch(rng: np.random.Generator, vocab: int, lengths: Sequence[int], n_items: Sequence[int]) -> Batch:
    """A right-padded random batch: ``lengths[b]`` tokens, ``n_items[b]`` distinct readout positions
    (sorted, inside the real tokens) and a context position before the first readout, per row. Used to
    validate exports at untraced shapes. Raises ValueError if a row has fewer tokens than items."""
    b, s, n = len(lengths), max(lengths), max(n_items)
    ids = np.zeros((b, s), dtype=np.int64)
    pos = np.zeros((b, n), dtype=np.int64)
    mask = np.zeros((b, n), dtype=bool)
    ctx = np.zeros(b, dtype=np.int64)
    for i, (L, k) in enumerate(zip(lengths, n_items)):
        if k > L:
            raise ValueError(f"row {i}: {k} items need at least {k} tokens, got {L}")
        ids[i, :L] = rng.integers(0, vocab, L)
        pos[i, :k] = np.sort(rng.choice(L, size=k, replace=False))
        mask[i, :k] = True
        ctx[i] = rng.integers(0, pos[i, 0] + 1)
    return Batch(ids, pos, mask, np.array(lengths), np.array(n_items), context_positions=ctx)


def validation_batches(vocab: int, k: int, seed: int = 0) -> list[tuple[str, Batch]]:
    """Shapes the export is validated at, all different from the traced (B=2, S=32, N=min(4,K))."""
    rng = np.random.default_rng(seed)
    shapes = [
        ("B1_N1", [9], [1]),
        ("B3_unequal", [40, 17, 29], [min(6, k), min(2, k), min(5, k)]),
        ("B2_NK", [max(64, k + 8), max(20, k)], [k, max(1, k // 2)]),
    ]
    return [(name, synthetic_batch(rng, vocab, ls, ns)) for name, ls, ns in shapes]


def validate_against_torch(model, onnx_path: Path, k: int, batches, context: bool) -> tuple[list[ShapeCheck], list[np.ndarray]]:
    """PyTorch (``model``, float32) vs ONNX Runtime (``onnx_path``) on each ``(name, Batch)`` of ``batches``.

    Returns per batch a :class:`hllm.formats.export.ShapeCheck` and the reference scores
    ``[B, N, K]`` float32. The caller decides what tolerance fails (``export_onnx``: ``atol``).
    Raises EngineError if ONNX Runtime cannot load or run the graph."""
    import torch

    results, refs = [], []
    with OnnxRuntimeEngine(onnx_path, k, context=context) as eng, torch.inference_mode():
        for name, b in batches:
            ref = model(*(torch.from_numpy(x) for x in b.inputs(context).values())).numpy()
            refs.append(ref)
            got = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
            results.append(ShapeCheck(name, int(b.input_ids.shape[0]), int(b.input_ids.shape[1]), int(b.item_mask.shape[1]),
                                      float(np.abs(ref - got).max()), int((~np.isfinite(got)).sum())))
    return results, refs



def validate_fp16_emulation(emu_path: Path, batches, refs, min_tau: float, context: bool = False) -> dict:
    """Ranking-level check of the FP16 graph's float32 CPU emulation against the float32 references.

    ``refs[i]`` is the PyTorch ``[B, N, K]`` float32 score matrix of ``batches[i]``. Each slate row is compared
    with :func:`hllm.verify.parity.compare_slate`. Returns ``{min_kendall_tau, kendall_tau_mean, nonfinite,
    max_abs_diff, rows}``. Raises ExportError on any non-finite score or a mean Kendall tau below ``min_tau``
    (|ΔM| is recorded, not enforced: FP16 moves scores, the ranking is what must hold).
    """
    rows = []
    with OnnxRuntimeEngine(emu_path, refs[0].shape[-1], context=context) as eng:
        for (name, b), ref in zip(batches, refs):
            got = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
            for j, n in enumerate(b.n_items):
                r = compare_slate(ref[j, :n], got[j, :n], f"{name}[{j}]")
                rows.append({k: r[k] for k in ("slate_id", "n_items", "max_abs_diff", "nonfinite", "kendall_tau",
                                              "top1_match")})
    tau = float(np.mean([r["kendall_tau"] for r in rows]))
    nonfinite = int(sum(r["nonfinite"] for r in rows))
    if nonfinite or not tau >= min_tau:
        raise ExportError(f"FP16 emulation fails the ranking check: nonfinite={nonfinite}, mean Kendall tau "
                          f"{tau:.4f} (min {min_tau}); rows: {rows}")
    return {"min_kendall_tau": min_tau, "kendall_tau_mean": tau, "nonfinite": nonfinite,
            "max_abs_diff": float(max(r["max_abs_diff"] for r in rows)), "rows": rows}
