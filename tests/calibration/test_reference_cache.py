"""The ``calibrate --reference-scores`` cache proves what it holds: it is keyed by the hash of each slate's
encoded graph inputs, the graph file's sha256 and K (:func:`hllm.verify.reference.reference_key`), and a cache
for other slates, another graph or K, with non-finite values or cut short is refused with exit 2 and a
message naming the cache file (never blaming the FP32 export)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hllm.cli import main
from hllm.errors import ParityError
from hllm.testing import tiny_slates
from hllm.verify.reference import (REFERENCE_FORMAT, ReferenceKey, load_reference, reference_key, reference_scores,
                                   save_reference)


@pytest.fixture(scope="module")
def evals() -> list[dict]:
    return tiny_slates(3, (3, 6), seed=11)


@pytest.fixture(scope="module")
def art(export_dir):
    from hllm.runtime.artefact import resolve

    return resolve(export_dir)


@pytest.fixture(scope="module")
def good_cache(tmp_path_factory, art, evals) -> tuple[Path, list[np.ndarray], ReferenceKey]:
    key = reference_key(art, evals)
    scores = reference_scores(art, evals)
    path = tmp_path_factory.mktemp("ref") / "ref.npz"
    save_reference(path, scores, key)
    return path, scores, key


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _npz(path: Path, **arrays) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, np.asarray(a))
            zf.writestr(name.replace("__", "/") + ".npy", buf.getvalue())
    return path


def _members(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k.replace("/", "__"): z[k] for k in z.files}


def _calibrate(capsys, export_dir, out: Path, slates: Path, cache: Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(export_dir), str(out), "--backend", "ort-dynamic", "-s", str(slates),
              "--threads", "1", "--reference-scores", str(cache)])
    return e.value.code, capsys.readouterr().err


def test_the_key_is_the_content_not_the_id(art, evals):
    key = reference_key(art, evals)
    assert len(key.graph_sha256) == 64 and key.num_positions == 8 and key.n_items == tuple(len(s["candidates"]) for s in evals)
    assert len(set(key.slate_keys)) == 3 and key.slate_ids == tuple(s["slate_id"] for s in evals)
    flipped = [dict(s, candidates=s["candidates"][::-1]) for s in evals]  # same ids, other inputs
    assert not set(reference_key(art, flipped).slate_keys) & set(key.slate_keys)
    renamed = [dict(s, slate_id=f"other-{i}") for i, s in enumerate(evals)]  # other ids, same inputs
    assert reference_key(art, renamed).slate_keys == key.slate_keys


def test_a_cache_is_found_by_content_in_any_order_and_subset(good_cache, art, evals):
    path, scores, _ = good_cache
    want = [evals[2], dict(evals[0], slate_id="renamed")]
    got = load_reference(path, reference_key(art, want))
    assert [g.shape for g in got] == [scores[2].shape, scores[0].shape]
    np.testing.assert_array_equal(got[0], scores[2])
    np.testing.assert_array_equal(got[1], scores[0])


@pytest.mark.parametrize("case, words", [
    ("reversed-candidates", ["holds no scores for the inputs of 3 of the 3", "other candidates"]),
    ("short", ["holds no scores for the inputs of 1 of the 3", "cut short"]),
    ("k16", ["K=16", "the export ranks K=8"]),
    ("nan", ["non-finite"]),
    ("empty-graph-hash", ["records no graph hash"]),
    ("other-graph", ["comes from another graph"]),
    ("old-layout", ["not a reference-score cache of layout"]),
    ("fewer-rows", ["array 'scores/0' has shape ({n0_short}, 8), expected ({n0}, 8)"]),
])
def test_a_cache_that_cannot_prove_its_content_is_refused_naming_the_cache(case, words, good_cache, evals, export_dir,
                                                                           tmp_path, capsys):
    path, scores, key = good_cache
    slates = _write_jsonl(tmp_path / "eval.jsonl", evals)
    m = _members(path)
    cache = tmp_path / "cache.npz"
    if case == "reversed-candidates":  # the same slate ids, candidates reversed: the cache is for other inputs
        slates = _write_jsonl(tmp_path / "eval.jsonl", [dict(s, candidates=s["candidates"][::-1],
                                                             labels=s["labels"][::-1]) for s in evals])
        cache.write_bytes(path.read_bytes())
    elif case == "short":  # computed on the first two slates only
        save_reference(cache, scores[:2], ReferenceKey(key.graph_sha256, 8, key.slate_keys[:2], key.slate_ids[:2],
                                                       key.n_items[:2]))
    elif case == "k16":
        _npz(cache, **{**m, "num_positions": np.array(16),
                       **{f"scores__{i}": np.zeros((n, 16), np.float32) for i, n in enumerate(key.n_items)}})
    elif case == "nan":
        _npz(cache, **{**m, "scores__1": np.full(m["scores__1"].shape, np.nan, np.float32)})
    elif case == "empty-graph-hash":
        _npz(cache, **{**m, "graph_sha256": np.array("")})
    elif case == "other-graph":
        _npz(cache, **{**m, "graph_sha256": np.array("0" * 64)})
    elif case == "old-layout":  # the layout keyed by slate id only
        _npz(cache, slate_ids=m["slate_ids"], source_sha256=np.array(""),
             **{k: v for k, v in m.items() if k.startswith("scores__")})
    elif case == "fewer-rows":  # slate 0's matrix lacks its last candidate's row
        _npz(cache, **{**m, "scores__0": m["scores__0"][:-1]})
    before = cache.read_bytes()
    code, err = _calibrate(capsys, export_dir, tmp_path / "q", slates, cache)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    assert str(cache) in lines[0] and "FP32 export" not in lines[0], lines[0]
    for w in words:
        assert w.format(n0=key.n_items[0], n0_short=key.n_items[0] - 1) in lines[0], lines[0]
    assert cache.read_bytes() == before and not (tmp_path / "q").exists()


def test_library_refuses_each_mismatch(good_cache):
    path, _, key = good_cache
    with pytest.raises(ParityError, match="K=8, the export ranks K=4"):
        load_reference(path, ReferenceKey(key.graph_sha256, 4, key.slate_keys, key.slate_ids, key.n_items))
    with pytest.raises(ParityError, match="another graph"):
        load_reference(path, ReferenceKey("f" * 64, 8, key.slate_keys, key.slate_ids, key.n_items))
    with pytest.raises(ParityError, match="first: slate x"):
        load_reference(path, ReferenceKey(key.graph_sha256, 8, ("0" * 64,), ("x",), (3,)))


def test_non_finite_or_mismatched_scores_are_never_cached(good_cache, tmp_path):
    _, scores, key = good_cache
    bad = [s.copy() for s in scores]
    bad[0][0, 0] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        save_reference(tmp_path / "r.npz", bad, key)
    with pytest.raises(ValueError, match="score matrices for 3 slates"):
        save_reference(tmp_path / "r.npz", scores[:2], key)
    with pytest.raises(ValueError, match="sha256"):
        save_reference(tmp_path / "r.npz", scores, ReferenceKey("", 8, key.slate_keys, key.slate_ids, key.n_items))
    assert not (tmp_path / "r.npz").exists()


def test_fp32_reference_writes_then_reuses_the_cache(export_dir, art, evals, tmp_path):
    from hllm.calibration.selection.loop import LoopRequest
    from hllm.calibration.selection.pipeline import fp32_reference
    from hllm.verify.gate import GateThresholds

    cache = tmp_path / "ref.npz"
    req = LoopRequest(export_dir, tmp_path / "q", GateThresholds(), evals, reference_cache=cache, artefact=art)
    said = []
    first, _ = fp32_reference(req, say=said.append)
    assert cache.is_file() and not said
    with np.load(cache) as z:
        assert str(z["format"]) == REFERENCE_FORMAT and int(z["num_positions"]) == 8
    again, _ = fp32_reference(req, say=said.append)
    assert said == [f"FP32 reference scores from {cache}"]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
