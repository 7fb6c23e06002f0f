"""FP16 graph with FP32 islands (hllm.exporter.fp16) and its CPU emulation.

Structure: no float16 reduction inside RMSNorm, Cast placement at island borders, float32 output.
Numerics: the explicit emulation reproduces float16 overflow that ONNX Runtime CPU's own float16
fallback hides; without the RMSNorm island large activations overflow, with it they do not.
All on the tiny random backbones of tests/conftest.py (seconds on 2 cores).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hllm.errors import ExportError
from hllm.exporter.fp16 import (DEFAULT_ISLANDS, ISLANDS, convert_to_fp16, emulate_fp16, fp32_islands_check,
                                island_of, parse_islands)
from hllm.exporter.onnx_io import FLOAT, FLOAT16, load_onnx


def _types(model) -> dict[str, int]:
    g = model.graph
    t = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    t.update({i.name: i.data_type for i in g.initializer})
    return t


def _session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def fp32_model(standard_export_dir):
    return load_onnx(standard_export_dir / "model.onnx")


@pytest.fixture(scope="module")
def fp16_model(fp32_model):
    model, rep = convert_to_fp16(fp32_model)
    return model, rep


@pytest.fixture(scope="module")
def fp16_export(tmp_path_factory, merged_checkpoint):
    from hllm.exporter.onnx import export_onnx

    out = tmp_path_factory.mktemp("fp16") / "export"
    export_onnx(merged_checkpoint, out, precision="fp16")
    return out


def test_parse_islands():
    assert parse_islands(None) == DEFAULT_ISLANDS and "residual" not in DEFAULT_ISLANDS
    assert parse_islands("default,residual") == DEFAULT_ISLANDS + ("residual",)
    assert parse_islands("none") == ()
    assert parse_islands("rmsnorm, softmax") == ("rmsnorm", "softmax")
    with pytest.raises(ExportError, match="unknown FP32 island"):
        parse_islands("rmsnorm,attention")


def test_every_island_is_found_in_the_export(fp32_model):
    found = {}
    for n in fp32_model.graph.node:
        isl = island_of(n)
        found[isl] = found.get(isl, 0) + 1
    # Qwen3: 2 decoder layers × (input, post-attention, q_norm, k_norm) + the final norm = 9 RMSNorms
    rms_means = [n for n in fp32_model.graph.node if n.op_type == "ReduceMean" and island_of(n) == "rmsnorm"]
    assert len(rms_means) == 9
    assert found["softmax"] == 2 + 2  # 2 backbone layers + 2 head blocks
    assert found["layernorm"] == 2 * 2 + 1  # head: 2 per block + final
    assert found.get("rotary", 0) > 0 and found.get("scores", 0) >= 2
    assert found["residual"] == 2 * 2  # 2 residual Adds per decoder layer


def test_no_fp16_reduction_inside_rmsnorm(fp16_model):
    model, rep = fp16_model
    t = _types(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    rms = [n for n in model.graph.node if island_of(n) == "rmsnorm"]
    assert rms and rep.island_nodes["rmsnorm"] == len(rms)
    for n in rms:
        for x in list(n.input) + list(n.output):
            if t.get(x) in (FLOAT, FLOAT16):
                assert t[x] == FLOAT, f"{n.name} ({n.op_type}) touches float16 tensor {x}"
    # the RMSNorm input comes from float16 through exactly one Cast(to=float32) at the island border
    for n in (n for n in rms if n.op_type == "Pow"):
        src = producers[n.input[0]]
        assert src.op_type == "Cast" and src.attribute[0].i == FLOAT and t[src.input[0]] == FLOAT16


def test_cast_placement_and_fp16_bulk(fp16_model):
    model, rep = fp16_model
    t = _types(model)
    assert fp32_islands_check(model) == []
    for n in model.graph.node:
        if n.op_type in ("Softmax", "LayerNormalization"):
            assert t[n.input[0]] == FLOAT and t[n.output[0]] == FLOAT
        if n.op_type == "MatMul" and island_of(n) is None:
            assert all(t[x] == FLOAT16 for x in n.input), n.name
    # no Cast pair that would be a no-op round trip fp16→fp32→fp16 on the same tensor
    casts = {n.output[0]: n for n in model.graph.node if n.op_type == "Cast"}
    for n in casts.values():
        src = casts.get(n.input[0])
        assert not (src is not None and t[src.input[0]] == t[n.output[0]] and src.name.startswith("hllm_cast")
                    and n.name.startswith("hllm_cast")), f"redundant cast pair {src.name} → {n.name}"
    assert model.graph.output[0].type.tensor_type.elem_type == FLOAT
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.INT64, TensorProto.INT64,
                                                                          TensorProto.BOOL]
    assert rep.fp16_nodes > rep.fp32_nodes and rep.casts_inserted > 0
    onnx.checker.check_model(model, full_check=True)


def test_island_check_detects_a_violation(fp16_model):
    model, _ = fp16_model
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    ln = next(n for n in broken.graph.node if n.op_type == "LayerNormalization")
    for vi in broken.graph.value_info:
        if vi.name == ln.output[0]:
            vi.type.tensor_type.elem_type = FLOAT16
    assert any("LayerNormalization" in p for p in fp32_islands_check(broken))


def test_without_islands_rmsnorm_reduces_in_fp16(fp32_model):
    model, rep = convert_to_fp16(fp32_model, ())
    t = _types(model)
    means = [n for n in model.graph.node if n.op_type == "ReduceMean" and island_of(n) == "rmsnorm"]
    assert means and all(t[n.input[0]] == FLOAT16 for n in means)
    assert rep.fp32_nodes == 0


def test_emulation_reproduces_fp16_overflow_that_ort_cpu_hides():
    """x² for x = 300 is 90,000 > 65,504: float16 gives inf. ORT CPU's own float16 fallback computes
    Mul→Sub in float32 and returns 30,000; the explicit emulation returns inf, like a GPU."""
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=FLOAT16), helper.make_node("Mul", ["a", "a"], ["b"]),
             helper.make_node("Sub", ["b", "c"], ["d"]), helper.make_node("Cast", ["d"], ["y"], to=FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2])],
                          [helper.make_tensor_value_info("y", FLOAT, [2])],
                          [numpy_helper.from_array(np.full(2, 60000, np.float16), "c")],
                          value_info=[helper.make_tensor_value_info(v, FLOAT16, [2]) for v in "abd"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    x = np.array([300.0, 2.0], np.float32)
    native = _session(m).run(None, {"x": x})[0]
    emulated = _session(emulate_fp16(m)).run(None, {"x": x})[0]
    assert np.isfinite(native[0])  # ORT CPU hides the overflow …
    assert np.isinf(emulated[0]) and emulated[1] == np.float32(np.float16(4.0) - np.float16(60000))  # … emulation does not


def test_emulated_fp16_export_ranks_like_fp32(fp16_export, merged_checkpoint):
    import torch

    from hllm.engines.ort import OnnxRuntimeEngine
    from hllm.exporter.onnx import EMULATED_NAME, validation_batches
    from hllm.model.hllm import load_model
    from hllm.verify.parity import compare_slate

    meta = json.loads((fp16_export / "export.json").read_text())
    assert meta["precision"] == "fp16" and meta["fp32_islands"] == list(DEFAULT_ISLANDS)
    assert meta["flavour"] == "standard"  # the TensorRT input: --precision fp16 defaults to it
    assert meta["fp16"]["validation"]["nonfinite"] == 0
    model = load_onnx(fp16_export / "model.onnx")
    assert fp32_islands_check(model) == []
    assert any(i.data_type == FLOAT16 for i in model.graph.initializer)
    ref = load_model(merged_checkpoint)
    taus = []
    with OnnxRuntimeEngine(fp16_export / EMULATED_NAME, 8) as eng, torch.inference_mode():
        for _, b in validation_batches(ref.backbone.config.vocab_size, 8, seed=5):
            want = ref(*(torch.from_numpy(x) for x in b.inputs(False).values())).numpy()
            got = eng.run(b.input_ids, b.readout_positions, b.item_mask)
            assert np.isfinite(got).all()
            scale = np.abs(want).max()
            assert np.abs(got - want).max() <= 0.02 * scale  # float16 storage: ~1e-3 relative per op
            assert np.abs(got - want).max() > 0  # it really is a different (rounded) computation
            for j, n in enumerate(b.n_items):
                taus.append(compare_slate(want[j, :n], got[j, :n])["kendall_tau"])
    assert np.mean(taus) >= 0.9


def _scaled(model, factor: float):
    """Copy of ``model`` with the token embedding scaled (RMSNorm makes the fp32 output invariant)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    gather = next(n for n in m.graph.node if n.op_type == "Gather")
    for i, t in enumerate(m.graph.initializer):
        if t.name == gather.input[0]:
            arr = numpy_helper.to_array(t) * factor
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t.name))
    return m


def test_rmsnorm_island_is_needed_for_large_activations(fp32_model):
    """Embeddings × 5000 (|x| ≈ 100–500, so x² > 65,504 for many elements): against the float32 run of the
    same graph, float16 with the RMSNorm island stays within 1% of the score scale; without it x² → inf,
    rsqrt → 0 and the normalised states collapse: the scores are wrong by about the score scale itself."""
    from hllm.exporter.onnx import validation_batches

    big = _scaled(fp32_model, 5000.0)
    _, b = validation_batches(320, 8)[1]
    feeds = {"input_ids": b.input_ids, "readout_positions": b.readout_positions, "item_mask": b.item_mask}
    ref = _session(big).run(None, feeds)[0]
    with_island = _session(emulate_fp16(convert_to_fp16(big)[0])).run(None, feeds)[0]
    without = _session(emulate_fp16(convert_to_fp16(big, tuple(i for i in DEFAULT_ISLANDS if i != "rmsnorm"))[0])).run(None, feeds)[0]
    mask, scale = b.item_mask, np.abs(ref).max()
    assert np.isfinite(with_island).all()
    err_with = np.abs(with_island - ref)[mask].max()
    err_without = np.where(np.isfinite(without), np.abs(without - ref), np.inf)[mask].max()
    assert err_with < 0.01 * scale
    assert err_without > 0.3 * scale and err_without > 100 * err_with


def test_export_rejects_unknown_precision(merged_checkpoint, tmp_path):
    from hllm.exporter.onnx import export_onnx

    with pytest.raises(ExportError, match="precision"):
        export_onnx(merged_checkpoint, tmp_path / "x", precision="fp8")


def test_emulated_twin_opens_through_its_export_sidecar(fp16_export, tmp_path):
    """`hllm parity CKPT EXPORT/model.fp16-emulated.onnx` (docs/tensorrt.md) must open the twin the
    sidecar records, while any other file beside the sidecar is still refused."""
    import shutil

    from hllm.exporter.onnx import EMULATED_NAME
    from hllm.errors import EngineError
    from hllm.formats.export import read_export

    meta = read_export(fp16_export / EMULATED_NAME)
    assert meta.onnx_path == (fp16_export / EMULATED_NAME).resolve()
    assert read_export(fp16_export).onnx_path.name == "model.onnx"
    stray = tmp_path / "x"
    shutil.copytree(fp16_export, stray)
    shutil.copy(stray / EMULATED_NAME, stray / "other.onnx")
    with pytest.raises(EngineError, match="is not the graph"):
        read_export(stray / "other.onnx")
