"""The JSON documents the benchmarks write (torch-free).

A document is the report envelope (:func:`hllm.formats.report.envelope`: ``kind, hllm_version, libraries,
machine, created``) plus ``{schema, command, shared, note, records: [...]}`` and kind-specific
top-level figures (e.g. ``matmul_peak``); every record carries ``machine`` and ``versions`` so that a
single record copied elsewhere still says where it was measured.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hllm.bench import SCHEMA_VERSION
from hllm.measure import describe_machine
from hllm.formats.provenance import library_versions
from hllm.formats.report import envelope
from hllm.files import atomic_write_json


def document(kind: str, records: list[dict], shared: bool | None, note: str | None = None, **top) -> dict:
    """Wrap ``records`` in the report envelope (machine description, library versions, creation time) with
    the command line; every record also carries ``machine`` and ``versions``."""
    machine = describe_machine(shared=shared, note=note)
    versions = library_versions()
    for r in records:
        r.setdefault("machine", machine)
        r.setdefault("versions", versions)
    return envelope(kind, {
        "schema": SCHEMA_VERSION,
        "command": " ".join(["hllm", *sys.argv[1:]]),  # the CLI is the only caller that writes files
        "shared": shared,
        "note": note,
        **top,
        "records": records,
    }, machine=machine)


def write_document(path: str | os.PathLike, doc: dict) -> Path:
    """Write ``doc`` as JSON atomically (no partial file on failure)."""
    return atomic_write_json(path, doc)
