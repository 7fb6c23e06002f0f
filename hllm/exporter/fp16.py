"""FP16 graph with FP32 islands: the precision recipe for strongly typed TensorRT builds.

TensorRT 11 removed ``BuilderFlag.FP16`` and weak typing; a strongly typed network runs every tensor in
the type the ONNX graph gives it (TensorRT developer guide, "Strongly Typed Networks"). So precision is
decided here, in the graph: every float32 tensor becomes float16 except inside *islands* that stay
float32, with ``Cast`` nodes at island borders. The same graph builds on TensorRT 10.x and 11.x.

Islands (names used by ``hllm export --fp32-islands`` and recorded in ``export.json``):

``rmsnorm``
    every node of a ``*RMSNorm`` module (``x.pow(2).mean(-1)`` overflows float16 once |x| > 256).
``rotary``
    every node of a ``*RotaryEmbedding`` module (position × inv_freq in float16 has a spacing of 1 rad
    near position 1,024: cos/sin would be garbage; Hugging Face computes them in float32 too).
``softmax``
    every ``Softmax`` node (the logits are cast up, the probabilities back down).
``layernorm``
    every ``LayerNormalization`` node (the scoring head's norms).
``scores``
    the head's output projection and row mask (nodes whose innermost module is ``head`` or
    ``head.out``): the score matrix M is computed and returned in float32.
``residual`` (not in the default set)
    the residual ``Add`` of every ``*DecoderLayer``: the residual stream stays float32 (SmolLM2 carries
    activations of ~2·10⁴ in a few channels, where float16 spacing is 16).

Module islands: besides these op-class names, an island may name a module path of the exported model,
``backbone.layers.11.mlp`` or ``backbone.layers.3.self_attn`` (every node recorded inside that module stays
float32) — what ``hllm debug precision`` writes into an islands file. ``--fp32-islands FILE.json`` reads the
``islands`` list of such a file (:func:`read_islands_file`).

Nodes are assigned to islands from the module path the dynamo exporter records on each node
(read by :mod:`hllm.exporter.scopes`), so the pass needs an export made by
:func:`hllm.exporter.onnx.export_onnx`. Loading and saving graphs: :mod:`hllm.exporter.onnx_io`.

Why our own pass and not ModelOpt AutoCast (``modelopt.onnx.autocast``): see ``docs/tensorrt.md``
(measured); in short, AutoCast pins onnx 1.21 / onnxruntime-gpu and decides by data magnitudes,
while the islands here are named by module and tested structurally.

ONNX Runtime on CPU has few float16 kernels and silently runs float16 nodes in float32 (it inserts
casts and drops the float32→float16→float32 round trips between neighbouring nodes), which hides
float16 overflow. :func:`emulate_fp16` therefore rewrites a float16 graph into an explicit float32
emulation: float16 weights keep their float16 values (stored as float32) and every float16 tensor a
node produces is rounded through ``Cast(float16) → Cast(float32)`` (overflow → ±inf as on a GPU).
Not emulated: float16 accumulation *inside* one kernel (MatMul / ReduceMean sum in float32, as tensor
cores with float32 accumulate do).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import ExportError, HllmError
from hllm.exporter.onnx_io import FLOAT, FLOAT16, as_float32, model_like, tensor_types
from hllm.exporter.scopes import class_hierarchy, in_module, island_names, module_scopes, refuse_unmatched
from hllm.runtime.slates import loads_json

FP16_MAX = 65504.0

ISLANDS = ("rmsnorm", "rotary", "softmax", "layernorm", "scores", "residual")
DEFAULT_ISLANDS = ("rmsnorm", "rotary", "softmax", "layernorm", "scores")
# Ops whose inputs are read as they come (type-agnostic or producing non-float outputs only).
_PASSTHROUGH_INPUT_OPS = {"Shape", "Size", "IsNaN", "IsInf", "Cast", "CastLike"}


def parse_islands(text: str | None, what: str = "--fp32-islands") -> tuple[str, ...]:
    """``"rmsnorm,softmax"`` → ``("rmsnorm", "softmax")``; ``"none"`` → ``()``; None → defaults;
    ``"default,residual"`` → the defaults plus ``residual``.

    Raises: ExportError naming an unknown island, an empty entry (``""``, ``","``) or ``none`` beside islands
        (:func:`hllm.exporter.scopes.island_names`).
    """
    if text is None:
        return DEFAULT_ISLANDS
    names = tuple(island_names(text.split(","), what))
    if "default" in names:
        names = DEFAULT_ISLANDS + tuple(n for n in names if n != "default" and n not in DEFAULT_ISLANDS)
    bad = [n for n in names if n not in ISLANDS and not is_module_island(n)]
    if bad:
        raise ExportError(f"unknown FP32 island(s) {bad}; choose from {list(ISLANDS)}, a module path "
                          "(backbone.layers.N.mlp, backbone.layers.N.self_attn, head) or 'none'")
    return names


_MODULE_ISLAND = re.compile(r"^(backbone|head)(\.[A-Za-z0-9_]+)*$")


def is_module_island(name: str) -> bool:
    """True for a module-path island (``backbone.layers.11.mlp``, ``head``), see the module docstring."""
    return bool(_MODULE_ISLAND.match(name)) and name not in ISLANDS


def read_islands_file(path: str | os.PathLike) -> tuple[str, ...]:
    """The ``islands`` list of an islands file written by ``hllm debug precision`` (JSON object with an
    ``islands`` list of island names / module paths), validated by :func:`parse_islands`. The JSON is read
    strictly (:func:`hllm.runtime.slates.loads_json`: a duplicate key, ``NaN`` / ``Infinity``, deep nesting
    are refused — which of two ``islands`` lists was meant is unknowable).

    Raises: ExportError (unreadable file, not strict JSON, no ``islands`` list, an unknown island).
    """
    try:
        d = loads_json(Path(path).read_bytes(), f"islands file {path}")
    except OSError as e:
        raise ExportError(f"cannot read islands file {path}: {e.strerror or e}") from None
    except HllmError as e:
        raise ExportError(str(e)) from None
    isl = d.get("islands") if isinstance(d, dict) else None
    if not isinstance(isl, list) or not all(isinstance(x, str) for x in isl):
        raise ExportError(f"islands file {path}: expected a JSON object with an 'islands' list of strings")
    return parse_islands(",".join(isl) if isl else "none", f"islands file {path}:")


def module_island_of(node, islands: Sequence[str]) -> str | None:
    """The first module-path island of ``islands`` that ``node`` lies in (its recorded module scopes), or None."""
    return next((m for m in islands if is_module_island(m) and in_module(node, m)), None)


def island_of(node) -> str | None:
    """The island a node belongs to (one of :data:`ISLANDS`) or None (float16).

    Uses the op type and the dynamo exporter's module metadata on the node.
    """
    if node.op_type == "LayerNormalization":
        return "layernorm"
    if node.op_type == "Softmax":
        return "softmax"
    classes = class_hierarchy(node)
    if any(c.endswith("RMSNorm") for c in classes):
        return "rmsnorm"
    if any(c.endswith("RotaryEmbedding") for c in classes):
        return "rotary"
    if node.op_type == "Add" and len(classes) >= 2 and classes[-2].endswith("DecoderLayer"):
        return "residual"
    scopes = module_scopes(node)  # ['', 'head', 'head.out'] for the head's output projection
    if scopes and scopes[-1] in ("head", "head.out"):
        return "scores"
    return None


@dataclass
class PrecisionReport:
    """What :func:`convert_to_fp16` did. ``island_nodes`` counts float32 nodes per island;
    ``clipped_values`` counts finite float32 constants beyond ±65504 saturated to ±65504."""

    islands: list[str]
    fp16_nodes: int = 0
    fp32_nodes: int = 0
    island_nodes: dict = field(default_factory=dict)
    casts_inserted: int = 0
    initializers_fp16: int = 0
    initializers_fp32: int = 0
    clipped_values: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def convert_to_fp16(model, islands: tuple[str, ...] = DEFAULT_ISLANDS):
    """Float16 graph with float32 islands from a float32 ONNX model (in memory).

    Args:
        model: ``onnx.ModelProto`` exported by :func:`hllm.exporter.onnx.export_onnx` (float32,
            with value_info and the dynamo exporter's node metadata).
        islands: island names (see module docstring) kept in float32.
    Returns:
        ``(model_fp16, PrecisionReport)``. Graph inputs are unchanged (int64/bool); the ``scores``
        output stays float32 (a final Cast is added if the last node runs in float16).
    Raises:
        ExportError: a subgraph (If/Loop) is present, a node's float inputs cannot be typed, or a
            module-path island contains no node of the graph.
    """
    islands = tuple(islands)
    parse_islands(",".join(islands) or "none")
    refuse_unmatched([m for m in islands if is_module_island(m)],
                     {s for n in model.graph.node for s in module_scopes(n) if s})
    return _Fp16Rewrite(model, islands).run()


class _Fp16Rewrite:
    """One pass of :func:`convert_to_fp16`: node by node, each node runs in float16 unless its island
    is kept in float32; Casts are inserted (once per tensor and type) where the types meet."""

    def __init__(self, model, islands: tuple[str, ...]):
        self.model, self.islands = model, islands
        self.types = tensor_types(model)
        g = model.graph
        self.rep = PrecisionReport(islands=list(islands))
        self.inits = {t.name: t for t in g.initializer}
        self.dtype_now: dict[str, int] = {t.name: FLOAT for t in g.initializer if t.data_type == FLOAT}
        self.dtype_now.update({vi.name: vi.type.tensor_type.elem_type for vi in g.input})
        self.new_inits: dict[str, object] = {}
        self.casts: dict[tuple[str, int], str] = {}
        self.nodes: list = []

    def init_as(self, name: str, to: int) -> str:
        """An initializer in type ``to`` (a float16 copy is made once; values over the float16 range
        are clipped and counted, e.g. an additive mask of float32 min → -65504; ±inf stay ±inf)."""
        from onnx import numpy_helper

        if to == FLOAT:
            return name
        key = f"{name}__fp16"
        if key not in self.new_inits:
            arr = numpy_helper.to_array(self.inits[name])
            over = np.isfinite(arr) & (np.abs(arr) > FP16_MAX)
            if over.any():
                self.rep.clipped_values += int(over.sum())
                arr = np.clip(arr, -FP16_MAX, FP16_MAX)
            self.new_inits[key] = numpy_helper.from_array(arr.astype(np.float16), key)
        return key

    def value_as(self, name: str, to: int) -> str:
        """Tensor ``name`` in float type ``to``: itself, an initializer copy, or a (shared) Cast."""
        from onnx import helper

        if name in self.inits and self.inits[name].data_type == FLOAT:
            return self.init_as(name, to)
        have = self.dtype_now.get(name)
        if have is None:
            raise ExportError(f"no type known for tensor {name!r}; export with `hllm export`")
        if have == to or have not in (FLOAT, FLOAT16):
            return name
        key = (name, to)
        if key not in self.casts:
            out = f"{name}__to_{'fp16' if to == FLOAT16 else 'fp32'}"
            self.nodes.append(helper.make_node("Cast", [name], [out], to=to, name=f"hllm_cast_{out}"))
            self.dtype_now[out] = to
            self.casts[key] = out
            self.rep.casts_inserted += 1
        return self.casts[key]

    def node(self, node) -> None:
        """Rewrite one node into :attr:`nodes` in its precision (float32 inside an island)."""
        import onnx
        from onnx import numpy_helper

        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise ExportError(f"node {node.name} ({node.op_type}) has a subgraph; the FP16 pass does not handle them")
        isl = module_island_of(node, self.islands) or island_of(node)
        prec = FLOAT if isl in self.islands else FLOAT16
        if prec == FLOAT:
            self.rep.fp32_nodes += 1
            self.rep.island_nodes[isl] = self.rep.island_nodes.get(isl, 0) + 1
        else:
            self.rep.fp16_nodes += 1
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for i, name in enumerate(node.input):
            t = self.types.get(name, self.dtype_now.get(name)) if name else None
            if t not in (FLOAT, FLOAT16):
                continue
            if node.op_type in _PASSTHROUGH_INPUT_OPS:
                if name in self.inits and self.inits[name].data_type == FLOAT:
                    new.input[i] = self.init_as(name, FLOAT)
                continue
            new.input[i] = self.value_as(name, prec)
        if node.op_type == "Cast" and prec == FLOAT16:
            for a in new.attribute:
                if a.name == "to" and a.i == FLOAT:
                    a.i = FLOAT16
        if node.op_type in ("Constant", "ConstantOfShape") and prec == FLOAT16:
            for a in new.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
        for out in node.output:
            if self.types.get(out) == FLOAT:
                cast_to = next((a.i for a in new.attribute if a.name == "to"), None) if node.op_type == "Cast" else None
                self.dtype_now[out] = cast_to if cast_to is not None else prec
            elif out in self.types:
                self.dtype_now[out] = self.types[out]
        self.nodes.append(new)

    def keep_outputs_fp32(self) -> None:
        """Graph outputs keep their float32 type: a float16 producer gets a final Cast."""
        from onnx import helper

        for vo in self.model.graph.output:
            if vo.type.tensor_type.elem_type != FLOAT or self.dtype_now.get(vo.name) != FLOAT16:
                continue
            inner = f"{vo.name}__fp16"
            for n in self.nodes:
                n.output[:] = [inner if o == vo.name else o for o in n.output]
                n.input[:] = [inner if x == vo.name else x for x in n.input]
            self.nodes.append(helper.make_node("Cast", [inner], [vo.name], to=FLOAT, name=f"hllm_cast_{vo.name}"))
            self.dtype_now[inner], self.dtype_now[vo.name] = FLOAT16, FLOAT
            self.rep.casts_inserted += 1

    def value_info(self) -> list:
        """Typed value_info for every intermediate tensor (shapes copied from the float32 graph)."""
        import onnx

        g = self.model.graph
        io = {vo.name for vo in g.output} | {vi.name for vi in g.input}
        shapes = {vi.name: vi for vi in g.value_info}
        out = []
        for name, t in self.dtype_now.items():
            if name in self.inits or name in self.new_inits or name in io:
                continue
            base = shapes.get(name) or shapes.get(name.split("__")[0])
            vi = onnx.ValueInfoProto()
            if base is not None:
                vi.CopyFrom(base)
            vi.name = name
            vi.type.tensor_type.elem_type = t
            out.append(vi)
        return out

    def run(self):
        from onnx import helper

        g = self.model.graph
        for node in g.node:
            self.node(node)
        self.keep_outputs_fp32()
        used = {x for n in self.nodes for x in n.input}
        keep = [t for t in g.initializer if t.data_type != FLOAT or t.name in used]
        keep += [t for k, t in self.new_inits.items() if k in used]
        self.rep.initializers_fp16 = sum(1 for k in self.new_inits if k in used)
        self.rep.initializers_fp32 = sum(1 for t in keep if t.data_type == FLOAT)
        graph = helper.make_graph(self.nodes, g.name, list(g.input), list(g.output), keep, value_info=self.value_info())
        out = model_like(self.model, graph, "fp16")
        meta = out.metadata_props.add()
        meta.key, meta.value = "hllm.fp32_islands", ",".join(self.islands) or "none"
        return out, self.rep


def emulate_fp16(model):
    """Float32 emulation of a float16 graph for ONNX Runtime CPU (see module docstring).

    Every float16 initializer / Constant becomes float32 holding the same (float16) values; every
    float16 tensor a node produces is rounded by ``Cast(to=float16) → Cast(to=float32)`` right after
    the node, so values, rounding and overflow (±inf) match float16 storage, while each node computes
    in float32. Returns a new ``onnx.ModelProto`` whose tensors are all float32 / int / bool.
    """
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    fp16_values = {vi.name for vi in g.value_info if vi.type.tensor_type.elem_type == FLOAT16}
    fp16_values |= {vo.name for vo in g.output if vo.type.tensor_type.elem_type == FLOAT16}
    nodes = []
    for node in g.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.op_type in ("Constant", "ConstantOfShape"):
            for a in new.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT16:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
            nodes.append(new)
            continue
        rounded = []
        for i, o in enumerate(node.output):
            if o in fp16_values:
                new.output[i] = f"{o}__f32"
                rounded.append(o)
        if node.op_type == "Cast":
            for a in new.attribute:
                if a.name == "to" and a.i == FLOAT16:
                    a.i = FLOAT
        nodes.append(new)
        for o in rounded:
            nodes.append(helper.make_node("Cast", [f"{o}__f32"], [f"{o}__h"], to=FLOAT16, name=f"emu_round_{o}"))
            nodes.append(helper.make_node("Cast", [f"{o}__h"], [o], to=FLOAT, name=f"emu_back_{o}"))
    inits = []
    for t in g.initializer:
        if t.data_type == FLOAT16:
            inits.append(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        else:
            inits.append(t)
    value_info = as_float32(g.value_info)
    outputs = as_float32(g.output)
    return model_like(model, helper.make_graph(nodes, g.name, list(g.input), outputs, inits, value_info=value_info),
                       "fp16-emulated-fp32")


def fp32_islands_check(model) -> list[str]:
    """Structural check of a float16 graph; returns the list of violations (empty = fine).

    Checked: every ``ReduceMean`` / ``Pow`` / ``Sqrt`` / ``Reciprocal`` inside an RMSNorm module, every
    ``Softmax`` and ``LayerNormalization`` reads and writes float32 when its island is on; graph outputs
    are float32; no float32 ``MatMul`` outside islands (the bulk of the FLOPs must be float16).
    """
    g = model.graph
    islands = set()
    for p in model.metadata_props:
        if p.key == "hllm.fp32_islands" and p.value != "none":
            islands = set(p.value.split(","))
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output) + list(g.input)}
    for t in g.initializer:
        types[t.name] = t.data_type
    bad = []
    for n in g.node:
        isl = module_island_of(n, tuple(islands)) or island_of(n)
        float_io = [x for x in list(n.input) + list(n.output) if types.get(x) in (FLOAT, FLOAT16)]
        if n.op_type == "Cast" and n.name.startswith("hllm_cast_"):
            continue
        if isl in islands:
            wrong = [x for x in float_io if types[x] != FLOAT and not (n.op_type == "Cast")]
            if wrong:
                bad.append(f"{n.name} ({n.op_type}, island {isl}) has float16 tensors {wrong}")
        elif n.op_type in ("MatMul", "Gemm") and any(types.get(x) == FLOAT for x in n.input):
            bad.append(f"{n.name} ({n.op_type}) runs in float32 outside every island")
    for vo in g.output:
        if vo.type.tensor_type.elem_type != FLOAT:
            bad.append(f"output {vo.name} is not float32")
    return bad


def island_precision(original, converted) -> dict:
    """Per island, how many of its (non-Cast) nodes run in float32 vs float16 in ``converted``.

    Nodes are matched by name to ``original`` (the float32 export, which carries the module metadata);
    works for graphs converted by other tools (e.g. ModelOpt AutoCast, which drops node metadata).
    Returns ``{island: {"fp32": n, "fp16": n}}`` plus ``"other"`` for nodes outside every island.
    """
    isl = {n.name: island_of(n) for n in original.graph.node}
    g = converted.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output) + list(g.input)}
    types.update({i.name: i.data_type for i in g.initializer})
    out: dict = {}
    for n in g.node:
        if n.op_type == "Cast" or n.name not in isl:
            continue
        fl = [types[x] for x in list(n.input) + list(n.output) if types.get(x) in (FLOAT, FLOAT16)]
        if not fl:
            continue
        key = isl[n.name] or "other"
        prec = "fp16" if FLOAT16 in fl else "fp32"
        out.setdefault(key, {"fp32": 0, "fp16": 0})[prec] += 1
    return out
