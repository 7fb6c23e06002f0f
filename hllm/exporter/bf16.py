"""BF16 GEMMs with FP32 islands: an explicitly typed graph that OpenVINO honours, and its exact CPU emulation.

Why a typed graph. OpenVINO's CPU plugin decides precision for the whole graph from
``INFERENCE_PRECISION_HINT``: under ``bf16`` it runs nearly every op in bfloat16 and ignores per-node
runtime info (``precise_0`` / ``disable_fp16_compression_0`` leave the scores bit-identical to plain bf16,
measured on OpenVINO 2026.4). So precision is decided here, in the ONNX graph, and the graph is compiled
with the ``f32`` hint: each matrix multiplication outside the islands reads ``Cast(bfloat16)`` inputs
(weights are stored as bfloat16 initializers), multiplies in bfloat16 and is cast back to float32; every
other op (RMSNorm, rotary, softmax, residual adds, the head's norms) stays float32. A bfloat16 ``MatMul`` in
the graph keeps its type through the f32 hint on a CPU with bf16 instructions; elsewhere OpenVINO converts
it to f32 (:func:`runtime_precisions` reads what the compiled model really runs).

BF16 GEMM semantics (Intel AVX512_BF16 ``VDPBF16PS`` and AMX ``TDPBF16PS``, Intel 64 and IA-32
Architectures Software Developer's Manual, Vol. 2): inputs are bfloat16 (float32 rounded to 8 significand
bits, round-to-nearest-even), products are summed in float32; the typed ``MatMul`` writes a bfloat16
result (the float32 accumulator rounded to nearest even, ``VCVTNEPS2BF16``).

Islands (names read by :func:`parse_islands`, written by ``hllm debug precision --precision bf16``):

op classes (every layer)
    ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (attention projections), ``attention`` (the attention
    scores: QKᵀ and PV matrix products of each decoder layer; the softmax is float32 anyway), ``gate_proj``,
    ``up_proj``, ``down_proj`` (the MLP), ``head`` (every matrix product of the scoring head), ``all``.
module paths
    ``backbone.layers.N`` (a whole decoder layer), ``backbone.layers.N.self_attn.q_proj``,
    ``backbone.layers.N.mlp.down_proj``, ... and ``backbone.layers.N.self_attn.attention`` for that layer's
    attention scores; a path covers every node recorded inside it (dynamo exporter module scopes, as in
    :mod:`hllm.exporter.fp16`).

The scoring head is an island by default (:data:`DEFAULT_ISLANDS`): it is < 1 % of the FLOPs and computes
the score matrix M itself.

:func:`emulate_bf16` turns a typed graph into a float32 twin for ONNX Runtime: bfloat16 weights become
float32 holding the same values and every bfloat16 tensor is rounded through ``Cast(bfloat16) →
Cast(float32)`` (ONNX Runtime's ``Cast`` rounds to nearest even, like ``VCVTNEPS2BF16``); each MatMul then
multiplies bf16-valued inputs with float32 accumulation — the bf16 GEMM above, up to summation order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from hllm.errors import ExportError
from hllm.exporter.onnx_io import model_like, tensor_types
from hllm.exporter.scopes import island_names, module_scopes, refuse_unmatched

FLOAT = 1  # onnx.TensorProto.FLOAT
BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16

#: Op classes of matrix products an island can name (module doc).
OP_CLASSES = ("q_proj", "k_proj", "v_proj", "o_proj", "attention", "gate_proj", "up_proj", "down_proj", "head")
DEFAULT_ISLANDS = ("head",)
_GEMM_OPS = ("MatMul", "Gemm")
# Ops that only move or select values (a bf16-valued input gives a bf16-valued output).
_VALUE_MOVING_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather",
                     "Expand", "Concat", "Split", "Neg"}
_MODULE = re.compile(r"^(backbone|head)(\.[A-Za-z0-9_]+)*$")


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → float32 holding the nearest bfloat16 value (round-to-nearest-even; ±inf, NaN kept; finite
    values beyond the bfloat16 range round to ±inf). Uses ``ml_dtypes.bfloat16`` (the NumPy bfloat16 type
    of JAX / ONNX). Same shape as ``x``."""
    import ml_dtypes

    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def parse_islands(text: str | Iterable[str] | None, what: str = "bf16 islands") -> tuple[str, ...]:
    """``"q_proj,attention"`` (or a list) → a tuple of island names; ``"none"`` → ``()``; None →
    :data:`DEFAULT_ISLANDS`; ``"default,..."`` adds the defaults. Names are op classes, ``all`` or module
    paths (module doc).

    Raises: ExportError naming an unknown island, an empty entry (``""``, ``","``) or ``none`` beside islands
        (:func:`hllm.exporter.scopes.island_names`).
    """
    if text is None:
        return DEFAULT_ISLANDS
    items = text.split(",") if isinstance(text, str) else list(text)
    names = island_names(items, what)
    if "default" in names:
        names = list(DEFAULT_ISLANDS) + [n for n in names if n != "default" and n not in DEFAULT_ISLANDS]
    bad = [n for n in names if n not in OP_CLASSES and n != "all" and not _MODULE.match(n)]
    if bad:
        raise ExportError(f"unknown bf16 FP32 island(s) {bad}; choose from {list(OP_CLASSES) + ['all']}, a module "
                          "path (backbone.layers.N, backbone.layers.N.self_attn.q_proj, "
                          "backbone.layers.N.self_attn.attention, backbone.layers.N.mlp.down_proj) or 'none'")
    return tuple(dict.fromkeys(names))


def check_islands(model, islands: Sequence[str]) -> tuple[str, ...]:
    """``islands`` parsed (:func:`parse_islands`), each module path checked to contain the site
    (:func:`node_site`) of at least one matrix product of ``model`` (an ``onnx.ModelProto``).

    Raises: ExportError (an unknown island; a module path that keeps nothing in float32, such as
        ``backbone.layers.99.mlp`` on a 2-layer model).
    """
    islands = parse_islands(list(islands) or "none")
    sites = {node_site(n)[1] for n in model.graph.node if n.op_type in _GEMM_OPS}
    refuse_unmatched([m for m in islands if m not in OP_CLASSES and m != "all"], sites - {None}, "matrix product")
    return islands


def node_site(node) -> tuple[str | None, str | None]:
    """``(op class, module path)`` of a matrix-product node from the exporter's module scopes, e.g.
    ``("q_proj", "backbone.layers.3.self_attn.q_proj")``, ``("attention", "backbone.layers.3.self_attn.attention")``,
    ``("head", "head.blocks.0.ff1")``; ``(None, None)`` when the node carries no scope (not from
    :func:`hllm.exporter.onnx.export_onnx`)."""
    sc = module_scopes(node)
    if not sc:
        return None, None
    mod = sc[-1]
    if mod == "head" or mod.startswith("head."):
        return "head", mod
    last = mod.rsplit(".", 1)[-1]
    if last in OP_CLASSES:
        return last, mod
    if last in ("self_attn", "attn"):
        return "attention", f"{mod}.attention"
    return None, mod


def in_islands(node, islands: Sequence[str]) -> bool:
    """Whether matrix-product ``node`` stays float32 under ``islands`` (op class, ``all`` or a module path
    containing the node's site)."""
    if "all" in islands:
        return True
    cls, mod = node_site(node)
    if cls is not None and cls in islands:
        return True
    if mod is None:
        return False
    return any(mod == m or mod.startswith(m + ".") for m in islands if m not in OP_CLASSES)


@dataclass
class Bf16Report:
    """What :func:`convert_to_bf16` did: matrix products in bf16 / kept fp32 (per op class), casts inserted,
    weights stored as bf16."""

    islands: list[str]
    bf16_gemms: int = 0
    fp32_gemms: int = 0
    by_class: dict = field(default_factory=dict)
    casts_inserted: int = 0
    roundings_inserted: int = 0
    weights_bf16: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def convert_to_bf16(model, islands: Sequence[str] = DEFAULT_ISLANDS):
    """The explicitly typed graph of the module doc, from a float32 ONNX model (in memory; not modified).

    Args:
        model: ``onnx.ModelProto`` from :func:`hllm.exporter.onnx.export_onnx` (flavour ``standard``: plain
            ``MatMul`` nodes with the exporter's module metadata). islands: names (module doc).
    Returns: ``(model_bf16, Bf16Report)``: every ``MatMul`` outside the islands reads bfloat16 inputs and
        writes a bfloat16 output that is cast back to float32; graph inputs/outputs are unchanged.
    Raises: ExportError (unknown island; a module-path island that contains no matrix product; a ``MatMul``
        whose inputs are not float32; no ``MatMul`` node carries module metadata, so islands could not be placed).
    """
    import onnx
    from onnx import helper, numpy_helper

    islands = check_islands(model, islands)
    g = model.graph
    types = tensor_types(model)
    inits = {t.name: t for t in g.initializer}
    rep = Bf16Report(islands=list(islands))
    nodes, new_inits, casts = [], {}, {}
    gemms = [n for n in g.node if n.op_type in _GEMM_OPS]
    if gemms and all(node_site(n) == (None, None) for n in gemms) and islands and islands != ("all",):
        raise ExportError("no matrix product carries the exporter's module metadata; export with `hllm export` "
                          "(islands are placed by module)")

    def as_bf16(name: str) -> str:
        if name in inits and inits[name].data_type == FLOAT:
            key = f"{name}__bf16"
            if key not in new_inits:
                import ml_dtypes

                arr = numpy_helper.to_array(inits[name]).astype(ml_dtypes.bfloat16)
                t = numpy_helper.from_array(arr, key)
                new_inits[key] = t
                rep.weights_bf16 += 1
            return key
        if types.get(name) != FLOAT:
            raise ExportError(f"matrix product input {name!r} is not float32; start from the float32 export")
        if name not in casts:
            if name in exact:  # already bf16-valued: the cast is exact, no rounding needed
                casts[name] = f"{name}__bf16_cast"
                nodes.append(helper.make_node("Cast", [name], [casts[name]], to=BFLOAT16,
                                              name=f"hllm_bf16_{casts[name]}"))
            else:
                casts[name] = round_then_cast(nodes, name)
                rep.roundings_inserted += 1
            rep.casts_inserted += 1
        return casts[name]

    exact: set[str] = set()  # float32 tensors that hold bfloat16 values (a bf16 product, moved around)
    for node in g.node:
        if node.op_type not in _GEMM_OPS:
            nodes.append(node)
            if node.op_type in _VALUE_MOVING_OPS and node.input and (
                    all(x in exact for x in node.input if types.get(x) == FLOAT) if node.op_type == "Concat"
                    else node.input[0] in exact):
                exact.update(o for o in node.output if types.get(o) == FLOAT)
            continue
        cls = node_site(node)[0] or "other"
        per = rep.by_class.setdefault(cls, {"bf16": 0, "fp32": 0})
        if node.op_type == "Gemm" or in_islands(node, islands):
            rep.fp32_gemms += 1
            per["fp32"] += 1
            nodes.append(node)
            continue
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[:] = [as_bf16(x) for x in node.input]
        out = node.output[0]
        new.output[0] = f"{out}__bf16"
        nodes.append(new)
        nodes.append(helper.make_node("Cast", [new.output[0]], [out], to=FLOAT, name=f"hllm_bf16_back_{out}"))
        exact.add(out)
        rep.casts_inserted += 1
        rep.bf16_gemms += 1
        per["bf16"] += 1
    used = {x for n in nodes for x in n.input}
    keep = [t for t in g.initializer if t.name in used] + [t for k, t in new_inits.items() if k in used]
    graph = helper.make_graph(nodes, g.name, list(g.input), list(g.output), keep, value_info=list(g.value_info))
    out = model_like(model, graph, "bf16-gemm")
    p = out.metadata_props.add()
    p.key, p.value = "hllm.fp32_islands", ",".join(islands) or "none"
    return out, rep


#: Veltkamp's splitting constant for float32 → 8 significand bits: 2**(24 - 8) + 1.
VELTKAMP_C = 65537.0


def round_then_cast(nodes: list, name: str) -> str:
    """Append nodes that round float32 tensor ``name`` to bfloat16 (round-to-nearest-even) in float32
    arithmetic and cast it to bfloat16; returns the bfloat16 tensor's name.

    Veltkamp's splitting (Dekker 1971, "A floating-point technique for extending the available precision",
    Numer. Math. 18): ``t = c·x``, ``hi = t − (t − x)`` with ``c = 2**16 + 1`` leaves the 8 leading
    significand bits of ``x`` rounded to nearest. The rounded value is exactly representable in bfloat16,
    so the ``Cast`` that follows is exact whatever rounding the runtime's conversion uses (OpenVINO 2026.4's
    CPU ``Convert`` f32→bf16 is not round-to-nearest-even; measured, ``docs/calibration.md``). Valid for
    |x| < 3.4e38 / 65537 ≈ 5.2e33 (beyond, ``c·x`` overflows to inf).
    """
    from onnx import helper

    c = "hllm_bf16_veltkamp_c"
    if not any(n.output[0] == c for n in nodes if n.op_type == "Constant"):
        nodes.insert(0, helper.make_node("Constant", [], [c], name=c, value=helper.make_tensor(
            c, FLOAT, [], [VELTKAMP_C])))
    t, d, r, out = (f"{name}__bf16_{k}" for k in ("t", "d", "r", "cast"))
    nodes += [helper.make_node("Mul", [name, c], [t], name=f"hllm_bf16_{t}"),
              helper.make_node("Sub", [t, name], [d], name=f"hllm_bf16_{d}"),
              helper.make_node("Sub", [t, d], [r], name=f"hllm_bf16_{r}"),
              helper.make_node("Cast", [r], [out], to=BFLOAT16, name=f"hllm_bf16_{out}")]
    return out


def emulate_bf16(model):
    """Float32 twin of a typed graph from :func:`convert_to_bf16` for ONNX Runtime on any CPU (module doc).

    bfloat16 initializers become float32 with the same values; every node output typed bfloat16 is rounded
    by ``Cast(to=bfloat16) → Cast(to=float32)`` and ``Cast(to=bfloat16)`` nodes keep rounding (their output
    is cast back to float32). Returns a new ``onnx.ModelProto`` whose float tensors are all float32.
    """
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    bf = {t.name for t in g.initializer if t.data_type == BFLOAT16}
    nodes = []
    for node in g.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.op_type == "Cast" and any(a.name == "to" and a.i == BFLOAT16 for a in node.attribute):
            o = node.output[0]
            new.output[0] = f"{o}__h"
            nodes += [new, helper.make_node("Cast", [f"{o}__h"], [o], to=FLOAT, name=f"emu_back_{o}")]
            bf.add(o)
            continue
        if node.op_type in _GEMM_OPS and any(x in bf for x in node.input):
            o = node.output[0]
            new.output[0] = f"{o}__f32"
            nodes += [new, helper.make_node("Cast", [f"{o}__f32"], [f"{o}__h"], to=BFLOAT16, name=f"emu_round_{o}"),
                      helper.make_node("Cast", [f"{o}__h"], [o], to=FLOAT, name=f"emu_back_{o}")]
            bf.add(o)
            continue
        if node.op_type == "Cast" and any(x in bf for x in node.input):
            # Cast(bfloat16 → float32) of a value already held in float32
            nodes.append(helper.make_node("Identity", list(node.input), list(node.output), name=node.name))
            continue
        nodes.append(new)
    inits = [numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
             if t.data_type == BFLOAT16 else t for t in g.initializer]
    value_info = []
    for vi in g.value_info:
        if vi.type.tensor_type.elem_type == BFLOAT16:
            continue
        value_info.append(vi)
    return model_like(model, helper.make_graph(nodes, g.name, list(g.input), list(g.output), inits,
                                               value_info=value_info), "bf16-gemm-emulated-fp32")


def gemm_flops(model, feeds: dict) -> dict[str, float]:
    """Floating-point operations of every matrix product for one input (``2·m·n·k`` per ``MatMul``), keyed by
    node name; shapes come from ONNX shape inference on the graph with ``feeds``' shapes fixed.

    Args: model: the float32 export. feeds: ``{input name: array}`` (one encoded slate).
    Returns: ``{node name: flops}`` (0 where a shape is unknown).
    """
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for vi in m.graph.input:
        if vi.name in feeds:
            shape = vi.type.tensor_type.shape
            for d, n in zip(shape.dim, np.shape(feeds[vi.name])):
                d.Clear()
                d.dim_value = int(n)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        return {}
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    for t in m.graph.initializer:
        shapes[t.name] = list(t.dims)
    out = {}
    for n in m.graph.node:
        if n.op_type != "MatMul":
            continue
        a, y = shapes.get(n.input[0]), shapes.get(n.output[0])
        out[n.name] = float(2 * np.prod(y) * a[-1]) if a and y and all(a) and all(y) else 0.0
    return out


def flop_shares(model, feeds: dict) -> dict[str, float]:
    """The share of the matrix-product FLOPs of each op class (:data:`OP_CLASSES`, ``other``) for one input;
    sums to 1 (empty when shapes cannot be inferred)."""
    fl = gemm_flops(model, feeds)
    total = sum(fl.values())
    if not total:
        return {}
    out: dict[str, float] = {}
    for n in model.graph.node:
        if n.name in fl:
            cls = node_site(n)[0] or "other"
            out[cls] = out.get(cls, 0.0) + fl[n.name] / total
    return out


def fp32_share(model, feeds: dict, islands: Sequence[str]) -> float:
    """The share of matrix-product FLOPs that ``islands`` keep in float32 for one input (0 … 1)."""
    fl = gemm_flops(model, feeds)
    total = sum(fl.values())
    if not total:
        return float("nan")
    isl = parse_islands(list(islands) or "none")
    kept = sum(fl[n.name] for n in model.graph.node if n.name in fl and in_islands(n, isl))
    return kept / total


def runtime_precisions(compiled) -> dict[str, int]:
    """Counts of OpenVINO's executed ops by ``(layer type, runtime precision)`` in a compiled model
    (``CompiledModel.get_runtime_model()`` op runtime info ``layerType`` / ``runtimePrecision``), e.g.
    ``{"FullyConnected:bf16": 60, "MatMul:f32": 4}``: what the CPU plugin really runs."""
    out: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ops():
        rt = op.get_rt_info()
        lt = str(rt["layerType"].astype(str)) if "layerType" in rt else op.get_type_name()
        pr = str(rt["runtimePrecision"].astype(str)) if "runtimePrecision" in rt else "?"
        key = f"{lt}:{pr}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
