"""The prompt spec: how a slate becomes a prompt (the ``prompt`` section of ``hllm.json`` and of every
sidecar). Torch-free, tokenizer-free: :class:`hllm.runtime.prompt.PromptBuilder` applies it."""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, fields

from hllm.errors import CheckpointError
from hllm.formats.graph import MAX_SEQ

#: The ``{placeholders}`` each template may use (``str.format`` fields; ``{{`` / ``}}`` are literal braces).
#: ``candidate_template`` may also name any string field of a candidate (``{brand}``; :data:`ANY_FIELD`).
PLACEHOLDERS = {
    "user_template": ("history",),
    "history_item_template": ("title", "index"),
    "candidate_template": ("title", "index"),
}
#: The templates whose placeholders may also be any field name of the candidate (an identifier).
ANY_FIELD = ("candidate_template",)


def candidate_fields(template: str) -> tuple[str, ...]:
    """The candidate fields ``template`` names besides ``{index}`` (``title`` first when used), in order."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f and f != "index"]
    return tuple(dict.fromkeys(names))
#: Longest template / separator (characters): each is rendered and tokenised for every candidate, so its
#: length multiplies into every slate's memory; hllm's own are under 100.
MAX_TEMPLATE_CHARS = 65536
#: Integer fields bounded by the longest sequence a graph takes (:data:`hllm.formats.graph.MAX_SEQ`): a
#: larger budget no longer bounds how much of a candidate's text is tokenised.
BOUNDED_BY_MAX_SEQ = ("candidate_token_budget", "history_token_budget", "max_seq_len")
#: Integer fields and their smallest allowed value.
MINIMUMS = {"candidate_token_budget": 1, "history_token_budget": 1, "max_history": 0, "max_seq_len": 1}


@dataclass(frozen=True)
class PromptSpec:
    """How a slate becomes a prompt. Stored in ``hllm.json`` under ``prompt``.

    Attributes:
        user_template: user-context text; ``{history}`` is replaced by the rendered history items.
        history_item_template: one history item; ``{title}`` and ``{index}`` (1-based) available.
        candidate_template: one candidate's text; ``{title}``, ``{index}`` (1-based) and any other string
            field of the candidate (``{brand}``: a slate whose candidate lacks it is refused, naming it).
            Its last token is the candidate's readout position.
        separator: text after each candidate (tokenized once).
        candidate_token_budget: max tokens per candidate text (the rendered template); longer ones are
            truncated (recorded), never dropped. A budget that the template's own tokens fill (``"1. "``
            is 2 tokens) keeps none of the candidate's text: such a slate is refused.
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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise CheckpointError naming the field: a template that is not a string, uses an unknown
        ``{placeholder}`` (or attribute / index access), is not a valid format string, or a
        candidate_template without ``{title}``; a budget that is not an integer ≥ its minimum
        (:data:`MINIMUMS`; booleans are not integers) or over :data:`hllm.formats.graph.MAX_SEQ` (:data:`BOUNDED_BY_MAX_SEQ`);
        a template over :data:`MAX_TEMPLATE_CHARS` characters; a placeholder with a format spec, width or
        conversion (``{title:>5000000}``, ``{index:02d}``, ``{title!r}``); a ``bos_token`` that is neither a string nor null."""
        for name in ("user_template", "history_item_template", "candidate_template", "separator"):
            if not isinstance(getattr(self, name), str):
                raise CheckpointError(f"prompt spec {name} must be a string, got {_type(getattr(self, name))}")
            if len(getattr(self, name)) > MAX_TEMPLATE_CHARS:
                raise CheckpointError(f"prompt spec {name} is {len(getattr(self, name))} characters, over the limit of "
                                      f"{MAX_TEMPLATE_CHARS}")
        used = {name: _check_template(name, getattr(self, name), allowed) for name, allowed in PLACEHOLDERS.items()}
        if "title" not in used["candidate_template"]:
            raise CheckpointError("prompt spec candidate_template must contain {title}")
        for name, low in MINIMUMS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                what = "a non-negative integer" if low == 0 else "a positive integer"
                raise CheckpointError(f"prompt spec {name} must be {what}, got {v!r}")
            if name in BOUNDED_BY_MAX_SEQ and v > MAX_SEQ:
                raise CheckpointError(f"prompt spec {name} is {v}, over the longest sequence {MAX_SEQ}")
        if self.bos_token is not None and (not isinstance(self.bos_token, str) or not self.bos_token):
            raise CheckpointError(f"prompt spec bos_token must be a token string or null, got {self.bos_token!r}")

    def to_dict(self) -> dict:
        """JSON-serialisable dict (the ``prompt`` section of ``hllm.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: object) -> "PromptSpec":
        """Build from a dict; a non-object, unknown keys or bad values raise CheckpointError naming them
        (:meth:`validate`)."""
        if not isinstance(d, dict):
            raise CheckpointError(f"prompt spec must be an object, got {_type(d)}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise CheckpointError(f"prompt spec has unknown keys: {sorted(map(str, unknown))}")
        return cls(**d)


def _type(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _check_template(name: str, template: str, allowed: tuple[str, ...]) -> set[str]:
    """The placeholders ``template`` uses; refuses unknown or non-plain ``{fields}`` (attribute or index
    access, a format spec or width such as ``{title:>5000000}``, a conversion such as ``{title!r}``: text is
    only ever inserted as it is, so memory stays bounded by the title cut of the prompt builder) and
    malformed format strings, then formats once with sample values."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise CheckpointError(f"prompt spec {name} is not a valid template ({e}): {template!r}") from None
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if spec or conversion:  # a width such as {title:>5000000} would allocate gigabytes per slate
            raise CheckpointError(f"prompt spec {name}: the placeholder {{{field_name}"
                                  f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} has a "
                                  f"format spec or conversion; only plain placeholders such as {{{field_name}}} are allowed")
        if field_name not in allowed and not (name in ANY_FIELD and field_name.isidentifier()):
            raise CheckpointError(f"prompt spec {name} uses the unknown placeholder {{{field_name}}}; "
                                  f"allowed: {', '.join('{' + a + '}' for a in allowed)} (write {{{{ }}}} for a literal brace)")
    try:
        template.format(**{a: ("1" if a != "index" else 1) for a in allowed},
                        **{f: "1" for _, f, _, _ in parsed if f and f not in allowed})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"prompt spec {name} cannot be formatted ({e}): {template!r}") from None
    return {f for _, f, _, _ in parsed if f is not None}
