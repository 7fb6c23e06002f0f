"""[experiment] last run at commit 9e61c82; output: results/quality/levers-heldout-train.json. Kept for provenance, not maintained (experiments/README.md).
Lever experiment: frozen final-layer features, self-attention head d=256 trained with Sinkhorn on
the first n-n_val cached train slates, evaluated on the first n_val (held out). Variants: none (items only, the
paper head), token (the user-context vector as one extra token), xattn (items cross-attend to all context rows).
Ad hoc research script kept for provenance of results/quality/levers-heldout-train.json.
usage: [T=threads NMAX=n TARGET=clicks|teacher|clicks+teacher LR=1e-3] python heads.py FEAT_DIR N_VAL VARIANTS STEPS"""
import sys, os, glob, json, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from hllm.training.sinkhorn import sinkhorn_loss
from hllm.training.targets import build_target, read_teacher
from hllm.runtime.slates import read_slates
from hllm.runtime.decode import decode
from hllm.verify.metrics import evaluate
torch.set_num_threads(int(os.environ.get("T", "1")))
feat_dir = sys.argv[1]; n_val = int(sys.argv[2]); variants = sys.argv[3].split(","); steps = int(sys.argv[4])
n_max = int(os.environ.get("NMAX", "100000")); target_kind = os.environ.get("TARGET", "clicks+teacher")
lr = float(os.environ.get("LR", "1e-3"))
files = sorted(glob.glob(f"{feat_dir}/*.npz"))[:n_max]
n = len(files)
slates = read_slates(os.environ.get("HLLM_TRAIN_SLATES", "data/amazon-beauty/train.jsonl.gz"), limit=n)
teacher = read_teacher("work/teacher/emb-train2400.jsonl")
X, U, C, T = [], [], [], []
for i in range(n):
    z = np.load(f"{feat_dir}/{i:05d}.npz")
    X.append(torch.from_numpy(z[os.environ.get("ITEMS", "items")]).float()); U.append(torch.from_numpy(z[os.environ.get("USERK", "user")]).float())
    C.append(torch.from_numpy(z["ctx"].astype(np.float32)) if "ctx" in z else None)
    T.append(build_target(target_kind, slates[i], teacher))
D = X[0].shape[1]; K = 50; d = 256
class Head(nn.Module):
    def __init__(s, v):
        super().__init__(); s.v = v
        s.proj = nn.Linear(D, d); s.cproj = nn.Linear(D, d)
        mk = lambda: nn.TransformerEncoderLayer(d, 4, 512, dropout=0.0, batch_first=True, norm_first=True)
        s.enc = nn.TransformerEncoder(mk(), 2); s.norm = nn.LayerNorm(d); s.out = nn.Linear(d, K)
        if v == "xattn":
            s.dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, 4, 512, dropout=0.0, batch_first=True, norm_first=True), 2)
    def forward(s, x, u, c, cmask):
        h = s.proj(x)
        if s.v == "token":
            h = s.enc(torch.cat([s.cproj(u)[:, None], h], 1))[:, 1:]
        elif s.v == "xattn":
            h = s.dec(h, s.cproj(c), memory_key_padding_mask=~cmask)
        else:
            h = s.enc(h)
        return s.out(s.norm(h))
def batch(idx):
    x = torch.stack([X[i] for i in idx]); u = torch.stack([U[i] for i in idx])
    if C[idx[0]] is None:
        return x, u, None, None
    L = max(C[i].shape[0] for i in idx)
    c = torch.zeros(len(idx), L, D); m = torch.zeros(len(idx), L, dtype=torch.bool)
    for j, i in enumerate(idx):
        c[j, :C[i].shape[0]] = C[i]; m[j, :C[i].shape[0]] = True
    return x, u, c, m
def run(v, steps, bs=8, seed=0):
    torch.manual_seed(seed); m = Head(v)
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    tr = [i for i in range(n_val, n) if T[i] is not None]; rng = np.random.default_rng(seed)
    for st in range(steps):
        idx = rng.choice(tr, bs, replace=False)
        t = torch.stack([torch.from_numpy(T[i]).float() for i in idx])
        loss = sinkhorn_loss(m(*batch(idx)), t, torch.full((bs,), 50), 1.0, 20)
        opt.zero_grad(); loss.backward(); opt.step()
    m.eval()
    with torch.no_grad():
        orders = [decode(m(*batch([i]))[0].numpy(), 50).tolist() for i in range(n_val)]
    return evaluate(orders, [slates[i]["labels"] for i in range(n_val)]).to_dict(), loss.item()
for v in variants:
    t0 = time.time(); r, l = run(v, steps)
    print(v, f"n_train={n-n_val} steps={steps}", f"auc={r['auc']:.4f} [{r['ci95']['auc'][0]:.3f},{r['ci95']['auc'][1]:.3f}] r10={r['recall@10']:.3f} r1={r['recall@1']:.3f} loss={l:.3f}", f"{time.time()-t0:.0f}s", flush=True)
