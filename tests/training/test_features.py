"""Feature caches (``hllm features``): training and evaluation from cached frozen hidden states equal
the uncached computation; mismatched caches are refused."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hllm.errors import CheckpointError, HllmError
from hllm.formats.prompt import PromptSpec
from hllm.runtime.slates import read_slates, write_jsonl
from hllm.testing import tiny_slates
from hllm.training.features import FeatureCache, build_cache, scores_from_cache
from hllm.training.trainer import train
from tests.conftest import TINY_HEAD, train_config

PROMPT = PromptSpec().to_dict()


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("feat") / "train.jsonl"
    write_jsonl(p, tiny_slates(5, (3, 8), seed=11))
    return p


def _cfg(backbone, slates, out, **kw):
    """The training tests' tiny config, with LoRA on the top layer (the part a cache can skip)."""
    return train_config(backbone, slates, out, **{"lora_layers": 1, "steps": 3, "save_every": 10, **kw})


def _cache(backbone, slates_path, out, layer):
    return build_cache(backbone, read_slates(slates_path), out, layer, PROMPT, 8, threads=1)


@pytest.mark.parametrize("lora_rank,layer", [(4, 1), (4, 0), (0, 1), (0, 2)])
def test_training_from_a_cache_equals_training_without(backbones, train_file, tmp_path, lora_rank, layer):
    bb = backbones["llama"]  # 2 layers; LoRA on the top one starts at layer 1
    cache = _cache(bb, train_file, tmp_path / "cache", layer)
    assert len(cache) == 5 and cache.layer == layer and cache.get(0).hidden.dtype == np.float32
    a = train(_cfg(bb, train_file, tmp_path / "a", lora_rank=lora_rank))
    b = train(_cfg(bb, train_file, tmp_path / "b", lora_rank=lora_rank, features=str(tmp_path / "cache")))
    assert b.losses == pytest.approx(a.losses, abs=1e-5)
    ha, hb = load_file(str(tmp_path / "a/head.safetensors")), load_file(str(tmp_path / "b/head.safetensors"))
    assert all(torch.allclose(ha[k], hb[k], atol=1e-5) for k in ha)


def test_scores_from_cache_equal_the_full_model(backbones, train_file, tmp_path):
    from hllm.model.hllm import load_model
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    bb = backbones["qwen3"]
    ck = tmp_path / "ck"
    train(_cfg(bb, train_file, ck, steps=2))
    cache = _cache(bb, train_file, tmp_path / "cache", 1)
    slates = read_slates(train_file)
    ids = [s["slate_id"] for s in slates]
    got = list(scores_from_cache(ck, cache, ids))
    model = load_model(ck)
    builder = PromptBuilder(load_tokenizer(bb), PromptSpec(), max_items=8)
    for s, m in zip(slates, got):
        b = builder.encode([s])
        with torch.no_grad():
            want = model(torch.from_numpy(b.input_ids), torch.from_numpy(b.readout_positions),
                         torch.from_numpy(b.item_mask))[0].numpy()
        assert m.shape == (len(s["candidates"]), 8)
        np.testing.assert_allclose(m, want, atol=1e-5)
    # an adapter on layer 0 was not in the cached layer-1 states: refused
    train(_cfg(bb, train_file, tmp_path / "all", steps=1, lora_layers=None))
    with pytest.raises(CheckpointError, match="below the cached layer"):
        list(scores_from_cache(tmp_path / "all", cache, ids))


def test_mismatched_or_incomplete_caches_are_refused(backbones, train_file, tmp_path):
    bb = backbones["llama"]
    _cache(bb, train_file, tmp_path / "c", 2)
    with pytest.raises(HllmError, match="training starts at layer 1"):
        train(_cfg(bb, train_file, tmp_path / "x", features=str(tmp_path / "c")))
    with pytest.raises(CheckpointError, match="prompt"):
        FeatureCache.open(tmp_path / "c").check(bb, dict(PROMPT, max_history=3), ["tiny-0"])
    assert FeatureCache.open(tmp_path / "c").check(bb, PROMPT, ["tiny-3", "tiny-1"]) == [3, 1]
    with pytest.raises(CheckpointError, match="lacks 1 of the 2 slates"):
        FeatureCache.open(tmp_path / "c").check(bb, PROMPT, ["tiny-1", "other"])
    with pytest.raises(CheckpointError, match="another backbone"):
        FeatureCache.open(tmp_path / "c").check(backbones["qwen3"], PROMPT, ["tiny-0"])
    with pytest.raises(CheckpointError, match="different feature cache"):
        _cache(bb, train_file, tmp_path / "c", 1)
    with pytest.raises(HllmError, match="layer must be"):
        _cache(bb, train_file, tmp_path / "d", 3)
    # an interrupted cache: not openable, and not resumable with other slates
    (tmp_path / "e").mkdir()
    (tmp_path / "e/partial.json").write_text(json.dumps({"slate_ids": ["zz"]}))
    with pytest.raises(CheckpointError, match="not a complete feature cache"):
        FeatureCache.open(tmp_path / "e")
    with pytest.raises(CheckpointError, match="unfinished cache"):
        _cache(bb, train_file, tmp_path / "e", 1)
    with pytest.raises(HllmError, match="sample-items"):
        train(_cfg(bb, train_file, tmp_path / "y", features=str(tmp_path / "c"), sample_items=3))


def test_an_interrupted_cache_resumes(backbones, train_file, tmp_path):
    bb = backbones["llama"]
    full = _cache(bb, train_file, tmp_path / "full", 1)
    part = tmp_path / "part"
    calls = []

    def stop_after_two(done, total):
        calls.append(done)
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(bb, read_slates(train_file), part, 1, PROMPT, 8, threads=1, on_progress=stop_after_two)
    assert sorted(p.name for p in part.glob("*.npz")) == ["00000.npz", "00001.npz"]
    with pytest.raises(CheckpointError):
        FeatureCache.open(part)
    resumed = _cache(bb, train_file, part, 1)
    for i in range(5):
        np.testing.assert_array_equal(resumed.get(i).hidden, full.get(i).hidden)


def test_cli_features_and_eval_from_features(backbones, train_file, tmp_path, capsys):
    from hllm.cli.app import main

    bb = str(backbones["qwen3"])

    def run(argv):
        with pytest.raises(SystemExit) as e:
            main(argv)
        cap = capsys.readouterr()
        return e.value.code, cap.out, cap.err

    ck = tmp_path / "ck"
    train(_cfg(bb, train_file, ck, steps=2))
    code, out, err = run(["features", bb, str(train_file), str(tmp_path / "f"), "--layer", "1", "-k", "8", "--threads", "1"])
    assert code == 0, err
    assert "5 slates" in out
    code, out, err = run(["eval", str(ck), "--slates", str(train_file), "--out", str(tmp_path / "a.json")])
    assert code == 0, err
    code, out, err = run(["eval", str(ck), "--slates", str(train_file), "--features", str(tmp_path / "f"),
                          "--out", str(tmp_path / "b.json")])
    assert code == 0, err
    a = json.loads((tmp_path / "a.json").read_text())["rankers"][str(ck)]
    b = json.loads((tmp_path / "b.json").read_text())["rankers"][str(ck)]
    assert b["kind"] == "checkpoint+features"
    assert {k: a[k] for k in ("auc", "recall@1", "ndcg@10")} == {k: b[k] for k in ("auc", "recall@1", "ndcg@10")}
    code, _, err = run(["eval", str(ck), "--slates", str(train_file), "--features", str(tmp_path / "nope")])
    assert code == 2 and "not a complete feature cache" in err


def test_rows_only_cache_trains_the_context_head_like_the_full_path(backbones, train_file, tmp_path):
    """A frozen-backbone head with the user-context readout: trained from a rows-only cache (made from a
    layer-1 cache) it reaches the same losses and weights as trained from the prompts, and the
    checkpoint scores slates from the cache as its full forward does."""
    from hllm.model.hllm import load_model
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    bb = backbones["qwen3"]
    low = _cache(bb, train_file, tmp_path / "low", 1)
    rows = build_cache(bb, read_slates(train_file), tmp_path / "rows", 2, PROMPT, 8, threads=1, source=low)
    assert rows.rows_only and rows.get(0).hidden.shape[0] == len(rows.get(0).readout) + 1 == rows.get(0).context + 1
    head = {"context": True}
    kw = dict(lora_rank=0, lora_layers=None, head_kwargs={**TINY_HEAD, **head})
    a = train(_cfg(bb, train_file, tmp_path / "a", **kw))
    b = train(_cfg(bb, train_file, tmp_path / "b", features=str(tmp_path / "rows"), **kw))
    assert b.losses == pytest.approx(a.losses, abs=1e-5)
    slates = read_slates(train_file)
    got = list(scores_from_cache(tmp_path / "b", rows, [s["slate_id"] for s in slates]))
    model = load_model(tmp_path / "b")
    builder = PromptBuilder(load_tokenizer(bb), PromptSpec(), max_items=8)
    for s, m in zip(slates, got):
        enc = builder.encode([s])
        with torch.no_grad():
            want = model(*(torch.from_numpy(x) for x in enc.inputs(True).values()))[0].numpy()
        np.testing.assert_allclose(m, want, atol=1e-5)
    with pytest.raises(HllmError, match="--layer must be"):
        build_cache(bb, read_slates(train_file), tmp_path / "bad", 1, PROMPT, 8, source=low)
