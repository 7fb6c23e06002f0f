"""The ``openvino-int8-weights`` recipe: NNCF INT8 weight compression (INT8_SYM / INT8_ASYM, per-channel) with
OpenVINO's dynamic activation quantization, the effective group size read back from the compiled model."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from hllm.calibration.recipes.recipe import Recipe  # noqa: E402
from hllm.errors import EngineError  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402


@pytest.mark.parametrize(("mode", "group"), [("int8_sym", 32), ("int8_asym", 64)])
def test_int8_weights_build_record_the_effective_group_size_and_rank(standard_export_dir, tmp_path, mode, group):
    from hllm.runtime.artefact import open_engine, resolve
    from hllm.verify.reference import cpu_ranker, ranker_scores

    r = Recipe(f"ov-w-{mode}", "openvino", "int8", scheme="openvino-int8-weights", inference_precision="f32",
               flavour="standard", settings={"mode": mode, "group_size": group})
    meta = r.build(standard_export_dir, tmp_path / "w")
    q = meta.raw["quantization"]
    assert (meta.engine, str(meta.precision), q["mode"], q["granularity"]) == ("openvino", "int8", mode, "per-channel")
    assert q["compressed_weights"] > 0
    dq = q["dynamic_quantization"]
    assert dq["group_size"] == group and isinstance(dq["effective_group_size"], int)
    assert meta.openvino.dynamic_quantization_group_size == group and meta.openvino.ir == "model_int8w.xml"
    with open_engine(resolve(tmp_path / "w"), threads=1) as e:  # the engine compiles with the sidecar's setting
        assert e.compiled_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == dq["effective_group_size"]
    slates = tiny_slates(3, (3, 6), seed=5)
    got = ranker_scores(cpu_ranker(tmp_path / "w", 1), slates)
    ref = ranker_scores(cpu_ranker(standard_export_dir, 1), slates)
    assert all(np.isfinite(m).all() for m in got)
    assert [m.shape for m in got] == [m.shape for m in ref]
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, ref))
    scale = max(float(np.abs(b).max()) for b in ref)
    assert 0 < err < 0.5 * scale  # the weights were rounded, the scores kept their scale


def test_int8_weights_refuse_a_bad_mode_group_or_existing_directory(standard_export_dir, tmp_path):
    from hllm.calibration.recipes.openvino_weights import compress_weights_export

    with pytest.raises(EngineError, match="int4_sym"):
        compress_weights_export(standard_export_dir, tmp_path / "a", mode="int4_sym")
    with pytest.raises(EngineError, match="group size 48"):
        compress_weights_export(standard_export_dir, tmp_path / "b", group_size=48)
    (tmp_path / "c").mkdir()
    with pytest.raises(EngineError, match="exists"):
        compress_weights_export(standard_export_dir, tmp_path / "c")
