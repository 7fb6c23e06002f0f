"""Where an ONNX node came from in the PyTorch module tree: the one reader of the exporter's node metadata.

The dynamo exporter (``torch.onnx.export(..., dynamo=True)``, used by :func:`hllm.exporter.onnx.export_onnx`)
stores on each node two metadata properties (PyTorch docs, "torch.onnx: TorchDynamo-based ONNX exporter",
node metadata):

* ``pkg.torch.onnx.name_scopes`` — the module scopes from the root down to the op, as a Python list literal:
  ``['', 'backbone', 'backbone.layers.0', 'backbone.layers.0.mlp', 'linear_3']`` (the last entry names the op
  itself, the first is the root module);
* ``pkg.torch.onnx.class_hierarchy`` — the module classes along the same path
  (``[..., 'LlamaDecoderLayer', 'LlamaMLP', 'Linear']``).

The FP16 and BF16 island rewrites (:mod:`hllm.exporter.fp16`, :mod:`hllm.exporter.bf16`), the quantizers'
graph parts (:mod:`hllm.calibration.recipes.parts`) and the activation statistics read them only through this module.
A node without metadata (a graph not made by ``hllm export``) has no scopes and no module path.
"""

from __future__ import annotations

import ast
import re
from typing import Iterable, Sequence

from hllm.errors import ExportError

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
#: ``layers.I`` inside a module path: decoder block I.
BLOCK_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def _literal_list(text: str | None) -> list[str]:
    """A metadata value (Python list literal) as a list of strings; ``[]`` if absent or unreadable."""
    if not text:
        return []
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else []


def _prop(node, key: str) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == key), None)


def module_scopes(node) -> list[str]:
    """The module scopes of an ``onnx.NodeProto``, root first, without the op's own entry
    (``['', 'backbone', ..., 'backbone.layers.0.mlp']``); ``[]`` for a node without metadata."""
    return _literal_list(_prop(node, NAME_SCOPES))[:-1]


def class_hierarchy(node) -> list[str]:
    """The module class names along the node's scope path, root first (``[..., 'LlamaMLP', 'Linear']``);
    ``[]`` for a node without metadata."""
    return _literal_list(_prop(node, CLASS_HIERARCHY))


def module_path(node) -> str:
    """The innermost PyTorch module path a node came from (``backbone.layers.0.mlp.up_proj``), or ``""``."""
    mods = [s for s in module_scopes(node) if s]
    return mods[-1] if mods else ""


def in_module(node, path: str) -> bool:
    """Whether ``node`` was recorded inside module ``path`` (the path itself or one of its submodules)."""
    return any(s == path or s.startswith(path + ".") for s in module_scopes(node))


def block_index(path: str) -> int | None:
    """Decoder block index of a module path (``backbone.layers.3.mlp`` → 3); None for the scoring head
    (``head…``) and for a path outside every block."""
    if path.startswith("head"):
        return None
    m = BLOCK_RE.search(path)
    return int(m.group(1)) if m else None


def island_names(items: Iterable[str], what: str) -> list[str]:
    """The island names of a comma list split into ``items`` (or a file's list), stripped, ``none`` left out.

    ``none`` is the one spelling of "no island": an empty value or an empty entry (``''``, ``','``,
    ``'rmsnorm,,softmax'``: an unset shell variable, a stray comma) and ``none`` beside other islands are
    refused, since the two readings (no island / a mistake) export different graphs.

    Args: items: the entries; what: the option or file named in the message (``--fp32-islands``).
    Raises: ExportError naming the empty entry or the mix.
    """
    names = [str(s).strip() for s in items]
    if any(not n for n in names):
        raise ExportError(f"{what} {','.join(names)!r} holds an empty island name: give island names "
                          "separated by single commas, or 'none' for no island")
    if "none" in names and len(set(names)) > 1:
        raise ExportError(f"{what} {','.join(names)!r} holds 'none' beside islands: give either 'none' or islands")
    return [n for n in names if n != "none"]


def refuse_unmatched(islands: Sequence[str], paths: Iterable[str], what: str = "node") -> None:
    """Refuse module-path islands that contain none of ``paths`` (the module paths an island can place).

    Args:
        islands: module-path islands (``backbone.layers.11.mlp``; op-class names are not passed here).
        paths: the module paths of the graph's nodes an island may cover (every node's scopes for the FP16
            pass, each matrix product's site for the BF16 pass).
        what: what the graph lacks, for the message ("node", "matrix product").
    Raises: ExportError naming every island that would keep nothing in float32 (a ``layers.99`` of a
        2-layer model, a misspelt module), with the graph's decoder blocks when it has any.
    """
    paths = set(paths)
    bad = [m for m in islands if not any(p == m or p.startswith(m + ".") for p in paths)]
    if not bad:
        return
    blocks = sorted({b for p in paths if (b := block_index(p)) is not None})
    hint = f"; its decoder blocks are backbone.layers.{blocks[0]}…{blocks[-1]}" if blocks else ""
    raise ExportError(f"FP32 island(s) {bad} name no {what} of this graph (an island must keep at least one "
                      f"{what} in float32){hint}")
