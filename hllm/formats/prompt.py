"""The prompt spec: how a slate becomes a prompt (the ``prompt`` section of ``hllm.json`` and of every
sidecar). Torch-free, tokenizer-free: :class:`hllm.runtime.prompt.PromptBuilder` applies it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from hllm.errors import CheckpointError


@dataclass(frozen=True)
class PromptSpec:
    """How a slate becomes a prompt. Stored in ``hllm.json`` under ``prompt``.

    Attributes:
        user_template: user-context text; ``{history}`` is replaced by the rendered history items.
        history_item_template: one history item; ``{title}`` and ``{index}`` (1-based) available.
        candidate_template: one candidate's text; ``{title}`` and ``{index}`` (1-based). Its last
            token is the candidate's readout position.
        separator: text after each candidate (tokenized once).
        candidate_token_budget: max tokens per candidate text; longer ones are truncated (recorded),
            never dropped.
        history_token_budget: max tokens of the user context; oldest history items are dropped
            first until it fits, then the context is cut (recorded).
        max_history: at most this many most recent history items are used.
        max_seq_len: a prompt longer than this is an error (SlateError).
        bos_token: token string to prepend (e.g. ``"<|endoftext|>"``), or None.
    """

    user_template: str = "A shopper bought these products, oldest first:\n{history}Products to rank:\n"
    history_item_template: str = "- {title}\n"
    candidate_template: str = "{index}. {title}"
    separator: str = "\n"
    candidate_token_budget: int = 32
    history_token_budget: int = 320
    max_history: int = 10
    max_seq_len: int = 2048
    bos_token: str | None = None

    def to_dict(self) -> dict:
        """JSON-serialisable dict (the ``prompt`` section of ``hllm.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PromptSpec":
        """Build from a dict; unknown keys or bad values raise CheckpointError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise CheckpointError(f"prompt spec has unknown keys: {sorted(unknown)}")
        spec = cls(**d)
        for name in ("candidate_token_budget", "history_token_budget", "max_seq_len", "max_history"):
            v = getattr(spec, name)
            if not isinstance(v, int) or v < (0 if name == "max_history" else 1):
                raise CheckpointError(f"prompt spec {name} must be a positive integer, got {v!r}")
        if "{title}" not in spec.candidate_template:
            raise CheckpointError("prompt spec candidate_template must contain {title}")
        return spec
