"""Scoped torch intra-op thread count (no module-global side effect)."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)`` and restore the previous count afterwards.

    ``None`` or 0 leaves torch's setting alone. (torch.set_num_threads is process-wide: a library call
    that changed it for good would slow or oversubscribe whatever the caller runs next.)
    """
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
