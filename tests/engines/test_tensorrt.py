"""TensorRT plans: optimization profiles, the metadata sidecar and its compatibility refusals, the
TensorRT 10 / 11 code paths, the build recipe, and artefact resolution of a plan.

The ``tensorrt`` module cannot be imported on the CPU development machines (its wheels fetch the real
libraries from NVIDIA's index) and there is no GPU. The build and run tests therefore run hllm's code and
the real Polygraphy (``polygraphy.backend.trt``: ``NetworkFromOnnxPath``, ``CreateConfig``,
``EngineBytesFromNetwork``, ``EngineFromBytes``, ``TrtRunner``) with TensorRT faked only at the
``tensorrt`` module boundary and the CUDA runtime faked only behind ``polygraphy.cuda.wrapper()``
(:mod:`tests.engines.fake_tensorrt`): the fakes record what Polygraphy asks TensorRT for (network flags,
profiles, pool limits, hardware compatibility, timing cache, profile switches, input shapes, copies), and
the fake execution context computes ``scores`` with ONNX Runtime from the bytes Polygraphy copied, so the
runner's outputs come back through the copies Polygraphy made. These tests are named ``test_plumbing_…``:
they check what hllm and Polygraphy ask of TensorRT and that the bytes travel, never TensorRT's numerics
(equal scores there prove the bindings and copies, because the fake computes them with ONNX Runtime). Where
``tensorrt`` imports, ``test_real_tensorrt_dispatch`` checks the real module. The real parity test,
``test_tiny_fp16_plan_matches_reference``, builds and runs a plan on a GPU: it is marked ``gpu``/``tensorrt``
and skips with the reason elsewhere.
"""

from __future__ import annotations

import enum
import json
import shutil
import sys

import numpy as np
import pytest

from hllm.engines.tensorrt.profiles import default_profile, select_profile, validate_profiles
from hllm.engines.tensorrt.targets import DeviceInfo, check_compatible, target_settings
from hllm.formats.plan import read_sidecar, sidecar_path, write_sidecar
from hllm.formats.profiles import DimRange, Profile
from hllm.errors import EngineError
from tests.engines.fake_tensorrt import FakeCudart, make_tensorrt

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


# -- TensorRT faked at the module boundary, Polygraphy real ------------------------------------------------
def _reset_polygraphy_trt() -> None:
    """Forget the ``tensorrt`` module Polygraphy's lazy imports cached (each test installs its own fake)."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("polygraphy"):
            continue
        for value in list(vars(module).values()):
            if type(value).__name__ == "LazyModule":
                cached = object.__getattribute__(value, "module")
                if getattr(cached, "__name__", None) == "tensorrt":
                    object.__setattr__(value, "module", None)
    trt_util = sys.modules.get("polygraphy.backend.trt.util")
    if trt_util is not None:
        trt_util.TRT_LOGGER = None


@pytest.fixture
def fake_trt(monkeypatch):
    """``install(version, cudart)`` → (fake tensorrt module, its call record, fake libcudart): the fake
    ``tensorrt`` goes into ``sys.modules`` and the fake CUDA runtime behind ``polygraphy.cuda.wrapper()``."""
    from polygraphy.cuda import cuda as pg_cuda

    def install(version: str = "10.13.0", cudart: FakeCudart | None = None):
        rec: list = []
        trt = make_tensorrt(version, rec)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        _reset_polygraphy_trt()
        wrapper = pg_cuda.Cuda.__new__(pg_cuda.Cuda)
        wrapper.handle = cudart or FakeCudart()
        monkeypatch.setattr(pg_cuda, "G_CUDA", wrapper)
        return trt, rec, wrapper.handle

    yield install
    _reset_polygraphy_trt()


def test_plumbing_version_dispatch_10_and_11():
    """Plumbing (fake ``tensorrt`` modules): the major version decides the network flags; a TensorRT older
    than 10, or a 10.x without STRONGLY_TYPED, is refused."""
    from hllm.engines.tensorrt.runner import trt_api

    t10 = trt_api(make_tensorrt("10.13.0.35", []))
    assert (t10.major, t10.strongly_typed_flag, t10.network_flags) == (10, True, 1 << 1)
    t11 = trt_api(make_tensorrt("11.4.0.106", []))
    assert (t11.major, t11.strongly_typed_flag, t11.network_flags) == (11, False, 0)
    with pytest.raises(EngineError, match="too old"):
        trt_api(make_tensorrt("8.6.1", []))
    old10 = make_tensorrt("10.0.0", [])
    old10.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"EXPLICIT_BATCH": 0})
    with pytest.raises(EngineError, match="STRONGLY_TYPED"):
        trt_api(old10)


@pytest.mark.tensorrt
@pytest.mark.skipif(not _trt_importable(), reason="tensorrt is not importable here (install it from NVIDIA's index)")
def test_real_tensorrt_dispatch():
    import tensorrt

    from hllm.engines.tensorrt.runner import trt_api

    api = trt_api(tensorrt)
    assert api.major == int(tensorrt.__version__.split(".")[0])


TWO_PROFILES = ["1:1:4/2:64:128/1:8:8", "1:2:2/2:256:512/1:8:8"]


def _calls(rec, kind):
    return [c for c in rec if c[0] == kind]


@pytest.mark.parametrize("version, flags", [("10.13.0", 2), ("11.4.0", 0)])
def test_plumbing_build_recipe_through_polygraphy(fake_trt, standard_export_dir, tmp_path, version, flags):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): Polygraphy asks TensorRT for a strongly typed network (flag on 10.x, none on 11.x), no precision
    flag, one optimization profile per hllm profile with min/opt/max per input, the optimization level,
    hardware compatibility, the workspace pool limit and the timing cache (read, then merged back)."""
    from hllm.exporter.plan import build_plan

    trt, rec, cudart = fake_trt(version)  # the build GPU: the fake libcudart's H100 (sm_90)
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"old")
    plan = tmp_path / "tiny.plan"
    profiles = [Profile.parse(p) for p in TWO_PROFILES]
    meta = build_plan(standard_export_dir, plan, profiles, timing_cache=cache, opt_level=5, target="a100", workspace_gb=2)
    assert _calls(rec, "create_network") == [("create_network", flags)]
    assert _calls(rec, "parse_from_file") == [("parse_from_file", str(standard_export_dir / "model.onnx"))]
    assert _calls(rec, "set_flag") == []  # no FP16/BF16/INT8 weak-typing flag, ever
    assert ("clear_flag", trt.BuilderFlag.TF32) in rec  # FP32 islands in IEEE FP32
    assert ("config", "builder_optimization_level", 5) in rec
    assert ("config", "hardware_compatibility_level", trt.HardwareCompatibilityLevel.AMPERE_PLUS) in rec  # H100 → A100
    assert _calls(rec, "set_memory_pool_limit") == [("set_memory_pool_limit", trt.MemoryPoolType.WORKSPACE, 2 << 30)]
    shapes = _calls(rec, "set_shape")
    assert len(shapes) == 3 * 2 and len(_calls(rec, "add_optimization_profile")) == 2
    assert shapes[3:] == [("set_shape", "input_ids", (1, 2), (2, 256), (2, 512)),
                          ("set_shape", "readout_positions", (1, 1), (2, 8), (2, 8)),
                          ("set_shape", "item_mask", (1, 1), (2, 8), (2, 8))]
    assert ("create_timing_cache", b"old") in rec and ("set_timing_cache", b"old", False) in rec
    assert cache.read_bytes() == b"old+tuned"
    built = json.loads(plan.read_bytes())
    assert built["fake_trt"] == version and built["flags"] == flags
    side = read_sidecar(plan)
    for p, got in zip(side["profiles"], built["profiles"]):  # the plan's profiles are the sidecar's table
        assert {k: tuple(tuple(x) for x in v) for k, v in got.items()} == Profile.from_dict(p).shapes()
    assert side["tensorrt_version"] == version and side["tensorrt_code_path"] == f"{version[:2]}.x strongly typed"
    assert side["compute_capability"] == "9.0" and side["gpu_name"] == cudart.name
    assert side["cuda_runtime_version"] == "12.8" and side["hardware_compatibility"] == "ampere_plus"
    assert side["target"] == "a100" and side["builder_optimization_level"] == 5 and side["workspace_gb"] == 2
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


def _batch(seed, lengths, items, vocab=300):
    from hllm.exporter.validate import synthetic_batch

    return synthetic_batch(np.random.default_rng(seed), vocab, lengths, items)


def test_plumbing_runner_feeds_every_input_and_copies_scores_back(fake_trt, standard_export_dir, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): TrtRunner
    does the buffers, copies and execution; hllm picks the profile by slate shape and switches only when
    needed. The fake context computes scores with ONNX Runtime from the copied bytes, so equal scores prove
    the feeds and copies, not TensorRT."""
    from hllm.exporter.plan import build_plan
    from hllm.engines.tensorrt.runner import TensorRTEngine
    from hllm.runtime import Ranker

    trt, rec, cudart = fake_trt("10.13.0")
    plan = tmp_path / "tiny.plan"
    build_plan(standard_export_dir, plan, [Profile.parse(p) for p in TWO_PROFILES])
    small, big = _batch(1, [40, 17, 33], [8, 3, 5]), _batch(2, [300, 90], [8, 6])
    with Ranker.from_path(standard_export_dir) as ort_ranker:
        want_small = ort_ranker.engine.run(small.input_ids, small.readout_positions, small.item_mask)
        want_big = ort_ranker.engine.run(big.input_ids, big.readout_positions, big.item_mask)
    rec.clear()
    cudart.calls.clear()
    with TensorRTEngine(plan, 8) as eng:
        got_small = eng.run(small.input_ids, small.readout_positions, small.item_mask)
        got_big = eng.run(big.input_ids, big.readout_positions, big.item_mask)
        eng.run(small.input_ids[:1], small.readout_positions[:1], small.item_mask[:1])
        with pytest.raises(EngineError, match="outside every optimization profile"):
            eng.run(np.zeros((1, 600), np.int64), np.zeros((1, 2), np.int64), np.ones((1, 2), bool))
        fed = eng._runner.context.fed
    assert got_small.shape == (3, 8, 8) and got_big.shape == (2, 8, 8) and got_small.dtype == np.float32
    np.testing.assert_allclose(got_small, want_small, atol=1e-5)
    np.testing.assert_allclose(got_big, want_big, atol=1e-5)  # not overwritten by the later calls
    assert [c[1] for c in _calls(rec, "set_optimization_profile_async")] == [0, 1, 0]  # S=40 → #0, S=300 → #1
    assert len(_calls(rec, "execute_async_v3")) == 3 and len(fed) == 3
    for feeds, b in zip(fed, (small, big)):
        assert list(feeds) == ["input_ids", "readout_positions", "item_mask"]
        np.testing.assert_array_equal(feeds["input_ids"], b.input_ids)
        np.testing.assert_array_equal(feeds["readout_positions"], b.readout_positions)
        np.testing.assert_array_equal(feeds["item_mask"], b.item_mask)
    copies = [c[1] for c in cudart.calls if c[0] == "cudaMemcpyAsync"]
    assert copies.count(1) == 3 * 3 and copies.count(2) == 3  # host→device ×3 inputs, device→host scores
    assert ("cudaSetDevice", 0) in cudart.calls and ("cudaStreamDestroy", 0x5EED1) in cudart.calls
    assert sum(c[0] == "cudaFree" for c in cudart.calls) >= 3  # deactivate frees the three input buffers


@pytest.fixture(scope="module")
def context_export(tiny_dir, qwen3_backbone):
    """A standard-flavour export of a head that reads the user context (fourth input ``context_positions``)."""
    from hllm.checkpoint.init import init_checkpoint
    from hllm.exporter.onnx import export_onnx

    from tests.conftest import TINY_HEAD

    ckpt = init_checkpoint(qwen3_backbone, tiny_dir / "ckpt-context-trt", "self_attention", 8, seed=5,
                           head_kwargs={**TINY_HEAD, "context": True})
    export_onnx(ckpt, tiny_dir / "export-context-trt", flavour="standard", overwrite=True)
    return tiny_dir / "export-context-trt"


def test_plumbing_context_head_profile_and_feed(fake_trt, context_export, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): a context head's
    plan has a ``context_positions`` profile and the runner feeds it."""
    from hllm.exporter.plan import build_plan
    from hllm.engines.tensorrt.runner import TensorRTEngine
    from hllm.runtime import Ranker

    trt, rec, _ = fake_trt("11.4.0")
    plan = tmp_path / "ctx.plan"
    build_plan(context_export, plan, [Profile.parse("1:2:4/2:64:512/1:8:8")])
    assert ("set_shape", "context_positions", (1,), (2,), (4,)) in rec
    b = _batch(3, [41, 12, 30], [8, 3, 5])
    with Ranker.from_path(context_export) as ort_ranker:
        want = ort_ranker.engine.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
    with TensorRTEngine(plan, 8) as eng:
        assert eng.context
        got = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
        feeds = eng._runner.context.fed[-1]
    assert list(feeds) == ["input_ids", "readout_positions", "item_mask", "context_positions"]
    np.testing.assert_array_equal(feeds["context_positions"], b.context_positions)
    assert got.shape == (3, 8, 8)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_plumbing_runner_refuses_other_gpu_or_tensorrt(fake_trt, standard_export_dir, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): a plan built
    for another GPU or TensorRT version is refused from its sidecar before TensorRT loads it."""
    from hllm.exporter.plan import build_plan
    from hllm.engines.tensorrt.runner import TensorRTEngine

    fake_trt("10.13.0")  # built on the fake H100, hardware compatibility none
    plan = tmp_path / "h100.plan"
    build_plan(standard_export_dir, plan, [default_profile(8, 64)])
    fake_trt("10.13.0", FakeCudart("NVIDIA A100-SXM4-80GB", (8, 0)))
    with pytest.raises(EngineError, match=r"built for NVIDIA H100.*sm_90.*this GPU is NVIDIA A100"):
        TensorRTEngine(plan, 8).activate()
    _, rec, _ = fake_trt("10.14.1")
    with pytest.raises(EngineError, match=r"built with TensorRT 10\.13\.0 but this is TensorRT 10\.14\.1"):
        TensorRTEngine(plan, 8).activate()
    assert _calls(rec, "deserialize_cuda_engine") == []  # refused before TensorRT reads the plan


def test_plumbing_build_failure_is_one_engine_error_and_stdout_stays_clean(fake_trt, standard_export_dir, tmp_path, capsys):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): a failed TensorRT build (``build_serialized_network`` returns None) reaches the caller as one
    EngineError with Polygraphy's message; nothing is written; Polygraphy's output is not on stdout."""
    from hllm.exporter.plan import build_plan

    trt, rec, _ = fake_trt("10.13.0")
    trt.Builder.build_serialized_network = lambda self, network, config: None
    cache = tmp_path / "new.cache"
    with pytest.raises(EngineError, match=r"building a TensorRT plan from .*model\.onnx failed in Polygraphy/TensorRT: "
                                          r"Invalid Engine"):
        build_plan(standard_export_dir, tmp_path / "x.plan", [default_profile(8, 64)], timing_cache=cache)
    assert not (tmp_path / "x.plan").exists() and not sidecar_path(tmp_path / "x.plan").exists()
    assert ("create_timing_cache", b"") in rec  # a missing cache file: Polygraphy starts from an empty cache
    assert capsys.readouterr().out == ""


def test_plumbing_no_cuda_runtime_is_one_engine_error(fake_trt, standard_export_dir, tmp_path, monkeypatch):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): TensorRT importable but no libcudart (no GPU stack): one EngineError, not an OSError traceback."""
    from polygraphy.cuda import cuda as pg_cuda

    from hllm.exporter.plan import build_plan

    fake_trt("10.13.0")
    monkeypatch.setattr(pg_cuda, "G_CUDA", None)

    def no_lib(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pg_cuda.ctypes, "CDLL", no_lib)
    with pytest.raises(EngineError, match=r"CUDA runtime library \(libcudart\) cannot be loaded .*cannot open shared"):
        build_plan(standard_export_dir, tmp_path / "x.plan", [default_profile(8, 64)])
    assert not (tmp_path / "x.plan").exists()


def test_plumbing_build_refuses_bad_profile_before_tensorrt(fake_trt, standard_export_dir, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): a profile
    beyond the head's K is refused before anything is asked of TensorRT."""
    from hllm.exporter.plan import build_plan

    _, rec, _ = fake_trt("10.13.0")
    with pytest.raises(EngineError, match="exceeds the head's K=8"):
        build_plan(standard_export_dir, tmp_path / "x.plan", [Profile.parse("1:1:1/2:64:64/1:8:9")])
    assert rec == [] and not (tmp_path / "x.plan").exists()


def test_plumbing_build_refuses_a_fused_graph_before_tensorrt(fake_trt, export_dir, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): the default export (flavour ort-cpu) holds ONNX Runtime contrib ops: build names them and the fix."""
    from hllm.exporter.plan import build_plan

    assert json.loads((export_dir / "export.json").read_text())["flavour"] == "ort-cpu"
    _, rec, _ = fake_trt("10.13.0")
    with pytest.raises(EngineError, match=r"com\.microsoft:GroupQueryAttention ×2.*hllm export --flavour standard"):
        build_plan(export_dir, tmp_path / "x.plan", [default_profile(8, 64)])
    with pytest.raises(EngineError, match="--flavour standard"):
        build_plan(export_dir / "model.onnx", tmp_path / "x.plan", [default_profile(8, 64)])
    assert rec == [] and not (tmp_path / "x.plan").exists()


def test_cli_build_refuses_a_fused_graph(export_dir):
    from typer.testing import CliRunner

    from hllm.cli import app

    r = CliRunner().invoke(app, ["build", str(export_dir), "x.plan", "--dry-run"])
    assert r.exit_code != 0 and isinstance(r.exception, EngineError)
    assert "--flavour standard" in str(r.exception)


def test_plumbing_build_refuses_existing_plan(fake_trt, standard_export_dir, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): an existing plan
    is not replaced without ``overwrite``."""
    from hllm.exporter.plan import build_plan

    fake_trt("11.4.0")
    plan = tmp_path / "x.plan"
    plan.write_bytes(b"good")
    with pytest.raises(FileExistsError):
        build_plan(standard_export_dir, plan, [default_profile(8, 64)])
    assert plan.read_bytes() == b"good"


@pytest.mark.skipif(_trt_importable(), reason="checks the message shown when tensorrt is missing")
def test_plumbing_engine_without_tensorrt_says_how_to_install(fake_trt, standard_export_dir, tmp_path, monkeypatch):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): a plan built
    with the fake, opened where ``tensorrt`` is missing, is an error that says how to install it; a missing
    plan is "not found"."""
    from hllm.exporter.plan import build_plan
    from hllm.engines.tensorrt.runner import TensorRTEngine

    fake_trt("10.13.0")
    plan = tmp_path / "m.plan"
    build_plan(standard_export_dir, plan, [default_profile(8, 64)])
    monkeypatch.delitem(sys.modules, "tensorrt")
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


def _trtexec_profiles(argv: list[str]) -> list[dict]:
    """Per profile, {input: (min, opt, max)} from trtexec's --minShapes/--optShapes/--maxShapes flags."""
    out: list[dict] = []
    for arg in argv:
        for which, flag in enumerate(("--minShapes=", "--optShapes=", "--maxShapes=")):
            if arg.startswith(flag):
                if which == 0:
                    out.append({})
                for item in arg[len(flag):].split(","):
                    name, dims = item.rsplit(":", 1)
                    out[-1].setdefault(name, [None, None, None])[which] = tuple(int(d) for d in dims.split("x"))
    return [{k: tuple(v) for k, v in p.items()} for p in out]


def _polygraphy_profiles(argv: list[str]) -> list[dict]:
    """Per profile, {input: (min, opt, max)} from polygraphy's --trt-{min,opt,max}-shapes groups."""
    out: list[dict] = []
    flags = {"--trt-min-shapes": 0, "--trt-opt-shapes": 1, "--trt-max-shapes": 2}
    which = None
    for arg in argv:
        if arg in flags:
            which = flags[arg]
            if which == 0:
                out.append({})
        elif arg.startswith("-"):
            which = None
        elif which is not None:
            name, dims = arg.split(":[")
            out[-1].setdefault(name, [None, None, None])[which] = tuple(int(d) for d in dims.rstrip("]").split(","))
    return [{k: tuple(v) for k, v in p.items()} for p in out]


def test_plumbing_dry_run_commands_name_the_sidecar_profiles(fake_trt, context_export, tmp_path):
    """Plumbing (TensorRT faked at the module boundary, Polygraphy real): `hllm build --dry-run` prints trtexec and polygraphy convert lines whose profiles are those the
    sidecar of the real build lists (context_positions included for a context head)."""
    from typer.testing import CliRunner

    from hllm.cli import app
    from hllm.exporter.plan import build_plan

    profiles = ["1:1:4/2:64:128/1:8:8", "1:2:2/2:256:512/1:8:8"]
    fake_trt("10.13.0")
    plan = tmp_path / "ctx.plan"
    build_plan(context_export, plan, [Profile.parse(p) for p in profiles], timing_cache=tmp_path / "tc", workspace_gb=1)
    want = [Profile.from_dict(p).shapes(context=True) for p in read_sidecar(plan)["profiles"]]
    args = ["build", str(context_export), str(plan), "--dry-run", "--json", "--timing-cache", str(tmp_path / "tc"),
            "--workspace-gb", "1"] + [a for p in profiles for a in ("--profile", p)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.find("{\n"):])
    assert _trtexec_profiles(doc["trtexec"]) == want == _polygraphy_profiles(doc["polygraphy"])
    assert "--profile=1" in doc["trtexec"] and "--stronglyTyped" in doc["trtexec"]
    assert "--strongly-typed" in doc["polygraphy"] and doc["polygraphy"][:2] == ["polygraphy", "convert"]
    assert f"--memPoolSize=workspace:1024M" in doc["trtexec"] and f"workspace:{1 << 30}" in doc["polygraphy"]
    assert len(want[0]) == 4 and want[0]["context_positions"] == ((1,), (1,), (4,))


def test_polygraphy_convert_line_parses_in_polygraphy():
    """The printed `polygraphy convert` line is read back by Polygraphy's own `convert` argument groups
    (no TensorRT needed to parse): same profiles, strongly typed, optimization level, timing cache,
    workspace pool and hardware compatibility level."""
    import argparse

    from polygraphy.tools.args import TrtConfigArgs, TrtLoadNetworkArgs
    from polygraphy.tools.convert.convert import Convert

    from hllm.engines.tensorrt.interop import polygraphy_convert_command

    profiles = [Profile.parse(p) for p in TWO_PROFILES]
    argv = polygraphy_convert_command("m.onnx", "m.plan", profiles, context=True, opt_level=4, timing_cache="tc",
                                      hardware_compat="ampere_plus", workspace_gb=1)
    tool = Convert()
    parser = argparse.ArgumentParser()
    tool.setup_parser(parser.add_subparsers())
    args = parser.parse_args(argv[1:])
    for group in tool.arg_groups.values():
        group.parse(args)
    config = tool.arg_groups[TrtConfigArgs]
    got = [{name: tuple(tuple(s) for s in shapes) for name, shapes in d.items()} for d in config.profile_dicts]
    assert got == [p.shapes(context=True) for p in profiles]
    assert config.builder_optimization_level == 4 and config.load_timing_cache == "tc"
    assert list(config.memory_pool_limits.values()) == [1 << 30]
    assert "AMPERE_PLUS" in str(config.hardware_compatibility_level)
    assert tool.arg_groups[TrtLoadNetworkArgs].strongly_typed is True


# -- on a GPU with TensorRT --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.tensorrt
@pytest.mark.skipif(not (_trt_importable() and _gpu_present()), reason="needs an NVIDIA GPU with tensorrt and polygraphy")
def test_tiny_fp16_plan_matches_reference(tmp_path, merged_checkpoint, slates):
    from hllm.exporter.onnx import export_onnx
    from hllm.exporter.plan import build_plan
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
