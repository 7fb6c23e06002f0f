"""Packaging: the base package needs only numpy, `hllm[runtime]` no CLI library, a missing extra prints its
`pip install 'hllm[EXTRA]'` line and exits 2, `hllm --version` prints `hllm.__version__`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hllm
from hllm.extras import MODULE_EXTRA, MissingExtraError, extra_for, require

REPO = Path(__file__).resolve().parents[1]
BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
from hllm.cli import main
main({argv!r})
"""


def _hllm_without(blocked: set[str], *argv: str) -> subprocess.CompletedProcess:
    """Run the `hllm` entry point with ``blocked`` modules unimportable (as if their extra were not installed)."""
    code = BLOCK.format(blocked=blocked, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _extras() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


def _closure(extras: dict[str, list[str]], name: str) -> set[str]:
    """The extras ``name`` pulls in, itself included (``hllm[a,b]`` entries followed)."""
    from packaging.requirements import Requirement

    seen, todo = set(), [name]
    while todo:
        e = todo.pop()
        if e not in seen:
            seen.add(e)
            todo += [x for d in extras[e] if Requirement(d).name == "hllm" for x in Requirement(d).extras]
    return seen


def test_runtime_extra_pulls_no_cli_library_and_cli_extras_include_cli():
    base, extras = _extras()
    assert [_name(d) for d in base] == ["numpy"]
    assert [_name(d) for d in extras["cli"]] == ["typer", "rich"]
    assert not {"typer", "rich", "pydantic", "fastapi"} & {_name(d) for d in extras["runtime"]}
    for name in ("export", "serve", "bench", "ray", "tensorrt"):
        assert "cli" in _closure(extras, name), name
    # every extra named in the module map exists
    assert set(MODULE_EXTRA.values()) <= set(extras)


def test_dev_extra_installs_every_extra_the_suite_exercises():
    """`make setup` / CI install only ``.[dev]``: an extra left out of it turns its tests into setup errors
    on a clean clone (tests that exercise Polygraphy or OpenVINO need the module itself). Left out on
    purpose: ``modelopt`` (pins its own onnx / onnxruntime-gpu; a separate environment) and ``teacher``
    (an 83 MB model wheel; its tests use a tiny in-code encoder)."""
    _, extras = _extras()
    missing = set(extras) - _closure(extras, "dev") - {"modelopt", "teacher"}
    assert not missing, f"the dev extra does not pull {sorted(missing)}"


def test_floors_requires_python_and_the_readme_agree_with_the_pins():
    """Every pinned dependency satisfies its floor; requires-python admits the pins' Python (3.11) and the
    README's install section says the same; transformers 5 (``dtype=``) and typer 0.29 are floors."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            n, v = line.split("==")
            pins[n.lower().replace("_", "-")] = v.strip()
    reqs = [Requirement(d) for d in project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]]
    floors = {r.name.lower().replace("_", "-"): r.specifier for r in reqs if r.name != "hllm" and r.specifier}
    assert {"numpy", "onnxruntime", "tokenizers", "lap", "transformers", "typer", "torch", "ray"} <= set(floors)
    for name, spec in floors.items():
        if name in pins:
            assert spec.contains(pins[name]), f"{name}: pinned {pins[name]} is outside {spec}"
    assert "5.0" in floors["transformers"] and not floors["transformers"].contains("4.57")
    assert SpecifierSet(project["requires-python"]).contains("3.11") and not SpecifierSet(project["requires-python"]).contains("3.10")
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]
    readme = (REPO / "README.md").read_text()
    assert "Python ≥ 3.11" in readme and "Python ≥ 3.10" not in readme
    for extra in project["optional-dependencies"]:  # the install section's table lists every extra
        assert f"| `{extra}` |" in readme, extra
    # hllm is not on the package index: the README installs it from the clone or the built wheel
    assert "pip install -c constraints.txt -e '.[runtime,cli]'" in readme
    assert not [ln for ln in readme.splitlines() if ln.startswith("pip install 'hllm")]


def test_readme_extras_table_lists_what_each_extra_brings():
    """The install section's table names, for every extra, each package it brings and each other extra it
    includes (``runtime``/``cli`` aside, which nearly every extra includes)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    rows = {}
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows.setdefault(cells[0].strip("`"), cells[2])
    for extra, deps in project["optional-dependencies"].items():
        brings = rows[extra]
        for r in map(Requirement, deps):
            names = sorted(r.extras - {"runtime", "cli"}) if r.name == "hllm" else [r.name]
            for name in names:
                assert name in brings, f"README extras table, `{extra}` row: {name} missing from {brings!r}"


def test_import_runtime_loads_no_cli_library():
    code = "import sys, hllm.runtime, hllm.extras; print(sorted({m.split('.')[0] for m in sys.modules} & {'typer','rich','pydantic','torch','click'}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_version_is_the_package_metadata():
    from importlib.metadata import version

    assert hllm.__version__ == version("hllm")
    r = subprocess.run([sys.executable, "-m", "hllm", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"hllm {hllm.__version__}"


def test_missing_cli_extra_prints_the_install_line_and_exits_2():
    r = _hllm_without({"typer"}, "--help")
    assert r.returncode == 2 and "pip install 'hllm[cli]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_missing_extra_of_a_command_prints_its_install_line_and_exits_2(export_dir, tmp_path):
    r = _hllm_without({"fastapi"}, "serve", str(export_dir))
    assert r.returncode == 2 and "pip install 'hllm[serve]'" in " ".join(r.stderr.split()), r.stderr
    r = _hllm_without({"ray"}, "rank", str(export_dir), "--slates", str(REPO / "examples/beauty-eval-sample.jsonl.gz"),
                      "--out", str(tmp_path / "o.jsonl"), "--ray")
    assert r.returncode == 2 and "pip install 'hllm[ray]'" in " ".join(r.stderr.split()), r.stderr


def test_require_names_the_extra(monkeypatch):
    assert extra_for("onnxruntime.capi") == "runtime" and extra_for("nothing_known") is None
    assert require("json").__name__ == "json"
    with pytest.raises(ModuleNotFoundError):
        require("surely_not_a_module_xyz")  # no extra provides it: not hidden
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ModuleNotFoundError
    with pytest.raises(MissingExtraError, match=r"pip install 'hllm\[bench\]'"):
        require("matplotlib")
