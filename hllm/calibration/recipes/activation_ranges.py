"""Per-layer ranges of the activations that INT8 quantizes: the SmoothQuant question, measured.

Static INT8 gives each MatMul input one scale per tensor. Activation outliers concentrated in a few
channels stretch that scale, so every other channel is rounded coarsely; SmoothQuant (Xiao et al. 2023,
"SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language Models",
https://arxiv.org/abs/2211.10438, §3, Fig. 4) migrates them into the weights. Whether a checkpoint
needs it is read from three figures per activation tensor, measured here on real slates:

* ``max_abs`` — max |x| over all real tokens and channels (the per-tensor MinMax range);
* ``p99_9`` — the 99.9th percentile of |x| over the same values (how far the max sits above the bulk);
* ``outlier_ratio`` — max over channels of the channel's abs-max divided by the median over channels of
  the channel's abs-max (≫ 1: a few channels carry the range, the SmoothQuant case).

Tensors: the activation input of every weight ``MatMul`` / ``Gemm`` of the decoder blocks (module paths
``…layers.I…`` from the exporter's node metadata, :func:`hllm.exporter.scopes.module_path`); one entry
per tensor with the MatMuls it feeds (q/k/v share the normed hidden state, gate/up the MLP input). The
FP32 export is run with ONNX Runtime (CPU) with those tensors added as graph outputs; pad positions
(``≥ lengths[b]``) are left out. Percentiles come from a histogram of |x| keyed by the top 16 bits of the
float32 bit pattern (exponent + 7 mantissa bits: bins of relative width ≤ 2⁻⁷ = :data:`RESOLUTION`),
interpolated linearly inside the bin; max and channel abs-max are exact.

Imports numpy, onnx and onnxruntime only (no torch).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.calibration.recipes.parts import weight_matmuls
from hllm.errors import EngineError
from hllm.exporter.scopes import block_index, module_path
from hllm.formats.precision import Precision
from hllm.runtime.artefact import resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer

RESOLUTION = 2.0 ** -7  # relative width of one |x| histogram bin (float32 with 7 mantissa bits kept)
_BINS = 1 << 16


def decoder_matmul_inputs(model) -> dict[str, dict]:
    """``{tensor name: {"layer": I, "matmuls": [module paths]}}`` for the activation input of every weight
    MatMul/Gemm of decoder block I (the scoring head's are left out), in graph order.

    Raises: EngineError if the graph carries no module metadata (no decoder MatMul found).
    """
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    out: dict[str, dict] = {}
    for n in weight_matmuls(model):
        path = module_path(n)
        layer = block_index(path)
        if layer is None:
            continue
        x = next(i for i in n.input if i not in consts)
        entry = out.setdefault(x, {"layer": layer, "matmuls": []})
        entry["matmuls"].append(path)
    if not out:
        raise EngineError("no decoder-block MatMul with module metadata in this graph (export it with `hllm export`)")
    return out


class AbsStats:
    """Running statistics of |x| for one activation tensor with ``channels`` channels (last axis).

    ``update(x)`` takes ``[T, C]`` float32 rows (real tokens only); :meth:`to_dict` gives the figures of
    the module docstring. Raises EngineError for a non-finite value or a channel count that changes.
    """

    def __init__(self, channels: int):
        self.channels = channels
        self.count = 0
        self.chan_absmax = np.zeros(channels, np.float32)
        self.hist = np.zeros(_BINS, np.int64)

    def update(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float32)).reshape(-1, self.channels)
        if not np.isfinite(a).all():
            raise EngineError("non-finite activation (the FP32 graph overflowed on this slate)")
        if a.size == 0:
            return
        np.maximum(self.chan_absmax, a.max(axis=0), out=self.chan_absmax)
        self.hist += np.bincount((a.view(np.uint32) >> 16).ravel(), minlength=_BINS)
        self.count += a.size

    def percentile(self, q: float) -> float:
        """The q-th percentile of |x| (numpy's linear definition), within one bin (relative :data:`RESOLUTION`)."""
        if not self.count:
            raise EngineError("no activation values recorded")
        rank = q / 100.0 * (self.count - 1)  # 0-based position in the sorted values
        cum = np.cumsum(self.hist)
        b = int(np.searchsorted(cum, rank, side="right"))
        before = cum[b - 1] if b else 0
        lo, hi = (np.array([k << 16], np.uint32).view(np.float32)[0] for k in (b, b + 1))
        est = float(lo) + (float(hi) - float(lo)) * (rank - before + 0.5) / self.hist[b]
        return min(est, float(self.chan_absmax.max()))

    def to_dict(self, q: float = 99.9, top: int = 4) -> dict:
        """``max_abs``, ``p99_9`` (key named after ``q``), ``outlier_ratio`` (None when the median channel
        abs-max is 0), ``channel_absmax_median``, ``top_channels`` ([[index, abs-max], …], largest first),
        ``channels``, ``values`` (count)."""
        cmax = self.chan_absmax.astype(np.float64)
        med = float(np.median(cmax))
        idx = np.argsort(-cmax, kind="stable")[:top]
        return {
            "max_abs": float(cmax.max()),
            f"p{q:g}".replace(".", "_"): self.percentile(q),
            "outlier_ratio": float(cmax.max() / med) if med > 0 else None,
            "channel_absmax_median": med,
            "top_channels": [[int(i), float(cmax[i])] for i in idx],
            "channels": self.channels,
            "values": int(self.count),
        }


def _session(onnx_path: Path, tensors: Sequence[str], threads: int | None):
    """An ORT CPU session of the graph with ``tensors`` added as float outputs."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                              for t in tensors if t not in have)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or 0
    if model.ByteSize() < 1_900_000_000:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory() as tmp:  # > 2 GB: protobuf cannot serialize it in one piece
        onnx.save(model, os.path.join(tmp, "m.onnx"), save_as_external_data=True, location="m.data")
        return ort.InferenceSession(os.path.join(tmp, "m.onnx"), opts, providers=["CPUExecutionProvider"])


def activation_ranges(
    export_dir: str | os.PathLike,
    slates: Sequence[dict],
    batch_size: int = 1,
    threads: int | None = None,
    q: float = 99.9,
    on_progress: Callable[[int], None] | None = None,
) -> dict:
    """Measure the module docstring's figures on ``slates`` with the FP32 export ``export_dir``.

    Args:
        export_dir: an FP32 export (either flavour) or its ``.onnx``.
        slates: real slates (JSONL dicts), encoded with the export's own prompt builder.
        batch_size: slates per run (pads are excluded from the statistics).
        threads: ORT intra-op threads (None = ORT default).
        q: the percentile reported (``p99_9`` for 99.9).
        on_progress: called with the number of slates after each batch.
    Returns: JSON-serializable ``{"export", "onnx_sha256", "slates", "tokens", "percentile", "resolution",
        "layers": [{"layer": I, "inputs": [{"tensor", "matmuls", "max_abs", "p99_9", "outlier_ratio",
        "channel_absmax_median", "top_channels", "channels", "values"}, …]}, …], "worst": {…}}`` where
        ``worst`` names the tensor with the largest outlier ratio.
    Raises: EngineError (not an FP32 ONNX export, no decoder metadata, a non-finite activation, an
        activation whose leading axes are not ``[B, S]``), SlateError (bad slates).
    """
    import onnx

    if not slates:
        raise EngineError("activation ranges need at least one slate")
    if not 0 < q < 100:
        raise EngineError(f"percentile must be in (0, 100), got {q}")
    art = resolve(export_dir)
    if art.kind != "onnx" or art.precision is not Precision.FP32:
        raise EngineError(f"{export_dir}: activation ranges are measured on an FP32 ONNX export")
    targets = decoder_matmul_inputs(onnx.load(str(art.path), load_external_data=False))
    names = list(targets)
    sess = _session(art.path, names, threads)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    stats: dict[str, AbsStats] = {}
    tokens = 0
    for i in range(0, len(slates), max(1, batch_size)):
        b = builder.encode(list(slates[i : i + batch_size]))
        outs = dict(zip(names, sess.run(names, b.inputs(art.graph_inputs))))
        B, S = b.input_ids.shape
        real = np.arange(S)[None, :] < b.lengths[:, None]  # [B, S]
        tokens += int(real.sum())
        for t, x in outs.items():
            if x.ndim != 3 or x.shape[:2] != (B, S):
                raise EngineError(f"activation {t} has shape {x.shape}, expected [B={B}, S={S}, C]")
            stats.setdefault(t, AbsStats(x.shape[2])).update(x[real])
        if on_progress is not None:
            on_progress(len(b.input_ids))
    layers: dict[int, list] = {}
    for t in names:
        layers.setdefault(targets[t]["layer"], []).append(
            {"tensor": t, "matmuls": targets[t]["matmuls"], **stats[t].to_dict(q)})
    flat = [e for es in layers.values() for e in es if e["outlier_ratio"] is not None]
    worst = max(flat, key=lambda e: e["outlier_ratio"], default=None)
    return {
        "export": str(art.path.parent), "onnx_sha256": art.meta.get("onnx_sha256"),
        "slates": len(slates), "tokens": tokens, "percentile": q, "resolution": RESOLUTION,
        "layers": [{"layer": i, "inputs": layers[i]} for i in sorted(layers)],
        "worst": None if worst is None else {k: worst[k] for k in ("tensor", "matmuls", "outlier_ratio", "max_abs")},
    }
