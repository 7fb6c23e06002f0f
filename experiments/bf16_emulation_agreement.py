"""[experiment] last run at commit 68a4986; output: results/precision/bf16-emulation-smollm2-beauty-eval20.json. Kept for provenance, not maintained (experiments/README.md).
The exact bf16 emulation (hllm.exporter.bf16.emulate_bf16, ONNX Runtime fp32) against real bf16 kernels on this
CPU: (1) one GEMM of the SmolLM2 MLP shape — PyTorch bf16, the typed OpenVINO graph, the emulation — against
bf16 inputs multiplied exactly in float64 then rounded; OpenVINO's own f32→bf16 Convert against round-to-nearest-even;
(2) real eval slates: the typed graph (islands = head) on OpenVINO vs its emulation, each vs fp32; OpenVINO's bf16
hint vs fp32; the full-island graph vs OpenVINO fp32. Raw scores of (2) come from `measure` (cached .npz).
Usage: python experiments/bf16_emulation_agreement.py measure STD N RAW.npz
       python experiments/bf16_emulation_agreement.py report STD N RAW.npz REF.npz OUT.json"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def slates_of(n):
    from hllm.runtime.slates import read_slates

    return read_slates(os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz"))[:n]


def measure(std, n, raw):
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants
    from hllm.engines.openvino import OpenVinoEngine
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    art = resolve(std)
    b = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    batches = [b.encode([s]) for s in slates_of(n)]
    ov, em = Bf16Variants(std, batches, "openvino", threads=2), Bf16Variants(std, batches, "emulate", threads=2)
    out, times = {}, {}

    def run(name, fn):
        t = time.time()
        for i, a in enumerate(fn()):
            out[f"{name}/{i}"] = a
        times[name] = time.time() - t
        np.savez(raw, **out)

    ovf = lambda p: OpenVinoEngine(art.path, art.num_positions, threads=2, inference_precision=p,  # noqa: E731
                                   flavour="standard", context=art.context)
    run("ov_typed_head", lambda: ov(("head",)))
    run("ov_hint_bf16", lambda: ov._scores(ovf("bf16")))
    run("emu_head", lambda: em(("head",)))
    ov.batches = batches[:3]
    run("ov_typed_all3", lambda: ov(("all",)))
    run("ov_f32_3", lambda: ov._scores(ovf("f32")))
    ov.close(), em.close()


def gemm_check():
    """One [1300, 576] x [576, 1536] product: bit-agreement with round(bf16(x) @ bf16(W)) computed exactly."""
    import ml_dtypes
    import onnx
    import onnxruntime as ort
    import openvino as ov
    import torch
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    from hllm.exporter.bf16 import round_then_cast, emulate_bf16, round_bf16

    rng = np.random.default_rng(0)
    K, N = 576, 1536
    W = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    x = rng.standard_normal((1, 1300, K)).astype(np.float32)
    exact = (round_bf16(x).astype(np.float64) @ round_bf16(W).astype(np.float64)).astype(np.float32)
    want = round_bf16(exact)
    nodes = []
    xb = round_then_cast(nodes, "x")
    nodes += [helper.make_node("MatMul", [xb, "Wb"], ["yb"]), helper.make_node("Cast", ["yb"], ["y"], to=TP.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [1, None, K])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [numpy_helper.from_array(W.astype(ml_dtypes.bfloat16), "Wb")])
    typed = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    core = ov.Core()
    p = Path("work/bf16-gemm-typed.onnx")
    onnx.save(typed, str(p))
    c = core.compile_model(core.read_model(str(p)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    y_ov = np.array(c.create_infer_request().infer({"x": x})[c.output(0)])
    y_emu = ort.InferenceSession(emulate_bf16(typed).SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y_t = (torch.from_numpy(x).bfloat16() @ torch.from_numpy(W).bfloat16()).float().numpy()
    # OpenVINO's own Convert f32 -> bf16 (what the typed graph would use without the exact pre-rounding)
    g2 = helper.make_graph([helper.make_node("Cast", ["x"], ["h"], to=TP.BFLOAT16), helper.make_node("Cast", ["h"], ["y"], to=TP.FLOAT)],
                           "c", [helper.make_tensor_value_info("x", TP.FLOAT, [1, None, K])],
                           [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    onnx.save(helper.make_model(g2, opset_imports=[helper.make_opsetid("", 20)]), str(p))
    c2 = core.compile_model(core.read_model(str(p)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    xc = np.array(c2.create_infer_request().infer({"x": x})[c2.output(0)])
    p.unlink()
    ulp = lambda a: np.abs(a.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64)) >> 16  # noqa: E731
    row = lambda y: {"bit_equal_fraction": round(float((y == want).mean()), 6), "max_bf16_ulps": int(ulp(y).max())}  # noqa: E731
    return {"shape": [1300, K, N], "reference": "round_to_nearest_even(bf16(x) @ bf16(W) in float64)",
            "openvino_typed_graph": row(y_ov), "emulation_onnxruntime": row(y_emu), "pytorch_bf16_matmul": row(y_t),
            "openvino_convert_f32_to_bf16_equals_rne_fraction": round(float((xc == round_bf16(x)).mean()), 4)}


def fig(a, b, slates):
    from hllm.calibration.precision_search.precision_debug import ranking_figures

    f = ranking_figures(a, b, slates)
    return {k: f[k] for k in ("max_abs_dM", "mean_abs_dM", "top1_agreement", "kendall_tau_mean", "nonfinite")} | {
        "regret_p95": (f.get("gate") or {}).get("regret_p95")}


def report(std, n, raw, ref_path, out):
    from hllm.measure import describe_machine
    from hllm.runtime.artefact import resolve
    from hllm.verify.reference import load_reference, reference_key

    art = resolve(std)
    slates = slates_of(n)
    ref = load_reference(ref_path, reference_key(art, slates))
    z = np.load(raw)
    get = lambda name, m: [z[f"{name}/{i}"] for i in range(m)]  # noqa: E731
    typed, emu, hint = get("ov_typed_head", n), get("emu_head", n), get("ov_hint_bf16", n)
    whole, f32 = get("ov_typed_all3", 3), get("ov_f32_3", 3)
    doc = {
        "what": "exact bf16 emulation (ONNX Runtime fp32 twin of the typed bf16-GEMM graph) vs real bf16 kernels",
        "export": "SmolLM2-135M + LoRA merged, flavour standard", "slates": n,
        "gemm": gemm_check(),
        "slates_typed_head_islands": {
            "emulation_vs_openvino_real_bf16": fig(typed, emu, slates[:n]),
            "openvino_real_bf16_vs_fp32": fig(ref, typed, slates[:n]),
            "emulation_vs_fp32": fig(ref, emu, slates[:n])},
        "openvino_bf16_hint_vs_fp32": fig(ref, hint, slates[:n]),
        "full_islands_vs_openvino_fp32_3_slates": {"max_abs_dM": max(float(np.abs(a - b).max()) for a, b in zip(whole, f32))},
        "fp32_reference": "OpenVINO f32 scores cached with hllm.verify.reference.save_reference",
        "machine": describe_machine(shared=True, note="2 cores shared with other jobs"),
    }
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        measure(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        report(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
