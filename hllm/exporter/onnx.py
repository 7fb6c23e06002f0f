"""``hllm export``: the prefill + readout + head graph as ONE ONNX model, validated in ONNX Runtime.

Graph (names and dtypes are the contract with every engine, :mod:`hllm.formats.graph`)::

    input_ids          [batch, seq]   int64
    readout_positions  [batch, items] int64
    item_mask          [batch, items] bool
    context_positions  [batch]        int64   only when the head reads the user context (``head.context``)
    → scores           [batch, items, K] float32

No attention-mask input: batches are right-padded and attention is purely causal, so real tokens
never see pads and keep their position ids; the readout only gathers real positions. This keeps the
graph small and removes the fully-masked rows that left padding creates (NaN risk in FP16).

Exported with the dynamo exporter (``torch.onnx.export(..., dynamo=True)``,
https://pytorch.org/docs/stable/onnx_export.html). The example input has batch 2 and several items:
an example with batch 1 silently specialises the batch dimension to 1. Weights go to external data
(``model.onnx.data``, referenced relative to the model file) when the model is over 2 GB.

Two flavours (:mod:`hllm.exporter.fusion`), both exported under
:func:`hllm.exporter.patches.causal_sdpa_export` (SDPA with ``is_causal``: no materialised mask, no
``Where(IsNaN)`` guard): ``ort-cpu`` (default) rewrites each decoder attention into
``com.microsoft.GroupQueryAttention`` and the RMSNorms into ``(Skip)SimplifiedLayerNormalization`` for
ONNX Runtime; ``standard`` keeps only ``ai.onnx`` ops (TensorRT, other runtimes; ``--precision fp16``
needs it). The sidecar records which (``flavour``).

After export the graph validates itself in ONNX Runtime against PyTorch at shapes different from the
traced one (B=1 N=1; B=3 with unequal lengths; B=2 N=K; plus real slates when given) and the export
fails (nothing written) past ``atol``. A sidecar ``export.json`` records source checkpoint hash,
opset, library versions, the tolerance reached and the input/output specs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from hllm.exporter.fp16 import DEFAULT_ISLANDS, convert_to_fp16, emulate_fp16, fp32_islands_check
from hllm.exporter.onnx_io import load_onnx, save_onnx
from hllm.exporter.patches import causal_sdpa_export
from hllm.formats.checkpoint import Manifest, load_manifest
from hllm.formats.graph import MAX_BATCH, MAX_ITEMS, MAX_SEQ, MIN_SEQ, graph_io_specs, input_names
from hllm.exporter.fusion import FLAVOURS
from hllm.errors import CheckpointError, ExportError, HllmError
from hllm.files import atomic_dir
from hllm.reading import sha256_file, sha256_tree
from hllm.formats.export import Fp16Check, ShapeCheck, write_export
from hllm.formats.precision import Precision
from hllm.formats.export import onnx_metadata_props
from hllm.formats.provenance import library_versions
from hllm.model.hllm import load_model
from hllm.exporter.validate import synthetic_batch, validate_against_torch, validate_fp16_emulation, validation_batches
from hllm.runtime.prompt import PromptBuilder, load_tokenizer

ONNX_NAME = "model.onnx"
EMULATED_NAME = "model.fp16-emulated.onnx"
TWO_GB = 2 * 1024**3


@dataclass
class ExportReport:
    """What an export produced: the directory, the graph's size in bytes, its flavour and
    :class:`Precision`, the validation max |Δscores| per shape (:class:`ShapeCheck`), and (FP16) the
    emulated graph's ranking check (:class:`Fp16Check`)."""

    out_dir: str
    onnx_bytes: int
    opset: int
    validation: list[ShapeCheck]
    max_abs_diff: float
    atol: float
    export_seconds: float
    flavour: str = "ort-cpu"
    precision: Precision = Precision.FP32
    fp16: Fp16Check | None = None

    def to_dict(self) -> dict:
        """JSON-ready: shapes and the FP16 record as dicts, precision as its string."""
        return {**self.__dict__, "validation": [v.to_dict() for v in self.validation], "precision": str(self.precision),
                "fp16": None if self.fp16 is None else self.fp16.to_dict()}


def export_onnx(
    ckpt: "str | os.PathLike | Manifest",
    out_dir: str | os.PathLike,
    opset: int = 20,
    atol: float = 1e-4,
    slates: Sequence[dict] = (),
    overwrite: bool = False,
    progress=None,
    precision: str | Precision = Precision.FP32,
    fp32_islands: Sequence[str] | None = None,
    fp16_min_tau: float = 0.9,
    flavour: str | None = None,
) -> ExportReport:
    """Export a checkpoint (without adapter: merge first) to ``out_dir/model.onnx`` and validate it.

    Args:
        ckpt: checkpoint directory, or its manifest already loaded (:func:`load_manifest`, so a command
            reads it once); must have no adapter (``hllm merge`` first).
        out_dir: export directory (atomic): ``model.onnx`` [+ ``model.onnx.data``], ``export.json``,
            ``tokenizer.json``.
        opset: ONNX opset (default 20: widest TensorRT 10/11 support).
        atol: max allowed |scores_ORT − scores_torch| at every validation shape.
        slates: optional real slates; the first two are validated as one padded batch of 2.
        progress: optional callable(str) told about each step.
        precision: :class:`Precision` ``FP32`` (default) or ``FP16`` (or their strings): the validated float32 graph is rewritten by
            :func:`hllm.exporter.fp16.convert_to_fp16` (float16 with float32 islands) and a
            float32 emulation ``model.fp16-emulated.onnx`` is written beside it for ONNX Runtime CPU.
            The emulation is validated at ranking level: no non-finite score and mean Kendall tau
            ≥ ``fp16_min_tau`` over the validation rows (|ΔM| is recorded, not enforced).
        fp32_islands: islands kept in float32 (default:
            :data:`hllm.exporter.fp16.DEFAULT_ISLANDS`).
        flavour: ``ort-cpu`` (fused ONNX Runtime graph) or ``standard`` (only ``ai.onnx`` ops); default
            ``standard`` with ``precision="fp16"`` (a TensorRT input), else ``ort-cpu``.
    Raises:
        CheckpointError: the checkpoint has an adapter. ExportError: export or validation failed.
    """
    import time

    say = progress or (lambda msg: None)
    try:
        precision = Precision.parse(precision)
    except HllmError as e:
        raise ExportError(str(e)) from None
    if precision not in (Precision.FP32, Precision.FP16):
        raise ExportError(f"precision must be 'fp32' or 'fp16', got {str(precision)!r}")
    flavour = flavour or ("standard" if precision is Precision.FP16 else "ort-cpu")
    if flavour not in FLAVOURS:
        raise ExportError(f"flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    if precision is Precision.FP16 and flavour != "standard":
        raise ExportError("--precision fp16 writes a TensorRT input: export it with --flavour standard")
    m = ckpt if isinstance(ckpt, Manifest) else load_manifest(ckpt)
    if m.adapter_path is not None:
        raise CheckpointError(f"{m.root} has a LoRA adapter: run `hllm merge` first and export the merged checkpoint")
    model = load_model(m)
    k, context = m.num_positions, model.reads_context
    t0 = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        onnx_path = tmp / ONNX_NAME
        say(f"tracing with the dynamo exporter (opset {opset}), {flavour} graph")
        builder = PromptBuilder(load_tokenizer(m.tokenizer_path), m.prompt, max_items=k)  # loaded once
        props = onnx_metadata_props(k, flavour, m.prompt.to_dict(), context, builder.pad_id)
        fusion = _export(model, onnx_path, opset, k, m.dims.vocab_size, flavour, m.dims.num_layers, props)
        export_s = time.perf_counter() - t0
        say("validating in ONNX Runtime against PyTorch")
        batches = validation_batches(m.dims.vocab_size, k)
        if slates:
            batches.append(("real_slates", builder.encode(list(slates)[:2])))
        results, refs = validate_against_torch(model, onnx_path, k, batches, context)
        worst = max(r.max_abs_diff for r in results)
        bad = [r.to_dict() for r in results if not (r.max_abs_diff <= atol) or r.nonfinite]
        if bad:
            raise ExportError(f"ONNX Runtime disagrees with PyTorch beyond atol={atol:g}: {bad}")
        fp16_meta = None
        if precision is Precision.FP16:
            say("rewriting to FP16 with FP32 islands and validating its CPU emulation")
            fp16_meta = _to_fp16(onnx_path, batches, refs, fp32_islands, fp16_min_tau, context)
        shutil.copy2(m.tokenizer_path, tmp / "tokenizer.json")
        onnx_bytes = sum(p.stat().st_size for p in tmp.glob(f"{ONNX_NAME}*"))
        write_export(tmp, _sidecar(m, tmp, onnx_path, precision, flavour, fusion, fp16_meta, context, onnx_bytes,
                                   {"atol": atol, "max_abs_diff": worst, "shapes": [r.to_dict() for r in results]},
                                   builder.pad_id))
    return ExportReport(str(out_dir), onnx_bytes, opset, results, worst, atol, round(export_s, 2), flavour, precision,
                        fp16_meta)


def _sidecar(m, tmp: Path, onnx_path: Path, precision: Precision, flavour: str, fusion: dict,
             fp16_meta: Fp16Check | None, context: bool, onnx_bytes: int, validation: dict, pad_id: int) -> dict:
    """The ``export.json`` dict of an export (:mod:`hllm.formats.export` validates and writes it)."""
    k = m.num_positions
    inputs, outputs = graph_io_specs(k, context)
    return {
        "onnx": ONNX_NAME,
        "precision": str(precision),
        "flavour": flavour,
        "fusion": fusion,
        **({"fp32_islands": list(fp16_meta.islands), "fp16": fp16_meta.to_dict()} if fp16_meta else {}),
        "opset": fusion.pop("opset"),
        "num_positions": k,
        "head": m.head.kind,
        "backbone": {"model_type": m.dims.model_type, "hidden_size": m.dims.hidden_size,
                     "num_layers": m.dims.num_layers, "vocab_size": m.dims.vocab_size},
        "prompt": m.prompt.to_dict(),
        "tokenizer": "tokenizer.json",
        "tokenizer_sha256": sha256_file(tmp / "tokenizer.json"),
        "pad_id": pad_id,
        "source_checkpoint": {"path": str(m.root), "sha256": checkpoint_hash(m.root)},
        "onnx_sha256": sha256_file(onnx_path),
        "onnx_bytes": onnx_bytes,
        "validation": validation,
        "inputs": [x.to_dict() for x in inputs],
        "outputs": [x.to_dict() for x in outputs],
        "versions": library_versions(),
    }


def _to_fp16(onnx_path: Path, batches, refs, islands, min_tau: float, context: bool = False) -> Fp16Check:
    """Rewrite ``onnx_path`` in place to FP16 (+ write its CPU emulation) and validate it (ranking level)."""
    islands = tuple(DEFAULT_ISLANDS if islands is None else islands)
    src = load_onnx(onnx_path)
    fp16, rep = convert_to_fp16(src, islands)
    problems = fp32_islands_check(fp16)
    if problems:
        raise ExportError(f"FP16 graph breaks its FP32 islands: {problems[:5]}")
    _keep_metadata(src, fp16)
    del src
    emu_path = onnx_path.with_name(EMULATED_NAME)
    emulated = emulate_fp16(fp16)
    _keep_metadata(fp16, emulated)
    save_onnx(emulated, emu_path)
    del emulated
    for p in onnx_path.parent.glob(f"{ONNX_NAME}*"):
        p.unlink()
    save_onnx(fp16, onnx_path)
    del fp16
    validation = validate_fp16_emulation(emu_path, batches, refs, min_tau, context)
    return Fp16Check(
        islands=tuple(islands),
        conversion=rep.to_dict(),
        cpu_emulation={
            "onnx": EMULATED_NAME,
            "what": "float16 weights stored as float32 with float16 values; every float16 tensor a node "
                    "produces rounded through Cast(float16)->Cast(float32) (overflow -> inf); each node "
                    "computes in float32 (no float16 accumulation inside MatMul/ReduceMean)",
        },
        validation=validation,
    )


def _keep_metadata(src, dst) -> None:
    """Copy model-level ``metadata_props`` of ``src`` that ``dst`` lacks (onnx.ModelProto; the FP16 rewrite
    builds a new model)."""
    have = {p.key for p in dst.metadata_props}
    for p in src.metadata_props:
        if p.key not in have:
            dst.metadata_props.add(key=p.key, value=p.value)


def checkpoint_hash(root: Path) -> str:
    """sha256 over a checkpoint: its files plus its backbone directory's files."""
    m = load_manifest(root)
    import hashlib

    h = hashlib.sha256(sha256_tree(m.root).encode())
    if not str(m.backbone_path).startswith(str(m.root)):
        h.update(sha256_tree(m.backbone_path).encode())
    return h.hexdigest()


def _export(model: torch.nn.Module, path: Path, opset: int, k: int, vocab: int, flavour: str = "standard",
            num_layers: int | None = None, metadata: dict[str, str] | None = None) -> dict:
    """Trace ``model`` (causal SDPA patch on), rewrite it into ``flavour`` and save it to ``path`` with the
    model-level ``metadata_props`` ``metadata`` (:func:`hllm.formats.export.onnx_metadata_props`).
    Returns the rewrite and op counts. Raises ExportError if tracing fails, a ``standard`` graph holds a
    non-standard op or an ``IsNaN``, or the fused graph lacks one GroupQueryAttention per decoder layer."""
    from torch.export import Dim

    from hllm.exporter.fusion import clean_standard, fuse_for_ort, nonstandard_ops, op_counts

    context = model.reads_context
    ex = synthetic_batch(np.random.default_rng(1), vocab, [32, 27], [min(4, k), min(3, k)])
    args = tuple(torch.from_numpy(x) for x in ex.inputs(context).values())
    batch, seq, items = Dim("batch", min=1, max=MAX_BATCH), Dim("seq", min=MIN_SEQ, max=MAX_SEQ), Dim("items", min=1, max=MAX_ITEMS)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "readout_positions": {0: batch, 1: items},
        "item_mask": {0: batch, 1: items},
    }
    if context:
        dynamic_shapes["context_positions"] = {0: batch}
    try:
        with causal_sdpa_export():
            prog = torch.onnx.export(
                model,
                args,
                dynamo=True,
                input_names=list(input_names(context)),
                output_names=["scores"],
                opset_version=opset,
                dynamic_shapes=dynamic_shapes,
                optimize=True,
            )
    except Exception as e:  # the exporter raises many kinds; keep the message
        raise ExportError(f"torch.onnx.export failed: {type(e).__name__}: {e}") from e
    counts = fuse_for_ort(prog.model) if flavour == "ort-cpu" else clean_standard(prog.model)
    ops = op_counts(prog.model)
    if flavour == "standard" and (nonstandard_ops(prog.model) or "ai.onnx:IsNaN" in ops):
        raise ExportError(f"the standard graph holds non-standard ops {nonstandard_ops(prog.model)} "
                          f"or IsNaN ({ops.get('ai.onnx:IsNaN', 0)})")
    gqa = ops.get("com.microsoft:GroupQueryAttention", 0)
    if flavour == "ort-cpu" and num_layers is not None and gqa != num_layers:
        raise ExportError(f"attention fusion matched {gqa} of {num_layers} decoder layers ({counts}): "
                          "export with --flavour standard")
    imports = prog.model.opset_imports  # onnx_ir: {domain: version}
    real_opset = imports.get("", imports.get("ai.onnx"))
    if real_opset != opset:  # the exporter may silently raise the opset (hardening: record what the graph has)
        raise ExportError(f"asked for opset {opset} but the exporter wrote opset {real_opset}: use --opset {real_opset}")
    prog.model.metadata_props.update(metadata or {})
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    prog.save(str(path), external_data=size >= TWO_GB)
    return {"rewrites": counts, "ops": dict(sorted(ops.items())), "opset": real_opset}
