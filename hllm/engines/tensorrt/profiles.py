"""Optimization-profile policy for TensorRT plans: the default profile, validating a build's profiles and
choosing the profile a request runs in (torch-free, TRT-free).

A profile's form (:class:`hllm.formats.profiles.Profile`: ``min ≤ opt ≤ max`` per dim, its text and sidecar
dict) is a file format; these functions are the choices made with it (TensorRT Python API,
``IOptimizationProfile``; a request must lie inside the profile it runs in).
"""

from __future__ import annotations

from hllm.errors import EngineError
from hllm.formats.profiles import DimRange, Profile


def default_profile(num_positions: int, max_seq_len: int, max_batch: int = 8, opt_seq: int | None = None) -> Profile:
    """One profile covering B ∈ [1, max_batch] (opt 1), S ∈ [2, max_seq_len] (opt ≈ 3/4 of it or
    ``opt_seq``), N ∈ [1, K] (opt K): the serving shape of the paper (one slate, N = K)."""
    opt_s = opt_seq or max(2, min(max_seq_len, (3 * max_seq_len) // 4))
    k = int(num_positions)
    return Profile(DimRange(1, 1, max_batch), DimRange(2, opt_s, max_seq_len),
                   DimRange(1, min(k, opt_s), k)).validate(k)


def validate_profiles(profiles: list[Profile], num_positions: int | None = None) -> list[Profile]:
    """Validate every profile (see :meth:`Profile.validate`); at least one. Raises EngineError."""
    if not profiles:
        raise EngineError("at least one optimization profile is needed (the graph has dynamic dims)")
    for i, p in enumerate(profiles):
        try:
            p.validate(num_positions)
        except EngineError as e:
            raise EngineError(f"profile {i} ({p}): {e}") from None
    return profiles


def select_profile(profiles: list[Profile], batch: int, seq: int, items: int) -> int:
    """Index of the first profile containing (B, S, N) (smallest ``seq.max`` first among matches).

    Raises: EngineError naming the request and the ranges the plan was built for.
    """
    matches = [i for i, p in enumerate(profiles) if p.contains(batch, seq, items)]
    if not matches:
        built = "; ".join(f"#{i} batch {p.batch.min}..{p.batch.max}, seq {p.seq.min}..{p.seq.max}, "
                          f"items {p.items.min}..{p.items.max}" for i, p in enumerate(profiles))
        raise EngineError(f"request batch={batch} seq={seq} items={items} lies outside every optimization "
                          f"profile of the plan ({built}); rebuild with a wider --profile")
    return min(matches, key=lambda i: (profiles[i].seq.max, profiles[i].batch.max, i))
