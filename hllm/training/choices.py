"""Named choices the CLI offers and the library checks, each defined once here (torch-free, so ``--help``
needs no torch).

* :data:`OBJECTIVES` — what ``hllm train --objective`` fits (:mod:`hllm.training.targets`): the clicked
  items (``clicks``), a teacher's ranking (``teacher``), or both (``clicks+teacher``).
* :data:`AGGREGATIONS` — how the embedding teacher (:mod:`hllm.teacher.embedding`) turns a candidate's
  cosine similarities to the history titles into one score: their ``max``, their ``mean``, or the
  similarity to the history ``centroid``.
"""

from __future__ import annotations

OBJECTIVES = ("clicks", "teacher", "clicks+teacher")
AGGREGATIONS = ("max", "mean", "centroid")
