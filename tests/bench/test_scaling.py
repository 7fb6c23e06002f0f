"""Engine time against prompt length (hllm bench scaling) on the tiny export."""

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


def test_scaling_records(merged_checkpoint, export_dir, standard_export_dir):
    recs = bench_scaling([merged_checkpoint, export_dir, standard_export_dir], [32, 96], n_items=8, runs=2)
    assert [(r["seq_len"], r["flavour"]) for r in recs] == [(32, None), (32, "ort-cpu"), (32, "standard"),
                                                           (96, None), (96, "ort-cpu"), (96, "standard")]
    assert recs[0]["ratio_to_reference"] == 1.0 and recs[3]["ratio_to_reference"] == 1.0
    for r in recs:
        assert r["engine_ms"]["runs"] == 2 and r["engine_ms"]["median"] > 0 and r["gflops"] > 0
        assert r["ratio_to_reference"] > 0 and r["peak_fraction"] is None
