"""[experiment] last run at commit 9e61c82; output: results/quality/levers-heldout-train.json. Kept for provenance, not maintained (experiments/README.md).
Lever experiment: extract final-layer readout rows + the user-context vector from a layer-24 feature cache
(hllm features --layer 24), for experiments/levers/heads.py. Ad hoc research script kept for provenance of
results/quality/levers-heldout-train.json; the product path is `hllm features --from` + `hllm train --features`.
usage: python extract_features.py CACHE_L24 SLATES OUT_DIR N  (env T = torch threads). Resumable."""
import sys, os, json, time
import numpy as np, torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from hllm.model.hllm import load_backbone
from hllm.model.hllm import run_layers as lower_layers
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec
from hllm.runtime.slates import read_slates

cache_dir, slates_file, out_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(int(os.environ.get("T", "1")))
os.makedirs(out_dir, exist_ok=True)
slates = read_slates(slates_file, limit=n)
b = PromptBuilder(load_tokenizer("work/smollm2"), PromptSpec(), max_items=50)
model = load_backbone("work/smollm2")
L = len(model.layers)
with torch.inference_mode():
    for i, s in enumerate(slates):
        out = f"{out_dir}/{i:05d}.npz"
        src = f"{cache_dir}/{i:05d}.npz"
        if os.path.exists(out):
            continue
        while not os.path.exists(src):
            time.sleep(20)
        time.sleep(0.5)
        z = np.load(src); h, pos = z["hidden"], z["readout"]
        ctx_len = len(b._bos) + len(b._context_ids(s.get("history") or [])[0])
        enc = b.encode_one(s)
        assert enc.readout == pos.tolist(), i
        fin = model.norm(lower_layers(model, torch.from_numpy(h)[None], 24, L))[0].numpy()
        np.savez(out + ".tmp.npz", items=fin[pos], user=fin[ctx_len - 1], hist_mean=fin[:ctx_len].mean(0), ctx=fin[:ctx_len].astype(np.float16),
                 items24=h[pos], user24=h[ctx_len - 1])
        os.replace(out + ".tmp.npz", out)
        if i % 50 == 0:
            print(i, flush=True)
