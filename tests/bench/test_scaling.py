"""Engine time against prompt length (hllm bench scaling) on the tiny export."""

from collections import Counter

import numpy as np
import pytest

from hllm.bench.scaling import bench_scaling, synthetic_inputs


def test_synthetic_inputs_have_the_asked_shape():
    x = synthetic_inputs(64, 8, vocab=300, seed=1)
    assert x["input_ids"].shape == (1, 64) and x["input_ids"].max() < 300
    pos = x["readout_positions"][0]
    assert len(set(pos.tolist())) == 8 and (np.diff(pos) > 0).all() and pos.min() >= 32 and pos.max() < 64
    assert x["context_positions"][0] < pos.min()
    with pytest.raises(ValueError, match="at least 20 tokens"):
        synthetic_inputs(12, 10, vocab=300)


def test_scaling_records(merged_checkpoint, export_dir, standard_export_dir, monkeypatch):
    """Each contender really runs warm-up + timed rounds at every S; the ratios and GFLOP/s come from the
    medians. The medians are set by the test (the engines still run), so the expected ratios are known
    here, not recomputed from the record."""
    from hllm.bench import scaling

    real, ran = scaling.time_interleaved, Counter()
    medians_ms = [4.0, 2.0, 8.0]  # reference (PyTorch), fused graph, standard graph

    def timed(calls, rounds, warmup=1, unit=1e3):
        counting = {k: (lambda r, k=k, fn=fn: (ran.update([k]), fn(r))) for k, fn in calls.items()}
        real(counting, rounds=rounds, warmup=warmup, unit=unit)
        return {k: [medians_ms[i]] * rounds for i, k in enumerate(calls)}

    monkeypatch.setattr(scaling, "time_interleaved", timed)
    recs = bench_scaling([merged_checkpoint, export_dir, standard_export_dir], [32, 96], n_items=8, runs=2)
    assert [(r["seq_len"], r["flavour"]) for r in recs] == [(32, None), (32, "ort-cpu"), (32, "standard"),
                                                           (96, None), (96, "ort-cpu"), (96, "standard")]
    assert sorted(ran.values()) == [6, 6, 6]  # (1 warm-up + 2 rounds) × 2 lengths, every contender
    assert [r["ratio_to_reference"] for r in recs] == [1.0, 2.0, 0.5] * 2
    assert [r["engine_ms"]["median"] for r in recs] == medians_ms * 2
    for ref, fused, std in (recs[:3], recs[3:]):  # same FLOPs at one S: GFLOP/s in inverse ratio of the times
        assert fused["gflops"] == pytest.approx(2 * ref["gflops"], rel=1e-3)
        assert std["gflops"] == pytest.approx(ref["gflops"] / 2, rel=1e-3)
    assert recs[3]["gflops"] > recs[0]["gflops"]  # S=96 costs more FLOPs than S=32 in the same 4 ms
    assert all(r["peak_fraction"] is None for r in recs)  # no peak given
