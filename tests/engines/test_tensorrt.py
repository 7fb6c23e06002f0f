"""TensorRT plans: optimization profiles, the metadata sidecar and its compatibility refusals, the
TensorRT 10 / 11 code paths, the build recipe, and artefact resolution of a plan.

The ``tensorrt`` module cannot be imported on the CPU development machines (its wheels fetch the real
libraries from NVIDIA's index). Where it cannot be imported, the build and version-dispatch tests use
a small stub of its API surface (``_FakeTrt`` below: Builder, network, OnnxParser, builder config,
optimization profile, timing cache — the calls :func:`hllm.engines.tensorrt.builder.build_plan` makes, with
the names of the TensorRT Python API). The stub records the calls, so the tests check the recipe:
strongly typed flag on 10.x and none on 11.x, no FP16 builder flag, one ``set_shape`` per input per
profile, optimization level, hardware compatibility, timing cache reuse. Where ``tensorrt`` imports,
``test_real_tensorrt_dispatch`` checks the real module instead. Running a plan needs a GPU: those tests
are marked ``gpu``/``tensorrt`` and skip with the reason.
"""

from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest

from hllm.formats.plan import (DeviceInfo, check_compatible, read_sidecar, sidecar_path, target_settings,
                                    write_sidecar)
from hllm.formats.profiles import DimRange, Profile, default_profile, select_profile, validate_profiles
from hllm.errors import EngineError

A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", (8, 0), "12.4", "12.4")
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", (9, 0), "12.4", "12.4")
T4 = DeviceInfo("Tesla T4", (7, 5), "12.4", "12.4")


def _trt_importable() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return False
    return True


def _gpu_present() -> bool:
    try:
        from hllm.engines.tensorrt.runner import device_info

        device_info()
    except Exception:
        return False
    return True


# -- profiles ----------------------------------------------------------------------------------------------
def test_profile_parse_and_shapes():
    p = Profile.parse("1:2:8/16:1536:2048/1:50:50")
    assert (p.batch, p.seq, p.items) == (DimRange(1, 2, 8), DimRange(16, 1536, 2048), DimRange(1, 50, 50))
    s = p.shapes()
    assert s["input_ids"] == ((1, 16), (2, 1536), (8, 2048))
    assert s["readout_positions"] == s["item_mask"] == ((1, 1), (2, 50), (8, 50))
    assert Profile.parse("4/64/8").batch == DimRange(4, 4, 4)
    assert Profile.from_dict(p.to_dict()) == p and str(p) == "1:2:8/16:1536:2048/1:50:50"


@pytest.mark.parametrize("spec, message", [
    ("1:4:2/16:64:128/1:8:8", "min ≤ opt ≤ max"),
    ("0:1:2/16:64:128/1:8:8", "min ≤ opt ≤ max"),
    ("1:1:2/1:64:128/1:8:8", "seq.min must be ≥ 2"),
    ("1:1:2/2:4:128/1:8:8", "items.opt=8 exceeds seq.opt=4"),
    ("1:1:2/16:64:128/1:8:9", "exceeds the head's K=8"),
    ("1:1:2/16:64:128", "BATCH/SEQ/ITEMS"),
    ("1:x:2/16:64:128/1:8:8", "not min:opt:max"),
    ("1:2/16:64:128/1:8:8", "needs 1 or 3 numbers"),
])
def test_profile_validation_refuses(spec, message):
    with pytest.raises(EngineError, match=message):
        validate_profiles([Profile.parse(spec)], num_positions=8)


def test_validate_profiles_needs_one():
    with pytest.raises(EngineError, match="at least one"):
        validate_profiles([], 8)


def test_default_profile_covers_the_serving_shape():
    p = default_profile(50, 2048)
    assert p.contains(1, 1437, 50) and p.items.max == 50 and p.seq.max == 2048 and p.batch.opt == 1
    with pytest.raises(EngineError):
        default_profile(50, 2048).validate(num_positions=40)


def test_select_profile_and_request_outside():
    small = Profile.parse("1:1:4/2:256:512/1:50:50")
    big = Profile.parse("1:1:8/2:1536:2048/1:50:50")
    assert select_profile([big, small], 1, 300, 50) == 1  # the tighter one
    assert select_profile([big, small], 6, 300, 50) == 0
    with pytest.raises(EngineError, match=r"batch=1 seq=4096 items=50 lies outside every optimization profile"):
        select_profile([big, small], 1, 4096, 50)
    with pytest.raises(EngineError, match="items 1..50"):
        select_profile([big], 1, 100, 60)


# -- sidecar ---------------------------------------------------------------------------------------------
def _meta(**over) -> dict:
    m = {
        "tensorrt_version": "10.13.0", "compute_capability": "8.0", "gpu_name": A100.gpu_name,
        "hardware_compatibility": "none", "profiles": [Profile.parse("1:1:8/2:1536:2048/1:50:50").to_dict()],
        "precision": "fp16", "num_positions": 50, "prompt": {}, "tokenizer": "m.plan.tokenizer.json",
        "onnx_sha256": "ab" * 32,
    }
    m.update(over)
    return m


def test_sidecar_round_trip(tmp_path):
    plan = tmp_path / "m.plan"
    path = write_sidecar(plan, _meta(source_checkpoint={"sha256": "cd" * 32}))
    assert path == sidecar_path(plan) == tmp_path / "m.plan.json"
    back = read_sidecar(plan)
    assert back["format"] == "hllm-tensorrt-plan" and back["source_checkpoint"]["sha256"] == "cd" * 32
    assert back["profiles"] == _meta()["profiles"]
    from hllm.formats.plan import read_plan
    from hllm.formats.precision import Precision

    typed = read_plan(plan)  # the typed view of the same file
    assert typed.precision is Precision.FP16 and typed.num_positions == 50 and typed.compute_capability == (8, 0)
    assert typed.tokenizer_path == tmp_path / "m.plan.tokenizer.json" and typed.context is False
    assert [pr.to_dict() for pr in typed.profiles] == _meta()["profiles"] and typed.raw == back


def test_sidecar_refuses_malformed(tmp_path):
    plan = tmp_path / "m.plan"
    with pytest.raises(EngineError, match="no sidecar"):
        read_sidecar(plan)
    bad = _meta()
    del bad["tensorrt_version"]
    with pytest.raises(EngineError, match="tensorrt_version"):
        write_sidecar(plan, bad)
    with pytest.raises(EngineError, match="hardware_compatibility"):
        write_sidecar(plan, _meta(hardware_compatibility="everything"))
    sidecar_path(plan).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(EngineError, match="format"):
        read_sidecar(plan)
    assert not plan.exists()


def test_compatibility_same_gpu_and_version_loads():
    check_compatible(_meta(), "10.13.0", A100)
    check_compatible(_meta(), "10.13.0", DeviceInfo("NVIDIA A100-PCIE-40GB", (8, 0)))  # same architecture


def test_compatibility_refuses_other_tensorrt_version():
    with pytest.raises(EngineError, match=r"built with TensorRT 10\.13\.0 but this is TensorRT 11\.4\.0"):
        check_compatible(_meta(), "11.4.0", A100)
    with pytest.raises(EngineError, match="rebuild"):
        check_compatible(_meta(), "10.13.1", A100)
    check_compatible(_meta(version_compatible=True), "10.14.1", A100)
    with pytest.raises(EngineError):
        check_compatible(_meta(version_compatible=True), "11.0.0", A100)


def test_compatibility_refuses_other_gpu():
    with pytest.raises(EngineError, match=r"built for NVIDIA A100.*sm_80.*this GPU is NVIDIA H100.*sm_90"):
        check_compatible(_meta(), "10.13.0", H100)
    plan_h100 = _meta(compute_capability="9.0", gpu_name=H100.gpu_name, hardware_compatibility="ampere_plus")
    check_compatible(plan_h100, "10.13.0", A100)  # ampere_plus: loads on any sm ≥ 80
    with pytest.raises(EngineError, match="≥ 8.0"):
        check_compatible(plan_h100, "10.13.0", T4)


def test_target_a100_settings():
    assert target_settings("a100", A100, None, "fp16") == {"target": "a100", "hardware_compatibility": "none"}
    assert target_settings("a100", H100, None, "fp16")["hardware_compatibility"] == "ampere_plus"
    with pytest.raises(EngineError, match="will not load on a100"):
        target_settings("a100", H100, "same_compute_capability", "fp16")
    with pytest.raises(EngineError, match="cannot build for a100 on Tesla T4"):
        target_settings("a100", T4, None, "fp16")
    with pytest.raises(EngineError, match="no fp8 tensor cores"):
        target_settings("a100", A100, None, "fp8")
    with pytest.raises(EngineError, match="unknown target"):
        target_settings("b200x", A100, None, "fp16")
    assert target_settings(None, H100, "ampere_plus", "fp32") == {"target": None, "hardware_compatibility": "ampere_plus"}


# -- TensorRT 10 / 11 code paths (stubbed API surface where tensorrt cannot be imported) -----------------
class _Rec:
    def __init__(self):
        self.calls = []


def _fake_trt(version: str, strongly_typed: bool = True, fp16_flag: bool = True, rec: _Rec | None = None):
    """A stub of the ``tensorrt`` module's build API (names from the TensorRT Python API docs)."""
    rec = rec or _Rec()
    flag_ns = types.SimpleNamespace(**({"STRONGLY_TYPED": 1} if strongly_typed else {}), PREFER_JIT_PYTHON_PLUGINS=3)
    builder_flags = types.SimpleNamespace(**({"FP16": 0, "INT8": 1} if fp16_flag else {}), TF32=2)

    class Profile_:
        def set_shape(self, name, mn, opt, mx):
            rec.calls.append(("set_shape", name, tuple(mn), tuple(opt), tuple(mx)))

    class Cache:
        def __init__(self, blob):
            self.blob = bytes(blob)

        def serialize(self):
            return self.blob + b"+tuned"

    class Config:
        def __init__(self):
            self._cache = None

        def __setattr__(self, k, v):
            if not k.startswith("_"):
                rec.calls.append(("config", k, v))
            object.__setattr__(self, k, v)

        def set_flag(self, f):
            rec.calls.append(("set_flag", f))

        def set_memory_pool_limit(self, pool, n):
            rec.calls.append(("pool", pool, n))

        def add_optimization_profile(self, p):
            rec.calls.append(("add_profile",))
            return sum(1 for c in rec.calls if c[0] == "add_profile") - 1

        def create_timing_cache(self, blob):
            rec.calls.append(("create_timing_cache", bytes(blob)))
            return Cache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            self._cache = cache
            rec.calls.append(("set_timing_cache", ignore_mismatch))
            return True

        def get_timing_cache(self):
            return self._cache

    class Parser:
        def __init__(self, network, logger):
            self.num_errors = 0

        def parse_from_file(self, path):
            rec.calls.append(("parse_from_file", path))
            return True

        def get_error(self, i):
            return ""

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            rec.calls.append(("create_network", flags))
            return object()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile_()

        def build_serialized_network(self, network, config):
            rec.calls.append(("build",))
            return b"PLAN" + version.encode()

    class Logger:
        WARNING = 2

        def __init__(self, level):
            pass

    mod = types.SimpleNamespace(
        __version__=version, Logger=Logger, Builder=Builder, OnnxParser=Parser,
        NetworkDefinitionCreationFlag=flag_ns, BuilderFlag=builder_flags,
        MemoryPoolType=types.SimpleNamespace(WORKSPACE=0),
        HardwareCompatibilityLevel=types.SimpleNamespace(NONE=0, AMPERE_PLUS=1, SAME_COMPUTE_CAPABILITY=2),
    )
    return mod, rec


def test_version_dispatch_10_and_11():
    from hllm.engines.tensorrt.runner import trt_api

    t10 = trt_api(_fake_trt("10.13.0.35")[0])
    assert (t10.major, t10.network_flags) == (10, 1 << 1)
    t11 = trt_api(_fake_trt("11.4.0.106", strongly_typed=True, fp16_flag=False)[0])
    assert (t11.major, t11.network_flags) == (11, 0)
    t11b = trt_api(_fake_trt("11.6.0", strongly_typed=False, fp16_flag=False)[0])  # flag removed later: fine
    assert t11b.network_flags == 0
    with pytest.raises(EngineError, match="too old"):
        trt_api(_fake_trt("8.6.1")[0])
    with pytest.raises(EngineError, match="STRONGLY_TYPED"):
        trt_api(_fake_trt("10.0.0", strongly_typed=False)[0])


@pytest.mark.tensorrt
@pytest.mark.skipif(not _trt_importable(), reason="tensorrt is not importable here (install it from NVIDIA's index)")
def test_real_tensorrt_dispatch():
    import tensorrt

    from hllm.engines.tensorrt.runner import trt_api

    api = trt_api(tensorrt)
    assert api.major == int(tensorrt.__version__.split(".")[0])


@pytest.mark.parametrize("version, flags", [("10.13.0", 2), ("11.4.0", 0)])
def test_build_recipe(standard_export_dir, tmp_path, version, flags):
    from hllm.engines.tensorrt.builder import build_plan

    trt, rec = _fake_trt(version, fp16_flag=version.startswith("10"))
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"old")
    plan = tmp_path / "tiny.plan"
    profiles = [Profile.parse("1:1:4/2:64:128/1:8:8"), Profile.parse("1:2:2/2:256:512/1:8:8")]
    meta = build_plan(standard_export_dir, plan, profiles, timing_cache=cache, opt_level=5, target="a100", trt=trt, device=H100)
    assert ("create_network", flags) in rec.calls
    assert not any(c[0] == "set_flag" for c in rec.calls)  # no FP16/INT8 weak-typing flag, ever
    assert ("config", "builder_optimization_level", 5) in rec.calls
    assert ("config", "hardware_compatibility_level", 1) in rec.calls  # built on H100 for A100 → AMPERE_PLUS
    shapes = [c for c in rec.calls if c[0] == "set_shape"]
    assert len(shapes) == 3 * 2 and ("set_shape", "input_ids", (1, 2), (2, 256), (2, 512)) in shapes
    assert ("create_timing_cache", b"old") in rec.calls and cache.read_bytes() == b"old+tuned"
    assert plan.read_bytes() == b"PLAN" + version.encode()
    side = read_sidecar(plan)
    assert side == json.loads(sidecar_path(plan).read_text()) and side["tensorrt_version"] == version
    assert side["compute_capability"] == "9.0" and side["hardware_compatibility"] == "ampere_plus"
    assert side["target"] == "a100" and side["builder_optimization_level"] == 5 and len(side["profiles"]) == 2
    export = json.loads((standard_export_dir / "export.json").read_text())
    assert side["onnx_sha256"] == export["onnx_sha256"] and side["precision"] == export["precision"]
    assert side["source_checkpoint"] == export["source_checkpoint"] and meta == {k: side[k] for k in meta}
    assert side["timing_cache"] == {"path": str(cache), "reused": True}

    from hllm.runtime import Ranker
    from hllm.runtime.artefact import resolve

    art = resolve(plan)
    assert art.kind == "tensorrt" and art.num_positions == 8 and art.tokenizer_path.is_file()
    ranker = Ranker.from_path(plan)  # builds the prompt builder; the engine activates lazily
    assert ranker.engine.name == "tensorrt" and ranker.builder.max_items == 8


def test_build_refuses_bad_profile_before_tensorrt(standard_export_dir, tmp_path):
    from hllm.engines.tensorrt.builder import build_plan

    trt, rec = _fake_trt("10.13.0")
    with pytest.raises(EngineError, match="exceeds the head's K=8"):
        build_plan(standard_export_dir, tmp_path / "x.plan", [Profile.parse("1:1:1/2:64:64/1:8:9")], trt=trt, device=A100)
    assert rec.calls == [] and not (tmp_path / "x.plan").exists()


def test_build_refuses_a_fused_graph_before_tensorrt(export_dir, tmp_path):
    """The default export (flavour ort-cpu) holds ONNX Runtime contrib ops: build names them and the fix."""
    from hllm.engines.tensorrt.builder import build_plan

    assert json.loads((export_dir / "export.json").read_text())["flavour"] == "ort-cpu"
    trt, rec = _fake_trt("10.13.0")
    with pytest.raises(EngineError, match=r"com\.microsoft:GroupQueryAttention ×2.*hllm export --flavour standard"):
        build_plan(export_dir, tmp_path / "x.plan", [default_profile(8, 64)], trt=trt, device=A100)
    with pytest.raises(EngineError, match="--flavour standard"):
        build_plan(export_dir / "model.onnx", tmp_path / "x.plan", [default_profile(8, 64)], trt=trt, device=A100)
    assert rec.calls == [] and not (tmp_path / "x.plan").exists()


def test_cli_build_refuses_a_fused_graph(export_dir):
    from typer.testing import CliRunner

    from hllm.cli import app

    r = CliRunner().invoke(app, ["build", str(export_dir), "x.plan", "--dry-run"])
    assert r.exit_code != 0 and isinstance(r.exception, EngineError)
    assert "--flavour standard" in str(r.exception)


def test_build_refuses_existing_plan(standard_export_dir, tmp_path):
    from hllm.engines.tensorrt.builder import build_plan

    trt, _ = _fake_trt("11.4.0", fp16_flag=False)
    plan = tmp_path / "x.plan"
    plan.write_bytes(b"good")
    with pytest.raises(FileExistsError):
        build_plan(standard_export_dir, plan, [default_profile(8, 64)], trt=trt, device=A100)
    assert plan.read_bytes() == b"good"


@pytest.mark.skipif(_trt_importable(), reason="checks the message shown when tensorrt is missing")
def test_engine_without_tensorrt_says_how_to_install(standard_export_dir, tmp_path):
    from hllm.engines.tensorrt.builder import build_plan
    from hllm.engines.tensorrt.runner import TensorRTEngine

    trt, _ = _fake_trt("10.13.0")
    plan = tmp_path / "m.plan"
    build_plan(standard_export_dir, plan, [default_profile(8, 64)], trt=trt, device=A100)
    with pytest.raises(EngineError, match="TensorRT is not importable.*pypi.nvidia.com"):
        TensorRTEngine(plan, 8).activate()
    with pytest.raises(EngineError, match="not found"):
        TensorRTEngine(tmp_path / "none.plan", 8).activate()


def test_cli_build_dry_run_and_bad_profile(standard_export_dir):
    from typer.testing import CliRunner

    from hllm.cli import app

    r = CliRunner().invoke(app, ["build", str(standard_export_dir), "x.plan", "--dry-run", "--target", "a100",
                                 "--profile", "1:1:4/2:64:128/1:8:8", "--profile", "1/8:512:1024/8"])
    assert r.exit_code == 0, r.output
    assert "profile 0: batch 1:1:4  seq 2:64:128  items 1:8:8" in r.output
    assert "profile 1: batch 1:1:1  seq 8:512:1024  items 8:8:8" in r.output
    r = CliRunner().invoke(app, ["build", str(standard_export_dir), "x.plan", "--dry-run", "--profile", "1:1:4/2:64:128/1:8:80"])
    assert r.exit_code != 0 and isinstance(r.exception, EngineError)


# -- on a GPU with TensorRT --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.tensorrt
@pytest.mark.skipif(not (_trt_importable() and _gpu_present()), reason="needs an NVIDIA GPU with tensorrt and cuda-python")
def test_tiny_fp16_plan_matches_reference(tmp_path, merged_checkpoint, slates):
    from hllm.exporter.onnx import export_onnx
    from hllm.engines.tensorrt.builder import build_plan
    from hllm.verify.parity import Thresholds, run_parity

    exp = tmp_path / "export16"
    export_onnx(merged_checkpoint, exp, precision="fp16")
    plan = tmp_path / "tiny.plan"
    build_plan(exp, plan, [Profile.parse("1:2:4/2:64:256/1:8:8")], timing_cache=tmp_path / "tc")
    rep = run_parity(merged_checkpoint, plan, slates, Thresholds(atol=0.05, min_perm_match=0, min_top1=0.8, min_tau=0.8))
    assert rep.precision == "fp16" and rep.summary().nonfinite == 0 and rep.passed, rep.failures()
    from hllm.engines.tensorrt.runner import TensorRTEngine

    with TensorRTEngine(plan, 8) as eng, pytest.raises(EngineError, match="outside every optimization profile"):
        eng.run(np.zeros((1, 300), np.int64), np.zeros((1, 2), np.int64), np.ones((1, 2), bool))
    shutil.rmtree(exp)
