"""The served model's names and version: ``--served-model-name`` and ``model_version``.

Names: the model answers to each of :attr:`ServedModel.names` (default :data:`DEFAULT_NAME`,
``hllm_ranker``, the Triton ensemble's name): the rerank ``model`` field and the KServe v2 model name
accept any of them, and ``GET /v1/models`` lists them (the OpenAI "list models" shape,
https://platform.openai.com/docs/api-reference/models/list, which Cohere-, Jina- and OpenAI-style
clients and gateways read).

Version (:func:`model_version`), from the artefact's sidecar (``export.json`` or the plan's ``.plan.json``):

1. its ``model_version`` key when that is a non-empty string (set it to a release name when exporting);
2. else ``sha256:`` + the first 12 hex digits of the graph's recorded hash (``onnx_sha256`` of an export,
   ``plan_sha256`` of a TensorRT plan): the same file always has the same version, a re-export with other
   weights a new one;
3. else (a checkpoint directory, an older sidecar without a hash) ``unversioned``.

Every response of the server carries it in the ``X-Model-Version`` header; the JSON bodies of
``/v1/rank``, the rerank routes, ``/v1/models`` and ``/readyz`` carry ``model_version``, and the KServe v2
inference response its ``model_version`` field (``/versions/1``, the Triton repository's version number,
stays accepted beside it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hllm.errors import HllmError

#: The default served name (that of the Triton ensemble ``hllm triton-repo`` writes).
DEFAULT_NAME = "hllm_ranker"
#: A served name: 1..128 characters of letters, digits and ``._:/-`` (a URL path segment for KServe needs no ``/``).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
UNVERSIONED = "unversioned"


def model_version(meta: dict | None) -> str:
    """The model version of an artefact whose sidecar is ``meta`` (the rule is in the module docstring)."""
    meta = meta or {}
    v = meta.get("model_version")
    if isinstance(v, str) and v.strip():
        return v.strip()[:128]
    for key in ("onnx_sha256", "plan_sha256"):
        h = meta.get(key)
        if isinstance(h, str) and re.fullmatch(r"[0-9a-f]{12,}", h):
            return f"sha256:{h[:12]}"
    return UNVERSIONED


@dataclass(frozen=True)
class ServedModel:
    """The names the served model answers to (the first is the one responses name by default) and its version.

    Raises: HllmError for no name, a duplicate, or a name outside :data:`NAME_RE`.
    """

    names: tuple[str, ...] = (DEFAULT_NAME,)
    version: str = UNVERSIONED

    def __post_init__(self):
        if not self.names:
            raise HllmError("--served-model-name: give at least one name")
        for n in self.names:
            if not isinstance(n, str) or not NAME_RE.fullmatch(n):
                raise HllmError(f"--served-model-name {str(n)[:200]!r}: 1..128 letters, digits and '._:-', "
                                "starting with a letter or digit")
        if len(set(self.names)) != len(self.names):
            raise HllmError(f"--served-model-name given twice: {sorted(n for n in self.names if self.names.count(n) > 1)[0]!r}")

    @property
    def name(self) -> str:
        """The primary name."""
        return self.names[0]

    def serves(self, name: str | None) -> bool:
        """True for None (the field left out) or one of the names."""
        return name is None or name in self.names

    def listing(self) -> dict:
        """``GET /v1/models``: ``{"object": "list", "data": [{"id", "object": "model", "owned_by", "model_version"}]}``."""
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "hllm",
                                            "model_version": self.version} for n in self.names]}
