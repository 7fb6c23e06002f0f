"""bf16 GEMMs with fp32 islands on the CPU: the engine recipe, the variant runner and the island search.

Mechanism (:mod:`hllm.exporter.bf16`): the ``standard`` export is rewritten into an explicitly typed graph
(bfloat16 weights and ``MatMul`` nodes outside the islands, everything else float32) and compiled by
OpenVINO with ``INFERENCE_PRECISION_HINT=f32``, so the CPU plugin runs exactly the bfloat16 matrix
products the graph names (checked through the compiled model's runtime precisions) and leaves the islands
in float32. Where the CPU has no bf16 instructions the same graph runs as its exact float32 twin in ONNX
Runtime (:func:`hllm.exporter.bf16.emulate_bf16`).

Search (:func:`search_islands`, ``hllm debug precision --precision bf16``): op classes × layer groups.

1. *baseline*: every matrix product in bf16 except the base islands (:data:`SEARCH_BASE`: the scoring head
   and the attention scores QKᵀ / PV; the attention in bf16 is a frontier point of its own);
2. *op classes*: one class kept fp32 in every layer (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
   ``gate_proj``, ``up_proj``, ``down_proj``);
3. *layer groups*: all matrix products of a group of consecutive decoder layers kept fp32;
4. *class × group*: the most helpful classes restricted to each layer group;
5. *greedy*: the single sets ranked by error removed per unit of fp32 FLOP share, unioned one at a time.

Every evaluated set is a point of the speed-vs-fidelity frontier: its fp32 share of the matrix-product
FLOPs (:func:`hllm.exporter.bf16.fp32_share`; the bf16 GEMM runs ~2-4× the fp32 one, so the share is the
speed cost) and its fidelity against the fp32 scores (max/mean |ΔM|, top-1 agreement, mean Kendall tau:
:func:`hllm.calibration.precision_search.precision_debug.ranking_figures`). The chosen islands are the passing set with
the smallest fp32 share (or, when none passes, the best-fidelity set, flagged ``passed: false``); the
points that no other point beats on both axes are flagged ``pareto``.

Sources: OpenVINO precision control (docs.openvino.ai, "Precision Control": ``INFERENCE_PRECISION_HINT``);
OpenVINO runtime model info (``CompiledModel.get_runtime_model``, ``runtimePrecision``); Polygraphy
``debug precision`` for the idea of searching precision islands by an accuracy criterion.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.calibration.precision_search.precision_debug import DebugSettings, figure_error, format_figures, batch_scores, ranking_figures
from hllm.engines.openvino import OpenVinoEngine
from hllm.errors import EngineError, HllmError
from hllm.exporter.bf16 import (DEFAULT_ISLANDS, OP_CLASSES, check_islands, convert_to_bf16, emulate_bf16,
                               parse_islands)
from hllm.exporter.onnx_io import load_onnx, save_onnx
from hllm.extras import optional
from hllm.files import copy_files
from hllm.formats.export import ExportChange, OpenVinoSettings, derive_export, read_export
from hllm.formats.precision import Precision
from hllm.measure import bf16_support
from hllm.runtime.slates import loads_json

#: Sidecar key of a typed bf16 export (islands, conversion counts, the fp32 graph it came from).
SIDECAR_KEY = "bf16_gemm"
#: Engines that can run a bf16 variant: real bf16 kernels (OpenVINO) or the exact emulation (ONNX Runtime).
RUNNERS = ("auto", "openvino", "emulate")


def bf16_runner(choice: str = "auto") -> str:
    """``openvino`` (real bf16 kernels) or ``emulate`` for ``choice``: ``auto`` picks OpenVINO on a CPU with
    AVX512_BF16 / AMX-BF16 when OpenVINO is installed, the emulation elsewhere.

    Raises: EngineError for an unknown choice, or ``openvino`` on a CPU without bf16 instructions / without
        OpenVINO (naming what is missing).
    """
    if choice not in RUNNERS:
        raise EngineError(f"unknown bf16 runner {choice!r}; one of {RUNNERS}")
    ok, what = bf16_support()
    have_ov = optional("openvino") is not None
    if choice == "openvino":
        if not ok:
            raise EngineError(f"real bf16 needs AVX512_BF16 or AMX-BF16; {what}. use the emulation (emulate)")
        if not have_ov:
            raise EngineError("real bf16 runs on OpenVINO, which is not installed (pip install 'hllm[openvino]')")
        return "openvino"
    if choice == "emulate":
        return "emulate"
    return "openvino" if ok and have_ov else "emulate"


def build_bf16_export(export_dir, dst, islands: Sequence[str] | None = None) -> dict:
    """Write the typed bf16 export of ``export_dir`` into the new directory ``dst``: ``model.onnx`` with bf16
    matrix products outside ``islands`` (:func:`hllm.exporter.bf16.convert_to_bf16`), the other files copied,
    and a sidecar with ``precision: bf16``, ``engine: openvino``, ``openvino.inference_precision: f32`` and
    :data:`SIDECAR_KEY` (islands, counts, the source graph's sha256). ``hllm rank`` / ``serve`` open it as it is.

    Args: export_dir: a float32 export of flavour ``standard``. dst: must not exist. islands: None = defaults.
    Returns: the :data:`SIDECAR_KEY` record. Raises: EngineError (another flavour or precision), ExportError
        (unknown island), FileExistsError (``dst`` exists).
    """
    meta = read_export(export_dir)
    if meta.flavour != "standard" or meta.precision is not Precision.FP32:
        raise EngineError(f"{meta.root}: bf16 islands need a float32 export of flavour standard (this one is "
                          f"{meta.precision.value}, {meta.flavour}; `hllm export --flavour standard`)")
    isl = DEFAULT_ISLANDS if islands is None else parse_islands(list(islands) or "none")
    typed, rep = convert_to_bf16(load_onnx(meta.onnx_path), isl)
    dst = Path(dst)
    dst.mkdir(parents=True)
    copy_files(meta.root, dst, skip=("export.json", meta.onnx_path.name))
    out = dst / meta.onnx_path.name
    save_onnx(typed, out)
    rec = {"islands": list(isl), "report": rep.to_dict(), "from_onnx_sha256": meta.raw.get("onnx_sha256")}
    derive_export(meta, dst, ExportChange(precision="bf16", engine="openvino", openvino=OpenVinoSettings(None, "f32"),
                                          graph=out.name, drop=("openvino", SIDECAR_KEY), extra={SIDECAR_KEY: rec}))
    return rec


def read_islands(path, export_dir=None) -> tuple[str, ...]:
    """The islands of a bf16 islands file written by ``hllm debug precision --precision bf16`` (JSON object
    ``{"format": "hllm-fp32-islands", "target": "bf16", "islands": [...]}``), read strictly; with
    ``export_dir`` (of flavour ``standard``), each module-path island is checked to contain a matrix product
    of its graph (:func:`hllm.exporter.bf16.check_islands`).

    Raises: EngineError (unreadable, not strict JSON, another target, no ``islands`` list, an unknown island,
        an island naming no matrix product of ``export_dir``'s graph).
    """
    isl = _read_islands(path)
    meta = read_export(export_dir) if export_dir is not None else None
    if meta is not None and meta.flavour == "standard":  # the only flavour a bf16 variant is built from
        try:
            check_islands(load_onnx(meta.onnx_path), isl)
        except HllmError as e:
            raise EngineError(f"islands file {path}: {e}") from None
    return isl


def _read_islands(path) -> tuple[str, ...]:
    try:
        d = loads_json(Path(path).read_bytes(), f"islands file {path}")
    except OSError as e:
        raise EngineError(f"cannot read islands file {path}: {e.strerror or e}") from None
    except HllmError as e:
        raise EngineError(str(e)) from None
    if not isinstance(d, dict) or d.get("target") != Precision.BF16:
        raise EngineError(f"islands file {path}: not a bf16 islands file (`hllm debug precision --precision bf16`)")
    isl = d.get("islands")
    if not isinstance(isl, list) or not all(isinstance(x, str) for x in isl):
        raise EngineError(f"islands file {path}: expected an 'islands' list of strings")
    try:
        return parse_islands(isl or "none")
    except HllmError as e:
        raise EngineError(f"islands file {path}: {e}") from None


class Bf16Variants:
    """Builds and runs typed bf16 variants of one export on fixed encoded slates; callable as
    ``variants(islands) → [n_i, K] float32 score matrices`` (one per slate).

    Args:
        export_dir: float32 export, flavour ``standard``. batches: encoded slates (:class:`hllm.runtime.prompt.Batch`).
        runner: ``openvino`` (real bf16) / ``emulate`` (ONNX Runtime, any CPU) / ``auto`` (:func:`bf16_runner`).
        threads: engine threads.
    Raises: EngineError (flavour; runner unavailable).
    """

    def __init__(self, export_dir, batches: list, runner: str = "auto", threads: int | None = 2):
        self.meta = read_export(export_dir)
        if self.meta.flavour != "standard":
            raise EngineError(f"{self.meta.root}: bf16 islands need an export of flavour standard "
                              f"(this one is {self.meta.flavour}; `hllm export --flavour standard`)")
        self.runner = bf16_runner(runner)
        self.batches, self.threads = batches, threads
        self.context = "context_positions" in str(self.meta.raw.get("inputs"))
        self.tmp = Path(tempfile.mkdtemp(prefix="hllm-bf16-"))
        self._model = None
        self.runtime: dict = {}

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def model(self):
        """The float32 export's ONNX model (loaded once)."""
        if self._model is None:
            from hllm.exporter.onnx_io import load_onnx

            self._model = load_onnx(self.meta.onnx_path)
        return self._model

    def feeds(self) -> dict:
        """The graph inputs of the first slate (for FLOP counts)."""
        b = self.batches[0]
        f = {"input_ids": b.input_ids, "readout_positions": b.readout_positions, "item_mask": b.item_mask}
        if self.context:
            f["context_positions"] = b.context_positions
        return f

    def _scores(self, engine) -> list[np.ndarray]:
        return batch_scores(engine, self.batches)

    def engine(self, islands: Sequence[str]):
        """An engine (not yet activated) for the typed graph with ``islands`` on this runner."""
        typed, _ = convert_to_bf16(self.model(), islands)
        path = self.tmp / "variant.onnx"
        if self.runner == "emulate":
            from hllm.engines.ort import OnnxRuntimeEngine

            save_onnx(emulate_bf16(typed), path)
            return OnnxRuntimeEngine(path, self.meta.num_positions, providers=["CPUExecutionProvider"],
                                     intra_op_threads=self.threads or 0, context=self.context)

        save_onnx(typed, path)
        return OpenVinoEngine(path, self.meta.num_positions, threads=self.threads, inference_precision="f32",
                              precision=Precision.BF16, context=self.context, flavour="standard")

    def __call__(self, islands: Sequence[str]) -> list[np.ndarray]:
        eng = self.engine(islands)
        out = self._scores(eng)
        return out


def _layer_groups(num_layers: int, groups: int) -> list[list[int]]:
    """``groups`` runs of consecutive layers covering ``range(num_layers)`` (sizes differ by at most 1)."""
    groups = max(1, min(groups, num_layers))
    return [list(a) for a in np.array_split(np.arange(num_layers), groups)]


def layer_islands(layers: Sequence[int], cls: str | None = None) -> list[str]:
    """Module-path islands for ``cls`` (an op class; None = whole layers) in ``layers``."""
    if cls is None:
        return [f"backbone.layers.{i}" for i in layers]
    part = "mlp" if cls in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return [f"backbone.layers.{i}.{part}.{cls}" for i in layers]


#: Islands every searched set keeps: the head (< 1 % of the FLOPs, computes M) and the attention scores —
#: a typed bf16 QKᵀ / PV materialises and rounds the ``[heads, T, T]`` probabilities, measured slower on
#: OpenVINO than its fused float32 attention (``docs/calibration.md``).
SEARCH_BASE = ("head", "attention")
#: Islands of the ``openvino-bf16-islands`` recipe when no islands file is given: every matrix product of
#: the attention (q/k/v/o projections and the scores) and the head in fp32, the MLP in bf16. On the SmolLM2
#: LoRA export this is the set that passed the quality gate on 200 eval slates, where the base alone and the
#: base + ``o_proj`` failed its ΔAUC bound (``docs/calibration.md``, bf16 section).
RECIPE_ISLANDS = ("head", "attention", "q_proj", "k_proj", "v_proj", "o_proj")


def search_islands(run: Callable[[tuple[str, ...]], list[np.ndarray]], ref: Sequence[np.ndarray],
                   slates: Sequence[dict], num_layers: int, share: Callable[[tuple[str, ...]], float],
                   settings=None, groups: int = 4, refine: int = 2, base: Sequence[str] = SEARCH_BASE,
                   say: Callable[[str], None] = lambda m: None) -> dict:
    """The op-class × layer-group search of the module doc.

    Args:
        run: islands → the variant's score matrices on ``slates`` (e.g. :class:`Bf16Variants`).
        ref: the fp32 score matrices (one ``[n_i, K]`` per slate). num_layers: decoder layers.
        share: islands → fp32 share of the matrix-product FLOPs (0 … 1).
        settings: :class:`hllm.calibration.precision_search.precision_debug.DebugSettings` (pass criteria, ``max_islands``
            = most greedy steps). groups: layer groups. refine: classes restricted to layer groups.
        base: islands every searched set keeps (:data:`SEARCH_BASE`); each island of ``base`` but the head is
            also tried in bf16 alone (a frontier point ``outside_base``, never chosen).
    Returns: ``{frontier: [{name, islands, fp32_share, figures, passes, pareto, outside_base}], islands,
        islands_figures, passed, chosen, base, criteria}`` — frontier sorted by fp32 share.
    """
    st = settings or DebugSettings()
    base = parse_islands(list(base) or "none")
    points: dict[tuple, dict] = {}

    def evaluate(name: str, extra: Sequence[str], without: str | None = None) -> dict:
        isl = tuple(x for x in dict.fromkeys(base + tuple(extra)) if x != without)
        key = tuple(sorted(isl))
        if key in points:
            return points[key]
        fig = ranking_figures(ref, run(isl), slates, st.gate)
        p = {"name": name, "islands": list(isl), "fp32_share": round(float(share(isl)), 5), "figures": fig,
             "passes": bool(st.passes(fig)), "outside_base": without is not None}
        points[key] = p
        say(f"{name}: fp32 share {p['fp32_share']:.3f}; {format_figures(fig)}")
        return p

    b = evaluate(f"baseline ({', '.join(base) or 'nothing'} fp32)", ())
    for x in base:
        if x != "head":
            evaluate(f"{x} bf16 too (outside the search base)", (), without=x)
    singles = []
    for c in (c for c in OP_CLASSES if c != "head" and c not in base):
        singles.append(evaluate(f"{c} fp32", (c,)))
    for g in _layer_groups(num_layers, groups):
        singles.append(evaluate(f"layers {g[0]}-{g[-1]} fp32", layer_islands(g)))

    def gain(p: dict) -> float:
        red = figure_error(b["figures"]) - figure_error(p["figures"])
        extra = max(p["fp32_share"] - b["fp32_share"], 1e-6)
        return red / extra if np.isfinite(red) else 0.0

    classes = sorted((p for p in singles if p["name"].split()[0] in OP_CLASSES), key=gain, reverse=True)
    for p in classes[:refine]:
        cls = p["name"].split()[0]
        for g in _layer_groups(num_layers, groups):
            singles.append(evaluate(f"{cls} in layers {g[0]}-{g[-1]} fp32", layer_islands(g, cls)))
    order = [p for p in sorted(singles, key=gain, reverse=True) if gain(p) > 0]
    acc: list[str] = []
    for p in order[: st.max_islands]:
        if any(q["passes"] and not q["outside_base"] for q in points.values()):
            break
        acc += [x for x in p["islands"] if x not in base and x not in acc]
        evaluate("greedy: " + " + ".join(sorted({q['name'] for q in order[: order.index(p) + 1]})), acc)
    front = sorted(points.values(), key=lambda p: (p["fp32_share"], figure_error(p["figures"])))
    for p in front:
        p["pareto"] = not any(q["fp32_share"] <= p["fp32_share"] and figure_error(q["figures"]) < figure_error(p["figures"])
                              for q in front if q is not p)
    eligible = [p for p in front if not p["outside_base"]]
    passing = [p for p in eligible if p["passes"]]
    chosen = passing[0] if passing else min(eligible, key=lambda p: figure_error(p["figures"]))
    return {"frontier": front, "islands": chosen["islands"], "islands_figures": chosen["figures"],
            "passed": chosen["passes"], "chosen": chosen["name"], "baseline": b["figures"], "base": list(base),
            "criteria": st.to_dict()}


def build_recipe(export_dir, dst, islands_file=None) -> dict:
    """The ``openvino-bf16-islands`` recipe of ``hllm calibrate --backend auto``: :func:`build_bf16_export`
    with the islands of ``islands_file`` (:func:`read_islands`), or :data:`RECIPE_ISLANDS` when None.

    Raises: as :func:`build_bf16_export` and :func:`read_islands`.
    """
    islands = read_islands(islands_file) if islands_file is not None else RECIPE_ISLANDS
    return build_bf16_export(export_dir, dst, islands)
