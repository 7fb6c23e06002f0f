"""Package data: the 100-slate sample of real Amazon Beauty eval slates (numpy-free, torch-free).

``beauty-eval-sample.jsonl.gz`` ships inside the package (``pyproject.toml``,
``[tool.setuptools.package-data]``), so commands that default to it (``hllm rank``, ``parity``, ``eval``,
``merge``, ``export``, ``calibrate``, ``bench``, ``loadtest``) work from any directory and from a wheel.
Its provenance is in ``examples/README.md`` (``examples/beauty-eval-sample.jsonl.gz`` is a symbolic
link to this file, so the 183 kB are stored once).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SAMPLE_NAME = "beauty-eval-sample.jsonl.gz"


def sample_slates() -> Path:
    """Path of the packaged sample (``importlib.resources``; a regular file in a source tree or an
    installed wheel). Raises FileNotFoundError if the package was built without its data."""
    p = Path(str(files(__name__).joinpath(SAMPLE_NAME)))
    if not p.is_file():
        raise FileNotFoundError(f"the packaged slate sample is missing: {p} (reinstall hllm)")
    return p
