"""A bounded, sensitivity-ordered search for the INT8 MLP layers of the mixed OpenVINO graph (the
``openvino-int8-sensitivity`` recipe scheme): the most ranking-sensitive layers keep their MLP in float.

The graph of every try is :mod:`hllm.calibration.recipes.openvino_mixed`'s: INT8 weights with dynamic
activation quantization for the MLP products of the layers not kept, fp32 attention, norms, rotary position
math and head, and the kept layers' MLPs in bf16 (``float_precision="fp32"``: fp32, a CPU without bf16
instructions). Each try is compiled and run on the **validation slates** (never the gate's:
:func:`hllm.calibration.recipes.table.check_validation`) and compared with the FP32 graph's scores on them
(OpenVINO, ``f32``): the mean Kendall tau of the decoded rankings (:func:`hllm.calibration.recipes.ranking_validation.slate_value`,
metric ``tau``) and max|ΔM|.

1. *baseline*: no layer in INT8 (skipped for ``fp32``: it is the reference graph). If it misses the
   fidelity floor no INT8 set can be expected to clear it: the search stops there.
2. *sensitivity*: each layer group (``backbone.layers.I.mlp``) alone in INT8, on the first
   ``sensitivity_slates`` validation slates (an order, not a verdict: one build and compile per group is the
   cost, so fewer slates keep 30 groups inside the budget); the groups are ordered by their mean tau (lowest
   first), ties by max|ΔM| (largest first).
3. *growing k*: all groups but the ``k`` most sensitive in INT8, for k = 0, 1, 2, 4, 8 … (doubling, at most
   one group less than all) until
   one clears the floor (mean tau ≥ ``min_tau`` + ``margin``: by default the gate's fidelity floor 0.9 + 0.02, on
   the whole validation slates, as the gate scores them; and max|ΔM| ≤
   ``max_abs_diff`` when given), then bisection between the last k that failed and the first that passed;
   at most ``max_tries`` tries in this step, all within ``budget_s`` seconds of the start.

The smallest passing k found is built (:func:`hllm.calibration.recipes.openvino_mixed.build_mixed_export`)
with the search recorded in the sidecar (``quantization.search``: the order, the kept groups, every try's
figures). No passing k within the bounds: EngineError, no export written (a search cut short does not
pass, as with NNCF's accuracy control in :mod:`hllm.calibration.recipes.accuracy_control`).

This is the logic of NNCF's accuracy control (``nncf.quantize_with_accuracy_control``: rank the quantizer
groups by their effect on a user validation metric, keep the worst in float until the drop is within
``max_drop``) with a ranking metric, written out because NNCF's algorithm drives ``nncf.quantize`` (static
FakeQuantize activations) only, not ``nncf.compress_weights`` with the CPU plugin's dynamic activation
quantization; and it ranks groups by quantizing one at a time instead of reverting one at a time from the
fully quantized model (the same ranking for groups whose errors add up, one pass either way).

Sources: NNCF docs, "Quantization with accuracy control" (``nncf.quantize_with_accuracy_control``) and
"Weight Compression" (``nncf.compress_weights``, ``nncf.IgnoredScope``); OpenVINO CPU plugin, "Dynamic
quantization" (``DYNAMIC_QUANTIZATION_GROUP_SIZE``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.calibration.recipes.accuracy_control import cut_slate
from hllm.calibration.recipes.openvino_mixed import (build_mixed_export, check_float_precision, check_fp32_islands,
                                                     int8_matmuls, mixed_model)
from hllm.calibration.recipes.parts import num_blocks
from hllm.calibration.recipes.ranking_validation import RankingValidation, encode_slates, slate_value
from hllm.calibration.precision_search.bf16_islands import RECIPE_ISLANDS
from hllm.errors import EngineError

#: Settings of the search (overridden per call): validation slates used and candidates kept per slate
#: (as NNCF's accuracy control, :data:`hllm.calibration.recipes.accuracy_control.ACCURACY_CONTROL_SETTINGS`), the most
#: tries of step 3, the wall-clock bound of the whole search (seconds), the fidelity floor (None: the gate's
#: ``min_tau``, 0.9 when it names none) and an optional max|ΔM| bound, the weight mode and the dynamic
#: activation quantization group.
SEARCH_SETTINGS = {"validation_slates": 24, "sensitivity_slates": 8, "max_candidates": None, "max_tries": 8,
                   "budget_s": 900.0, "min_tau": None, "margin": 0.02, "max_abs_diff": None, "mode": "int8_sym",
                   "group_size": 32}
#: Why the validation slates are NOT cut (``max_candidates`` None) and the search aims ``margin`` above the floor:
#: on the real SmolLM2 export, every MLP in INT8 reached mean tau 0.909 on 24 validation slates cut to 20
#: candidates and then 0.865 on the gate's 50-candidate slates — tau over more items is lower, and 24 slates
#: estimate it to about ±0.02. ``sensitivity_slates``: ordering the 30 groups of that export on all 24 whole slates
#: took over 900 s on 2 cores (the budget ran out before the first try); fewer slates cut the scoring, but one NNCF
#: compression and CPU compile per group remain most of the cost (docs/calibration.md, "Known limits").
#: The fidelity floor when neither the settings nor the gate thresholds name one (the gate's default).
DEFAULT_MIN_TAU = 0.9


def k_schedule(tried: dict[int, bool], groups: int) -> int | None:
    """The next number of kept groups to try (step 3 of the module doc), from ``tried`` (k → passed): the
    doubling 0, 1, 2, 4 … capped at ``groups − 1`` (one group left in INT8) until a pass, then bisection
    between the largest failing k below the smallest passing one and it. None when nothing is left to try."""
    passing = [k for k, ok in tried.items() if ok]
    if passing:
        hi = min(passing)
        lo = max((k for k, ok in tried.items() if not ok and k < hi), default=-1)
        return (lo + hi) // 2 if hi - lo > 1 else None
    k = 0
    while k in tried:
        if k >= groups - 1:
            return None
        k = 1 if k == 0 else min(2 * k, groups - 1)
    return k if k < groups else None


def _figures(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> dict:
    """Mean Kendall tau of the decoded rankings and max / mean |ΔM| of one try against the FP32 scores."""
    taus = [slate_value("tau", r, g) for r, g in zip(ref, got)]
    d = [np.abs(r - g) for r, g in zip(ref, got)]
    finite = all(np.isfinite(g).all() for g in got)
    return {"kendall_tau_mean": round(float(np.mean(taus)), 6),
            "max_abs_dM": float(max(x.max() for x in d)) if finite else None,
            "mean_abs_dM": float(np.mean(np.concatenate([x.ravel() for x in d]))) if finite else None}


def _score(model, runner: RankingValidation, group_size: int, slates: int | None = None) -> list[np.ndarray]:
    """Score matrices of the first ``slates`` (None: every) validation slates from ``model``
    (``openvino.Model`` or path), compiled for the CPU with the ``f32`` hint and dynamic activation
    quantization of ``group_size``."""
    from hllm.calibration.recipes.openvino_weights import compile_dynamic

    compiled = compile_dynamic(model, group_size, "f32")
    return [runner.scores(compiled, i) for i in range(len(runner.feeds) if slates is None else slates)]


def _grow_k(order: Sequence[str], run: Callable, passes: Callable, rec: dict, deadline: float,
            say: Callable[[str], None]) -> list[int]:
    """Step 3 of the module doc: try all groups of ``order`` but the first k in INT8 (``run``), k by
    :func:`k_schedule`, at most ``rec["max_tries"]`` tries until ``deadline``; appends each try to
    ``rec["tries"]`` (sets ``out_of_time``). Returns the passing k, ascending."""
    rec["tries"] = []
    tried: dict[int, bool] = {}
    while len(rec["tries"]) < rec["max_tries"] and (k := k_schedule(tried, len(order))) is not None:
        if time.monotonic() > deadline:
            rec["out_of_time"] = True
            break
        fig = run(order[k:])
        tried[k] = passes(fig)
        rec["tries"].append({"k": k, "kept": list(order[:k]), "figures": fig, "passed": tried[k]})
        say(f"k = {k} kept ({', '.join(order[:k]) or 'none'}): {fig} → {'pass' if tried[k] else 'fail'}")
    return sorted(k for k, ok in tried.items() if ok)


def sensitivity_search(export_dir, dst, validation: Sequence[dict], thresholds=None, float_precision: str = "bf16",
                       settings: dict | None = None, say: Callable[[str], None] = lambda m: None) -> dict:
    """Run the search of the module doc on the FP32 ``standard`` export ``export_dir`` and write the chosen
    mixed export into the new directory ``dst``.

    Args:
        validation: slates apart from the gate's (the first ``validation_slates``, cut to ``max_candidates``
            candidates, are used; labels are not needed). thresholds: the gate's
            :class:`hllm.verify.gate.GateThresholds` (its ``min_tau`` is the default floor).
        float_precision: ``bf16`` / ``fp32`` for the kept layers' MLPs. settings: overrides of
            :data:`SEARCH_SETTINGS`. say: progress messages.
    Returns: the ``quantization`` record (:func:`~hllm.calibration.recipes.openvino_mixed.build_mixed_export`)
        with ``search``: ``{min_tau, max_abs_diff, validation_slates, sensitivity_slates, groups, baseline, sensitivity
        ({group: figures}), order, tries ([{k, kept, figures, passed}]), kept, figures, max_tries, budget_s,
        out_of_time, seconds}``.
    Raises: EngineError (flavour / precision, ``dst`` exists, no validation slate, unknown setting, a graph
        without decoder-layer MLPs, a baseline below the floor, no passing k within the bounds, NNCF /
        OpenVINO failures), SlateError (a validation slate that does not encode).
    """
    from hllm.calibration.recipes.openvino_int8 import nncf_input
    from hllm.exporter.onnx_io import load_onnx

    unknown = set(settings or {}) - set(SEARCH_SETTINGS)
    if unknown:
        raise EngineError(f"unknown INT8 search setting(s) {sorted(unknown)}; known: {sorted(SEARCH_SETTINGS)}")
    st = {**SEARCH_SETTINGS, **(settings or {})}
    if int(st["max_tries"]) < 1 or not float(st["budget_s"]) > 0:
        raise EngineError(f"max_tries must be ≥ 1 and budget_s > 0, got {st['max_tries']}, {st['budget_s']}")
    floor = st["min_tau"] if st["min_tau"] is not None else getattr(thresholds, "min_tau", None)
    gate_floor = DEFAULT_MIN_TAU if floor is None else float(floor)
    floor = gate_floor + float(st["margin"] or 0.0)  # the search's target
    check_float_precision(float_precision)
    meta, _ = nncf_input(export_dir, dst)
    val = [cut_slate(s, st["max_candidates"]) for s in validation[: int(st["validation_slates"])]]
    if not val:
        raise EngineError("the INT8 search needs validation slates (apart from the gate's)")
    t0 = time.perf_counter()
    deadline = time.monotonic() + float(st["budget_s"])
    feeds, n_items = encode_slates(meta, val)
    runner = RankingValidation(feeds, n_items, metric="tau")
    onnx_model = load_onnx(meta.onnx_path)
    islands = check_fp32_islands(onnx_model, RECIPE_ISLANDS)
    groups = [f"backbone.layers.{i}.mlp" for i in range(num_blocks(onnx_model))]
    if not groups:
        raise EngineError(f"{meta.root}: the graph has no decoder layers to search")
    nodes = {g: int8_matmuls(onnx_model, (g,)) for g in groups}
    ref = _score(str(meta.onnx_path), runner, st["group_size"])

    n_sens = max(1, min(int(st["sensitivity_slates"] or len(val)), len(val)))

    def run(int8_groups: Sequence[str], slates: int | None = None) -> dict:
        with tempfile.TemporaryDirectory(prefix="hllm-int8-search-") as tmp:
            names = [n for g in int8_groups for n in nodes[g]]
            q, _ = mixed_model(onnx_model, meta.onnx_path, names, islands, float_precision, Path(tmp), st["mode"])
            got = _score(q, runner, st["group_size"], slates)
            return _figures(ref[:len(got)], got)

    def passes(fig: dict) -> bool:
        return fig["max_abs_dM"] is not None and fig["kendall_tau_mean"] >= floor and (
            st["max_abs_diff"] is None or fig["max_abs_dM"] <= float(st["max_abs_diff"]))

    rec: dict = {"min_tau": gate_floor, "margin": float(st["margin"] or 0.0), "target_tau": floor, "max_abs_diff": st["max_abs_diff"], "validation_slates": len(val),
                 "sensitivity_slates": n_sens,
                 "max_candidates": st["max_candidates"], "groups": len(groups), "float_precision": float_precision,
                 "max_tries": int(st["max_tries"]), "budget_s": float(st["budget_s"]), "out_of_time": False}

    bound = f"mean tau ≥ {floor:g}" + ("" if st["max_abs_diff"] is None else f", max|ΔM| ≤ {st['max_abs_diff']:g}")

    def give_up(why: str):
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        raise EngineError(f"INT8 search: {why} (floor: {bound}; {len(rec.get('tries', []))} tries of k, "
                          f"{rec['seconds']} s); no export written")

    rec["baseline"] = ({"kendall_tau_mean": 1.0, "max_abs_dM": 0.0, "mean_abs_dM": 0.0} if float_precision == "fp32"
                       else run([]))
    say(f"baseline (no INT8 layer, the rest {float_precision}): {rec['baseline']}")
    if not passes(rec["baseline"]):
        give_up(f"with no layer in INT8 the validation agreement is already below the floor: {rec['baseline']}")
    rec["sensitivity"] = {}
    for g in groups:
        if time.monotonic() > deadline:
            rec["out_of_time"] = True
            give_up(f"the {st['budget_s']:g} s budget ran out while measuring the sensitivity of {len(groups)} groups")
        rec["sensitivity"][g] = run([g], n_sens)
        say(f"{g} alone in INT8: {rec['sensitivity'][g]}")
    sens = rec["sensitivity"]
    order = sorted(groups, key=lambda g: (sens[g]["kendall_tau_mean"], -(sens[g]["max_abs_dM"] or float("inf"))))
    rec["order"] = order
    passing = _grow_k(order, run, passes, rec, deadline, say)
    if not passing:
        give_up("no set of INT8 layers cleared the floor within the bounds"
                + (" (out of time)" if rec["out_of_time"] else f" ({len(rec['tries'])} of at most {rec['max_tries']} tries)"))
    k = passing[0]
    rec["kept"] = order[:k]
    rec["figures"] = next(t["figures"] for t in rec["tries"] if t["k"] == k)
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return build_mixed_export(meta.root, dst, int8=tuple(order[k:]), fp32=islands, float_precision=float_precision,
                              mode=st["mode"], group_size=st["group_size"], extra={"search": rec})

