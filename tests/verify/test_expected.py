"""``hllm parity CKPT --expected FILE``: the trainer's own numbers, agreement per slate, and the convention
mismatch named when the trainer's code differs from hllm's (each made here by the team's own scorer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from hllm.testing import tiny_backbone, tiny_slates
from examples.bring_your_own import TEAM_PROMPT, EncoderHead, make_adapter, save_head, team_ranking, team_scores
from tests.cli.conftest import run

K = 8
#: A separator that byte-level BPE merges with the next candidate's first word when the prompt is one string.
PROMPT = {**TEAM_PROMPT, "candidate_template": "{title}", "separator": " ", "candidate_token_budget": 64}


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    from hllm.checkpoint.importer import import_checkpoint

    root = tmp_path_factory.mktemp("expected")
    bb = tiny_backbone(root / "bb", "qwen3", seed=21)
    adapter = make_adapter(bb, root / "adapter", "CAUSAL_LM", seed=2)
    torch.manual_seed(8)
    head = EncoderHead(32, K)
    import_checkpoint(bb, save_head(head, root / "head.pt"), root / "ck", "self_attention", adapter,
                      ["inp.=proj.", "encoder.layers.=blocks.", "score.=out."], num_heads=4, activation="relu",
                      norm_first=False, prompt=__import__("hllm.formats.prompt", fromlist=["PromptSpec"]).PromptSpec(**PROMPT))
    slates = tiny_slates(8, (3, 6), seed=9)
    path = root / "slates.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in slates))
    return dict(bb=bb, adapter=adapter, head=head, ck=root / "ck", slates=slates, path=path)


def _npz(path, slates, mats):
    pad = np.full((len(mats), max(m.shape[0] for m in mats), max(m.shape[1] for m in mats)), np.nan, np.float32)
    for i, m in enumerate(mats):
        pad[i, : m.shape[0], : m.shape[1]] = m
    np.savez(path, slate_ids=np.array([s["slate_id"] for s in slates]), scores=pad)
    return path


def _jsonl(path, slates, rankings):
    path.write_text("".join(json.dumps({"slate_id": s["slate_id"], "ranking": [s["candidates"][i]["item_id"] for i in r]})
                            + "\n" for s, r in zip(slates, rankings)))
    return path


def _parity(team, expected, capsys):
    code, out, err = run(["parity", str(team["ck"]), "--expected", str(expected), "-s", str(team["path"]), "--json"],
                         capsys)
    return code, json.loads(out) if out.strip() else None, err


def test_the_trainers_own_scores_agree(team, tmp_path, capsys):
    mats = team_scores(team["bb"], team["adapter"], team["head"], team["slates"], PROMPT)
    code, rep, err = _parity(team, _npz(tmp_path / "e.npz", team["slates"], mats), capsys)
    assert code == 0, err
    assert rep["agreement"] == 1.0 and rep["max_abs_diff"] <= 1e-4 and rep["convention"] is None
    code, rep, _ = _parity(team, _jsonl(tmp_path / "e.jsonl", team["slates"], [team_ranking(m) for m in mats]), capsys)
    assert code == 0 and rep["expected_kind"] == "rankings" and rep["agreement"] == 1.0


@pytest.mark.parametrize("convention", ["separator", "pre_norm", "whole_string", "transposed"])
def test_score_convention_named(team, convention, tmp_path, capsys):
    made = None if convention == "transposed" else convention
    mats = team_scores(team["bb"], team["adapter"], team["head"], team["slates"], PROMPT, made)
    if convention == "transposed":
        mats = [m.T for m in mats]
    code, rep, _ = _parity(team, _npz(tmp_path / "e.npz", team["slates"], mats), capsys)
    assert code == 1
    assert rep["agreement"] < 1.0 and rep["convention"] == convention, rep["convention_agreement"]


@pytest.mark.parametrize("convention", ["minimised", "rectangular"])
def test_decode_convention_named(team, convention, tmp_path, capsys):
    mats = team_scores(team["bb"], team["adapter"], team["head"], team["slates"], PROMPT)
    rankings = []
    for m in mats:
        n = m.shape[0]
        sub = m[:, :n] if convention == "minimised" else m
        rows, cols = linear_sum_assignment(sub, maximize=convention != "minimised")
        rankings.append(rows[np.argsort(cols)].tolist())
    code, rep, _ = _parity(team, _jsonl(tmp_path / "e.jsonl", team["slates"], rankings), capsys)
    assert code == 1
    assert rep["agreement"] < 1.0 and rep["convention"] == convention, rep["convention_agreement"]


def test_bad_expected_files_exit_2(team, tmp_path, capsys):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    assert _parity(team, tmp_path / "x.npz", capsys)[0] == 2
    other = tiny_slates(1, 3, seed=1)
    other[0]["slate_id"] = "nobody"
    code, _, err = _parity(team, _jsonl(tmp_path / "o.jsonl", other, [[0, 1, 2]]), capsys)
    assert code == 2 and "not in the expected file" in err
