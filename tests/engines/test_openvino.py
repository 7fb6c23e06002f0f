"""OpenVINO engine: the ``standard`` export of tiny Qwen3 / Qwen2 / Llama (a context head on each) equals
PyTorch within 1e-4 in fp32 at shapes the export did not trace; the fused flavour and bf16 on a CPU
without bf16 instructions are refused with the reason; the sidecar / ``engine=`` option select it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("openvino")

from hllm.engines.openvino import OpenVinoEngine, check_inference_precision  # noqa: E402
from hllm.errors import EngineError  # noqa: E402
from hllm.exporter.validate import synthetic_batch  # noqa: E402
from hllm.model.hllm import load_model  # noqa: E402
from tests.conftest import TINY_HEAD  # noqa: E402

K = 8


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{family: (checkpoint, standard export)} with a context-reading head (K=8)."""
    from hllm.checkpoint.init import init_checkpoint
    from hllm.exporter.onnx import export_onnx
    from hllm.testing import tiny_backbone

    root = tmp_path_factory.mktemp("openvino")
    out = {}
    for i, fam in enumerate(("qwen3", "qwen2", "llama")):
        bb = tiny_backbone(root / f"bb-{fam}", fam, seed=20 + i)
        ck = init_checkpoint(bb, root / f"ck-{fam}", "self_attention", K, seed=i,
                             head_kwargs={**TINY_HEAD, "context": True})
        export_onnx(ck, root / f"ex-{fam}", flavour="standard")
        out[fam] = (ck, root / f"ex-{fam}")
    return out


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_openvino_fp32_matches_pytorch_at_untraced_shapes(family, exports):
    ckpt, export = exports[family]
    model = load_model(ckpt)
    rng = np.random.default_rng(7)
    vocab = model.backbone.config.vocab_size
    # the export traced B=2, S=32, N<=4: B>1 with unequal lengths and N<K, a long single row, N=K
    shapes = {"B3_unequal_N<K": ([57, 9, 130], [5, 1, 7]), "B1_S300": ([300], [K]), "B2_N=K": ([80, 45], [K, K])}
    with OpenVinoEngine(export / "model.onnx", K, threads=1, context=True, flavour="standard") as eng:
        for name, (lengths, items) in shapes.items():
            b = synthetic_batch(rng, vocab, lengths, items)
            with torch.inference_mode():
                ref = model(*(torch.from_numpy(x) for x in b.inputs(True).values())).numpy()
            got = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
            assert got.shape == (len(lengths), max(items), K) and np.isfinite(got).all()
            assert np.abs(ref - got).max() <= 1e-4, (name, float(np.abs(ref - got).max()))
            assert np.abs(ref).max() > 1e-3  # the comparison is not between two zero matrices


def test_openvino_refuses_the_fused_flavour_and_a_wrong_context(exports, tmp_path):
    with pytest.raises(EngineError, match="ort-cpu.*--flavour standard"):
        OpenVinoEngine(tmp_path / "model.onnx", K, flavour="ort-cpu")
    _, export = exports["llama"]
    with pytest.raises(EngineError, match="context"):
        OpenVinoEngine(export / "model.onnx", K, context=False).activate()
    with pytest.raises(EngineError, match="K=8"):
        OpenVinoEngine(export / "model.onnx", 5, context=True).activate()


def test_bf16_is_refused_without_bf16_instructions(monkeypatch):
    from hllm import measure

    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_vnni"])
    with pytest.raises(EngineError, match="AVX512_BF16 or AMX-BF16.*avx512_vnni"):
        check_inference_precision("bf16")
    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx512f", "avx512_bf16"])
    assert check_inference_precision("bf16") == "bf16"
    assert check_inference_precision("fp32") == "f32"
    with pytest.raises(EngineError, match="not one of"):
        check_inference_precision("int4")


def test_open_engine_selects_openvino_by_option_and_sidecar(exports):
    from hllm.runtime.artefact import open_engine, resolve

    _, export = exports["qwen2"]
    art = resolve(export)
    assert open_engine(art).name == "onnxruntime"
    eng = open_engine(art, engine="openvino", threads=1)
    assert eng.name == "openvino" and eng.context
    art.engine = "openvino"  # what resolve reads from a sidecar saying engine: openvino
    assert open_engine(art).name == "openvino"
    with pytest.raises(EngineError, match="unknown engine"):
        open_engine(art, engine="tvm")


def test_nncf_int8_export_opens_with_openvino_and_keeps_named_parts_in_fp32(exports, tmp_path):
    from hllm.calibration.recipes.openvino_int8 import quantize_openvino
    from hllm.runtime.artefact import open_engine, resolve

    ckpt, export = exports["llama"]
    vocab = load_model(ckpt).backbone.config.vocab_size
    rng = np.random.default_rng(0)
    feeds = [synthetic_batch(rng, vocab, [40, 25], [K, 5]).inputs(True) for _ in range(4)]
    full = quantize_openvino(export, tmp_path / "int8", feeds)
    kept = quantize_openvino(export, tmp_path / "int8-keep", feeds, keep_float=["block:1", "head"])
    assert full["fake_quantize_nodes"] > kept["fake_quantize_nodes"] > 0 and kept["ignored_nodes"] > 0
    with pytest.raises(EngineError, match="exists"):
        quantize_openvino(export, tmp_path / "int8", feeds)
    art = resolve(tmp_path / "int8")
    assert art.precision.value == "int8" and art.meta["engine"] == "openvino"
    b = synthetic_batch(rng, vocab, [70, 33], [K, 3])
    with OpenVinoEngine(export / "model.onnx", K, context=True) as ref, open_engine(art, threads=1) as q:
        assert q.name == "openvino" and str(q.precision) == "int8"
        want = ref.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
        got = q.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
    assert np.isfinite(got).all() and 0 < np.abs(got - want).max() < 0.5 * np.abs(want).max()


def test_cli_rank_engine_openvino_info_and_bf16_refusal(exports, tmp_path, capsys, monkeypatch):
    from hllm import measure
    from hllm.cli.app import run
    from hllm.testing import tiny_slates

    _, export = exports["qwen3"]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(3, (2, K), seed=1)))
    outs = {}
    for engine in ("onnxruntime", "openvino"):
        assert run(["rank", str(export), "-s", str(src), "-o", str(tmp_path / f"{engine}.jsonl"),
                    "--engine", engine, "--threads", "1"]) == 0
        outs[engine] = [json.loads(x)["order"] for x in (tmp_path / f"{engine}.jsonl").read_text().splitlines()]
        assert f"with {engine}" in capsys.readouterr().out
    assert outs["openvino"] == outs["onnxruntime"]  # same permutations from both engines
    assert run(["info", str(export), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["engine"] == "onnxruntime" and info["engines"] == ["onnxruntime", "openvino"]
    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_vnni"])
    assert run(["debug", "precision", str(export), "--precision", "bf16", "--bf16-runner", "openvino", "-o", str(tmp_path / "i.json"),
                "-s", str(src)]) == 2
    assert "AVX512_BF16 or AMX-BF16" in capsys.readouterr().err and not (tmp_path / "i.json").exists()


def test_frontier_times_every_contender_and_lists_refused_ones(exports, monkeypatch):
    from hllm import measure
    from hllm.bench.frontier import frontier, markdown_table
    from hllm.calibration.recipes.recipe import Recipe
    from hllm.testing import tiny_slates

    ckpt, export = exports["qwen2"]
    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_vnni"])
    # the engines really run; the seconds per slate are set here, so the expected ratios are known
    real, ran, per_slate_s = measure.time_interleaved, {}, {"PyTorch fp32 eager": 0.006, "ort": 0.002, "ov": 0.003}

    def timed(calls, rounds, warmup=1, unit=1e3):
        counting = {k: (lambda r, k=k, fn=fn: (ran.__setitem__(k, ran.get(k, 0) + 1), fn(r))) for k, fn in calls.items()}
        real(counting, rounds=rounds, warmup=warmup, unit=unit)
        return {k: [per_slate_s[k]] * rounds for k in calls}

    monkeypatch.setattr(measure, "time_interleaved", timed)
    cs = [Recipe("ort", "onnxruntime", "fp32", path=str(export)), Recipe("ov", "openvino", "fp32", path=str(export)),
          Recipe("ov-bf16", "openvino", "bf16", path=str(export), inference_precision="bf16",
                    gate={"top1_agreement": 0.9})]
    res = frontier(str(ckpt), cs, tiny_slates(2, (3, K), seed=2), rounds=2, warmup=0, threads=1, peak_n=128)
    rows = {r["name"]: r for r in res["rows"]}
    assert set(rows) == {"PyTorch fp32 eager", "ort", "ov", "ov-bf16"}
    assert ran == {"PyTorch fp32 eager": 2, "ort": 2, "ov": 2}  # the refused contender never runs
    assert [rows[n]["vs_torch_fp32"] for n in ("PyTorch fp32 eager", "ort", "ov")] == [1.0, 3.0, 2.0]
    assert res["ort_fp32"] == "ort"  # the first ONNX Runtime fp32 contender is the second reference
    assert [rows[n]["vs_ort_fp32"] for n in ("PyTorch fp32 eager", "ort", "ov")] == [0.333, 1.0, 0.667]
    assert rows["ort"]["gemm_peak_fraction"] == pytest.approx(1.5 * rows["ov"]["gemm_peak_fraction"], rel=0.01, abs=2e-3)  # both rounded to 3 decimals: 1.5·0.0005 + 0.0005
    assert rows["ov"]["engine_name"] == "openvino" and rows["ov"]["samples_s"] == [0.003, 0.003]
    assert 0 < rows["ort"]["gemm_peak_fraction"] and rows["ort"]["s_per_slate"] > 0
    assert "AVX512_BF16" in rows["ov-bf16"]["refused"] and rows["ov-bf16"]["gate"] == {"top1_agreement": 0.9}
    assert res["peaks_gflops"]["fp32"] > 0 and res["peaks_gflops"]["bf16"] is None
    md = markdown_table(res).splitlines()
    assert len(md) == 2 + 4 and md[-1].startswith("| ov-bf16 | refused: bf16 needs AVX512_BF16")
