"""INT8 through NNCF's accuracy control with a ranking validation function: the per-slate values are the
documented regret / tau / AUC / NDCG@10 (hand-made slates), NNCF reverts quantizer groups until the ranking
drop is within ``max_drop``, and the written export opens with the OpenVINO engine and ranks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nncf")

from hllm.calibration.recipes.ranking_validation import RankingValidation, aggregate, max_drop_for, slate_value  # noqa: E402
from hllm.errors import EngineError, SlateError  # noqa: E402

# a 3-candidate slate: FP32's optimum is the identity (J = 3 + 2 + 2 = 7); a random order scores
# E J = (4 + 3 + 3) / 3 = 10/3 on average, so the spread is 7 − 10/3 = 11/3
REF = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0]], dtype=np.float32)


def scores_for(order, k=3) -> np.ndarray:
    """A score matrix whose assignment decodes to ``order`` (item ``order[p]`` at position p)."""
    m = np.zeros((len(order), k), dtype=np.float32)
    for p, i in enumerate(order):
        m[i, p] = 5.0
    return m


def test_regret_tau_auc_ndcg_of_hand_made_slates():
    swap = scores_for([1, 0, 2])
    # [1, 0, 2]: J = M[1,0] + M[0,1] + M[2,2] = 0 + 1 + 2 = 3 → regret (7 − 3) / (11/3) = 12/11
    assert slate_value("regret", REF, swap) == pytest.approx(1 - 12 / 11)  # 1 − regret: FP32 scores 1
    assert slate_value("regret", REF, REF) == 1.0
    # [0, 2, 1]: J = 3 + M[2,1] + M[1,2] = 4 → regret 3 / (11/3) = 9/11
    assert slate_value("regret", REF, scores_for([0, 2, 1])) == pytest.approx(1 - 9 / 11)
    assert slate_value("regret", np.ones((3, 3)), swap) == 1.0  # every order ties: no regret
    assert slate_value("tau", REF, swap) == pytest.approx(1 / 3)  # one discordant pair of three
    labels = [0, 1, 0]
    assert slate_value("auc", REF, swap, labels) == 1.0  # the positive moved to the top
    assert slate_value("auc", REF, REF, labels) == 0.5  # FP32 puts it second: above one of two negatives
    assert slate_value("ndcg@10", REF, REF, labels) == pytest.approx(1 / np.log2(3))
    nan = np.full((3, 3), np.nan, dtype=np.float32)
    assert slate_value("regret", REF, nan) == 0.0 and slate_value("tau", REF, nan) == -1.0  # as a random order
    assert slate_value("auc", REF, nan, labels) == 0.0
    with pytest.raises(SlateError, match="positive and a negative"):
        slate_value("auc", REF, REF, [0, 0, 0])
    with pytest.raises(ValueError, match="unknown validation metric"):
        slate_value("mrr", REF, REF)


def test_aggregate_is_the_gates_statistic_and_max_drop_its_margin():
    vals = [1.0] * 19 + [0.5]  # regrets: nineteen 0, one 0.5
    assert aggregate("regret", vals) == pytest.approx(1 - np.percentile([0.0] * 19 + [0.5], 95))
    assert 0.5 < aggregate("regret", vals) < 1.0
    assert aggregate("tau", [1.0, 0.5]) == 0.75
    assert max_drop_for("regret") == 1e-3 and max_drop_for("auc") == 0.005 and max_drop_for("ndcg@10") == 0.01

    class Thresholds:
        min_tau = 0.95
        max_auc_delta = 0.002

    assert max_drop_for("tau", Thresholds()) == pytest.approx(0.05)
    assert max_drop_for("auc", Thresholds()) == 0.002


class FakeCompiled:
    """Stands in for an ``openvino.CompiledModel``: returns ``{port: scores[1, n, K]}`` per feed."""

    class Port:
        def get_names(self):
            return {"scores"}

    def __init__(self, by_slate):
        self.by_slate, self.port = by_slate, self.Port()

    def output(self, _):
        return self.port

    def __call__(self, feeds):
        return {self.port: self.by_slate[int(feeds["slate"])][None]}


def test_validation_fn_returns_the_aggregate_and_per_slate_values():
    feeds = [{"slate": 0}, {"slate": 1}]
    fn = RankingValidation(feeds, [3, 3], [REF, REF], [[0, 1, 0], [1, 0, 0]], metric="regret")
    model = FakeCompiled({0: REF.copy(), 1: scores_for([1, 0, 2])})
    agg, per_slate = fn(model, range(2))
    assert per_slate == [1.0, pytest.approx(1 - 12 / 11)]
    assert agg == pytest.approx(1 - 0.95 * 12 / 11)  # 1 − p95 of the regrets (0, 12/11)
    assert fn.trace == [agg] and fn.slates_run == 2
    agg1, one = fn(model, [1])  # NNCF's ranking subset: scored, but not a full validation
    assert one == [pytest.approx(1 - 12 / 11)] and fn.trace == [agg] and fn.slates_run == 3
    auc = RankingValidation(feeds, [3, 3], [REF, REF], [[0, 1, 0], [0, 1, 0]], metric="auc")
    assert auc(model, range(2)) == (pytest.approx(0.75), [0.5, 1.0])  # slate 1 ranks its positive first
    with pytest.raises(SlateError, match="labelled slates"):
        RankingValidation(feeds, [3, 3], [REF, REF], None, metric="ndcg@10")
    with pytest.raises(ValueError, match="2 slates, 1 item counts"):
        RankingValidation(feeds, [3], [REF, REF])


@pytest.fixture(scope="module")
def int8_inputs(standard_export_dir):
    from hllm.calibration.recipes.openvino_int8 import calibration_feeds
    from hllm.formats.export import read_export
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.testing import tiny_slates

    meta = read_export(standard_export_dir)
    builder = PromptBuilder(load_tokenizer(meta.tokenizer_path), meta.prompt, max_items=meta.num_positions)
    train = [{**s, "slate_id": f"train-{i}"} for i, s in enumerate(tiny_slates(6, 8, seed=21))]
    # validation slates on which the fully quantized tiny graph loses some assignment objective (5 of 12)
    return calibration_feeds(train, builder, 6, 0), tiny_slates(12, 8, seed=33)


def test_accuracy_control_reverts_groups_and_writes_an_engine_that_ranks(standard_export_dir, int8_inputs, tmp_path):
    from hllm.calibration.recipes.accuracy_control import quantize_with_accuracy_control
    from hllm.calibration.recipes.openvino_int8 import quantize_openvino
    from hllm.runtime.artefact import resolve
    from hllm.runtime.ranker import Ranker

    calib, val = int8_inputs
    full = quantize_openvino(standard_export_dir, tmp_path / "full", calib)
    # no drop allowed: NNCF reverts the groups that cost the most regret, at most two here
    rec = quantize_with_accuracy_control(standard_export_dir, tmp_path / "ac", calib, val, metric="regret",
                                         max_drop=0.0, ranking_subset=3, max_reverted=2)
    ac = rec["accuracy_control"]
    assert ac["float_metric"] == pytest.approx(1.0, abs=1e-6)  # FP32 against its own ranking: no regret
    assert ac["quantized_metric"] < 1  # full INT8 loses some of FP32's assignment objective
    assert 1 <= ac["reverted_groups"] <= 2 and ac["groups"] >= ac["reverted_groups"]
    assert len(ac["reverted_quantizers"]) >= ac["reverted_groups"] and len(ac["trace"]) == 2 + ac["iterations"]
    assert rec["fake_quantize_nodes"] <= full["fake_quantize_nodes"]  # reverted quantizers are gone (none added)
    assert ac["slates_run"] > 3 * len(val) and rec["inference_precision"] == "f32"
    art = resolve(tmp_path / "ac")
    assert art.precision.value == "int8" and art.meta["engine"] == "openvino"
    assert art.meta["quantization"]["accuracy_control"]["metric"] == "regret"
    with Ranker.from_path(tmp_path / "ac", threads=1) as r:
        ranked = r.rank(val[:3])
    assert r.engine.name == "openvino" and [sorted(x.order) for x in ranked] == [list(range(8))] * 3
    # a search past its budget with on_budget="raise" ends NNCF at the first ranking call and writes nothing
    with pytest.raises(EngineError, match="stopped at its 0 s budget"):
        quantize_with_accuracy_control(standard_export_dir, tmp_path / "late", calib, val, metric="regret",
                                       max_drop=0.0, ranking_subset=3, budget_s=0.0, on_budget="raise")
    assert not (tmp_path / "late").exists()
    # a drop the fully quantized graph already meets: nothing is reverted, no group is ranked
    loose = quantize_with_accuracy_control(standard_export_dir, tmp_path / "loose", calib, val, metric="tau",
                                           max_drop=2.0)
    assert loose["accuracy_control"]["reverted_groups"] == 0 and loose["accuracy_control"]["reached_max_drop"]
    assert loose["fake_quantize_nodes"] == full["fake_quantize_nodes"]


def test_accuracy_control_refuses_bad_inputs_before_quantizing(export_dir, standard_export_dir, int8_inputs, tmp_path):
    from hllm.calibration.recipes.accuracy_control import quantize_with_accuracy_control

    calib, val = int8_inputs
    with pytest.raises(EngineError, match="flavour standard"):
        quantize_with_accuracy_control(export_dir, tmp_path / "x", calib, val)
    (tmp_path / "taken").mkdir()
    with pytest.raises(EngineError, match="exists"):
        quantize_with_accuracy_control(standard_export_dir, tmp_path / "taken", calib, val)
    with pytest.raises(EngineError, match="unknown validation metric"):
        quantize_with_accuracy_control(standard_export_dir, tmp_path / "y", calib, val, metric="mrr")
    with pytest.raises(EngineError, match="validation slates"):
        quantize_with_accuracy_control(standard_export_dir, tmp_path / "y", calib, [])
    with pytest.raises(EngineError, match="max_drop"):
        quantize_with_accuracy_control(standard_export_dir, tmp_path / "y", calib, val, max_drop=-0.1)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_validation_fn_past_its_deadline_reports_no_drop_without_running():
    import time

    feeds = [{"slate": 0}, {"slate": 1}]
    model = FakeCompiled({0: REF.copy(), 1: scores_for([1, 0, 2])})
    fn = RankingValidation(feeds, [3, 3], [REF, REF], metric="tau", deadline=time.monotonic() - 1)
    first, _ = fn(model, range(2))  # the float and the quantized validations always run
    second, _ = fn(model, range(2))
    assert fn.slates_run == 4 and not fn.out_of_time and first == second == pytest.approx((1 + 1 / 3) / 2)
    fn.trace[0] = 1.0  # as if the first call had been the float model
    assert fn(model, [1]) == (1.0, [1.0]) and fn.out_of_time and fn.slates_run == 4  # nothing ran


def test_calibrate_recipe_bf16_twin_reuses_the_searched_ir(standard_export_dir, int8_inputs, tmp_path, monkeypatch):
    """``openvino-int8-bf16`` takes the IR the ``openvino-int8`` recipe's search wrote (no second search)
    and only changes the hint; its validation slates are the gate's first ones, cut short."""
    from hllm import measure
    from hllm.calibration.recipes.accuracy_control import build_recipe
    from hllm.calibration.recipes.openvino_int8 import fake_quantize_count
    from hllm.formats.export import read_export

    calib, val = int8_inputs
    small = {"validation_slates": 4, "max_candidates": 5, "ranking_subset": 2, "max_reverted": 1}
    rec = build_recipe(standard_export_dir, tmp_path / "openvino-int8", calib, val, settings=small)
    assert rec["accuracy_control"]["validation_slates"] == 4 and rec["inference_precision"] == "f32"
    assert rec["accuracy_control"]["max_drop"] == 1e-3  # the gate's default p95-regret limit
    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx512f", "avx512_bf16"])
    twin = build_recipe(standard_export_dir, tmp_path / "openvino-int8-bf16", calib, val, settings=small,
                           inference_precision="bf16")
    assert twin["reused_from"] == "openvino-int8" and twin["inference_precision"] == "bf16"
    meta = read_export(tmp_path / "openvino-int8-bf16")
    assert meta.raw["openvino"]["inference_precision"] == "bf16" and meta.raw["precision"] == "int8"
    import openvino as ov

    a, b = (ov.Core().read_model(str(tmp_path / d / "model_int8.xml")) for d in ("openvino-int8", "openvino-int8-bf16"))
    assert fake_quantize_count(a) == fake_quantize_count(b) == rec["fake_quantize_nodes"] > 0


def test_debug_precision_int8_runs_accuracy_control(standard_export_dir, tmp_path, capsys):
    import json

    from hllm.cli.app import run
    from hllm.runtime.slates import write_jsonl
    from hllm.testing import tiny_slates

    write_jsonl(tmp_path / "s.jsonl", tiny_slates(4, 6, seed=31))
    write_jsonl(tmp_path / "t.jsonl", [{**s, "slate_id": f"t{i}"} for i, s in enumerate(tiny_slates(4, 6, seed=32))])
    assert run(["debug", "precision", str(standard_export_dir), "--precision", "int8", "-o", str(tmp_path / "i.json"),
                "-s", str(tmp_path / "s.jsonl"), "--calib-slates", str(tmp_path / "t.jsonl"), "--calib-count", "4",
                "--threads", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ac = doc["accuracy_control"]
    assert ac["metric"] == "regret" and ac["validation_slates"] == 4 and ac["max_drop"] == 1e-3
    assert doc["islands"] == ac["reverted_operations"]  # the islands file lists what NNCF reverted
    isl = json.loads((tmp_path / "i.json").read_text())
    assert isl["target"] == "int8" and isl["islands"] == doc["islands"]
    assert set(doc["islands_figures"]) >= {"top1_agreement", "kendall_tau_mean"}


def test_validation_fn_can_end_the_search_at_its_deadline():
    import time

    from hllm.calibration.recipes.ranking_validation import SearchBudgetExceeded

    model = FakeCompiled({0: REF.copy()})
    fn = RankingValidation([{"slate": 0}], [3], [REF], metric="regret", deadline=time.monotonic() - 1, stop="raise")
    fn(model, [0]), fn(model, [0])  # the float and the quantized validations
    with pytest.raises(SearchBudgetExceeded, match="past its deadline after 2 slates"):
        fn(model, [0])
    assert fn.out_of_time and fn.slates_run == 2
    with pytest.raises(ValueError, match="stop must be"):
        RankingValidation([{"slate": 0}], [3], [REF], stop="later")
