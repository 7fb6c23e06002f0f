"""``hllm build``: a strongly typed TensorRT plan from an exported ONNX graph (TensorRT 10.x and 11.x),
built through Polygraphy's loaders (``polygraphy.backend.trt``, Polygraphy 0.53.6; docs
https://docs.nvidia.com/deeplearning/tensorrt/polygraphy/docs/backend/trt/loader.html and config.html).

Build: ``NetworkFromOnnxPath(onnx, strongly_typed=…)`` (TensorRT ``OnnxParser.parse_from_file`` into a
strongly typed network on 10.x; 11.x networks are always strongly typed) → ``CreateConfig(profiles=[one
polygraphy ``Profile`` per :class:`hllm.formats.profiles.Profile`, min/opt/max per input],
builder_optimization_level, hardware_compatibility_level, memory_pool_limits={WORKSPACE: bytes},
load_timing_cache=file)`` → ``EngineBytesFromNetwork(..., save_timing_cache=file)`` (TensorRT
``build_serialized_network``; the timing cache is merged and written back) → plan written atomically,
plus the sidecar of :mod:`hllm.formats.plan` and a copy of the tokenizer. No precision builder flag
is set (precision lives in the graph); Polygraphy's ``CreateConfig`` clears TF32, so the FP32 islands
run in IEEE FP32. The version-dependent part (strongly typed flag) comes from
:func:`hllm.engines.tensorrt.runner.trt_api`, shared with the runner.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hllm.engines.tensorrt.profiles import validate_profiles
from hllm.engines.tensorrt.runner import device_info, import_tensorrt, polygraphy_calls, trt_api
from hllm.engines.tensorrt.targets import DeviceInfo, target_settings
from hllm.errors import EngineError
from hllm.files import atomic_path
from hllm.reading import sha256_file
from hllm.formats.graph import sidecar_reads_context
from hllm.formats.plan import write_sidecar
from hllm.formats.precision import Precision
from hllm.formats.profiles import Profile
from hllm.runtime.artefact import resolve

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
    device: DeviceInfo | None = None,
    progress=None,
) -> dict:
    """Build a strongly typed TensorRT plan from an export (directory or its ``.onnx``) with Polygraphy.

    Args:
        model: export directory (``export.json`` + ``model.onnx``) or the ``.onnx`` file.
        plan_path: the plan to write (atomic); its sidecar ``<plan>.json`` and tokenizer copy
            ``<plan>.tokenizer.json`` go beside it.
        profiles: optimization profiles, validated (min ≤ opt ≤ max, items ≤ K) before TensorRT starts.
        timing_cache: file read when present and written back (merged) after the build.
        opt_level: ``builder_optimization_level`` 0..5 (TensorRT default 3).
        hardware_compat: ``none`` | ``ampere_plus`` | ``same_compute_capability``.
        target: e.g. ``a100``: see :func:`hllm.engines.tensorrt.targets.target_settings`.
        workspace_gb: workspace memory-pool limit in GiB (default: TensorRT's, the device memory).
        device: the build GPU (default: :func:`hllm.engines.tensorrt.runner.device_info`).
    Returns: the sidecar dict written.
    Raises: EngineError (TensorRT / Polygraphy missing, not a standard-ONNX export, bad profile,
        parse or build failure), FileExistsError.
    """
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
    trt = import_tensorrt()
    api = trt_api(trt)
    device = device or device_info()
    settings = target_settings(target, device, hardware_compat, precision)
    hc = settings["hardware_compatibility"]
    cache_path = Path(timing_cache) if timing_cache else None
    cache_reused = bool(cache_path and cache_path.is_file())
    network, config = polygraphy_loaders(trt, api, art, profiles, opt_level, workspace_gb, hc, cache_path)
    say(f"building {art.path.name} with TensorRT {api.version} ({len(profiles)} profile(s), optimization level "
        f"{opt_level}, hardware compatibility {hc})")
    from polygraphy.backend.trt import EngineBytesFromNetwork

    t0 = time.perf_counter()
    with polygraphy_calls(f"building a TensorRT plan from {art.path}", stdout_to_stderr=True):
        serialized = EngineBytesFromNetwork(network, config=config,
                                            save_timing_cache=str(cache_path) if cache_path else None)()
    data = bytes(memoryview(serialized))
    build_s = time.perf_counter() - t0
    with atomic_path(plan_path, overwrite=overwrite) as tmp:  # checked again at the commit: no silent replace
        tmp.write_bytes(data)
    tok_name = f"{plan_path.name}.tokenizer.json"
    with atomic_path(plan_path.parent / tok_name) as tmp:
        shutil.copy2(art.tokenizer_path, tmp)
    meta = _plan_sidecar(art, plan_path, data, tok_name, api, device, settings, opt_level, workspace_gb, profiles,
                         precision, cache_path, cache_reused, build_s)
    write_sidecar(plan_path, meta)
    return meta


def polygraphy_profiles(profiles: list[Profile], context: bool) -> list:
    """hllm's profiles as Polygraphy ``Profile`` objects: ``Profile().add(name, min, opt, max)`` for every
    graph input (``context_positions`` too when ``context``), shapes from :meth:`Profile.shapes`."""
    from polygraphy.backend.trt import Profile as PgProfile

    out = []
    for p in profiles:
        pg = PgProfile()
        for name, (mn, opt, mx) in p.shapes(context).items():
            pg.add(name, mn, opt, mx)
        out.append(pg)
    return out


def polygraphy_loaders(trt, api, art, profiles: list[Profile], opt_level: int, workspace_gb, hc: str,
                       cache_path: Path | None):
    """The two Polygraphy loaders of a build (lazy: nothing runs until called).

    Returns: (``NetworkFromOnnxPath`` — strongly typed on 10.x —, ``CreateConfig`` with one profile per
    hllm profile, ``builder_optimization_level``, ``hardware_compatibility_level`` (None for ``none``),
    ``memory_pool_limits`` {``MemoryPoolType.WORKSPACE``: bytes} (None without ``workspace_gb``) and
    ``load_timing_cache`` (a missing file means an empty cache)).
    """
    from polygraphy.backend.trt import CreateConfig, NetworkFromOnnxPath

    network = NetworkFromOnnxPath(str(art.path), strongly_typed=api.strongly_typed_flag)
    pools = {trt.MemoryPoolType.WORKSPACE: int(workspace_gb * 1024**3)} if workspace_gb else None
    level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_LEVELS[hc]) if hc != "none" else None
    with polygraphy_calls("configuring the TensorRT builder"):
        config = CreateConfig(profiles=polygraphy_profiles(profiles, sidecar_reads_context(art.meta)),
                              builder_optimization_level=int(opt_level), hardware_compatibility_level=level,
                              memory_pool_limits=pools, load_timing_cache=str(cache_path) if cache_path else None)
    return network, config


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

