"""What NVIDIA's tools read, written from hllm's own contracts (numpy only; no TensorRT, no Polygraphy).

* :func:`polygraphy_inputs_json`: engine inputs as the JSON file ``polygraphy run --load-inputs`` reads —
  a ``List[Dict[str, np.ndarray]]`` serialized like ``polygraphy.json.save_json``: every array is an
  object ``{"array": base64(np.save(array, allow_pickle=False)), "polygraphy_class": "ndarray"}``
  (Polygraphy ``polygraphy/json/serde.py``, ``Encoder.register(np.ndarray)``; ``constants.TYPE_MARKER``
  is ``"polygraphy_class"``; docs "Using Custom Input Data", ``--load-inputs``). No pickle anywhere.
* :func:`trtexec_command` / :func:`polygraphy_convert_command`: the command lines that build the same
  plan as ``hllm build`` (:func:`hllm.exporter.plan.build_plan`): the ONNX graph, one optimization
  profile per :class:`hllm.formats.profiles.Profile` (min/opt/max shapes per input), strongly typed,
  builder optimization level, timing cache, hardware compatibility level, workspace pool limit.
  Flags from TensorRT ``samples/common/sampleOptions.cpp`` (trtexec: ``--profile=I`` before each extra
  profile's ``--minShapes/--optShapes/--maxShapes``; ``--hardwareCompatibilityLevel=none|ampere+|
  sameComputeCapability``; ``--memPoolSize=workspace:N`` in MiB) and Polygraphy
  ``tools/args/backend/trt/{config,loader}.py`` (``--trt-min-shapes`` etc. once per profile,
  ``--hardware-compatibility-level`` takes ``trt.HardwareCompatibilityLevel`` names).
  The plan they write has no hllm sidecar (``<plan>.json``): ``hllm build`` is what makes a plan that
  ``hllm rank`` / ``serve`` load; these lines are for reproducing and debugging a build.
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import Sequence

import numpy as np

from hllm.formats.profiles import Profile

POLYGRAPHY_TYPE_MARKER = "polygraphy_class"
_TRTEXEC_HARDWARE = {"none": None, "ampere_plus": "ampere+", "same_compute_capability": "sameComputeCapability"}


def polygraphy_array(array: np.ndarray) -> dict:
    """One array as Polygraphy's JSON encoder writes it (``.npy`` bytes, base64, no pickle)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), POLYGRAPHY_TYPE_MARKER: "ndarray"}


def polygraphy_inputs_json(feeds: Sequence[dict[str, np.ndarray]]) -> str:
    """A list of feed dicts (input name → array, in graph input order) as the text of a Polygraphy
    ``--load-inputs`` JSON file (4-space indent, as ``polygraphy.json.to_json``)."""
    return json.dumps([{name: polygraphy_array(a) for name, a in feed.items()} for feed in feeds], indent=4)


def read_polygraphy_inputs(text: str) -> list[dict[str, np.ndarray]]:
    """Decode a Polygraphy inputs JSON (the inverse of :func:`polygraphy_inputs_json`; ``allow_pickle=False``).

    Raises: ValueError for anything that is not a list of feed dicts of encoded arrays.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("a Polygraphy inputs file holds a JSON list of feed dicts")
    feeds = []
    for feed in data:
        if not isinstance(feed, dict):
            raise ValueError("every feed is a JSON object of input name → array")
        arrays = {}
        for name, enc in feed.items():
            if not isinstance(enc, dict) or enc.get(POLYGRAPHY_TYPE_MARKER) != "ndarray":
                raise ValueError(f"input {name!r} is not an encoded ndarray")
            arrays[name] = np.load(io.BytesIO(base64.b64decode(enc["array"], validate=True)), allow_pickle=False)
        feeds.append(arrays)
    return feeds


def _dims(shape: Sequence[int], sep: str) -> str:
    return sep.join(str(int(d)) for d in shape)


def trtexec_command(onnx: str | os.PathLike, plan: str | os.PathLike, profiles: Sequence[Profile], *, context: bool = False,
                    opt_level: int = 3, timing_cache: str | os.PathLike | None = None,
                    hardware_compat: str = "none", workspace_gb: float | None = None) -> list[str]:
    """``trtexec`` argv that builds ``plan`` from ``onnx`` like ``hllm build`` (no inference run).

    Args: profiles: the optimization profiles; context: the graph has ``context_positions``;
        hardware_compat: ``none`` | ``ampere_plus`` | ``same_compute_capability``.
    Raises: ValueError for an unknown hardware compatibility level.
    """
    if hardware_compat not in _TRTEXEC_HARDWARE:
        raise ValueError(f"unknown hardware compatibility {hardware_compat!r}; known: {list(_TRTEXEC_HARDWARE)}")
    argv = ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}", "--stronglyTyped", "--skipInference",
            f"--builderOptimizationLevel={int(opt_level)}"]
    for i, p in enumerate(profiles):
        shapes = p.shapes(context)
        if len(profiles) > 1:
            argv.append(f"--profile={i}")
        for which, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes")):
            argv.append(flag + "=" + ",".join(f"{name}:{_dims(s[which], 'x')}" for name, s in shapes.items()))
    if timing_cache:
        argv.append(f"--timingCacheFile={timing_cache}")
    if _TRTEXEC_HARDWARE[hardware_compat]:
        argv.append(f"--hardwareCompatibilityLevel={_TRTEXEC_HARDWARE[hardware_compat]}")
    if workspace_gb:
        argv.append(f"--memPoolSize=workspace:{workspace_gb * 1024:g}M")
    return argv


def polygraphy_convert_command(onnx: str | os.PathLike, plan: str | os.PathLike, profiles: Sequence[Profile], *,
                               context: bool = False, opt_level: int = 3, timing_cache: str | os.PathLike | None = None,
                               hardware_compat: str = "none", workspace_gb: float | None = None) -> list[str]:
    """``polygraphy convert`` argv that builds the same plan as :func:`trtexec_command`."""
    if hardware_compat not in _TRTEXEC_HARDWARE:
        raise ValueError(f"unknown hardware compatibility {hardware_compat!r}; known: {list(_TRTEXEC_HARDWARE)}")
    argv = ["polygraphy", "convert", str(onnx), "--convert-to", "trt", "-o", str(plan), "--strongly-typed",
            "--builder-optimization-level", str(int(opt_level))]
    for p in profiles:
        shapes = p.shapes(context)
        for which, flag in enumerate(("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")):
            argv += [flag, *(f"{name}:[{_dims(s[which], ',')}]" for name, s in shapes.items())]
    if timing_cache:
        argv += ["--load-timing-cache", str(timing_cache), "--save-timing-cache", str(timing_cache)]
    if hardware_compat != "none":
        argv += ["--hardware-compatibility-level", hardware_compat]
    if workspace_gb:
        argv += ["--pool-limit", f"workspace:{int(workspace_gb * 1024**3)}"]
    return argv
