"""The envelope of every JSON report (``results/*.json``, ``--report``, ``--out``), torch-free.

A report is one JSON object whose first keys say what it is and where it was made::

    {"kind": "frontier", "hllm_version": "0.4.0", "libraries": {"python": "3.12.3", "numpy": ...},
     "machine": {"cpu": ..., "cpu_flags": [...], "logical_cpus": 2, ...}, "created": "2026-12-03T07:30:00Z",
     ...the kind's own fields...}

``machine`` is :func:`hllm.measure.describe_machine` (keys :data:`MACHINE_KEYS`), ``libraries`` is
:func:`hllm.formats.provenance.library_versions`, ``created`` is UTC in ISO 8601 (RFC 3339, seconds).

Reports written before the envelope existed (``created_utc``, ``versions``, a ``benchmark`` name, a
``machine`` string) stay readable: :func:`read_envelope` maps them onto the same keys.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping

from hllm.errors import HllmError
from hllm.formats.provenance import library_versions
from hllm.measure import describe_machine

#: Keys every report starts with.
ENVELOPE_KEYS = ("kind", "hllm_version", "libraries", "machine", "created")

#: Keys of ``machine`` (:func:`hllm.measure.describe_machine`).
MACHINE_KEYS = frozenset({"cpu", "cpu_id", "cpu_flags", "logical_cpus", "usable_cpus", "memory_gb", "gpus", "os",
                          "load_avg_1m", "shared", "note"})


def utc_now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def envelope(kind: str, body: Mapping[str, Any] | None = None, *, shared: bool | None = None,
             note: str | None = None, machine: Mapping[str, Any] | None = None) -> dict:
    """``body`` wrapped in the report envelope: ``{kind, hllm_version, libraries, machine, created, **body}``.

    Args:
        kind: what the report is (``"frontier"``, ``"loadtest"``, ``"calibration"``, ...); a non-empty str.
        body: the report's own fields. Envelope keys in it are replaced; a ``machine`` dict in it is merged
            over the machine description (its extra facts kept), a ``machine`` that is not a dict is kept
            as ``machine_arch``; the rest keep their order after the envelope.
        shared, note: stored in ``machine`` (whether other work shared the cores; free text).
        machine: an already taken :func:`hllm.measure.describe_machine` (e.g. before a long run), else taken now.
    Returns: a new dict (``body`` is not changed).
    Raises: ValueError for an empty ``kind``.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"report kind must be a non-empty string, got {kind!r}")
    body = dict(body or {})
    old_machine = body.pop("machine", None)
    if old_machine is not None and not isinstance(old_machine, Mapping):
        body.setdefault("machine_arch", old_machine)
    for k in ("kind", "hllm_version", "libraries", "created", "benchmark", "created_utc"):
        body.pop(k, None)
    libraries = library_versions()
    m = dict(machine) if machine is not None else describe_machine(shared=shared, note=note)
    if machine is not None and (shared is not None or note is not None):
        m.update({k: v for k, v in (("shared", shared), ("note", note)) if v is not None})
    if isinstance(old_machine, Mapping):
        m.update(old_machine)
    return {"kind": kind, "hllm_version": libraries.get("hllm"), "libraries": libraries, "machine": m,
            "created": utc_now(), **body}


def is_envelope(doc: Any) -> bool:
    """True when ``doc`` is a dict with every :data:`ENVELOPE_KEYS` and a dict ``machine``."""
    return isinstance(doc, Mapping) and all(k in doc for k in ENVELOPE_KEYS) and isinstance(doc["machine"], Mapping)


class ReportError(HllmError, ValueError):
    """A report's envelope field has the wrong JSON type (e.g. ``"libraries": "abc"``); the message names
    the field. Also a :class:`ValueError`, so callers catching that keep working."""


def _field(value: Any, name: str, types: tuple[type, ...], expected: str) -> Any:
    if value is not None and not isinstance(value, types):
        raise ReportError(f"report field {name!r} must be {expected} or absent, got {type(value).__name__} "
                          f"{value!r:.60}")
    return value


def read_envelope(doc: Mapping[str, Any]) -> dict:
    """The envelope fields of a report, new or old shape (tolerant of missing fields, strict on types;
    nothing is written back).

    Old shapes: ``created_utc`` → ``created``; ``benchmark`` or ``command`` → ``kind`` (``kind`` first,
    then ``benchmark``, then ``command``); ``versions`` → ``libraries``; a ``machine`` string →
    ``{"arch": str}``; a missing top-level ``machine`` → the first record's. Missing fields are None.
    Returns: ``{kind, hllm_version, libraries, machine, created}`` (str or None, dict or None, dict or
    None, str or None).
    Raises: :class:`ReportError` (a ValueError) when ``doc`` is not a JSON object or a field has the
    wrong type: ``kind`` / ``benchmark`` / ``command`` / ``hllm_version`` / ``created`` / ``created_utc``
    not a string, ``libraries`` / ``versions`` not an object, ``machine`` neither an object nor a string,
    ``records`` not a list; the message names the field.
    """
    if not isinstance(doc, Mapping):
        raise ReportError(f"a report is a JSON object, got {type(doc).__name__}")
    for name in ("kind", "benchmark", "command", "hllm_version", "created", "created_utc"):
        _field(doc.get(name), name, (str,), "a string")
    for name in ("libraries", "versions"):
        _field(doc.get(name), name, (Mapping,), "a JSON object")
    _field(doc.get("machine"), "machine", (Mapping, str), "a JSON object or a string")
    recs = _field(doc.get("records"), "records", (list,), "a list") or []
    first = recs[0] if recs and isinstance(recs[0], Mapping) else {}
    if first:
        _field(first.get("versions"), "records[0].versions", (Mapping,), "a JSON object")
        _field(first.get("machine"), "records[0].machine", (Mapping, str), "a JSON object or a string")
    libraries = doc.get("libraries") or doc.get("versions") or first.get("versions")
    machine = doc.get("machine") if doc.get("machine") is not None else first.get("machine")
    if machine is not None and not isinstance(machine, Mapping):
        machine = {"arch": machine}
    return {
        "kind": doc.get("kind") or doc.get("benchmark") or doc.get("command"),
        "hllm_version": doc.get("hllm_version") or (libraries or {}).get("hllm"),
        "libraries": dict(libraries) if libraries is not None else None,
        "machine": dict(machine) if machine is not None else None,
        "created": doc.get("created") or doc.get("created_utc"),
    }
