"""`hllm triton-repo`: the configs parse as Triton ModelConfig protobuf and match the ONNX graph; the three
Python-backend models run with a stand-in `triton_python_backend_utils`; the generated client `rank.py`
ranks through a local KServe v2 stub server that runs the repository as Triton's ensemble would
(preprocess → ONNX Runtime engine → decode); with `--bundle-deps` the repository runs with numpy alone.
Rankings equal hllm's Ranker. No Triton server is run here (none on these machines)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hllm.errors import DecodeError, EngineError
from hllm.runtime import Ranker
from hllm.runtime.slates import write_jsonl
from hllm.serve.triton import decode_model, preprocess_model, vendor
from hllm.serve.triton.repo import write_repository
from hllm.testing import tiny_slates
from tests.serve.conftest import KServeStub, assert_same_rankings, pb2_path, ranker_rankings

HERE = Path(__file__).resolve().parent
ONNX_TO_TRITON = {7: "TYPE_INT64", 9: "TYPE_BOOL", 1: "TYPE_FP32", 10: "TYPE_FP16"}
PY_MODELS = {"hllm_preprocess": "hllm.serve.triton.preprocess_model", "hllm_decode": "hllm.serve.triton.decode_model"}


def _model_config_pb2():
    """Triton's ModelConfig protobuf from the tritonclient package (its grpc extra is not needed)."""
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", pb2_path())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def repo(export_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    write_repository(export_dir, out, max_batch_size=4, instances=2, kind="gpu", decode_instances=3, preprocess_instances=2)
    return out


@pytest.fixture
def pb_utils(monkeypatch) -> types.ModuleType:
    """The stand-in `triton_python_backend_utils` (tests/serve/triton_stub), as the models import it."""
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", HERE / "triton_stub" / "triton_python_backend_utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", mod)
    return mod


def _config(repo: Path, name: str):
    from google.protobuf import text_format

    pb = _model_config_pb2()
    return text_format.Parse((repo / "models" / name / "config.pbtxt").read_text(), pb.ModelConfig()), pb


def test_engine_config_matches_the_onnx_graph_and_warms_up(repo, export_dir):
    import onnx

    eng, pb = _config(repo, "hllm_engine")
    assert eng.name == "hllm_engine" and eng.platform == "onnxruntime_onnx" and eng.max_batch_size == 4
    assert eng.dynamic_batching.max_queue_delay_microseconds == 2000
    assert eng.instance_group[0].count == 2 and eng.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    graph = onnx.load(str(repo / "models/hllm_engine/1/model.onnx"), load_external_data=False).graph
    for cfg_t, g_t in [*zip(eng.input, graph.input), *zip(eng.output, graph.output)]:
        assert cfg_t.name == g_t.name
        assert pb.DataType.Name(cfg_t.data_type) == ONNX_TO_TRITON[g_t.type.tensor_type.elem_type]
        gdims = [d.dim_value if d.HasField("dim_value") else -1 for d in g_t.type.tensor_type.shape.dim]
        assert gdims[0] == -1 and list(cfg_t.dims) == gdims[1:]  # batch dim dynamic in the graph, implicit in Triton
    assert len(eng.input) == 3 and list(eng.output[0].dims) == [-1, 8]
    assert (repo / "models/hllm_engine/1/model.onnx").read_bytes() == (export_dir / "model.onnx").read_bytes()
    (warm,) = eng.model_warmup
    assert warm.batch_size == 1 and set(warm.inputs) == {t.name for t in eng.input}
    sizes = {"TYPE_INT64": 8, "TYPE_BOOL": 1}
    for name, spec in warm.inputs.items():
        raw = (repo / "models/hllm_engine/warmup" / spec.input_data_file).read_bytes()
        assert len(raw) == int(np.prod(spec.dims)) * sizes[pb.DataType.Name(spec.data_type)]
    assert list(warm.inputs["item_mask"].dims) == [8] and warm.inputs["input_ids"].dims[0] % 64 == 0
    mask = np.frombuffer((repo / "models/hllm_engine/warmup/item_mask").read_bytes(), dtype=bool)
    assert mask.all()  # a real slate of K candidates, not zeros


def test_ensemble_chains_preprocess_engine_decode(repo):
    cfgs = {n: _config(repo, n)[0] for n in ("hllm_preprocess", "hllm_engine", "hllm_decode", "hllm_ranker")}
    pre, dec, ens = cfgs["hllm_preprocess"], cfgs["hllm_decode"], cfgs["hllm_ranker"]
    assert pre.backend == dec.backend == "python" and pre.instance_group[0].count == 2 and dec.instance_group[0].count == 3
    assert [t.name for t in ens.input] == ["slates"] and _config(repo, "hllm_ranker")[1].DataType.Name(ens.input[0].data_type) == "TYPE_STRING"
    assert ens.platform == "ensemble" and {c.max_batch_size for c in cfgs.values()} == {4}
    _assert_connected(cfgs)


def _assert_connected(cfgs: dict) -> None:
    """Every step input is an ensemble input or an earlier step's output (same type, compatible dims), every
    model input is fed, every ensemble output is produced, and no tensor anywhere has empty dims."""
    ens = cfgs["hllm_ranker"]
    for cfg in cfgs.values():
        assert all(len(t.dims) >= 1 for t in [*cfg.input, *cfg.output]), cfg.name
    produced = {t.name: t for t in ens.input}
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["hllm_preprocess", "hllm_engine", "hllm_decode"]
    for step in ens.ensemble_scheduling.step:
        m = cfgs[step.model_name]
        assert set(step.input_map) == {t.name for t in m.input}  # every model input is fed …
        for key, value in step.input_map.items():  # … from an ensemble input or an earlier step, same type, compatible dims
            src, dst = produced[value], next(t for t in m.input if t.name == key)
            assert src.data_type == dst.data_type and len(src.dims) == len(dst.dims)
            assert all(a == b or -1 in (a, b) for a, b in zip(src.dims, dst.dims)), (key, src.dims, dst.dims)
        assert set(step.output_map) <= {t.name for t in m.output}
        produced.update({v: next(t for t in m.output if t.name == k) for k, v in step.output_map.items()})
    assert [t.name for t in ens.output] == ["ranking", "scores", "truncated"]
    assert all(produced[t.name].data_type == t.data_type for t in ens.output)


def test_python_models_are_hllms_own_modules_copied_unchanged(repo):
    for name, module in PY_MODELS.items():
        home = repo / "models" / name / "1"
        assert f"from {module} import TritonPythonModel" in (home / "model.py").read_text()
        manifest = json.loads((home / "site/hllm/VENDORED.json").read_text())
        assert [m["module"] for m in manifest["modules"]] == list(vendor.MODEL_MODULES)
        for m in vendor.MODEL_MODULES:
            copied = home.joinpath("site", *m.split(".")).with_suffix(".py")
            assert copied.read_bytes() == vendor.module_file(m).read_bytes(), m
        assert not (home / "site/hllm/runtime/ranker.py").exists()  # only what the models need
    client = repo / "client/site"
    for m in vendor.CLIENT_MODULES:
        assert client.joinpath(*m.split(".")).with_suffix(".py").read_bytes() == vendor.module_file(m).read_bytes()
    # a module that imports an hllm module outside the copied set is refused
    with pytest.raises(EngineError, match="hllm.errors"):
        vendor.vendor_modules(repo.parent / "partial", ("hllm.runtime.decode",))


def _execute(model, pb, requests: list[dict]) -> list:
    return model.execute([pb.InferenceRequest(inputs=[pb.Tensor(k, v) for k, v in r.items()]) for r in requests])


def test_python_backend_models_execute_with_stub_backend(repo, export_dir, pb_utils):
    """preprocess.execute → the engine (as Triton's engine step) → decode.execute == Ranker.rank, bad requests fail alone."""
    slates = tiny_slates(7, (1, 8), seed=80)
    args = lambda name: {"model_repository": str(repo / "models" / name), "model_version": "1", "model_name": name}  # noqa: E731
    pre, dec = preprocess_model.TritonPythonModel(), decode_model.TritonPythonModel()
    pre.initialize(args("hllm_preprocess"))
    dec.initialize(args("hllm_decode"))
    as_bytes = lambda ss: np.array([[json.dumps(s).encode()] for s in ss], dtype=object)  # noqa: E731
    too_many = {"candidates": [{"title": f"t{i}"} for i in range(9)]}
    chunks = [slates[:4], slates[4:]]
    responses = _execute(pre, pb_utils, [{"slates": as_bytes(c)} for c in chunks]
                         + [{"slates": np.array([[b"{not json"]], dtype=object)}, {"slates": as_bytes([too_many])}])
    assert [r.has_error() for r in responses] == [False, False, True, True]
    assert "slates[0]" in responses[2].error().message() and "K=8" in responses[3].error().message()
    got = []
    with Ranker.from_path(export_dir) as ranker:
        dec_requests = []
        for resp in responses[:2]:
            out = {t.name(): t.as_numpy() for t in resp.output_tensors()}
            assert out["input_ids"].dtype == np.int64 and out["input_ids"].shape[1] % 64 == 0
            assert out["item_mask"].dtype == bool and out["readout_positions"].shape == out["item_mask"].shape == out["truncated"].shape
            assert out["item_mask"].shape[1] == 8
            scores = ranker.engine.run(out["input_ids"], out["readout_positions"], out["item_mask"])
            dec_requests.append({"scores": scores, "item_mask": out["item_mask"], "_truncated": out["truncated"]})
        nan = {"scores": np.full((1, 2, 8), np.nan, np.float32), "item_mask": np.ones((1, 2), bool)}
        decoded = _execute(dec, pb_utils, [{k: v for k, v in r.items() if not k.startswith("_")} for r in dec_requests] + [nan])
    assert [r.has_error() for r in decoded] == [False, False, True] and "non-finite" in decoded[2].error().message()
    from hllm.serve.triton.client import rankings_from_outputs

    for resp, req, chunk in zip(decoded, dec_requests, chunks):
        ranking = pb_utils.get_output_tensor_by_name(resp, "ranking").as_numpy()
        assert ranking.dtype == np.int64 and ranking.shape == req["item_mask"].shape
        got.extend(rankings_from_outputs(ranking, req["scores"], req["_truncated"], chunk))
    assert_same_rankings(got, ranker_rankings(export_dir, slates))
    pre.finalize()
    dec.finalize()
    assert pre.builder is None


def test_rank_arrays_checks_its_inputs():
    with pytest.raises(DecodeError, match="prefix"):
        decode_model.rank_arrays(np.zeros((1, 3, 4), np.float32), np.array([[True, False, True]]))
    with pytest.raises(DecodeError, match="must be"):
        decode_model.rank_arrays(np.zeros((1, 3, 4), np.float32), np.ones((1, 2), bool))
    r = decode_model.rank_arrays(np.eye(4, dtype=np.float32)[None, :, :], np.array([[True, True, True, False]]))
    assert r.tolist() == [[0, 1, 2, -1]]


def _rank_py(repo: Path, url: str, slates_file: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run the generated client as a user would (isolated: no PYTHONPATH, so hllm is not on the path)."""
    return subprocess.run([sys.executable, "-I", str(repo / "client/rank.py"), "--url", url, "--slates", str(slates_file), *extra],
                          capture_output=True, text=True, timeout=120)


def test_rank_py_end_to_end_against_kserve_stub(repo, export_dir, tmp_path):
    slates = tiny_slates(7, (1, 8), seed=81)
    write_jsonl(tmp_path / "s.jsonl", slates)
    write_jsonl(tmp_path / "bad.jsonl", [{"slate_id": "big", "candidates": [{"title": f"t{i}"} for i in range(9)]}])
    stub = KServeStub(repo / "models", ["-I"])
    try:
        r = _rank_py(repo, stub.url, tmp_path / "s.jsonl", "--batch-size", "3")
        bad = _rank_py(repo, stub.url, tmp_path / "bad.jsonl")
    finally:
        stub.close()
    assert r.returncode == 0, r.stderr
    assert_same_rankings([json.loads(line) for line in r.stdout.splitlines()], ranker_rankings(export_dir, slates))
    assert bad.returncode == 2 and "K=8" in bad.stderr  # the preprocessing model's error reaches the client
    assert stub.info["WARMUPS"] == {"hllm_engine": 1}
    for name, modules in stub.info["HLLM_MODULES"].items():  # every hllm module came from the repository itself
        assert modules and all(f.startswith(str(repo / "models" / name / "1" / "site")) for f in modules.values()), name


def test_bundled_repository_runs_with_numpy_alone(export_dir, tmp_path):
    """--bundle-deps (for this Python) → the stub server runs with only numpy, onnxruntime and protobuf on its path."""
    out = tmp_path / "bundled"
    try:
        res = write_repository(export_dir, out, max_batch_size=4, kind="cpu", bundle_deps=True,
                               bundle_python=f"{sys.version_info.major}.{sys.version_info.minor}")
    except EngineError as e:
        if "failed" in str(e) and ("connect" in str(e).lower() or "network" in str(e).lower() or "resolve" in str(e).lower()):
            pytest.skip(f"no package index reachable for --bundle-deps: {e}")
        raise
    assert {p.split("==")[0] for v in res["bundled"].values() for p in v} == {"tokenizers", "lap"}
    assert (out / "models/hllm_preprocess/1/site/tokenizers").is_dir() and (out / "models/hllm_decode/1/site/lap").is_dir()
    site = Path(np.__file__).resolve().parents[1]
    only = tmp_path / "only"  # the Triton image's Python: numpy (+ the engine backend and config parsing of this stub)
    only.mkdir()
    for name in ("numpy", "numpy.libs", "onnxruntime", "google"):
        if (site / name).exists():
            (only / name).symlink_to(site / name)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(only), "PYTHONNOUSERSITE": "1"}
    check = subprocess.run([sys.executable, "-S", "-c", "import lap"], env=env, capture_output=True, text=True)
    assert check.returncode != 0  # lap and tokenizers really are absent from that path
    slates = tiny_slates(5, (1, 8), seed=82)
    write_jsonl(tmp_path / "s.jsonl", slates)
    stub = KServeStub(out / "models", ["-S"], env=env)
    try:
        r = _rank_py(out, stub.url, tmp_path / "s.jsonl")
    finally:
        stub.close()
    assert r.returncode == 0, r.stderr
    assert_same_rankings([json.loads(line) for line in r.stdout.splitlines()], ranker_rankings(export_dir, slates))


def test_cli_triton_repo_and_refusals(export_dir, merged_checkpoint, tmp_path):
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "hllm", "triton-repo", *map(str, a)], capture_output=True, text=True, env=env)  # noqa: E731
    r = run(export_dir, out, "--kind", "cpu", "--seq-bucket", "32")
    assert r.returncode == 0, r.stderr
    assert "KIND_CPU" in (out / "models/hllm_engine/config.pbtxt").read_text()
    assert json.loads((out / "models/hllm_preprocess/1/hllm_preprocess.json").read_text())["seq_bucket"] == 32
    assert "--bundle-deps" in " ".join(r.stderr.split()) and "tokenizers" in (out / "README.md").read_text()
    r = run(export_dir, out)
    assert r.returncode == 2 and "already exists" in " ".join(r.stderr.split())  # rich wraps long lines
    r = run(merged_checkpoint, tmp_path / "c")
    assert r.returncode == 2 and "ONNX export or a TensorRT plan" in " ".join(r.stderr.split())
    r = run(export_dir, tmp_path / "d", "--bundle-deps", "--bundle-arch", "riscv")
    assert r.returncode == 2 and "--bundle-arch" in r.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


# -- a head that reads the user context: four engine inputs ---------------------------------------------

FOUR = ["input_ids", "readout_positions", "item_mask", "context_positions"]


@pytest.fixture(scope="module")
def context_repo(context_export_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("triton-context") / "repo"
    res = write_repository(context_export_dir, out, max_batch_size=4)
    assert res["instance_kind"] == "cpu" and res["notes"] == []  # ort-cpu export → KIND_CPU by default
    return out


def test_context_repository_feeds_every_engine_input(context_repo, context_export_dir):
    import onnx

    cfgs = {n: _config(context_repo, n)[0] for n in ("hllm_preprocess", "hllm_engine", "hllm_decode", "hllm_ranker")}
    eng, pb = _config(context_repo, "hllm_engine")
    graph = onnx.load(str(context_repo / "models/hllm_engine/1/model.onnx"), load_external_data=False).graph
    assert [t.name for t in eng.input] == [t.name for t in graph.input] == FOUR
    for cfg_t, g_t in zip(eng.input, graph.input):
        gdims = [d.dim_value if d.HasField("dim_value") else -1 for d in g_t.type.tensor_type.shape.dim]
        model_dims = list(cfg_t.reshape.shape) if cfg_t.HasField("reshape") else list(cfg_t.dims)
        assert model_dims == gdims[1:] and len(cfg_t.dims) >= 1, cfg_t.name  # what the backend sees == the graph
    ctx = eng.input[3]
    assert list(ctx.dims) == [1] and ctx.HasField("reshape") and list(ctx.reshape.shape) == []
    assert eng.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    pre_out = {t.name: list(t.dims) for t in cfgs["hllm_preprocess"].output}
    assert pre_out == {"input_ids": [-1], "readout_positions": [8], "item_mask": [8], "context_positions": [1], "truncated": [8]}
    _assert_connected(cfgs)
    (warm,) = eng.model_warmup
    assert set(warm.inputs) == set(FOUR) and list(warm.inputs["context_positions"].dims) == [1]
    files = context_repo / "models/hllm_engine/warmup"
    ids = np.frombuffer((files / "input_ids").read_bytes(), dtype=np.int64)
    (ctx_pos,) = np.frombuffer((files / "context_positions").read_bytes(), dtype=np.int64)
    readout = np.frombuffer((files / "readout_positions").read_bytes(), dtype=np.int64)
    assert 0 < ctx_pos < readout[0] < len(ids)  # the last user-context token precedes the first candidate
    settings = json.loads((context_repo / "models/hllm_preprocess/1/hllm_preprocess.json").read_text())
    assert settings["inputs"] == FOUR


def test_context_repository_ranks_like_hllm_rank(context_repo, context_export_dir, tmp_path):
    """The generated model.py files (preprocess, decode) and the ONNX engine, chained by the ensemble config
    in the stub server (which applies the engine's reshape), rank as `hllm rank` does."""
    slates = tiny_slates(6, (1, 8), seed=83)
    write_jsonl(tmp_path / "s.jsonl", slates)
    rank = subprocess.run([sys.executable, "-m", "hllm", "rank", str(context_export_dir), "-s", str(tmp_path / "s.jsonl"),
                           "-o", str(tmp_path / "want.jsonl")], capture_output=True, text=True)
    assert rank.returncode == 0, rank.stderr
    stub = KServeStub(context_repo / "models", ["-I"])
    try:
        r = _rank_py(context_repo, stub.url, tmp_path / "s.jsonl", "--batch-size", "4")
    finally:
        stub.close()
    assert r.returncode == 0, r.stderr
    assert stub.info["WARMUPS"] == {"hllm_engine": 1}
    want = [json.loads(line) for line in (tmp_path / "want.jsonl").read_text().splitlines()]
    assert_same_rankings([json.loads(line) for line in r.stdout.splitlines()], want)


def test_writer_refuses_what_it_cannot_serve_and_picks_the_instance_kind(context_export_dir, export_dir):
    import dataclasses

    from hllm.runtime.artefact import resolve
    from hllm.serve.triton.repo import check_ensemble, servable

    art = resolve(context_export_dir)
    assert servable(art, None) == ("cpu", [])
    kind, notes = servable(art, "gpu")  # asked for GPU instances of an ort-cpu graph: served, with a note
    assert kind == "gpu" and "GroupQueryAttention" in notes[0] and "--flavour standard" in notes[0]
    assert servable(dataclasses.replace(art, flavour="standard"), None) == ("gpu", [])
    odd = dataclasses.replace(art, meta={**art.meta, "inputs": [*art.meta["inputs"], {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "seq"]}]})
    with pytest.raises(EngineError, match="attention_mask"):
        servable(odd, None)
    # what `hllm calibrate --backend auto` may select: an OpenVINO sidecar over model.onnx is served by ORT
    # (with a note); an NNCF INT8 IR is refused with the way out
    ov = dataclasses.replace(art, meta={**art.meta, "engine": "openvino", "openvino": {"inference_precision": "bf16"}})
    kind, notes = servable(ov, None)
    assert kind == "cpu" and "OpenVINO (bf16)" in notes[0] and "fp32" in notes[0]
    ir = dataclasses.replace(art, meta={**art.meta, "engine": "openvino", "openvino": {"ir": "model.xml"}})
    with pytest.raises(EngineError, match="OpenVINO IR export.*hllm serve"):
        servable(ir, None)
    with pytest.raises(EngineError, match=r"hllm_engine reads \['context_positions'\]"):
        check_ensemble([("hllm_preprocess", ["slates"], ["input_ids", "truncated"]),
                        ("hllm_engine", ["input_ids", "context_positions"], ["scores"])])


def test_triton_writer_imports_without_fastapi():
    code = ("import sys; sys.modules['fastapi'] = None\n"  # a None entry makes `import fastapi` fail
            "import hllm.serve.triton.repo, hllm.serve\n"
            "print(sorted(m for m in ('fastapi', 'torch', 'transformers') if sys.modules.get(m)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
