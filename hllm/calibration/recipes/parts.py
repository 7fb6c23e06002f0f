"""Graph parts for the quantizers: which nodes a part name covers, which MatMuls carry weights, and what a
quantized graph ended up with.

Parts that must stay in higher precision are named, resolved to node names through the module path
the exporter stores on each node (:mod:`hllm.exporter.scopes`):

``head`` (scoring head), ``norms``, ``attention`` (``*.self_attn``), ``mlp``, ``first`` / ``last``
(first / last decoder block), ``block:I`` (block I, negative from the end), or any module path
prefix such as ``backbone.layers.3.mlp.down_proj``, or an exact node name.

In static mode only MatMuls with a constant (weight) input are quantized (:func:`activation_matmuls` are
kept float): the attention score/value MatMuls, the additive masks and the norms stay float (a quantized
−inf mask would get an infinite scale). A quantized graph is checked afterwards: no op of
:data:`hllm.calibration.recipes.options.FLOAT_OPS` may read a tensor rounded to 8 bits
(:func:`float_ops_fed_by_quantized`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from hllm.calibration.recipes.options import DEFAULT_OP_TYPES, FLOAT_OPS, QuantOptions
from hllm.errors import EngineError
from hllm.exporter.scopes import block_index, module_path

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
             "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "MatMulNBits"}
_ROUNDED_OUTPUT_OPS = {"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul"}
_NORM_OPS = {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
             "SkipSimplifiedLayerNormalization"}


def _is_norm(node, path: str) -> bool:
    if node.op_type in _NORM_OPS:
        return True
    last = path.rsplit(".", 1)[-1]
    return "norm" in last.lower()


def num_blocks(model) -> int:
    """Number of decoder blocks (``layers.I`` module paths) in the graph."""
    idx = [i for n in model.graph.node if (i := block_index(module_path(n))) is not None]
    return max(idx) + 1 if idx else 0


def nodes_in_part(model, part: str) -> list[str]:
    """Names of the nodes belonging to ``part`` (part names: module docstring).

    Raises: EngineError if the part matches no node (a typo must not silently quantize everything).
    """
    nodes = list(model.graph.node)
    paths = {n.name: module_path(n) for n in nodes}
    if not any(paths.values()) and part not in {n.name for n in nodes}:
        raise EngineError(
            f"cannot resolve part {part!r}: the graph carries no module metadata (export it with `hllm export`); "
            "pass node names instead"
        )
    L = num_blocks(model)

    def block(i: int) -> Callable:
        i = i + L if i < 0 else i
        return lambda n, p: block_index(p) == i

    if part == "head":
        pred = lambda n, p: p == "head" or p.startswith("head.")  # noqa: E731
    elif part == "norms":
        pred = _is_norm
    elif part == "attention":
        pred = lambda n, p: ".self_attn" in p and not p.startswith("head")  # noqa: E731
    elif part == "mlp":
        pred = lambda n, p: ".mlp" in p and not p.startswith("head")  # noqa: E731
    elif part == "first":
        pred = block(0)
    elif part == "last":
        pred = block(-1)
    elif part.startswith("block:"):
        try:
            i = int(part.split(":", 1)[1])
        except ValueError:
            raise EngineError(f"bad part {part!r}: expected block:INDEX") from None
        if not -L <= i < L:
            raise EngineError(f"part {part!r}: the graph has {L} blocks")
        pred = block(i)
    else:
        pred = lambda n, p: n.name == part or p == part or p.startswith(part + ".")  # noqa: E731
    out = [n.name for n in nodes if pred(n, paths[n.name])]
    if not out:
        raise EngineError(f"part {part!r} matches no node of the graph")
    return out


def excluded_nodes(model, options: QuantOptions) -> list[str]:
    """Node names to keep in float for ``options`` (parts resolved + explicit names), sorted, unique.

    Raises: EngineError for an unknown node name, a part that matches nothing, or parts asked of a graph
        where a node to quantize (``options.op_types``) carries no module path: it could not be placed in
        any part, so an exclusion could silently miss it.
    """
    names = set(options.exclude_nodes)
    known = {n.name for n in model.graph.node}
    unknown = names - known
    if unknown:
        raise EngineError(f"exclude_nodes not in the graph: {sorted(unknown)[:5]}")
    if options.exclude:
        blind = [n.name for n in model.graph.node if n.op_type in options.op_types and not module_path(n)]
        if blind:
            raise EngineError(f"{len(blind)} {'/'.join(options.op_types)} nodes carry no module path "
                              f"({', '.join(blind[:3])}): parts cannot be resolved on this graph; pass node names "
                              "(--exclude-node) or re-export with `hllm export`")
    for part in options.exclude:
        names.update(nodes_in_part(model, part))
    return sorted(names)


def activation_matmuls(model, op_types: Sequence[str] = DEFAULT_OP_TYPES) -> list[str]:
    """Names of ``op_types`` nodes none of whose inputs is a constant (initializer or Constant output):
    activation × activation products such as attention scores ``Q·Kᵀ`` and ``P·V``."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node if n.op_type in op_types and not any(i in consts for i in n.input)]


def weight_matmuls(model, op_types: Sequence[str] = DEFAULT_OP_TYPES) -> list:
    """The ``op_types`` nodes with a constant input (the weight projections the INT8 backends quantize),
    in graph order; the complement of :func:`activation_matmuls`."""
    act = set(activation_matmuls(model, op_types))
    return [n for n in model.graph.node if n.op_type in op_types and n.name not in act]


def float_ops_fed_by_quantized(model) -> list[str]:
    """Names of the :data:`FLOAT_OPS` nodes (contrib attention, rotary, fused norms) of a quantized graph
    that read a tensor rounded to 8 bits (output of ``DequantizeLinear``, ``QLinearMatMul`` …; the float
    outputs of ``MatMulInteger`` → scale, ``MatMulIntegerToFloat`` or ``MatMulNBits`` are not rounded).
    Empty for a graph whose contrib ops all run on unrounded float tensors."""
    producer = {o: n for n in model.graph.node for o in n.output}
    return [n.name for n in model.graph.node if n.op_type in FLOAT_OPS and any(
        (p := producer.get(i)) is not None and p.op_type in _ROUNDED_OUTPUT_OPS for i in n.input)]


def quantized_nodes(model) -> list[str]:
    """Names of the compute nodes that run quantized: ``MatMul``/``Gemm`` with an input produced by a
    ``DequantizeLinear`` (QDQ format) and integer compute ops (``MatMulInteger``, ``QLinearMatMul`` …,
    QOperator / dynamic format)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    integer_ops = QUANT_OPS - {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
    out = []
    for n in model.graph.node:
        if n.op_type in integer_ops or (n.op_type in ("MatMul", "Gemm") and any(
            (p := producer.get(i)) is not None and p.op_type == "DequantizeLinear" for i in n.input
        )):
            out.append(n.name)
    return out


def qdq_summary(model) -> dict:
    """Counts of quantization ops in a graph: ``{op_type: count}`` for QUANT_OPS, plus ``quantized_nodes``."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type in QUANT_OPS:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return {"ops": counts, "quantized_nodes": len(quantized_nodes(model))}


def sensitivity_ladder(model, ranges: dict[str, float] | None = None) -> list[str]:
    """Parts to keep in float, most sensitive first, for the automatic mode.

    ``head`` first (it writes the scores directly), then decoder blocks. With calibration ranges
    (ORT cache) the blocks are ordered by the largest activation magnitude entering their quantized
    MatMuls (per-tensor INT8 activation scales grow with it, so the rounding step is coarsest
    there); without, from the ends inward (last, first, second-to-last, second …).
    """
    L = num_blocks(model)
    ladder = ["head"] if any(module_path(n).startswith("head") for n in model.graph.node) else []
    if L == 0:
        return ladder
    if ranges:
        score = {i: 0.0 for i in range(L)}
        for n in model.graph.node:
            b = block_index(module_path(n))
            if n.op_type in DEFAULT_OP_TYPES and b is not None:
                score[b] = max(score[b], *(ranges.get(i, 0.0) for i in n.input))
        blocks = sorted(range(L), key=lambda i: -score[i])
    else:
        blocks = []
        lo, hi = 0, L - 1
        while lo <= hi:
            blocks.append(hi)
            if lo != hi:
                blocks.append(lo)
            lo, hi = lo + 1, hi - 1
    return ladder + [f"block:{i}" for i in blocks]

