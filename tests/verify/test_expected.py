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


def _ids(team):
    return np.array([s["slate_id"] for s in team["slates"]])


def _mats(team):
    return team_scores(team["bb"], team["adapter"], team["head"], team["slates"], PROMPT)


def test_empty_npz_is_exit_2_not_130(team, tmp_path, capsys):
    """An empty .npz raised EOFError from np.load, which the CLI read as Ctrl-D: exit 130 'aborted'."""
    (tmp_path / "e.npz").write_bytes(b"")
    code, _, err = _parity(team, tmp_path / "e.npz", capsys)
    assert code == 2 and "e.npz" in err


def test_compressed_npz_declaring_gigabytes_refused_from_its_header(team, tmp_path, capsys, monkeypatch):
    """The size bound was on the compressed file: a few kB can decompress to gigabytes. The member's header
    is now checked first (the bound lowered here so the test allocates nothing large)."""
    import hllm.verify.expected as ex

    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, slate_ids=_ids(team), scores=np.zeros((len(team["slates"]), 256, 256)))
    assert path.stat().st_size < 8192
    monkeypatch.setattr(ex, "MAX_EXPECTED_BYTES", 1 << 16)
    code, _, err = _parity(team, path, capsys)
    assert code == 2 and "'scores'" in err and "over the limit" in err


@pytest.mark.parametrize("bad", ["complex", "duplicate", "nan", "narrow"])
def test_bad_expected_scores_exit_2_naming_the_problem(team, bad, tmp_path, capsys):
    """Complex scores lost their imaginary part, a duplicate slate id kept the last, NaN among a slate's
    n × n scores read as a disagreement (exit 1, 'no convention'), a matrix narrower than n failed as
    '4 items but only K=2 rank positions' naming neither slate nor file."""
    mats = _mats(team)
    path = _npz(tmp_path / "e.npz", team["slates"], mats)
    with np.load(path) as z:
        ids, scores = z["slate_ids"], z["scores"]
    if bad == "complex":
        scores = scores.astype(np.complex64)
    elif bad == "duplicate":
        ids = ids.copy()
        ids[1] = ids[0]
    elif bad == "nan":
        scores[0, 0, 0] = np.nan
    else:
        scores = scores[:, :, :2]
    np.savez(path, slate_ids=ids, scores=scores)
    code, _, err = _parity(team, path, capsys)
    want = {"complex": "real numbers", "duplicate": "more than once", "nan": "NaN or infinity",
            "narrow": "holds at least"}[bad]
    assert code == 2 and want in err, err


def test_bytes_slate_ids_are_read_as_text(team, tmp_path, capsys):
    path = _npz(tmp_path / "e.npz", team["slates"], _mats(team))
    with np.load(path) as z:
        np.savez(path, slate_ids=z["slate_ids"].astype("S"), scores=z["scores"])
    code, rep, err = _parity(team, path, capsys)
    assert code == 0 and rep["agreement"] == 1.0, err


@pytest.mark.parametrize("bad", ["floats", "no_id", "duplicate"])
def test_bad_expected_rankings_exit_2(team, bad, tmp_path, capsys):
    """Float positions were cut by int() (0.5 → 0) and passed as a permutation; a row without slate_id was
    filed under 'None'; a slate given twice kept the last."""
    rows = [{"slate_id": s["slate_id"], "ranking": team_ranking(m)} for s, m in zip(team["slates"], _mats(team))]
    if bad == "floats":
        rows = [{**r, "ranking": [i + 0.5 for i in r["ranking"]]} for r in rows]
    elif bad == "no_id":
        del rows[0]["slate_id"]
    else:
        rows.append(rows[0])
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = _parity(team, tmp_path / "e.jsonl", capsys)
    want = {"floats": ".5; give item indices", "no_id": "line 1:", "duplicate": "more than once"}[bad]
    assert code == 2 and want in err, err
