"""What an hllm artefact is, from its manifest or sidecar: the library behind ``hllm info``
(:mod:`hllm.cli.inspect_cmds`; like ``polygraphy inspect model``).

Torch-free and TensorRT-free: :func:`describe` reads only JSON manifests, sidecars and file sizes (plus,
for an ONNX graph when the ``onnx`` package is installed, the graph's header: opset imports, producer,
``metadata_props`` and the declared inputs/outputs, loaded without external weights). Recognised:

==================  ==============================================================================
checkpoint          a directory with ``hllm.json`` (:mod:`hllm.formats.checkpoint`)
onnx-export         a directory with ``export.json``, or its ``.onnx`` (:mod:`hllm.formats.export`)
tensorrt-plan       a ``.plan`` / ``.engine`` with its ``<plan>.json`` (:mod:`hllm.formats.plan`)
calibration-set     ``<name>.npz`` + ``<name>.json`` (:mod:`hllm.formats.calibration_set`)
feature-cache       a directory with ``meta.json`` of ``hllm features`` (``partial.json``: unfinished)
backbone            a Hugging Face model directory (``config.json``; :mod:`hllm.formats.architectures`)
slates              a ``.jsonl`` / ``.jsonl.gz`` slates file (:func:`hllm.runtime.slates.read_slates`)
==================  ==============================================================================

Every description has ``kind``, ``path``, ``bytes`` (on disk) and kind-specific keys: shapes, precision,
flavour, K, prompt spec, sizes and provenance (source checkpoint, hashes, library versions).
Raises :class:`hllm.errors.HllmError` for a path that is none of these.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from hllm.errors import HllmError
from hllm.extras import optional
from hllm.reading import read_json, sha256_file
from hllm.formats.architectures import backbone_dims, read_config
from hllm.formats.calibration_set import FORMAT as CALIBRATION_FORMAT
from hllm.formats.checkpoint import FORMAT as CHECKPOINT_FORMAT, load_manifest
from hllm.formats.export import read_export
from hllm.formats.plan import profiles, read_sidecar, sidecar_path
from hllm.runtime.artefact import artefact_kind
from hllm.runtime.slates import read_slates

FEATURE_META = "meta.json"
FEATURE_PARTIAL = "partial.json"


def describe(path: str | os.PathLike) -> dict:
    """Describe the artefact at ``path`` (module docstring). Raises HllmError (not found, not recognised,
    or a malformed manifest/sidecar: the message names it; a field of an unexpected type anywhere in the
    metadata read is one HllmError naming ``path``, never an internal error)."""
    try:
        return _describe(path)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        raise HllmError(f"{path}: malformed metadata, cannot describe it ({type(e).__name__}: {e})") from None


def _describe(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.exists():
        raise HllmError(f"not found: {p}")
    kind = artefact_kind(p)
    if kind is not None:
        return {"checkpoint": describe_checkpoint, "onnx": describe_export, "tensorrt": describe_plan}[kind](p)
    if p.is_dir():
        if (p / FEATURE_META).is_file() or (p / FEATURE_PARTIAL).is_file():
            return describe_feature_cache(p)
        if (p / "config.json").is_file():
            return describe_backbone(p)
        raise HllmError(f"{p}: a directory without hllm.json, export.json, a feature cache's meta.json or config.json")
    if p.suffix in (".npz", ".json") and _calibration_meta(p) is not None:
        return describe_calibration_set(p)
    if p.name.endswith((".jsonl", ".jsonl.gz")):
        return describe_slates(p)
    raise HllmError(f"{p}: not an hllm artefact (checkpoint, export, .onnx, .plan, calibration set, feature cache, "
                    "backbone or slates file)")


def _bytes(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())


def describe_checkpoint(p: Path) -> dict:
    """A checkpoint directory: head, K, backbone, adapter, prompt, sizes, training provenance."""
    m = load_manifest(p)
    adapter = None
    if m.adapter_path is not None:
        cfg = m.adapter_path / "adapter_config.json"
        ac = read_json(cfg, HllmError) if cfg.is_file() else {}
        ac = ac if isinstance(ac, dict) else {}
        adapter = {"path": str(m.adapter_path), "rank": ac.get("r"), "alpha": ac.get("lora_alpha"),
                   "target_modules": ac.get("target_modules"), "bytes": _bytes(m.adapter_path)}
    return {
        "kind": "checkpoint", "path": str(m.root), "bytes": _bytes(m.root),
        "format": CHECKPOINT_FORMAT, "num_positions": m.num_positions, "precision": "fp32",
        "head": {**asdict(m.head), "bytes": _bytes(m.head_path)},
        "backbone": {"path": str(m.backbone_path), **asdict(m.dims), "bytes": _bytes(m.backbone_path)},
        "adapter": adapter,
        "prompt": m.prompt.to_dict(),
        "tokenizer": {"path": str(m.tokenizer_path), "sha256": sha256_file(m.tokenizer_path)},
        "provenance": {k: (_summary(v) if isinstance(v, dict) else v) for k, v in m.extra.items()} or None,
    }


def _summary(d: dict, keep: int = 40) -> dict:
    """A dict with long lists shortened to their length (provenance can hold per-step losses)."""
    return {k: (f"<{len(v)} values>" if isinstance(v, list) and len(v) > keep else v) for k, v in d.items()}


def describe_export(p: Path) -> dict:
    """An export directory or its ``.onnx``: flavour, precision, K, graph I/O, opset, prompt, provenance."""
    meta = read_export(p)
    raw = meta.raw
    files = {q.name: q.stat().st_size for q in sorted(meta.root.iterdir()) if q.is_file()}
    graph_bytes = sum(v for k, v in files.items() if k.startswith(meta.onnx_path.name))
    d = {
        "kind": "onnx-export", "path": str(meta.root), "onnx": str(meta.onnx_path), "bytes": _bytes(meta.root),
        "format": raw.get("format", "hllm-onnx"), "flavour": meta.flavour, "precision": meta.precision.value,
        "num_positions": meta.num_positions, "opset": raw.get("opset"), "head": raw.get("head"),
        "context": any(i.get("name") == "context_positions" for i in raw.get("inputs") or [] if isinstance(i, dict)),
        "inputs": raw.get("inputs"), "outputs": raw.get("outputs"),
        "backbone": raw.get("backbone"), "prompt": meta.prompt.to_dict(), "pad_id": raw.get("pad_id"),
        "tokenizer": {"file": meta.tokenizer_path.name, "sha256": raw.get("tokenizer_sha256")},
        "graph": {"bytes": graph_bytes, "recorded_bytes": raw.get("onnx_bytes"), "sha256": raw.get("onnx_sha256")},
        "files": files,
        "validation": {k: v for k, v in (raw.get("validation") or {}).items() if k != "shapes"} or None,
        "quantization": _summary(raw["quantization"]) if isinstance(raw.get("quantization"), dict) else None,
        "fp32_islands": raw.get("fp32_islands"),
        "engine": meta.engine,  # what `hllm rank --engine auto` opens (validated: onnxruntime or openvino)
        "engines": ["onnxruntime", "openvino"] if meta.flavour == "standard" else ["onnxruntime"],
        "openvino": raw.get("openvino"),
        "provenance": {"source_checkpoint": raw.get("source_checkpoint"), "versions": raw.get("versions")},
    }
    d["onnx_header"] = onnx_header(meta.onnx_path)
    return d


def onnx_header(path: Path) -> dict | None:
    """Opset imports, producer, IR version, ``metadata_props`` and declared graph inputs/outputs of an ONNX
    file, read with the ``onnx`` package without external weights; None when ``onnx`` is not installed."""
    onnx = optional("onnx")
    if onnx is None:
        return None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others for a corrupt file
        raise HllmError(f"{path} is not a readable ONNX model: {e}") from None

    def spec(v) -> dict:
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else None,
                "shape": dims}

    return {
        "ir_version": model.ir_version, "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "metadata_props": {m.key: m.value for m in model.metadata_props},
        "inputs": [spec(v) for v in model.graph.input], "outputs": [spec(v) for v in model.graph.output],
        "nodes": len(model.graph.node),
    }


def describe_plan(p: Path) -> dict:
    """A TensorRT plan: precision, profiles, TensorRT / GPU it was built with, compatibility, sizes."""
    meta = read_sidecar(p)
    keys = ("tensorrt_version", "cuda_runtime_version", "cuda_driver_version", "gpu_name", "compute_capability",
            "hardware_compatibility", "version_compatible", "builder_optimization_level", "target", "build_seconds",
            "timing_cache")
    return {
        "kind": "tensorrt-plan", "path": str(p), "bytes": p.stat().st_size, "sidecar": str(sidecar_path(p)),
        "format": meta.get("format"), "precision": meta.get("precision"), "num_positions": meta.get("num_positions"),
        "profiles": [q.to_dict() for q in profiles(meta)], "head": meta.get("head"),
        "prompt": meta.get("prompt"), "fp32_islands": meta.get("fp32_islands"),
        "build": {k: meta.get(k) for k in keys},
        "graph": {"recorded_bytes": meta.get("plan_bytes"), "sha256": meta.get("plan_sha256")},
        "provenance": {"onnx": meta.get("onnx"), "onnx_sha256": meta.get("onnx_sha256"),
                       "source_checkpoint": meta.get("source_checkpoint")},
    }


def _calibration_meta(p: Path) -> dict | None:
    js = p.with_suffix(".json")
    if not js.is_file():
        return None
    try:
        d = read_json(js)
    except ValueError:
        return None
    return d if isinstance(d, dict) and d.get("format") == CALIBRATION_FORMAT else None


def describe_calibration_set(p: Path) -> dict:
    """A calibration set (``.npz`` + ``.json``): how it was drawn, batch shapes, hashes (arrays not loaded)."""
    meta = _calibration_meta(p) or {}
    npz = p.with_suffix(".npz")
    shapes = meta.get("shapes") or []
    if not isinstance(shapes, list):
        raise HllmError(f"{p}: shapes must be a list of batch shapes, got {type(shapes).__name__}")
    return {
        "kind": "calibration-set", "path": str(p.with_suffix("")), "format": meta.get("format"),
        "bytes": (npz.stat().st_size if npz.is_file() else 0) + p.with_suffix(".json").stat().st_size,
        "npz": {"file": npz.name, "exists": npz.is_file()},
        "batches": len(shapes), "slates": len(meta.get("slate_ids") or []), "shapes": shapes,
        "prompt": meta.get("prompt"), "pad_id": meta.get("pad_id"), "tokenizer_sha256": meta.get("tokenizer_sha256"),
        "data_sha256": meta.get("data_sha256"),
        "provenance": {k: v for k, v in meta.items() if k not in ("shapes", "slate_ids", "prompt", "format")},
    }


def describe_feature_cache(p: Path) -> dict:
    """A feature cache of ``hllm features``: layer, slates, prompt, sizes (complete or not)."""
    complete = (p / FEATURE_META).is_file()
    meta = read_json(p / (FEATURE_META if complete else FEATURE_PARTIAL), HllmError)
    if not isinstance(meta, dict):
        raise HllmError(f"{p}: feature cache metadata is not a JSON object")
    files = list(p.glob("*.npz"))
    return {
        "kind": "feature-cache", "path": str(p), "bytes": _bytes(p), "complete": complete,
        "version": meta.get("version"), "layer": meta.get("layer"), "num_layers": meta.get("num_layers"),
        "slates": len(meta.get("slate_ids") or []) or len(files), "slate_files": len(files),
        "prompt": meta.get("prompt"), "fingerprint": meta.get("fingerprint"),
        "provenance": {k: v for k, v in meta.items() if k not in ("slate_ids", "prompt")},
    }


def describe_backbone(p: Path) -> dict:
    """A Hugging Face model directory: architecture dimensions, weight files, tokenizer."""
    dims = backbone_dims(read_config(p))
    weights = {q.name: q.stat().st_size for q in sorted(p.glob("*.safetensors"))}
    return {"kind": "backbone", "path": str(p), "bytes": _bytes(p), **asdict(dims), "weights": weights,
            "tokenizer": (p / "tokenizer.json").is_file()}


def describe_slates(p: Path) -> dict:
    """A slates file: count, candidates per slate, history lengths, labels (every line validated)."""
    rows = read_slates(p)
    if not rows:
        raise HllmError(f"{p}: no slates")
    n = [len(s["candidates"]) for s in rows]
    h = [len(s.get("history") or []) for s in rows]
    labelled = sum(s.get("labels") is not None for s in rows)
    return {"kind": "slates", "path": str(p), "bytes": p.stat().st_size, "slates": len(rows),
            "candidates": {"min": min(n), "max": max(n), "mean": round(sum(n) / len(n), 2)},
            "history": {"min": min(h), "max": max(h)}, "labelled_slates": labelled}
