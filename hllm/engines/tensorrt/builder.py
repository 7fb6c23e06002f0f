"""``hllm build``: a strongly typed TensorRT plan from an exported ONNX graph (TensorRT 10.x and 11.x).

Build: ``OnnxParser.parse_from_file`` → ``IBuilderConfig`` with one ``IOptimizationProfile`` per
:class:`hllm.formats.profiles.Profile` (``set_shape(name, min, opt, max)``),
``builder_optimization_level``, optional ``hardware_compatibility_level``, a timing cache read from /
written back to a file (``create_timing_cache`` / ``set_timing_cache`` /
``get_timing_cache().serialize()``) → ``build_serialized_network`` → plan written atomically, plus the
sidecar of :mod:`hllm.formats.plan` and a copy of the tokenizer. The version-dependent parts
(network flags, strongly typed) come from :func:`hllm.engines.tensorrt.trt_api`, shared with the runner.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hllm.engines.tensorrt.runner import device_info, import_tensorrt, trt_api
from hllm.errors import EngineError
from hllm.files import atomic_path, sha256_file
from hllm.formats.graph import sidecar_reads_context
from hllm.formats.precision import Precision
from hllm.formats.plan import DeviceInfo, target_settings, write_sidecar
from hllm.formats.profiles import Profile, validate_profiles

HARDWARE_LEVELS = {"ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}


def check_standard_graph(art) -> None:
    """Refuse what TensorRT cannot take: anything but an ONNX export, or a graph with ops outside the
    ONNX standard (the ``ort-cpu`` flavour's ONNX Runtime contrib ops, :func:`hllm.exporter.fusion.nonstandard_ops`).

    Args: art: a resolved :class:`hllm.runtime.artefact.Artefact`.
    Raises: EngineError naming the ops and the export to run instead.
    """
    from hllm.exporter.fusion import nonstandard_ops

    if art.kind != "onnx":
        raise EngineError(f"{art.path} is a {art.kind}, not an ONNX export: "
                          "run `hllm export --flavour standard` first")
    bad = nonstandard_ops(art.path)
    if bad:
        raise EngineError(f"{art.path} is a {art.meta.get('flavour', 'non-standard')} graph with ONNX Runtime contrib "
                          f"ops TensorRT cannot parse ({', '.join(f'{k} ×{v}' for k, v in sorted(bad.items()))}): "
                          "export the checkpoint with `hllm export --flavour standard` and build from that")


def build_plan(
    model: str | os.PathLike,
    plan_path: str | os.PathLike,
    profiles: list[Profile],
    *,
    timing_cache: str | os.PathLike | None = None,
    opt_level: int = 3,
    hardware_compat: str | None = None,
    target: str | None = None,
    workspace_gb: float | None = None,
    overwrite: bool = False,
    trt=None,
    device: DeviceInfo | None = None,
    progress=None,
) -> dict:
    """Build a strongly typed TensorRT plan from an export (directory or its ``.onnx``).

    Args:
        model: export directory (``export.json`` + ``model.onnx``) or the ``.onnx`` file.
        plan_path: the plan to write (atomic); its sidecar ``<plan>.json`` and tokenizer copy
            ``<plan>.tokenizer.json`` go beside it.
        profiles: optimization profiles, validated (min ≤ opt ≤ max, items ≤ K) before TensorRT starts.
        timing_cache: file read when present and written back after the build (reused across builds).
        opt_level: ``IBuilderConfig.builder_optimization_level`` 0..5 (TensorRT default 3).
        hardware_compat: ``none`` | ``ampere_plus`` | ``same_compute_capability``.
        target: e.g. ``a100``: see :func:`hllm.formats.plan.target_settings`.
        workspace_gb: workspace memory-pool limit (default: TensorRT's, the device memory).
        trt, device: the ``tensorrt`` module and build GPU (default: import / query them); tests pass stubs.
    Returns: the sidecar dict written.
    Raises: EngineError (TensorRT missing, not a standard-ONNX export, bad profile, parse or build
        failure), FileExistsError.
    """
    from hllm.runtime.artefact import resolve

    say = progress or (lambda msg: None)
    art = resolve(model)
    check_standard_graph(art)
    k = art.num_positions
    validate_profiles(profiles, k)
    if not 0 <= int(opt_level) <= 5:
        raise EngineError(f"--opt-level must be 0..5, got {opt_level}")
    precision = art.precision
    plan_path = Path(plan_path)
    if plan_path.exists() and not overwrite:
        raise FileExistsError(f"{plan_path} exists (use --overwrite)")
    trt = trt or import_tensorrt()
    api = trt_api(trt)
    device = device or device_info()
    settings = target_settings(target, device, hardware_compat, precision)

    hc = settings["hardware_compatibility"]
    builder, network, config, cache_reused = _configure(trt, api, art, profiles, opt_level, workspace_gb, hc,
                                                        timing_cache, say)
    say(f"building ({len(profiles)} profile(s), optimization level {opt_level}, hardware compatibility {hc})")
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError("TensorRT build failed (see the TensorRT log above)")
    data = bytes(memoryview(serialized))
    build_s = time.perf_counter() - t0
    with atomic_path(plan_path) as tmp:
        tmp.write_bytes(data)
    cache_path = Path(timing_cache) if timing_cache else None
    if cache_path:
        new_cache = bytes(memoryview(config.get_timing_cache().serialize()))
        with atomic_path(cache_path) as tmp:
            tmp.write_bytes(new_cache)
    tok_name = f"{plan_path.name}.tokenizer.json"
    with atomic_path(plan_path.parent / tok_name) as tmp:
        shutil.copy2(art.tokenizer_path, tmp)
    meta = _plan_sidecar(art, plan_path, data, tok_name, api, device, settings, opt_level, workspace_gb, profiles,
                         precision, cache_path, cache_reused, build_s)
    write_sidecar(plan_path, meta)
    return meta


def _configure(trt, api, art, profiles, opt_level: int, workspace_gb, hc: str, timing_cache, say):
    """Parse the ONNX graph into a strongly typed network and set up the builder config (optimization
    level, workspace, hardware compatibility, one optimization profile per :class:`Profile`, the
    timing cache). Returns (builder, network, config, timing cache reused). Raises EngineError."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(api.network_flags)
    parser = trt.OnnxParser(network, logger)
    say(f"parsing {art.path.name} (TensorRT {api.version}, strongly typed)")
    if not parser.parse_from_file(str(art.path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineError(f"TensorRT cannot parse {art.path}: {errors[:5]}")
    config = builder.create_builder_config()
    config.builder_optimization_level = int(opt_level)
    if workspace_gb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * 1024**3))
    if hc != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_LEVELS[hc])
    for p in profiles:
        prof = builder.create_optimization_profile()
        for name, (mn, opt, mx) in p.shapes(sidecar_reads_context(art.meta)).items():
            prof.set_shape(name, mn, opt, mx)
        if config.add_optimization_profile(prof) < 0:
            raise EngineError(f"TensorRT rejected optimization profile {p}")
    cache_path = Path(timing_cache) if timing_cache else None
    cache_reused = bool(cache_path and cache_path.is_file())
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_reused else b"")
    if not config.set_timing_cache(cache, False):
        raise EngineError(f"TensorRT rejected the timing cache {cache_path} (built by another TensorRT/GPU?); delete it")
    return builder, network, config, cache_reused


def _plan_sidecar(art, plan_path: Path, data: bytes, tok_name: str, api, device, settings: dict, opt_level: int,
                  workspace_gb, profiles, precision: Precision, cache_path, cache_reused: bool, build_s: float) -> dict:
    """The plan sidecar dict (:mod:`hllm.formats.plan` validates and writes it)."""
    m = art.meta
    return {
        "plan": plan_path.name,
        "plan_bytes": len(data),
        "plan_sha256": sha256_file(plan_path),
        "tensorrt_version": api.version,
        "tensorrt_code_path": f"{api.major}.x strongly typed",
        "cuda_runtime_version": device.cuda_runtime_version,
        "cuda_driver_version": device.cuda_driver_version,
        "gpu_name": device.gpu_name,
        "compute_capability": device.cc,
        "hardware_compatibility": settings["hardware_compatibility"],
        "version_compatible": False,
        "target": settings["target"],
        "builder_optimization_level": int(opt_level),
        "workspace_gb": workspace_gb,
        "profiles": [p.to_dict() for p in profiles],
        "precision": str(precision),
        "fp32_islands": m.get("fp32_islands"),
        "onnx": str(art.path),
        "onnx_sha256": m.get("onnx_sha256") or sha256_file(art.path),
        "source_checkpoint": m.get("source_checkpoint"),
        "num_positions": art.num_positions,
        "head": m.get("head"),
        "inputs": m.get("inputs"),
        "outputs": m.get("outputs"),
        "prompt": m["prompt"],
        "tokenizer": tok_name,
        "timing_cache": {"path": str(cache_path), "reused": cache_reused} if cache_path else None,
        "build_seconds": round(build_s, 2),
    }

