"""Every sidecar field is validated where it is read, by one typed reader (``export.json``:
:func:`hllm.formats.export.parse_export`; graph inputs/outputs: :func:`hllm.formats.graph.check_tensor_specs`;
``bench frontier --gates``: :func:`hllm.bench.frontier.read_gates`): a hostile value is exit 2 with one
``error:`` line naming the field, never exit 70 (internal error) or a traceback."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from hllm.cli import main
from hllm.testing import tiny_slates


@pytest.fixture(scope="module")
def work(tmp_path_factory, export_dir):
    """A private copy of the tiny export (its sidecar is rewritten by each test, then restored) and a
    one-slate file."""
    root = tmp_path_factory.mktemp("sidecar-fields")
    exp = root / "export"
    shutil.copytree(export_dir, exp)
    slates = root / "one.jsonl"
    slates.write_text(json.dumps(tiny_slates(1, 3, seed=4)[0]) + "\n")
    return exp, slates, (exp / "export.json").read_text()


@pytest.fixture
def export(work):
    exp, _, original = work
    yield exp
    (exp / "export.json").write_text(original)


def _run(capsys, argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    return e.value.code, capsys.readouterr().err


def _set(d: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        d = d[int(part)] if isinstance(d, list) else d.setdefault(part, {})
    if isinstance(d, list):
        d[int(leaf)] = value
    else:
        d[leaf] = value


def _edit(exp: Path, **fields) -> None:
    d = json.loads((exp / "export.json").read_text())
    for path, value in fields.items():
        _set(d, path.replace("__", "."), value)
    (exp / "export.json").write_text(json.dumps(d))


def _one_error(code: int, err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err and "internal error" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("fields, words", [
    ({"openvino": "bf16"}, ["openvino must be an object", "a string \"bf16\""]),
    ({"openvino": ["ir.xml"]}, ["openvino must be an object", "a list"]),
    ({"engine": "openvino", "openvino": {"ir": 7}}, ["openvino.ir must be a file name", "an integer 7"]),
    ({"openvino": {"inference_precision": "int4"}}, ["openvino.inference_precision must be one of"]),
    ({"engine": 5}, ["engine must be one of ('onnxruntime', 'openvino')", "an integer 5"]),
    ({"engine": "tensorrt"}, ["engine must be one of", "\"tensorrt\""]),
    ({"fp16": "yes"}, ["fp16 must be an object"]),
    ({"fp16": {"cpu_emulation": [1]}}, ["fp16.cpu_emulation must be an object"]),
    ({"validation": [1, 2]}, ["validation must be an object"]),
    ({"source_checkpoint": "x"}, ["source_checkpoint must be an object"]),
    ({"backbone__num_layers": "2"}, ["backbone.num_layers must be a positive integer"]),
    ({"inputs__0__dtype": None}, ["inputs[0].dtype must be 'int64', got null"]),
    ({"inputs__0__shape": 5}, ["inputs[0].shape must be a list of 2 dims", "an integer 5"]),
    ({"inputs__1__name": "token_type_ids"}, ["inputs[1].name 'token_type_ids' is not an hLLM graph input"]),
    ({"outputs__0__shape": ["batch", "items"]}, ["outputs[0].shape must be a list of 3 dims"]),
    ({"outputs": [{"name": "scores", "dtype": "float32", "shape": ["batch", "items", 8]}, {"name": "x"}]},
     ["outputs[1].name 'x'"]),
])
@pytest.mark.parametrize("command", ["rank", "info"])
def test_hostile_sidecar_field_is_exit_2_naming_it(command, fields, words, export, work, capsys, tmp_path):
    _edit(export, **fields)
    argv = ["rank", export, "-s", work[1], "-o", tmp_path / "r.jsonl"] if command == "rank" else ["info", export]
    _one_error(*_run(capsys, argv), "export.json", *words)
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("fields, words", [
    ({"inputs__0": {"name": "input_ids", "shape": ["batch", "seq"]}}, ["inputs[0].dtype must be 'int64', got null"]),
    ({"inputs__0__shape": 5}, ["inputs[0].shape must be a list of 2 dims"]),
    ({"inputs": {"input_ids": "int64"}}, ["inputs must be a non-empty list"]),
])
def test_triton_repo_of_hostile_graph_inputs_is_exit_2(fields, words, export, capsys, tmp_path):
    _edit(export, **fields)
    _one_error(*_run(capsys, ["triton-repo", export, tmp_path / "repo"]), *words)
    assert not (tmp_path / "repo").exists()


def test_sidecar_engine_is_honoured_only_when_valid(export, work, capsys, tmp_path):
    """A valid ``engine: onnxruntime`` still ranks (the reader refuses only what it cannot honour)."""
    _edit(export, engine="onnxruntime")
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export), "-s", str(work[1]), "-o", str(tmp_path / "r.jsonl")])
    assert e.value.code in (0, None), capsys.readouterr().err
    row = json.loads((tmp_path / "r.jsonl").read_text())
    assert sorted(row["order"]) == [0, 1, 2]


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", ["--gates", "expected a JSON object"]),
    ('{"a": 5}', ["entry 'a' must be an object"]),
    ('{"a": {"top1_agreement": "high"}}', ["a.top1_agreement must be a number in [-1, 1]"]),
    ('{"a": {"top1_agreement": NaN}}', ["NaN"]),
    ('{"a": {}, "a": {}}', ["duplicate key 'a'"]),
    ("{", ["malformed JSON"]),
])
def test_frontier_gates_file_is_read_strictly(text, words, tmp_path, capsys, merged_checkpoint, export_dir):
    gates = tmp_path / "gates.json"
    gates.write_text(text)
    _one_error(*_run(capsys, ["bench", "frontier", merged_checkpoint, "-c", f"a|{export_dir}|onnxruntime|fp32",
                              "--gates", gates, "--rounds", "1"]), *words)


def test_read_gates_keeps_figures_and_nulls(tmp_path):
    from hllm.bench.frontier import read_gates

    (tmp_path / "g.json").write_text('{"a": {"top1_agreement": 0.98, "failures": []}, "b": null}')
    assert read_gates(tmp_path / "g.json") == {"a": {"top1_agreement": 0.98, "failures": []}, "b": {}}


# -- the sweep: every field of a valid sidecar, every wrong JSON type -----------------------------------------

WRONG = {"int": 5, "str": "x", "list": [1, 2], "dict": {"a": 1}, "null": None, "nan": float("nan")}


def _field_paths(d: dict) -> list[str]:
    """Every key of the sidecar, one level into objects and into the first input / output, plus the
    optional keys a quantized / FP16 / OpenVINO export adds."""
    paths = []
    for k, v in d.items():
        paths.append(k)
        if isinstance(v, dict) and k not in ("fusion", "versions"):
            paths += [f"{k}.{c}" for c in v]
        if k in ("inputs", "outputs"):
            paths += [f"{k}.0.{c}" for c in v[0]]
    extra = ["engine", "openvino", "openvino.ir", "openvino.inference_precision", "fp16", "fp16.cpu_emulation",
             "fp16.cpu_emulation.onnx", "fp16.islands", "fp32_islands", "quantization"]
    return paths + [p for p in extra if p not in paths]


@pytest.fixture(scope="module")
def field_paths(export_dir) -> list[str]:
    return _field_paths(json.loads((export_dir / "export.json").read_text()))


def test_sweep_covers_the_sidecar(field_paths):
    for p in ("onnx", "num_positions", "prompt.candidate_template", "backbone.vocab_size", "inputs.0.dtype",
              "outputs.0.shape", "openvino.ir", "engine", "onnx_bytes", "validation.shapes"):
        assert p in field_paths


@pytest.mark.parametrize("kind", list(WRONG))
def test_every_field_of_every_wrong_type_is_never_an_internal_error(kind, field_paths, work, capsys, tmp_path):
    """``hllm rank`` and ``hllm info`` on a sidecar with one field replaced by a value of the wrong JSON type:
    exit 0 (a field nothing reads) or exit 2 with one ``error:`` line from the typed reader — never exit 70, a
    traceback, or ``info``'s fallback for a reader that crashed ("malformed metadata, cannot describe it")."""
    exp, slates, original = work
    failures, codes = [], {}
    try:
        for path in field_paths:
            d = json.loads(original)
            _set(d, path, WRONG[kind])
            (exp / "export.json").write_text(json.dumps(d))
            for argv in (["rank", exp, "-s", slates, "-o", tmp_path / "r.jsonl"], ["info", exp]):
                try:
                    code, err = _run(capsys, argv)
                except BaseException as e:  # noqa: BLE001 — anything escaping main is a failure to report
                    failures.append(f"{path}={kind} {argv[0]}: {type(e).__name__} {e}")
                    continue
                codes[(path, argv[0])] = code or 0
                lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
                if code not in (0, None, 2) or "Traceback" in err or "internal error" in err or (
                        "cannot describe it" in err) or (
                        code == 2 and not (len(lines) == 1 and lines[0].startswith("error:"))):
                    failures.append(f"{path}={kind} {argv[0]}: exit {code}: {err.strip()[:300]}")
    finally:
        (exp / "export.json").write_text(original)
    assert not failures, "\n".join(failures)
    assert codes[("prompt", "rank")] == 2 and codes[("prompt", "info")] == 2  # the sweep bites
    assert codes[("validation.atol", "rank")] == 0  # a record nothing reads: still ranks


@pytest.fixture(scope="module")
def plan_sidecar(tmp_path_factory, export_dir):
    """A fake TensorRT plan (10 bytes; no TensorRT needed: ``info`` reads only the sidecar) whose sidecar
    carries every key ``hllm build`` writes, with the export's inputs and outputs."""
    from hllm.formats.plan import write_sidecar
    from hllm.formats.prompt import PromptSpec

    root = tmp_path_factory.mktemp("plan-fields")
    plan = root / "m.plan"
    plan.write_bytes(b"plan bytes")
    shutil.copy(export_dir / "tokenizer.json", root / "m.plan.tokenizer.json")
    side = json.loads((export_dir / "export.json").read_text())
    meta = {
        "plan": "m.plan", "plan_bytes": 10, "tensorrt_version": "10.13.0", "compute_capability": "8.0",
        "gpu_name": "A100", "hardware_compatibility": "none", "version_compatible": False, "target": "a100",
        "builder_optimization_level": 3, "workspace_gb": 4.0,
        "profiles": [{"batch": {"min": 1, "opt": 1, "max": 2}, "seq": {"min": 2, "opt": 64, "max": 128},
                      "items": {"min": 1, "opt": 8, "max": 8}}],
        "precision": "fp16", "fp32_islands": ["softmax"], "onnx": "model.onnx", "onnx_sha256": "ab" * 32,
        "source_checkpoint": {"path": "ck", "sha256": "cd" * 32}, "num_positions": 8, "head": "self_attention",
        "inputs": side["inputs"], "outputs": side["outputs"], "prompt": PromptSpec().to_dict(),
        "tokenizer": "m.plan.tokenizer.json", "timing_cache": None, "build_seconds": 1.0,
    }
    write_sidecar(plan, meta)
    return plan


@pytest.mark.parametrize("kind", list(WRONG))
def test_every_plan_sidecar_field_of_every_wrong_type_is_never_an_internal_error(kind, plan_sidecar, capsys):
    """``hllm info`` of a TensorRT plan whose sidecar has one field of the wrong JSON type: exit 0 or one
    ``error:`` line from the typed reader (:func:`hllm.formats.plan.read_sidecar`), never a crash."""
    side = plan_sidecar.with_name(plan_sidecar.name + ".json")
    original = side.read_text()
    failures, codes = [], {}
    try:
        for path in _field_paths(json.loads(original)):
            if path.split(".")[0] in ("engine", "openvino", "fp16", "quantization"):
                continue  # export-only keys
            d = json.loads(original)
            _set(d, path, WRONG[kind])
            side.write_text(json.dumps(d))
            code, err = _run(capsys, ["info", plan_sidecar])
            codes[path] = code or 0
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if code not in (0, None, 2) or "Traceback" in err or "cannot describe it" in err or (
                    code == 2 and not (len(lines) == 1 and lines[0].startswith("error:"))):
                failures.append(f"{path}={kind}: exit {code}: {err.strip()[:300]}")
    finally:
        side.write_text(original)
    assert not failures, "\n".join(failures)
    assert codes["profiles"] == 2 and codes["build_seconds"] == 0  # the sweep bites; a record nothing reads passes
