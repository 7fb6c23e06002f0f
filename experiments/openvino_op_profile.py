"""[experiment] last run at commit ea0242a; output: results/precision/openvino-op-profile-smollm2-beauty.json. Kept for provenance, not maintained (experiments/README.md).
Where an OpenVINO engine's time goes: per-op execution time (``PERF_COUNT``, ``InferRequest.get_profiling_info``)
summed by op type × kernel, for OpenVINO fp32, the typed bf16 export with its fp32 islands (f32 hint) and the bf16
hint, on one real eval slate (the second of two runs). Usage: python experiments/openvino_op_profile.py STD ISLANDS EVAL OUT"""
import collections, json, sys

import openvino as ov

from hllm.formats.report import envelope
from hllm.measure import describe_machine
from hllm.runtime.artefact import resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.slates import read_slates

std, islands, eval_path, out = sys.argv[1:5]
art = resolve(std)
enc = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions).encode(
    read_slates(eval_path, limit=1))
core, rows = ov.Core(), []
for name, path, hint in [("OpenVINO fp32", f"{std}/model.onnx", "f32"),
                         ("OpenVINO typed bf16, islands head+attention+q/k/v/o_proj", f"{islands}/model.onnx", "f32"),
                         ("OpenVINO bf16 hint", f"{std}/model.onnx", "bf16")]:
    c = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                                                          "INFERENCE_NUM_THREADS": 2, "PERF_COUNT": True})
    req = c.create_infer_request()
    feeds = {i.get_any_name(): getattr(enc, i.get_any_name()) for i in c.inputs}
    for _ in range(2):
        req.infer(feeds)
    agg = collections.Counter()
    for p in req.get_profiling_info():
        agg[f"{p.node_type}:{p.exec_type}"] += p.real_time.total_seconds()
    rows.append({"name": name, "hint": hint, "total_s": round(sum(agg.values()), 4),
                 "by_op_s": {k: round(v, 4) for k, v in agg.most_common() if v >= 1e-3}})
    print(name, rows[-1]["total_s"], list(rows[-1]["by_op_s"].items())[:4])
doc = {"benchmark": "openvino_op_profile", "seq_len": int(enc.lengths[0]), "items": int(enc.n_items[0]), "rows": rows,
       "note": "Subgraph = OpenVINO's fused attention (QK^T, softmax, PV); FullyConnected = the linear layers"}
json.dump(envelope("openvino_op_profile", doc, machine=describe_machine()), open(out, "w"), indent=1)
