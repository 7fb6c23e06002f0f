"""One engine × precision type, the recipe, for ``calibrate``, ``--backend auto`` and ``bench frontier``."""

from __future__ import annotations

import dataclasses

import pytest

from hllm.calibration.recipes.recipe import Recipe
from hllm.calibration.recipes.table import RECIPES
from hllm.cli.frontier_cmds import parse_contender
from hllm.errors import HllmError
from hllm.formats.precision import Precision


def test_a_frontier_contender_is_a_calibrate_recipe():
    c = parse_contender("ov-bf16|exports/std|openvino|bf16|bf16")
    assert type(c) is type(RECIPES[0]) is Recipe
    assert (c.name, c.path, c.engine, c.precision, c.inference_precision) == (
        "ov-bf16", "exports/std", "openvino", Precision.BF16, "bf16")
    assert parse_contender("ort|x|onnxruntime|int8").inference_precision is None


def test_precision_is_the_enum_and_bad_values_are_refused():
    c = Recipe("a", "onnxruntime", "INT8")
    assert c.precision is Precision.INT8 and str(c.precision) == "int8"
    with pytest.raises(HllmError, match="unknown engine 'tensorrt'"):
        Recipe("a", "tensorrt", "fp32")
    with pytest.raises(HllmError, match="precision fp16 is not one of"):
        Recipe("a", "openvino", "fp16")
    with pytest.raises(HllmError, match="unknown precision 'int4'"):
        Recipe("a", "openvino", "int4")


def test_gate_figures_ride_along_without_changing_identity():
    c = Recipe("a", "openvino", "fp32", path="p")
    g = dataclasses.replace(c, gate={"top1_agreement": 0.9})
    assert g == c and g.gate == {"top1_agreement": 0.9} and c.gate == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "b"  # type: ignore[misc]


def test_the_openvino_recipes_carry_their_inference_precision():
    hints = {c.name: c.inference_precision for c in RECIPES if c.engine == "openvino"}
    assert hints == {"openvino-fp32": "f32", "openvino-bf16": "bf16", "openvino-bf16-islands": None,
                     "openvino-int8": "f32", "openvino-int8-bf16": "bf16",
                     "openvino-int8-weights-sym": "f32", "openvino-int8-weights-asym": "f32",
                     "openvino-int8-mlp": "f32", "openvino-int8-mlp-fp32": "f32", "openvino-int8-search": "f32",
                     "openvino-int8-search-fp32": "f32"}


def test_an_fp32_twin_is_refused_where_its_bf16_recipe_runs():
    by = {c.name: c for c in RECIPES}
    bf16, plain = ["avx512f", "avx512_vnni", "avx512_bf16"], ["avx512f", "avx512_vnni"]
    for name in ("openvino-int8-mlp", "openvino-int8-search"):
        assert by[name].refusal("standard", bf16, False, True) is None
        assert "AVX512_BF16" in by[name].refusal("standard", plain, False, True)
        assert by[f"{name}-fp32"].refusal("standard", plain, False, True) is None
        assert by[f"{name}-fp32"].refusal("standard", bf16, False, True).startswith("this CPU has AVX512_BF16")
        assert "flavour standard" in by[f"{name}-fp32"].refusal("ort-cpu", plain, False, True)
