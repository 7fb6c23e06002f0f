"""[experiment] last run at commit c768568; output: results/precision/fp16-emulation-smollm2-beauty-eval20.json. Kept for provenance, not maintained (experiments/README.md).
Cost and fidelity of the CPU-emulated FP16 graph (default op-class islands) on the first real eval slates,
against the cached OpenVINO fp32 scores of experiments/int8_openvino.py. Usage: python experiments/fp16_emulation_cost.py STD OUT [N]"""
import json, os, sys, time
from pathlib import Path

import numpy as np

from hllm.calibration.precision_search.precision_debug import ranking_figures
from hllm.engines.ort import OnnxRuntimeEngine
from hllm.exporter.fp16 import DEFAULT_ISLANDS, convert_to_fp16, emulate_fp16
from hllm.exporter.onnx_io import load_onnx, save_onnx
from hllm.measure import describe_machine
from hllm.runtime.artefact import resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.slates import read_slates

std, out, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2
art = resolve(std)
builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
slates = read_slates(os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz"))[:n]
z = np.load("work/precision-int8/openvino_fp32-ref-20.npz")
ref = [z[f"s{i}"] for i in range(n)]
t0 = time.perf_counter()
emu = emulate_fp16(convert_to_fp16(load_onnx(art.path), DEFAULT_ISLANDS)[0])
save_onnx(emu, "work/fp16-emu.onnx")
conv = time.perf_counter() - t0
got, ts = [], []
with OnnxRuntimeEngine("work/fp16-emu.onnx", art.num_positions, intra_op_threads=2, context=art.context) as e:
    for s in slates:
        b = builder.encode([s])
        t = time.perf_counter()
        got.append(e.run(*b.inputs(e.inputs()).values())[0, : int(b.n_items[0])])
        ts.append(time.perf_counter() - t)
res = {"islands": list(DEFAULT_ISLANDS), "slates": n, "s_per_slate": ts, "convert_s": round(conv, 1),
       "figures_vs_openvino_fp32": ranking_figures(ref, got, slates), "cpu": describe_machine(shared=True)}
out.write_text(json.dumps(res, indent=1))
print(res["s_per_slate"], res["figures_vs_openvino_fp32"])
