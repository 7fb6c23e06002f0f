"""Ranking-aware precision debugger (``hllm debug precision``): which layers must stay fp32 so that a
reduced-precision graph keeps the FP32 rankings.

In the spirit of ``polygraphy debug precision`` (which bisects layers into higher precision until a
tensor comparison passes; Polygraphy docs, "debug precision"), but judged by rankings: every variant is
run on real slates and compared with the FP32 graph's score matrices by max|ΔM|, top-1 agreement and
Kendall tau (:func:`hllm.verify.gate.gate_scores`).

The modules tried are module paths of the export (``backbone.layers.N.mlp``, ``backbone.layers.N.self_attn``,
``head``). Procedure (:func:`debug_precision`):

1. *baseline*: everything in the target precision except the always-on islands;
2. *keep-one*: for each module, the same graph with that one module kept in fp32 — its error
   reduction (baseline mean |ΔM| − variant mean |ΔM|) is the error it contributes;
3. *greedy islands*: modules sorted by contribution are added one at a time until the variant passes
   the ranking criteria (top-1 ≥ ``min_top1``, mean tau ≥ ``min_tau``, all finite) or ``max_islands`` is
   reached.

Targets: ``fp16`` (:func:`hllm.exporter.fp16.convert_to_fp16` + :func:`hllm.exporter.fp16.emulate_fp16`,
float16 storage emulated on the CPU; islands = the default op-class islands + kept modules), ``int8``
(NNCF INT8 with SmoothQuant on OpenVINO, :func:`hllm.calibration.recipes.openvino_int8.quantize_openvino`; kept
modules go to NNCF's ignored scope), ``bf16`` (the typed bf16-GEMM graph of :mod:`hllm.exporter.bf16`:
real bf16 kernels on OpenVINO where the CPU has AVX512_BF16 / AMX-BF16, the exact emulation in ONNX
Runtime elsewhere; searched over op classes × layer groups by
:func:`hllm.calibration.precision_search.bf16_islands.search_islands`, which writes the speed-vs-fidelity frontier).

The islands file (``format: hllm-fp32-islands``) lists ``islands`` (for fp16: the default op-class islands
plus the modules; for int8: the modules) and is read by ``hllm export --precision fp16 --fp32-islands
FILE.json`` and by :func:`hllm.calibration.recipes.openvino_int8.quantize_openvino` (``keep_float``).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.calibration.recipes.recipe import Recipe, RecipeInputs
from hllm.engines.ort import OnnxRuntimeEngine
from hllm.errors import EngineError
from hllm.exporter.fp16 import DEFAULT_ISLANDS
from hllm.formats.export import read_export
from hllm.formats.precision import Precision
from hllm.runtime.artefact import open_engine, resolve
from hllm.verify.gate import gate_scores

TARGETS = ("fp16", "int8", "bf16")
#: The recipe every int8 variant is built with (its kept modules go to NNCF's ignored scope).
NNCF_INT8 = Recipe("nncf-int8", "openvino", "int8", scheme="nncf-int8", flavour="standard", needs_calibration=True)
FORMAT = "hllm-fp32-islands"


def modules_to_try(num_layers: int, parts: Sequence[str] = ("mlp", "self_attn"),
                   layers: Sequence[int] | None = None, head: bool = True) -> list[str]:
    """Module paths to try, ``backbone.layers.{i}.{part}`` for each layer (default all) and part, + ``head``.

    Raises: EngineError for a part other than ``mlp`` / ``self_attn`` or a layer outside ``[0, num_layers)``.
    """
    bad = [p for p in parts if p not in ("mlp", "self_attn")]
    if bad:
        raise EngineError(f"unknown part(s) {bad}; use mlp, self_attn")
    idx = list(range(num_layers)) if layers is None else list(layers)
    if any(not 0 <= i < num_layers for i in idx):
        raise EngineError(f"layers must lie in [0, {num_layers}), got {idx}")
    return [f"backbone.layers.{i}.{p}" for i in idx for p in parts] + (["head"] if head else [])


def ranking_figures(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], slates: Sequence[dict],
                    thresholds=None) -> dict:
    """max|ΔM|, mean|ΔM| (finite entries), top-1 agreement, mean Kendall tau and the non-finite count of one
    variant against the FP32 score matrices (one ``[n_i, K]`` per slate), and the verdict of the gate
    (:func:`hllm.verify.gate.gate_scores` with ``thresholds``, default :class:`hllm.verify.gate.GateThresholds`):
    ``gate`` = ``{mode, passed, failures, strict_passed, regret_p95, lower bounds of ΔAUC / ΔNDCG@10 /
    ΔRecall@10}``."""
    d = gate_scores(ref, got, slates, thresholds).to_dict()
    diffs = [np.abs(a - b) for a, b in zip(ref, got)]
    finite = [x[np.isfinite(x)] for x in diffs]
    nonfinite = int(sum((~np.isfinite(g)).sum() for g in got))
    return {"max_abs_dM": float(max((x.max() for x in finite if x.size), default=float("nan"))) if not nonfinite
            else None,
            "mean_abs_dM": float(np.mean(np.concatenate(finite))) if not nonfinite else None,
            "top1_agreement": d["top1_agreement"], "kendall_tau_mean": d["kendall_tau_mean"],
            "nonfinite": nonfinite, "recall@10_delta": d["recall@10_delta"],
            "gate": {"mode": d["gate"], "passed": d["passed"], "failures": [f["criterion"] for f in d["failures"]],
                     "strict_passed": d["strict_passed"], "regret_p95": d["fidelity"]["regret_p95"],
                     **{f"{m}_delta_lower_bound": q["lower_bound"] for m, q in d["quality"].items()}}}


def figure_error(fig: dict) -> float:
    """A scalar error for ordering variants: mean|ΔM|, +inf when any score is non-finite."""
    return float("inf") if fig["nonfinite"] or fig["mean_abs_dM"] is None else fig["mean_abs_dM"]


@dataclass
class DebugSettings:
    """Pass criteria of a variant and the search limits (see module doc).

    ``gate``: a :class:`hllm.verify.gate.GateThresholds`; when set, a variant passes by that gate's verdict
    (``fig["gate"]["passed"]``, computed by :func:`ranking_figures` with these thresholds); None = the
    agreement rule ``top-1 ≥ min_top1``, ``mean tau ≥ min_tau``, all scores finite.
    """

    min_top1: float = 0.97
    min_tau: float = 0.9
    max_islands: int = 8
    gate: object = None

    def passes(self, fig: dict) -> bool:
        if self.gate is not None:
            return bool(fig["gate"]["passed"])
        return (not fig["nonfinite"] and fig["top1_agreement"] >= self.min_top1
                and fig["kendall_tau_mean"] >= self.min_tau)

    def to_dict(self) -> dict:
        """The criteria as JSON (``gate`` as its thresholds)."""
        return {"min_top1": self.min_top1, "min_tau": self.min_tau, "max_islands": self.max_islands,
                "gate": None if self.gate is None else self.gate.to_dict()}


def debug_precision(run_variant: Callable[[tuple[str, ...]], list[np.ndarray]], ref: Sequence[np.ndarray],
                    slates: Sequence[dict], modules: Sequence[str], settings: DebugSettings | None = None,
                    say: Callable[[str], None] = lambda m: None) -> dict:
    """Keep-one sensitivity and greedy islands (module doc).

    Args:
        run_variant: kept fp32 modules → the variant's score matrices on ``slates`` (one ``[n_i, K]`` each).
        ref: the FP32 graph's score matrices on the same slates. modules: module paths to try.
    Returns: ``{baseline, modules: [{module, figures, error_reduction}] (most sensitive first),
        islands: [...], islands_figures, passed}``.
    """
    st = settings or DebugSettings()
    base = ranking_figures(ref, run_variant(()), slates, st.gate)
    say(f"baseline: {format_figures(base)}")
    rows = []
    for c in modules:
        fig = ranking_figures(ref, run_variant((c,)), slates, st.gate)
        red = figure_error(base) - figure_error(fig)
        rows.append({"module": c, "figures": fig, "error_reduction": None if not np.isfinite(red) else red,
                     "fixes_nonfinite": bool(base["nonfinite"] and not fig["nonfinite"])})
        say(f"keep {c} in fp32: {format_figures(fig)}")
    rows.sort(key=lambda r: (not r["fixes_nonfinite"], -(r["error_reduction"] or 0.0)))
    islands: list[str] = []
    fig = base
    for r in rows[: st.max_islands]:
        if st.passes(fig):
            break
        if not r["fixes_nonfinite"] and not (r["error_reduction"] or 0) > 0:
            break
        islands.append(r["module"])
        fig = ranking_figures(ref, run_variant(tuple(islands)), slates, st.gate) if len(islands) > 1 else r["figures"]
        say(f"islands {islands}: {format_figures(fig)}")
    return {"baseline": base, "modules": rows, "islands": islands, "islands_figures": fig,
            "passed": st.passes(fig), "criteria": st.to_dict()}


def format_figures(f: dict) -> str:
    """One line of a variant's ranking figures (:func:`ranking_figures`): max / mean |ΔM|, top-1, tau and the gate verdict."""
    m = "non-finite" if f["nonfinite"] else f"max|ΔM| {f['max_abs_dM']:.3g} mean {f['mean_abs_dM']:.3g}"
    g = f.get("gate") or {}
    reg = g.get("regret_p95")
    verdict = f", regret p95 {'n/a' if reg is None else f'{reg:.2g}'}, {g.get('mode')} gate " + (
        "pass" if g.get("passed") else "FAIL (" + ", ".join(g.get("failures") or []) + ")") if g else ""
    return f"{m}, top-1 {f['top1_agreement']:.3f}, tau {f['kendall_tau_mean']:.3f}{verdict}"


def batch_scores(engine, batches) -> list[np.ndarray]:
    """Activate ``engine``, run every encoded batch (``context_positions`` included when the batch has it)
    and return one score matrix ``[n_i, K]`` float32 per slate, padding rows dropped; deactivates after.

    Raises: EngineError / ShapeError from the engine.
    """
    out = []
    with engine:
        for b in batches:
            s = engine.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
            out += [s[i, : int(n)] for i, n in enumerate(b.n_items)]
    return out



class VariantRunner:
    """Builds and runs the variants of one target on one encoded slate list (callable for :func:`debug_precision`).

    Args:
        export_dir: an FP32 export (``standard`` flavour for int8). target: ``fp16`` / ``int8`` / ``bf16``.
        batches: encoded slates (one :class:`hllm.runtime.prompt.Batch` each). calibration: feed dicts (int8).
        threads: engine threads. smooth_quant_alpha: int8 only (None = NNCF default, < 0 = off).
        bf16_runner: bf16 only: ``openvino`` (real bf16 kernels), ``emulate`` (ONNX Runtime, any CPU) or
            ``auto`` (:func:`hllm.calibration.precision_search.bf16_islands.bf16_runner`).
    Raises: EngineError (real bf16 asked on a CPU without bf16 instructions; a flavour the target cannot use).
    """

    def __init__(self, export_dir, target: str, batches: list, calibration=None, threads: int | None = 2,
                 smooth_quant_alpha: float | None = None, bf16_runner: str = "auto"):
        if target not in TARGETS:
            raise EngineError(f"unknown target precision {target!r}; one of {TARGETS}")
        self.meta = read_export(export_dir)
        self.bf16 = None
        if target == Precision.BF16:  # typed bf16 graph: OpenVINO on a bf16 CPU, the exact emulation elsewhere
            from hllm.calibration.precision_search.bf16_islands import Bf16Variants

            self.bf16 = Bf16Variants(export_dir, batches, bf16_runner, threads)
        if target == Precision.INT8 and (self.meta.flavour != "standard" or calibration is None):
            raise EngineError("int8 debugging needs a `standard` export and calibration slates")
        self.target, self.batches, self.calibration, self.threads = target, batches, calibration, threads
        self.alpha = smooth_quant_alpha
        self.tmp = Path(tempfile.mkdtemp(prefix="hllm-debug-precision-"))
        self._fp32 = None
        self.built = 0

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.bf16 is not None:
            self.bf16.close()

    def _scores(self, engine) -> list[np.ndarray]:
        return batch_scores(engine, self.batches)

    def reference(self) -> list[np.ndarray]:
        """The FP32 export's score matrices (ONNX Runtime)."""
        eng = OnnxRuntimeEngine(self.meta.onnx_path, self.meta.num_positions, intra_op_threads=self.threads or 0,
                                context="context_positions" in str(self.meta.raw.get("inputs")))
        return self._scores(eng)

    def __call__(self, keep: tuple[str, ...]) -> list[np.ndarray]:
        self.built += 1
        if self.bf16 is not None:
            return self.bf16(keep)
        ctx = "context_positions" in str(self.meta.raw.get("inputs"))
        if self.target == Precision.FP16:
            from hllm.engines.ort import OnnxRuntimeEngine
            from hllm.exporter.fp16 import DEFAULT_ISLANDS, convert_to_fp16, emulate_fp16
            from hllm.exporter.onnx_io import save_onnx

            if self._fp32 is None:
                import onnx

                self._fp32 = onnx.load(str(self.meta.onnx_path))
            fp16, _ = convert_to_fp16(self._fp32, DEFAULT_ISLANDS + tuple(keep))
            path = self.tmp / "variant.onnx"
            save_onnx(emulate_fp16(fp16), path)
            return self._scores(OnnxRuntimeEngine(path, self.meta.num_positions,
                                                  intra_op_threads=self.threads or 0, context=ctx))

        d = self.tmp / f"int8-{self.built}"
        NNCF_INT8.build(self.meta.root, d, RecipeInputs(feeds=self.calibration, keep_float=tuple(keep),
                                                        smooth_quant_alpha=self.alpha))
        try:
            return self._scores(open_engine(resolve(d), threads=self.threads))
        finally:
            shutil.rmtree(d, ignore_errors=True)


def islands_file(target: str, result: dict, export_dir: str) -> dict:
    """The islands file written by ``hllm debug precision`` (module doc). For bf16 the islands are the
    chosen set of the frontier (op classes / module paths of :mod:`hllm.exporter.bf16`), with the frontier."""
    isl = list(DEFAULT_ISLANDS) + result["islands"] if target == Precision.FP16 else list(result["islands"])
    doc = {"format": FORMAT, "target": target, "islands": isl, "modules": result["islands"],
           "passed": result["passed"], "figures": result["islands_figures"], "export": str(export_dir)}
    if target == Precision.BF16:
        doc.update(chosen=result.get("chosen"), runner=result.get("runner"), base=result.get("base"),
                   frontier=[{k: p[k] for k in ("name", "islands", "fp32_share", "figures", "passes", "pareto",
                                                "outside_base")} for p in result.get("frontier", [])])
    return doc
