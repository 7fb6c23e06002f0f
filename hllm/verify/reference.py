"""The FP32 reference of the gate (:mod:`hllm.verify.gate`): its scores, computed once per run, and the
content-keyed cache of them (``calibrate --reference-scores``).

A cache is used only when it provably holds what is asked for (:class:`ReferenceKey`): the sha256 of the graph
file that produced it, K, and per slate the sha256 of its encoded graph inputs (docs/hardening.md, "What a
``calibrate --reference-scores`` cache is keyed by"). Layout: an ``.npz`` (NumPy ``savez``) of
:data:`REFERENCE_FORMAT`, whose members' headers are checked before they are read
(:class:`hllm.formats.npz.CheckedNpz`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hllm.errors import ParityError
from hllm.files import atomic_path
from hllm.formats.npz import CheckedNpz
from hllm.reading import sha256_file
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.ranker import Ranker
from hllm.runtime.slates import slate_ids
from hllm.verify.scoring import score_slates


def cpu_ranker(path, threads: int | None = None):
    """The :class:`hllm.runtime.Ranker` the gate runs an export with: ONNX Runtime, CPU provider only
    (a quantized graph is compared on the CPU that calibrated it; FP8 graphs get ``basic`` graph
    optimizations in :func:`hllm.runtime.artefact.open_engine`). ``path``: an export path or an already
    resolved :class:`hllm.runtime.artefact.Artefact`."""
    return Ranker.from_path(path, providers=["CPUExecutionProvider"], threads=threads)


def ranker_scores(ranker, slates: Sequence[dict], batch_size: int = 1, on_progress=None) -> list[np.ndarray]:
    """Per-slate score matrices ``[n_i, K]`` float32 of one :class:`hllm.runtime.Ranker` (its builder)."""
    with ranker:
        return score_slates([ranker.engine], ranker.builder, slates, batch_size, on_progress)[0]


def reference_scores(reference, slates: Sequence[dict], batch_size: int = 1, on_progress=None) -> list[np.ndarray]:
    """Scores of the FP32 reference (path or Ranker), computed once per gate run."""
    ref = reference if isinstance(reference, Ranker) else cpu_ranker(reference)
    return ranker_scores(ref, slates, batch_size, on_progress)


#: The layout of a reference-score cache (``calibrate --reference-scores``); other files are refused.
REFERENCE_FORMAT = "hllm-reference-scores/2"


@dataclass(frozen=True)
class ReferenceKey:
    """What reference scores were computed from — a cache is used only when all of it matches.

    Attributes:
        graph_sha256: sha256 (hex) of the graph file that produced the scores (``model.onnx``; the same
            hash as the export sidecar's ``onnx_sha256``). Never empty.
        num_positions: K, the second dimension of every score matrix.
        slate_keys: per slate, the sha256 (hex) of its encoded graph inputs (:func:`input_key`): the token
            ids, readout positions, item mask (and context position) the graph reads for that slate alone.
        slate_ids: per slate, its id (:func:`hllm.runtime.slates.slate_id`), for messages only.
        n_items: per slate, its number of candidates (the first dimension of its score matrix).
    """

    graph_sha256: str
    num_positions: int
    slate_keys: tuple[str, ...]
    slate_ids: tuple[str, ...]
    n_items: tuple[int, ...]


def input_key(feeds: dict) -> str:
    """sha256 (hex) of one slate's encoded graph inputs ``{name: array}`` (name, dtype, shape and bytes of
    each, in the graph's input order): equal keys mean the graph sees the same inputs."""
    import hashlib

    h = hashlib.sha256()
    for name, a in feeds.items():
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def reference_key(artefact, slates: Sequence[dict]) -> ReferenceKey:
    """The :class:`ReferenceKey` of ``slates`` run through the export ``artefact``
    (:class:`hllm.runtime.artefact.Artefact`): the graph file's sha256, K, and each slate encoded alone
    by the export's prompt builder and tokenizer, hashed as the graph would read it
    (:func:`hllm.formats.graph.feed_dict`).

    Raises: SlateError (a slate that does not encode), CheckpointError (tokenizer).
    """
    builder = PromptBuilder(load_tokenizer(artefact.tokenizer_path), artefact.prompt, max_items=artefact.num_positions)
    keys = tuple(input_key(builder.encode([s]).inputs(artefact.graph_inputs)) for s in slates)
    return ReferenceKey(sha256_file(artefact.path), int(artefact.num_positions), keys, tuple(slate_ids(slates)),
                        tuple(len(s["candidates"]) for s in slates))


def save_reference(path, scores: Sequence[np.ndarray], key: ReferenceKey) -> None:
    """Save reference score matrices (one ``[n_i, K]`` float32 per slate of ``key``) with what they were
    computed from (:class:`ReferenceKey`: graph hash, K, each slate's input hash, its id) as an ``.npz``
    of layout :data:`REFERENCE_FORMAT`, written atomically, so later gate runs can skip the FP32 pass.

    Raises: ValueError if ``scores`` do not match ``key`` (count, shape) or hold a non-finite value (such a
        reference is never cached); OSError from writing.
    """
    if not key.graph_sha256:
        raise ValueError("reference scores need the graph's sha256 to be cached")
    if len(scores) != len(key.slate_keys):
        raise ValueError(f"{len(scores)} score matrices for {len(key.slate_keys)} slates")
    arrays = {}
    for i, (a, n) in enumerate(zip(scores, key.n_items)):
        a = np.asarray(a, dtype=np.float32)
        if a.shape != (n, key.num_positions) or not np.isfinite(a).all():
            raise ValueError(f"slate {key.slate_ids[i]}: scores of shape {a.shape} (expected {(n, key.num_positions)}) "
                             "or with non-finite values are not cached")
        arrays[f"scores/{i}"] = a
    arrays.update(format=np.array(REFERENCE_FORMAT), graph_sha256=np.array(key.graph_sha256),
                  num_positions=np.array(key.num_positions, dtype=np.int64),
                  slate_keys=np.array(key.slate_keys, dtype=str), slate_ids=np.array(key.slate_ids, dtype=str))
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_reference(path, key: ReferenceKey) -> list[np.ndarray]:
    """The cached reference scores of the slates of ``key``, found by the hash of each slate's inputs (any
    subset of the saved slates, in ``key``'s order), after proving the cache holds what is asked for.

    Returns: one ``[n_i, K]`` float32 matrix per slate of ``key``.
    Raises: ParityError naming the cache file (never the export) when it is not a readable ``.npz`` of
        layout :data:`REFERENCE_FORMAT` (each member's header is checked before it is read:
        :class:`hllm.formats.npz.CheckedNpz`), records no or another graph hash, another K, has no scores
        for some slate's inputs (other slates, the same ids with other candidates, another prompt or
        tokenizer, a cache cut short), a matrix of another shape, or a non-finite score.
    """
    fix = "delete it to recompute the reference, or pass another --reference-scores file"
    where = f"reference-score cache {path}"
    with CheckedNpz(path, ParityError) as z:  # headers checked before anything is decompressed
        fmt = str(z.get("format", ndim=0)) if "format" in z else None
        if fmt != REFERENCE_FORMAT:
            raise ParityError(f"{where}: not a reference-score cache of layout {REFERENCE_FORMAT!r} (format "
                              f"{fmt!r}: written by an older hllm, or another file); {fix}")
        k = z.get("num_positions", ndim=0)
        if k.dtype.kind not in "iu" or int(k) != key.num_positions:
            raise ParityError(f"{where}: holds scores for K={k.item()!r}, the export ranks K={key.num_positions}; {fix}")
        sha = str(z.get("graph_sha256", ndim=0))
        if not sha:
            raise ParityError(f"{where}: records no graph hash, so it cannot prove which graph made it; {fix}")
        if sha != key.graph_sha256:
            raise ParityError(f"{where}: comes from another graph (sha256 {sha[:12]}…, the export's graph is "
                              f"{key.graph_sha256[:12]}…); {fix}")
        saved = z.get("slate_keys", ndim=1)
        if saved.dtype.kind != "U":
            raise ParityError(f"{where}: slate_keys is {saved.dtype}, not text; {fix}")
        index = {str(x): i for i, x in enumerate(saved.tolist())}
        missing = [sid for sid, h in zip(key.slate_ids, key.slate_keys) if h not in index]
        if missing:
            raise ParityError(f"{where}: holds no scores for the inputs of {len(missing)} of the {len(key.slate_keys)} "
                              f"evaluation slates (first: slate {missing[0]}): it was computed for other slates, "
                              f"other candidates, another prompt or tokenizer, or is cut short; {fix}")
        out = []
        for sid, h, n in zip(key.slate_ids, key.slate_keys, key.n_items):
            m = z.get(f"scores/{index[h]}", (n, key.num_positions))
            if not np.issubdtype(m.dtype, np.floating):
                raise ParityError(f"{where}: scores/{index[h]} is {m.dtype}, not floating point; {fix}")
            if not np.isfinite(m).all():
                raise ParityError(f"{where}: the scores of slate {sid} hold {int((~np.isfinite(m)).sum())} non-finite "
                                  f"value(s) (a reference never caches them); {fix}")
            out.append(m.astype(np.float32, copy=False))
        return out
