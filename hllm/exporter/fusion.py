"""Graph rewrites of the exported hLLM graph: the portable ``standard`` flavour and the fused
``ort-cpu`` flavour (ONNX Runtime contrib ops).

Both start from the graph exported under :func:`hllm.exporter.patches.causal_sdpa_export`, where
every decoder attention is SDPA with the exporter's float causal mask (``Trilu``) and no NaN guard.

``standard`` (:func:`clean_standard`): only ``ai.onnx`` ops, for TensorRT and other runtimes. The one
rewrite drops ``Where(IsNaN(p), 0, p)`` after a ``Softmax`` (the exporter's guard for fully masked rows,
https://github.com/microsoft/onnxscript/pull/2479) that the scoring head's key-padding attention still
carries: every slate has at least one real item, and the exporter fills masked scores with the finite
``float32`` minimum, so no softmax row of this graph can be NaN. :func:`nonstandard_ops` lists what a
graph holds outside the ONNX standard (``hllm build`` refuses those).

``ort-cpu`` (:func:`fuse_for_ort`): onnxscript's ONNX Runtime fusions
(``onnxscript.rewriter.ort_fusions``, https://github.com/microsoft/onnxscript) turn RMSNorm into
``SimplifiedLayerNormalization`` / ``com.microsoft.SkipSimplifiedLayerNormalization`` and recognise the
rotary embedding and the SDPA core; one rule of this module (:class:`CausalGroupQueryAttention`) then
replaces each decoder layer's rotary + repeat-KV + causal SDPA with one
``com.microsoft.GroupQueryAttention`` (rotary inside, ``do_rotary=1``; contrib op spec:
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GroupQueryAttention).
onnxscript's own GQA rule needs an ``attention_mask`` input and a KV cache, which this graph does not
have. The scoring head's attention (key padding mask, not causal) becomes ``MultiHeadAttention``.

GQA inputs for the causal prefill without cache: ``seqlens_k[b] = S − 1`` for every row (right padding:
pads attend causally like real tokens and are never read), ``total_sequence_length = S``, and
``cos_cache`` / ``sin_cache`` = ``cos`` / ``sin`` of the graph's own rotary angles ``[S, head_dim/2]``
(positions 0..S−1, so no table of a fixed maximum length is baked in).
"""

from __future__ import annotations

import os
from collections import Counter

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.optimizer import optimize
from onnxscript.rewriter import pattern

from hllm.errors import ExportError

from hllm.files import copy_files
from hllm.formats.export import FLAVOURS  # noqa: E402,F401  (the one list of graph flavours)
from hllm.formats.export import ExportChange, derive_export, read_export
from hllm.formats.precision import Precision
FUSION_DOMAIN = "ai.onnxruntime._fusion"  # onnxscript's temporary fusion ops; none may survive


def nonstandard_ops(model) -> dict[str, int]:
    """``{"domain:op": count}`` of the nodes of ``model`` (``onnx.ModelProto``, ``onnx_ir.Model`` or a
    path, loaded without external data) that are not ONNX standard ops (``onnx.defs``): contrib ops in
    ``com.microsoft`` and ORT's ``SimplifiedLayerNormalization``, which it registers in the ONNX domain."""
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(str(model), load_external_data=False)
    if isinstance(model, onnx.ModelProto):
        nodes = [(n.domain, n.op_type) for n in _all_nodes_proto(model.graph)]
    else:
        nodes = [(n.domain, n.op_type) for n in model.graph.all_nodes()]
    bad = Counter(f"{d or 'ai.onnx'}:{t}" for d, t in nodes
                  if d not in ("", "ai.onnx") or not onnx.defs.has(t, ""))
    return dict(bad)


def _all_nodes_proto(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.g is not None and a.g.node:
                yield from _all_nodes_proto(a.g)


def op_counts(model) -> dict[str, int]:
    """``{"domain:op": count}`` over all nodes of an ``onnx_ir.Model`` (for sidecars and tests)."""
    return dict(Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.all_nodes()))


def _scalar(v):
    """The value of a one-element constant (initializer or ``Constant`` output), else None."""
    t = ir.convenience.get_const_tensor(v) if v is not None else None
    return t.numpy().reshape(-1)[0].item() if t is not None and t.size == 1 else None


def _nan_guard_rule():
    def guarded_softmax(op, x, zero):
        p = op.Softmax(x, _outputs=["p"])
        return op.Where(op.IsNaN(p), zero, p)

    def is_zero(context, zero, **_):
        return _scalar(zero) == 0

    def softmax(op, x, zero, p):
        return op.Softmax(x, axis=p.producer().attributes.get_int("axis", -1))

    return pattern.RewriteRule(guarded_softmax, softmax, is_zero, name="DropSoftmaxNanGuard")


def clean_standard(model) -> dict[str, int]:
    """Rewrite an exported ``onnx_ir.Model`` in place into the ``standard`` flavour (see the module
    docstring): drop the softmax NaN guards, and read every shape the graph computes from the graph
    inputs (:func:`_shapes_from_inputs`) so that the per-layer causal masks become one shared mask.
    Returns the counts of both rewrites."""
    n = pattern.RewriteRuleSet([_nan_guard_rule()]).apply_to_model(model)
    common_passes.ShapeInferencePass()(model)
    shapes = _shapes_from_inputs(model)
    common_passes.CommonSubexpressionEliminationPass()(model)
    optimize(model)  # removes what became dead
    return {"softmax_nan_guards_removed": n, "shapes_from_inputs": shapes}


def fuse_for_ort(model) -> dict[str, int]:
    """Rewrite an exported ``onnx_ir.Model`` in place into the ``ort-cpu`` flavour (see the module
    docstring). Returns the count of each fusion applied.

    Raises: ExportError if an onnxscript temporary fusion op survives (the graph would not load).
    """
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_rotary_embedding
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa
    from onnxscript.rewriter.ort_fusions.sdpa_via_mha import replace_sdpa_by_mha
    from onnxscript.rewriter.ort_fusions.skip_normalization import (fuse_skip_layer_normalization,
                                                                     fuse_skip_rms_normalization)

    counts = clean_standard(model)
    common_passes.ShapeInferencePass()(model)
    counts["rms_normalization"] = fuse_rms_normalization(model)
    counts["skip_rms_normalization"] = fuse_skip_rms_normalization(model)
    counts["skip_layer_normalization"] = fuse_skip_layer_normalization(model)
    counts["rotary_embedding"] = fuse_rotary_embedding(model)
    counts["sdpa"] = fuse_sdpa(model, apply_shape_inference=True)
    gqa_rules = [CausalGroupQueryAttention.rule(grouped=g) for g in (True, False)]
    counts["group_query_attention"] = pattern.RewriteRuleSet(gqa_rules).apply_to_model(model)
    counts["multi_head_attention"] = replace_sdpa_by_mha(model)
    _shapes_from_inputs(model)  # every layer's seqlens_k / total length from input_ids, shared after CSE
    common_passes.CommonSubexpressionEliminationPass()(model)
    optimize(model)  # inlines the rotary functions GQA did not absorb, removes dead nodes
    left = [f"{n.op_type}" for n in model.graph.all_nodes() if n.domain == FUSION_DOMAIN]
    if left:
        raise ExportError(f"ORT fusion left temporary ops {sorted(set(left))}: export with --flavour standard")
    model.opset_imports.setdefault("com.microsoft", 1)
    return counts


def _shapes_from_inputs(model) -> int:
    """Replace each ``Shape(x, start, end)`` whose dims are all known (ints, or symbolic dims of a
    graph input such as ``batch`` / ``seq``) by constants and ``Shape(input)`` slices. The exporter's
    SDPA lowering reads the batch and sequence length from the attention tensors themselves
    (``Shape(query)`` for the causal mask and the repeat-KV); rewired to the graph inputs, those
    tensors have no other use and the attention core can be replaced as a whole. Returns the count."""
    source = {}
    for inp in model.graph.inputs:
        for axis, d in enumerate(inp.shape or ()):
            if isinstance(d, ir.SymbolicDim) and d.value is not None:
                source.setdefault(d.value, (inp, axis))
    n = 0
    for node in list(model.graph):
        x = node.inputs[0] if node.op_type == "Shape" and node.domain == "" else None
        if x is None or x.shape is None or x in model.graph.inputs:
            continue
        rank = x.shape.rank()
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", rank)
        dims = list(x.shape)[slice(start, end)]
        if not dims or not all(isinstance(d, int) or (d.value in source) for d in dims):
            continue
        parts = []
        for d in dims:
            if isinstance(d, int):
                parts.append(ir.node("Constant", [], attributes={"value_ints": [d]}))
            else:
                inp, axis = source[d.value]
                parts.append(ir.node("Shape", [inp], attributes={"start": axis, "end": axis + 1}))
        cat = ir.node("Concat", [p.outputs[0] for p in parts], attributes={"axis": 0})
        model.graph.insert_before(node, [*parts, cat])
        ir.convenience.replace_all_uses_with(node.outputs[0], cat.outputs[0])
        n += 1
    return n


def _rotary_angles(cos4):
    """``cos4 = Unsqueeze(Cos(Concat(f, f, axis=-1)), [1])`` (the transformers rotary cache, broadcast
    over heads) → ``f [1, S, head_dim/2]``, the angles; None for any other producer chain."""
    node = cos4.producer()
    if node is None or node.op_type != "Unsqueeze":
        return None
    cos = node.inputs[0].producer()
    if cos is None or cos.op_type not in ("Cos", "Sin"):
        return None
    cat = cos.inputs[0].producer()
    if cat is None or cat.op_type != "Concat" or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1]:
        return None
    f = cat.inputs[0]
    if f.shape is None or f.shape.rank() != 3 or f.shape[0] != 1:
        return None
    return f


def _is_causal_mask(mask) -> bool:
    """``Where(Equal(Trilu(ones[S, S], upper=0), 0), lowest, 0)``: the exporter's causal mask
    (``torch_lib`` ``_causal_attention_mask``), square, lower triangle (diagonal included) visible."""
    where = mask.producer()
    if where is None or where.op_type != "Where" or mask.shape is None or mask.shape.rank() != 2:
        return False
    if mask.shape[0] != mask.shape[1]:
        return False
    eq = where.inputs[0].producer()
    lowest, zero = (_scalar(v) for v in where.inputs[1:])
    if eq is None or eq.op_type != "Equal" or lowest is None or zero != 0 or lowest > -1e30:
        return False
    tri = eq.inputs[0].producer()
    if tri is None or tri.op_type != "Trilu" or _scalar(eq.inputs[1]) != 0:
        return False
    upper = tri.attributes.get_int("upper", 1)
    k = tri.inputs[1] if len(tri.inputs) > 1 else None
    return upper == 0 and (k is None or _scalar(k) == 0)


class CausalGroupQueryAttention(pattern.RewriteRuleClassBase):
    """One decoder layer's attention core → ``com.microsoft.GroupQueryAttention``.

    Pattern (after onnxscript's RMSNorm, rotary and SDPA fusions), per projection ``x ∈ {q, k}``::

        x4 = Reshape(x_BSD) [B,S,H,Dh] → [SimplifiedLayerNormalization (Qwen3 q/k norm)]
           → Transpose(0,2,1,3) → RotaryEmbedding(cos, sin)                      (k: repeat-KV)
        v4 = Reshape(v_BSD) → Transpose(0,2,1,3)                                 (repeat-KV)
        out = Reshape(Transpose(SDPA(q, k, v, causal mask), (0,2,1,3)))  [B,S,H*Dh]
    """

    def __init__(self, grouped: bool):
        super().__init__(f"CausalGroupQueryAttention{'' if grouped else 'NoRepeat'}")
        self._grouped = grouped  # True: K/V heads repeated to the query heads (H > Hkv); False: H == Hkv

    def pattern(self, op, q_bsd, k_bsd, v_bsd, cos, sin, mask, k_axes, v_axes):
        def heads(x, name):
            x4 = op.Reshape(x, pattern.ANY_VALUE, _outputs=[f"{name}4"])
            normed = op.SimplifiedLayerNormalization(x4, pattern.ANY_VALUE, axis=-1, _outputs=[f"{name}_norm"])
            return op.Transpose(pattern.OrValue([normed, x4]), perm=[0, 2, 1, 3])

        def repeat_kv(x, axes):  # [B,Hkv,S,Dh] → Unsqueeze(2) → Expand [B,Hkv,G,S,Dh] → [B,H,S,Dh]
            return op.Reshape(op.Expand(op.Unsqueeze(x, axes), pattern.ANY_VALUE), pattern.ANY_VALUE)

        rope = dict(interleaved=0, _domain=FUSION_DOMAIN)
        q = op.RotaryEmbedding(heads(q_bsd, "q"), cos, sin, **rope)
        k = op.RotaryEmbedding(heads(k_bsd, "k"), cos, sin, **rope)
        v = op.Transpose(op.Reshape(v_bsd, pattern.ANY_VALUE, _outputs=["v4"]), perm=[0, 2, 1, 3])
        if self._grouped:
            k, v = repeat_kv(k, k_axes), repeat_kv(v, v_axes)
        attn = op.SDPA(q, k, v, mask, key_format="BHSd",
                       _domain=FUSION_DOMAIN, _outputs=["attn"])
        return op.Reshape(op.Transpose(attn, perm=[0, 2, 1, 3]), pattern.ANY_VALUE, _outputs=["out"])

    def check(self, context, q_bsd, k_bsd, v_bsd, cos, sin, mask, q4, k4, v4, out, k_axes=None, v_axes=None,
              **_):
        result = pattern.MatchResult()
        shapes = [x.shape for x in (q_bsd, k_bsd, v_bsd, q4, k4, v4, out)]
        if any(s is None for s in shapes) or [s.rank() for s in shapes] != [3, 3, 3, 4, 4, 4, 3]:
            return result.fail("q/k/v/output ranks are not [B,S,D] / [B,S,H,Dh]")
        h, hkv, dh = q4.shape[2], k4.shape[2], q4.shape[3]
        if (not all(isinstance(d, int) for d in (h, hkv, dh)) or h % hkv or k4.shape[3] != dh
                or v4.shape[2:] != k4.shape[2:]):
            return result.fail("head counts / head sizes unknown or inconsistent", [q4, k4, v4])
        for axes in (k_axes, v_axes):  # repeat-KV must put the copies of kv head j at heads j*G .. j*G+G-1
            if axes is not None and _scalar(axes) != 2:
                return result.fail("repeat-KV does not unsqueeze axis 2", axes)
        if self._grouped == (h == hkv):
            return result.fail("key/value heads are not repeated to the query heads", [k4, v4])
        if out.shape[2] != h * dh:
            return result.fail("output is not [B, S, H*Dh]", out)
        self._angles = _rotary_angles(cos)
        if self._angles is None or _rotary_angles(sin) is not self._angles or self._angles.shape[2] != dh // 2:
            return result.fail("rotary cos/sin are not cos/sin of one [1, S, Dh/2] angle tensor", [cos, sin])
        if not _is_causal_mask(mask):
            return result.fail("attention mask is not the exporter's causal mask", mask)
        self._heads = (h, hkv, dh)
        return result

    def rewrite(self, op, q_bsd, k_bsd, v_bsd, cos, sin, attn, q_norm=None, k_norm=None, **_):
        h, hkv, dh = self._heads
        to_3d = op.Constant(value_ints=[0, 0, -1])

        def heads(x, norm, n):  # [B,S,n*Dh] → [B,S,n,Dh]; the Qwen3 per-head RMSNorm is rebuilt (matched
            x4 = op.Reshape(x, op.Constant(value_ints=[0, 0, n, dh]))  # nodes are removed)
            if norm is None:
                return x4
            node = norm.producer()
            return op.SimplifiedLayerNormalization(x4, node.inputs[1], **node.attributes)

        def rotated(x4):  # x·cos + rotate_half(x)·sin in [B,S,n,Dh] layout → [B,S,n*Dh]
            c, s_ = (op.Transpose(t, perm=[0, 2, 1, 3]) for t in (cos, sin))  # [1,1,S,Dh] → [1,S,1,Dh]
            axis, lo, mid, hi = (op.Constant(value_ints=[v]) for v in (3, 0, dh // 2, dh))
            half = op.Concat(op.Neg(op.Slice(x4, mid, hi, axis)), op.Slice(x4, lo, mid, axis), axis=-1)
            return op.Reshape(op.Add(op.Mul(x4, c), op.Mul(half, s_)), to_3d)

        attrs = dict(num_heads=h, kv_num_heads=hkv, do_rotary=int(dh % 16 == 0), rotary_interleaved=0)
        scale = attn.producer().attributes.get("scale")
        if scale is not None:
            attrs["scale"] = scale.as_float()
        seq = op.Shape(q_bsd, start=1, end=2)  # [1] int64: S
        batch = op.Shape(q_bsd, start=0, end=1)  # [1] int64: B
        last = op.Cast(op.Sub(seq, op.Constant(value_ints=[1])), to=ir.DataType.INT32)
        seqlens_k = op.Expand(last, batch)  # [B] int32: S - 1 in every row
        total = op.Squeeze(op.Cast(seq, to=ir.DataType.INT32))  # scalar int32: S
        if attrs["do_rotary"]:  # ORT applies rotary inside GQA only for head_size % 16 == 0
            caches = [op.Reshape(f(self._angles), op.Constant(value_ints=[-1, dh // 2])) for f in (op.Cos, op.Sin)]
            q_in, k_in = (x if norm is None else op.Reshape(heads(x, norm, n), to_3d)
                          for x, norm, n in ((q_bsd, q_norm, h), (k_bsd, k_norm, hkv)))
        else:
            caches = [None, None]
            q_in, k_in = rotated(heads(q_bsd, q_norm, h)), rotated(heads(k_bsd, k_norm, hkv))
        out, _, _ = op.GroupQueryAttention(q_in, k_in, v_bsd, None, None, seqlens_k, total, *caches,
                                           **attrs, _domain="com.microsoft", _outputs=3)
        return out


def fuse_export(src: str | os.PathLike, dst: str | os.PathLike) -> dict:
    """Write the ``ort-cpu`` flavour of the fp32 ``standard`` export ``src`` into the new directory ``dst``
    without re-tracing: the saved graph is loaded with onnx_ir and rewritten by :func:`fuse_for_ort`
    (the standard graph is what the fused one starts from, less the NaN guards it already dropped).
    The other files are copied (never hard-linked: writing the output cannot change the input); the sidecar records the new graph's
    sha256, its fusion counts and ``fused_from`` (the source graph's sha256).

    Returns the fusion record. Raises: ExportError if ``src`` is not an fp32 standard export, ``dst``
    exists, or the attention fusion misses a decoder layer.
    """
    from pathlib import Path

    meta = read_export(src)
    dst = Path(dst)
    if meta.flavour != "standard" or meta.precision is not Precision.FP32:
        raise ExportError(f"{meta.root}: fusing needs an fp32 standard export, got {meta.precision.value} {meta.flavour}")
    if dst.exists():
        raise ExportError(f"{dst} exists; choose a new directory")
    model = ir.load(str(meta.onnx_path))
    counts = fuse_for_ort(model)
    ops = op_counts(model)
    layers = (meta.raw.get("backbone") or {}).get("num_layers")
    gqa = ops.get("com.microsoft:GroupQueryAttention", 0)
    if layers is not None and gqa != layers:
        raise ExportError(f"attention fusion matched {gqa} of {layers} decoder layers ({counts})")
    dst.mkdir(parents=True)
    copy_files(meta.root, dst, skip=("export.json", meta.onnx_path.name))
    out = dst / meta.onnx_path.name
    ir.save(model, str(out))
    fusion = {"rewrites": counts, "ops": dict(sorted(ops.items())), "opset": meta.raw.get("opset")}
    derive_export(meta, dst, ExportChange(flavour="ort-cpu", fusion=fusion, graph=out.name,  # ORT contrib ops now
                                          drop=("engine", "openvino"), extra={"fused_from": meta.raw.get("onnx_sha256")}))
    return fusion
