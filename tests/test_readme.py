"""The README is a README: at most 12,000 bytes; every measured figure in it is the figure of the committed
``results/`` JSON its paragraph cites; its graph contract and Python API are the code's (four graph inputs,
the engines including OpenVINO), and the Python snippet runs."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import re
from pathlib import Path

from hllm.runtime.slates import read_slates

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_BYTES = 12_000


def _json(path: str) -> dict:
    return json.loads((REPO / path).read_text(encoding="utf-8"))


def _get(doc: dict, key: str):
    for part in key.split("."):
        doc = doc[part]
    return doc


#: (figure as the README writes it, results JSON, key in it, how the value is written). A README figure
#: from a measurement must be listed here, so a rerun that changes the JSON fails until the README follows.
FIGURES = [
    ("8 slates", "results/parity-smollm2-demo8.json", "slates", "{} slates"),
    ("top-1 agreement 1.0", "results/parity-smollm2-demo8.json", "top1_agreement", "top-1 agreement {:.1f}"),
    ("Kendall tau 1.0", "results/parity-smollm2-demo8.json", "kendall_tau_mean", "Kendall tau {:.1f}"),
    (r"max \|ΔM\| 5.8e-5", "results/parity-smollm2-demo8.json", "max_abs_diff", None),
    ("0 non-finite", "results/parity-smollm2-demo8.json", "nonfinite", "{} non-finite"),
    ("577 s", "results/demo-timings.json", "total_wall_s", "{:.0f} s"),
    ("2 cores", "results/demo-timings.json", "machine.cores", "{} cores"),
    ("1,118 eval slates", "results/quality/smollm2-beauty-lora-eval-all.json", "rankers.lora.slates", "{:,} eval slates"),
    ("AUC 0.618", "results/quality/smollm2-beauty-lora-eval-all.json", "rankers.lora.auc", "AUC {:.3f}"),
]
#: Numbers in a results-citing paragraph that are not measurements: "step 4", "top-1".
NOT_FIGURES = {"step 4", "top-1"}


def _short_e(x: float) -> str:
    """5.7697e-05 → "5.8e-5" (the README's way of writing a small magnitude)."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def test_readme_is_at_most_12_kb():
    assert len(README.read_bytes()) <= MAX_BYTES, f"README.md is {len(README.read_bytes())} bytes (limit {MAX_BYTES})"


def test_every_readme_figure_is_its_results_json():
    text = README.read_text(encoding="utf-8")
    for shown, path, key, fmt in FIGURES:
        assert shown in text, f"README no longer shows {shown!r}: update FIGURES"
        value = _get(_json(path), key)
        written = rf"max \|ΔM\| {_short_e(value)}" if fmt is None else fmt.format(value)
        assert written == shown, f"{path} {key} = {value!r} reads {written!r}, the README says {shown!r}"


def test_results_paragraphs_hold_only_listed_figures():
    """A paragraph that cites a results/ JSON shows no number that FIGURES does not trace to that JSON."""
    text = README.read_text(encoding="utf-8")
    paragraphs = [p for block in re.split(r"\n\s*\n", text)
                  for p in (block.splitlines() if block.startswith("|") else [block]) if "results/" in p]  # a table: by row
    assert paragraphs
    for para in paragraphs:
        for path in re.findall(r"`(results/[\w./-]+\.json)`", para):
            assert (REPO / path).is_file(), f"README cites {path}, which is not committed"
        prose = re.sub(r"`[^`]*`", "", para)  # paths and code are not figures
        for shown, *_ in FIGURES:
            prose = prose.replace(shown, "")
        for word in NOT_FIGURES:
            prose = prose.replace(word, "")
        untraced = re.findall(r"(?<![\w.])\d(?:[\d.,]*\d)?(?:e-?\d+)?(?![\w])", prose)  # not INT8, FP16, bf16
        assert not untraced, f"figures without a FIGURES row in: {para[:80]!r}…: {untraced}"


def test_graph_contract_and_engines_are_the_codes():
    from hllm.engines.base import Engine
    from hllm.formats.graph import input_names

    text = README.read_text(encoding="utf-8")
    contract = text[text.index("## The graph contract"):text.index("## Install")]
    listed = re.findall(r"^(\w+)\s+\[[\w, ]+\]\s+(?:int64|bool)\s", contract, re.MULTILINE)  # the input rows
    assert listed == list(input_names(context=True)) and len(listed) == 4
    run_params = list(inspect.signature(Engine.run).parameters)[1:]
    assert run_params == listed
    api = text[text.index("## Python API"):text.index("## Read more")]
    for module, name in (("hllm.engines.reference", "TorchEngine"), ("hllm.engines.ort", "OnnxRuntimeEngine"),
                         ("hllm.engines.openvino", "OpenVinoEngine"), ("hllm.engines.tensorrt.runner", "TensorRTEngine")):
        assert f"`{name}`" in api, name
        assert issubclass(getattr(importlib.import_module(module), name), Engine), name


def test_the_python_api_snippet_runs(export_k50):
    """The README's snippet, on a tiny export with K = 50 instead of the demo's, ranks the packaged sample:
    three slates, each with five of its own candidates' ids, best first."""
    text = README.read_text(encoding="utf-8")
    api = text[text.index("## Python API"):]
    snippet = re.search(r"```python\n(.*?)```", api, re.DOTALL).group(1)
    assert '"work/demo/export"' in snippet
    out = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
        exec(compile(snippet.replace('"work/demo/export"', repr(str(export_k50))), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    sample = read_slates(REPO / "examples" / "beauty-eval-sample.jsonl.gz", limit=3)
    assert [ln.split(" ", 1)[0] for ln in lines] == [s["slate_id"] for s in sample]
    for line, slate in zip(lines, sample):
        ids = eval(line.split(" ", 1)[1], {})  # the printed list of item ids
        assert len(ids) == 5 and len(set(ids)) == 5
        assert set(ids) <= {c["item_id"] for c in slate["candidates"]}


def test_the_two_commands_are_on_the_first_screen():
    """``make demo`` and ``make test`` are the first thing a reader can run: within the README's first 40 lines,
    each at the start of a line of a code block."""
    head = README.read_text(encoding="utf-8").splitlines()[:40]
    assert any(line.startswith("make demo ") for line in head) and any(line.startswith("make test ") for line in head)
