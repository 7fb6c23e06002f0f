"""What a generated Triton repository ships so that it runs on a stock Triton image (``hllm triton-repo``).

A stock ``nvcr.io/nvidia/tritonserver:<yy.mm>-py3`` image runs Python-backend models with its own
Python (3.12) and numpy; it has neither hllm (not on PyPI) nor ``tokenizers`` nor ``lap``. So:

* :func:`vendor_modules` copies hllm's own module files — unchanged, one source of truth — into a
  ``site/hllm/`` folder of the model (or client) directory, with generated ``__init__.py`` files
  (the real ones import the whole runtime) and ``VENDORED.json`` (hllm version, file hashes). It
  refuses (EngineError) a module that imports an hllm module outside the copied set, so a later edit
  of the runtime cannot silently break the repository.
* :func:`bundle_wheels` unpacks the ``tokenizers`` / ``lap`` wheels for the image's Python and
  architecture into the same ``site/`` with ``pip install --target --only-binary=:all: --no-deps``
  (PyPI, or pip's own ``PIP_FIND_LINKS`` / ``PIP_INDEX_URL`` for offline use), pinned to the
  versions installed here so Triton tokenizes and decodes with the versions ``hllm rank`` uses.
  numpy is not shipped: the image has it, and the Python backend itself imports it first.

The generated ``model.py`` puts ``site/`` first on ``sys.path``; Triton runs each Python model in its
own stub process, so the models do not see each other's ``site/``.
(pip: https://pip.pypa.io/en/stable/cli/pip_install/#cmdoption-platform; Python backend:
https://github.com/triton-inference-server/python_backend#usage)
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hllm.errors import EngineError

#: hllm modules the two Python-backend models need (preprocess + decode, with what they import).
MODEL_MODULES = (
    "hllm.errors",
    "hllm.files",
    "hllm.staging",
    "hllm.reading",
    "hllm.formats.graph",
    "hllm.formats.prompt",
    "hllm.runtime.prompt",
    "hllm.runtime.slates",
    "hllm.runtime.decode",
    "hllm.serve.triton.preprocess_model",
    "hllm.serve.triton.decode_model",
)
#: hllm modules the generated client needs.
CLIENT_MODULES = ("hllm.errors", "hllm.files", "hllm.staging", "hllm.reading", "hllm.runtime.slates", "hllm.runtime.decode",
                  "hllm.serve.triton.client")
#: Wheels each Python model needs beyond numpy.
MODEL_WHEELS = {"preprocess": ("tokenizers",), "decode": ("lap",)}
#: ``--bundle-arch`` → pip ``--platform`` tags (Triton's images: Ubuntu 22.04/24.04, glibc ≥ 2.35).
PLATFORMS = {
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_28_x86_64"),
    "aarch64": ("manylinux2014_aarch64", "manylinux_2_28_aarch64"),
}


def hllm_version() -> str:
    import hllm

    return hllm.__version__


def module_file(module: str) -> Path:
    """The source file of an hllm module (``hllm.runtime.prompt`` → ``.../hllm/runtime/prompt.py``)."""
    import hllm

    parts = module.split(".")
    if parts[0] != "hllm" or len(parts) < 2:
        raise EngineError(f"not an hllm module: {module}")
    return Path(hllm.__file__).resolve().parent.joinpath(*parts[1:]).with_suffix(".py")


def hllm_imports(source: str) -> set[str]:
    """Every ``hllm.*`` module a source file imports, at any depth (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n == "hllm" or n.startswith("hllm."))
    return found


def vendor_modules(site: str | Path, modules: tuple[str, ...]) -> dict:
    """Copy ``modules`` (hllm's own files, unchanged) into ``site/hllm/...``; returns the manifest.

    Raises: EngineError if a module is missing or imports an hllm module not in ``modules``.
    """
    site = Path(site)
    files = []
    for module in modules:
        src = module_file(module)
        if not src.is_file():
            raise EngineError(f"cannot vendor {module}: {src} not found")
        text = src.read_text(encoding="utf-8")
        outside = {m for m in hllm_imports(text) if m not in modules}
        if outside:
            raise EngineError(f"{module} imports {sorted(outside)}, which the Triton repository does not ship")
        dst = site.joinpath(*module.split(".")).with_suffix(".py")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        files.append({"module": module, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()})
    init = f'"""hllm modules copied unchanged by `hllm triton-repo` (hllm {hllm_version()}); see VENDORED.json."""\n'
    for pkg in sorted({".".join(m.split(".")[:i]) for m in modules for i in range(1, len(m.split(".")))}):
        site.joinpath(*pkg.split("."), "__init__.py").write_text(init, encoding="utf-8")
    manifest = {"hllm_version": hllm_version(), "modules": files}
    (site / "hllm" / "VENDORED.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def pinned(package: str) -> str:
    """``package==X.Y.Z`` with the version installed here. Raises: EngineError if it is not installed."""
    try:
        return f"{package}=={version(package)}"
    except PackageNotFoundError:
        raise EngineError(f"{package} is not installed here, so its version cannot be pinned (pip install 'hllm[runtime]')") from None


def bundle_command(site: str | Path, packages: tuple[str, ...], python_version: str, arch: str) -> list[str]:
    """The ``pip install --target`` command line that unpacks ``packages`` (pinned) for the image."""
    if arch not in PLATFORMS:
        raise EngineError(f"--bundle-arch must be one of {sorted(PLATFORMS)}, got {arch!r}")
    if not python_version.replace(".", "").isdigit() or python_version.count(".") != 1:
        raise EngineError(f"--bundle-python must look like 3.12, got {python_version!r}")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
           "--target", str(site), "--no-deps", "--only-binary=:all:", "--implementation", "cp",
           "--python-version", python_version]
    for tag in PLATFORMS[arch]:
        cmd += ["--platform", tag]
    return cmd + [pinned(p) for p in packages]


def bundle_wheels(site: str | Path, packages: tuple[str, ...], python_version: str = "3.12", arch: str = "x86_64") -> list[str]:
    """Unpack the wheels of ``packages`` into ``site`` (see module doc); returns the pinned names.

    Raises: EngineError (pip failed: no network / no matching wheel — the message has pip's output).
    """
    cmd = bundle_command(site, packages, python_version, arch)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise EngineError(f"pip did not finish in 900 s: {' '.join(cmd)}") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        raise EngineError(f"bundling {', '.join(cmd[-len(packages):])} for Python {python_version} {arch} failed:\n{tail}")
    for cache in Path(site).rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return cmd[-len(packages):]
