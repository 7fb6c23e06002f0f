"""Another team's hLLM, made the way outside users make it, and its own scorer — no hllm model code
(docs/bring-your-own.md runs it; the import tests use it).

    python examples/bring_your_own.py OUT_DIR [--family qwen3|qwen2|llama]

writes OUT_DIR/backbone (a tiny random ``*ForCausalLM``, saved by ``save_pretrained``), OUT_DIR/adapter (peft,
CAUSAL_LM), OUT_DIR/head.pt (``torch.save`` of a plain ``nn.TransformerEncoder`` head), OUT_DIR/prompt.json,
OUT_DIR/slates.jsonl and the team's own numbers for them: OUT_DIR/expected.npz (score matrices) and
OUT_DIR/expected.jsonl (rankings). Your own training code would leave the first four; the last two are what
``hllm parity --expected`` checks against.

The artefacts: a backbone saved by ``AutoModelForCausalLM.save_pretrained`` (the tests' tiny random
families), a LoRA made with ``get_peft_model(AutoModelForCausalLM…, LoraConfig(task_type=…))`` +
``save_pretrained`` (non-zero B), a head written with plain ``torch.nn`` in the team's own key names
(``nn.TransformerEncoderLayer`` defaults: post-LN, ReLU, fused ``in_proj_weight``), and the team's own
prompt templates. :func:`team_scores` is the team's scorer: transformers + peft + that head, the prompt
built segment by segment from the team's templates with ``tokenizers`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

#: The team's prompt: its own wording and a candidate field beyond the title.
TEAM_PROMPT = {"user_template": "Customer history:\n{history}Candidates:\n", "history_item_template": "* {title}\n",
               "candidate_template": "[{index}] {title}", "separator": "\n", "candidate_token_budget": 64,
               "history_token_budget": 96, "max_history": 5, "max_seq_len": 1024, "bos_token": None}


class EncoderHead(nn.Module):
    """Linear(D, d) → nn.TransformerEncoder (PyTorch defaults: post-LN, ReLU, fused in_proj) → Linear(d, K)."""

    def __init__(self, dim: int, k: int, d: int = 32, heads: int = 4, ff: int = 64, layers: int = 2,
                 norm_first: bool = False, activation: str = "relu"):
        super().__init__()
        self.inp = nn.Linear(dim, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=norm_first,
                                           activation=activation)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.score = nn.Linear(d, k)

    def forward(self, x, mask):
        return self.score(self.encoder(self.inp(x), src_key_padding_mask=~mask))


class MLPHead(nn.Module):
    """Linear(D, d) → activation → Linear(d, K), keys ``fc1`` / ``fc2``."""

    def __init__(self, dim: int, k: int, d: int = 24, act: str = "silu"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, d), nn.Linear(d, k)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "silu": nn.SiLU()}[act]

    def forward(self, x, mask):
        return self.fc2(self.act(self.fc1(x)))


class PlainHead(nn.Module):
    """One nn.Linear(D, K), key ``classifier``."""

    def __init__(self, dim: int, k: int):
        super().__init__()
        self.classifier = nn.Linear(dim, k)

    def forward(self, x, mask):
        return self.classifier(x)


def make_adapter(backbone: Path, out: Path, task_type: str | None = "CAUSAL_LM", seed: int = 0) -> Path:
    """A LoRA on every linear projection of a ``*ForCausalLM``, non-zero B, saved by peft."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    lm = AutoModelForCausalLM.from_pretrained(str(backbone), dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                          "down_proj"], task_type=task_type)
    model = get_peft_model(lm, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out))
    return out


def save_head(head: nn.Module, path: Path) -> Path:
    """The team's head weights, in its own key names (``.safetensors`` or ``torch.save``)."""
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, str(path))
    return path


def write_prompt(path: Path) -> Path:
    path.write_text(json.dumps(TEAM_PROMPT), encoding="utf-8")
    return path


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def team_inputs(tokenizer_json: Path, slate: dict, prompt: dict = TEAM_PROMPT, convention: str | None = None
                ) -> tuple[list[int], list[int]]:
    """The team's prompt for one slate: context, then each candidate text and the separator, each
    tokenized on its own; readout = each candidate's last token (budgets: the slates here are short).
    ``convention``: ``separator`` reads at the separator's last token; ``whole_string`` tokenizes the
    whole prompt text at once and reads at the token holding each candidate's last character."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    hist = slate.get("history", [])[-prompt["max_history"]:]
    rendered = "".join(prompt["history_item_template"].format(title=t, index=i + 1) for i, t in enumerate(hist))
    text = prompt["user_template"].format(history=rendered)
    ids = _ids(tok, text)
    readout, ends = [], []
    for i, c in enumerate(slate["candidates"]):
        text += prompt["candidate_template"].format(index=i + 1, **c)
        ends.append(len(text))
        ids += _ids(tok, prompt["candidate_template"].format(index=i + 1, **c))[: prompt["candidate_token_budget"]]
        readout.append(len(ids) - 1)
        sep = _ids(tok, prompt["separator"])
        ids += sep
        text += prompt["separator"]
        if convention == "separator":
            readout[-1] += len(sep)
    if convention == "whole_string":
        enc = tok.encode(text, add_special_tokens=False)
        return enc.ids, [next(t for t, (s, e) in enumerate(enc.offsets) if s < end <= e) for end in ends]
    return ids, readout


def team_scores(backbone: Path, adapter: Path | None, head: nn.Module, slates: list[dict], prompt: dict = TEAM_PROMPT,
                convention: str | None = None) -> list[np.ndarray]:
    """The team's score matrices ``M [N, K]`` float32: peft's own loading of its adapter on the
    ``*ForCausalLM``, the final (normed) hidden state at each readout, the head. ``convention``:
    ``pre_norm`` reads the hidden state entering the final norm; others: :func:`team_inputs`."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(backbone), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, str(adapter))
    lm.eval()
    head.eval()
    out, seen = [], []
    norm = next(m for n, m in lm.named_modules() if n.endswith("model.norm"))
    hook = norm.register_forward_hook(lambda mod, args, res: seen.append(args[0]))
    with torch.no_grad():
        for s in slates:
            ids, readout = team_inputs(Path(backbone) / "tokenizer.json", s, prompt, convention)
            hidden = lm(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
            if convention == "pre_norm":
                hidden = seen[-1]
            items = hidden[:, readout]
            out.append(head(items, torch.ones(1, len(readout), dtype=torch.bool))[0].float().numpy())
    hook.remove()
    return out


def team_ranking(scores: np.ndarray) -> list[int]:
    """Item indices best first: maximum-weight assignment of the N items to the first N positions (scipy)."""
    from scipy.optimize import linear_sum_assignment

    n = scores.shape[0]
    rows, cols = linear_sum_assignment(scores[:, :n], maximize=True)
    return [int(i) for i in rows[np.argsort(cols)]]


def main(argv: list[str] | None = None) -> None:
    """Write the team's artefacts and numbers (module doc)."""
    import argparse

    from hllm.testing import tiny_backbone, tiny_slates  # a random tiny backbone and slates; no hllm model code

    ap = argparse.ArgumentParser(description="A team's hLLM artefacts, saved the standard way, and its own scores.")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--family", default="qwen3", choices=("qwen3", "qwen2", "llama"))
    a = ap.parse_args(argv)
    out = a.out_dir
    out.mkdir(parents=True, exist_ok=False)
    backbone = tiny_backbone(out / "backbone", a.family, seed=1)
    adapter = make_adapter(backbone, out / "adapter", "CAUSAL_LM")
    torch.manual_seed(2)
    head = EncoderHead(32, 8)
    save_head(head, out / "head.pt")
    write_prompt(out / "prompt.json")
    slates = tiny_slates(6, (3, 8), seed=3)
    (out / "slates.jsonl").write_text("".join(json.dumps(s) + "\n" for s in slates), encoding="utf-8")
    scores = team_scores(backbone, adapter, head, slates)
    pad = np.full((len(scores), 8, 8), np.nan, np.float32)
    for i, m in enumerate(scores):
        pad[i, : m.shape[0]] = m
    np.savez(out / "expected.npz", slate_ids=np.array([s["slate_id"] for s in slates]), scores=pad)
    (out / "expected.jsonl").write_text("".join(
        json.dumps({"slate_id": s["slate_id"], "ranking": [s["candidates"][i]["item_id"] for i in team_ranking(m)]}) + "\n"
        for s, m in zip(slates, scores)), encoding="utf-8")
    print(f"wrote {out}: backbone, adapter, head.pt, prompt.json, slates.jsonl, expected.npz, expected.jsonl")


if __name__ == "__main__":
    main()
