"""The JSON documents the benchmarks write (torch-free).

A document is ``{schema, kind, created_utc, command, shared, records: [...]}`` plus kind-specific
top-level figures (e.g. ``matmul_peak``); every record carries ``machine`` and ``versions`` so that a
single record copied elsewhere still says where it was measured.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path

from hllm.bench import SCHEMA_VERSION
from hllm.measure import describe_machine
from hllm.formats.provenance import library_versions
from hllm.files import atomic_write_json


def document(kind: str, records: list[dict], shared: bool | None, note: str | None = None, **top) -> dict:
    """Wrap ``records`` with the machine description, library versions and the command line."""
    machine = describe_machine(shared=shared, note=note)
    versions = library_versions()
    for r in records:
        r.setdefault("machine", machine)
        r.setdefault("versions", versions)
    return {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["hllm", *sys.argv[1:]]),  # the CLI is the only caller that writes files
        "shared": shared,
        "note": note,
        **top,
        "records": records,
    }


def write_document(path: str | os.PathLike, doc: dict) -> Path:
    """Write ``doc`` as JSON atomically (no partial file on failure)."""
    return atomic_write_json(path, doc)
