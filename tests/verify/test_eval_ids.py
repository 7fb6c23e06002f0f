"""One id rule for ``hllm rank`` and ``hllm eval`` (:func:`hllm.runtime.slates.slate_id`): a slate without
``slate_id`` is named by its index in the whole input, as a string; eval looks JSONL rankings up by the
same rule, and checks that every JSONL ranker covers every slate before any ranker runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hllm.cli import main
from hllm.runtime.slates import slate_id, slate_ids
from hllm.testing import tiny_slates


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys, argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    return e.value.code or 0, cap.out, cap.err


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Four labelled slates: the first has an id, the others none (named "1", "2", "3")."""
    rows = tiny_slates(4, (3, 6), seed=21)
    for r in rows[1:]:
        del r["slate_id"]
    return _write_jsonl(tmp_path / "mixed.jsonl", rows)


def test_the_rule():
    rows = [{"slate_id": "a"}, {}, {"slate_id": 7}, {}]
    assert [slate_id(r, i) for i, r in enumerate(rows)] == ["a", "1", "7", "3"]
    assert slate_ids(rows[1:], first_index=1) == ["1", "7", "3"]


def test_rank_output_of_id_less_slates_is_scored_by_eval(mixed, export_dir, tmp_path, capsys):
    ranked = tmp_path / "ranked.jsonl"
    code, _, err = _run(capsys, ["rank", export_dir, "-s", mixed, "-o", ranked, "--batch-size", "3"])
    assert code == 0, err
    rows = [json.loads(ln) for ln in ranked.read_text().splitlines()]
    first_id = json.loads(mixed.read_text().splitlines()[0])["slate_id"]
    assert [r["slate_id"] for r in rows] == [first_id, "1", "2", "3"]
    report = tmp_path / "eval.json"
    code, _, err = _run(capsys, ["eval", f"ranked={ranked}", f"model={export_dir}", "-s", mixed, "-o", report])
    assert code == 0, err
    res = json.loads(report.read_text())["rankers"]
    assert res["ranked"]["slates"] == res["model"]["slates"] > 0
    # the JSONL holds the model's own rankings: the same metrics, a zero paired difference
    assert res["ranked"]["auc"] == pytest.approx(res["model"]["auc"])
    assert all(v == pytest.approx(0.0) for v in res["model"]["paired_vs_first"]["delta"].values())


def test_a_jsonl_missing_slates_is_refused_before_any_ranker_runs(mixed, export_dir, tmp_path, capsys, monkeypatch):
    from hllm.runtime import ranker as ranker_mod

    short = _write_jsonl(tmp_path / "short.jsonl", [{"slate_id": "1", "order": [0, 1, 2]}])
    ran = []
    monkeypatch.setattr(ranker_mod.Ranker, "rank", lambda self, *a, **k: ran.append(1) or pytest.fail("ranked"))
    code, _, err = _run(capsys, ["eval", export_dir, f"short={short}", "-s", mixed])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"{short} has no ranking for 3 of the 4 slates" in lines[0], lines[0]
    assert not ran


def test_a_model_that_is_no_artefact_is_refused_before_any_ranker_runs(mixed, export_dir, tmp_path, capsys,
                                                                       monkeypatch):
    from hllm.runtime import ranker as ranker_mod

    ran = []
    monkeypatch.setattr(ranker_mod.Ranker, "rank", lambda self, *a, **k: ran.append(1) or pytest.fail("ranked"))
    code, _, err = _run(capsys, ["eval", export_dir, tmp_path / "nope", "-s", mixed])
    assert code == 2 and "not found" in err and not ran, err


def test_two_slates_with_one_name_cannot_be_looked_up(tmp_path, capsys):
    rows = tiny_slates(3, (3, 5), seed=3)
    rows[0]["slate_id"] = "2"  # and slate 2 has no id: it is named "2" too
    del rows[2]["slate_id"]
    slates = _write_jsonl(tmp_path / "s.jsonl", rows)
    orders = _write_jsonl(tmp_path / "o.jsonl", [{"slate_id": "2", "order": [0, 1, 2]}])
    code, _, err = _run(capsys, ["eval", orders, "-s", slates])
    assert code == 2 and "two slates are named '2'" in err, err


def test_teacher_outputs_name_id_less_slates_by_the_same_rule(tmp_path):
    """``hllm teacher`` output (autoregressive and embedding) names an id-less slate by its index, as
    ``rank`` does, so ``eval`` finds it."""
    from hllm.teacher.embedding import EmbeddingResult
    from hllm.teacher.ranker import ArResult
    from hllm.teacher.run import run_ar_teacher, run_embedding_teacher

    rows = tiny_slates(3, 3, seed=5)
    del rows[1]["slate_id"], rows[2]["slate_id"]

    class Ar:  # what an ArRanker returns: the slate's own id field, "" when it has none
        def rank_batch(self, slates, constrained):
            return [ArResult(str(s.get("slate_id", "")), [0, 1, 2], True, 0, 0, 0, 3, 10, 0.0, "1, 2, 3", constrained)
                    for s in slates]

    class Emb:
        def rank(self, s):
            return EmbeddingResult(str(s.get("slate_id", "?")), [2, 1, 0], [0.1, 0.2, 0.3], 0.0)

    want = [rows[0]["slate_id"], "1", "2"]
    run_ar_teacher(Ar(), rows, tmp_path / "ar.jsonl", True, batch_size=2)
    run_embedding_teacher(Emb(), rows, tmp_path / "emb.jsonl")
    for f in ("ar.jsonl", "emb.jsonl"):
        assert [json.loads(ln)["slate_id"] for ln in (tmp_path / f).read_text().splitlines()] == want
    from hllm.training.eval import jsonl_orders

    assert jsonl_orders(tmp_path / "emb.jsonl", rows) == [[2, 1, 0]] * 3
