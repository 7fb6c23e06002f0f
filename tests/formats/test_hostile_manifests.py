"""Hostile manifests and sidecars: paths that escape their directory, fields of
the wrong type, templates with unknown placeholders, corrupt or foreign adapters, a tokenizer or graph
that is not the one exported — each a CheckpointError/EngineError naming the field, never an internal error."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hllm.errors import CheckpointError, EngineError
from hllm.formats.checkpoint import load_manifest
from hllm.formats.export import read_export
from hllm.formats.plan import write_sidecar
from hllm.formats.prompt import PromptSpec
from hllm.formats.tokenizer import tokenizer_id_count
from hllm.runtime.artefact import resolve


# -- checkpoint manifest --------------------------------------------------------------------------------
def edit(ckpt: Path, fn) -> Path:
    d = json.loads((ckpt / "hllm.json").read_text())
    d = fn(d) or d
    (ckpt / "hllm.json").write_text(json.dumps(d))
    return ckpt


def refused(ckpt: Path, *words: str) -> str:
    with pytest.raises(CheckpointError) as e:
        load_manifest(ckpt)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


def test_head_file_escaping_the_checkpoint_is_refused(ckpt, tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(ckpt / "head.safetensors", evil / "head.safetensors")  # a readable file is there
    edit(ckpt, lambda d: d["head"].update(file="../evil/head.safetensors"))
    refused(ckpt, "head.file", "'../evil/head.safetensors'", "points outside")
    edit(ckpt, lambda d: d["head"].update(file=str(evil / "head.safetensors")))
    refused(ckpt, "head.file", "absolute path")


def test_head_file_symlink_out_of_the_checkpoint_is_refused(ckpt, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.move(ckpt / "head.safetensors", outside)
    (ckpt / "head.safetensors").symlink_to(outside)
    refused(ckpt, "head.file", "points outside")


def test_head_file_inside_a_subdirectory_is_fine_and_normalised(ckpt):
    (ckpt / "weights").mkdir()
    shutil.move(ckpt / "head.safetensors", ckpt / "weights" / "h.safetensors")
    edit(ckpt, lambda d: d["head"].update(file="weights/../weights/h.safetensors"))
    m = load_manifest(ckpt)
    assert m.head.file == "weights/h.safetensors" and m.head_path == ckpt.resolve() / "weights" / "h.safetensors"


def test_adapter_path_escaping_or_wrong_type_is_refused(ckpt, tmp_path):
    shutil.copytree(ckpt / "adapter", tmp_path / "stolen")
    edit(ckpt, lambda d: d["adapter"].update(path="../stolen"))
    refused(ckpt, "adapter.path", "points outside")
    edit(ckpt, lambda d: d["adapter"].update(path=str(tmp_path / "stolen")))
    refused(ckpt, "adapter.path", "absolute")
    edit(ckpt, lambda d: d["adapter"].update(path=3))
    refused(ckpt, "adapter.path must be a file name", "got 3")
    edit(ckpt, lambda d: d.update(adapter="adapter"))
    refused(ckpt, "adapter must be an object", "got str")
    edit(ckpt, lambda d: d.update(adapter={"path": "head.safetensors"}))
    refused(ckpt, "adapter.path 'head.safetensors' is not a directory")


def test_backbone_path_may_point_outside_but_must_be_a_path(ckpt):
    assert load_manifest(ckpt).backbone_path.is_absolute()  # by design (module doc): outside CKPT
    edit(ckpt, lambda d: d["backbone"].update(path=42))
    refused(ckpt, "backbone.path must be a directory path", "got 42")
    edit(ckpt, lambda d: d["backbone"].update(path=["x"]))
    refused(ckpt, "backbone.path")


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: [d], ["must be a JSON object", "got list"]),
        (lambda d: d.update(head=[1, 2]), ["section 'head' is missing or not an object"]),
        (lambda d: d.update(prompt="hello"), ["section 'prompt'"]),
        (lambda d: d["head"].update(num_positions="8"), ["head num_positions must be a positive integer", "got '8'"]),
        (lambda d: d["head"].update(num_positions=True), ["head num_positions", "got True"]),
        (lambda d: d["head"].update(num_positions=0), ["head num_positions", "got 0"]),
        (lambda d: d["head"].update(d_model=31.5), ["head d_model", "got 31.5"]),
        (lambda d: d["head"].update(kind=5), ["unknown head kind 5"]),
        (lambda d: d["head"].update(file=5), ["head file must be a file name", "got 5"]),
        (lambda d: d["head"].update(context="yes"), ["head context must be true or false"]),
        (lambda d: d["head"].update(colour="red"), ["unknown head keys", "colour"]),
        (lambda d: d["prompt"].update(candidate_template="{index}. {title} ({brand[0]})"), ["candidate_template", "{brand[0]}"]),
        (lambda d: d["prompt"].update(user_template="{history} {title}"), ["user_template", "{title}", "allowed: {history}"]),
        (lambda d: d["prompt"].update(history_item_template="{title.__class__}"), ["history_item_template", "{title.__class__}"]),
        (lambda d: d["prompt"].update(candidate_template="{title"), ["candidate_template is not a valid template"]),
        (lambda d: d["prompt"].update(max_seq_len="2048"), ["prompt spec max_seq_len must be a positive integer", "'2048'"]),
        (lambda d: d["prompt"].update(separator=None), ["prompt spec separator must be a string", "got null"]),
        (lambda d: d["prompt"].update(bogus=1), ["prompt spec has unknown keys", "bogus"]),
        (lambda d: d.update(format_version="1"), ["format_version '1' not supported"]),
    ],
)
def test_wrong_types_name_the_field(ckpt, mutate, words):
    edit(ckpt, mutate)
    refused(ckpt, *words)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"{not json", ["manifest is not readable JSON"]),
        (b"\xff\xfe{}", ["manifest is not readable JSON"]),
        (b"[" * 100_000 + b"]" * 100_000, ["manifest is not readable JSON", "recursion"]),
        (b"", ["manifest is not readable JSON"]),
    ],
)
def test_unreadable_manifest(ckpt, content, words):
    (ckpt / "hllm.json").write_bytes(content)
    refused(ckpt, *words)


def test_corrupt_adapter_config_and_weights(ckpt):
    cfg = ckpt / "adapter" / "adapter_config.json"
    good = cfg.read_text()
    cfg.write_text("{broken")
    refused(ckpt, "adapter_config.json", "adapter config is not readable JSON")
    cfg.write_text("[1, 2]")
    refused(ckpt, "adapter config must be a JSON object", "got list")
    d = json.loads(good)
    cfg.write_text(json.dumps(dict(d, r="4")))
    refused(ckpt, "r must be a positive integer", "'4'")
    cfg.write_text(json.dumps(dict(d, peft_type="IA3")))
    refused(ckpt, "peft_type 'IA3' is not supported")
    cfg.write_text(good)
    (ckpt / "adapter" / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    refused(ckpt, "adapter weights", "not a readable safetensors file")


@pytest.mark.parametrize(
    "targets, words",
    [
        (["q_proj", "fc_in"], ["target_modules names 'fc_in', which the backbone does not have", "q_proj"]),
        ([], ["target_modules must be a non-empty list"]),
        ([3], ["target_modules must be a non-empty list"]),
        (r".*\.layers\.(40|41)\.self_attn\.q_proj", ["matches no module of the backbone"]),
        ("(unclosed", ["is not a valid regular expression"]),
        (None, ["target_modules must be a non-empty list"]),
    ],
)
def test_lora_target_modules_must_exist_in_the_backbone(ckpt, targets, words):
    cfg = ckpt / "adapter" / "adapter_config.json"
    cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), target_modules=targets)))
    refused(ckpt, "adapter_config.json", *words)


def test_lora_target_modules_as_peft_writes_them_load(ckpt):
    cfg = ckpt / "adapter" / "adapter_config.json"
    d = json.loads(cfg.read_text())
    for targets in (r"(.*\.)?layers\.(0|1)\.(.*\.)?(q_proj|v_proj)", ["model.layers.0.self_attn.q_proj", "down_proj"]):
        cfg.write_text(json.dumps(dict(d, target_modules=targets)))
        assert load_manifest(ckpt).adapter_path is not None


def test_backbone_tokenizer_larger_than_the_embedding(ckpt, qwen3_backbone, tmp_path):
    bb = tmp_path / "bb"
    shutil.copytree(qwen3_backbone, bb)
    n = tokenizer_id_count(bb / "tokenizer.json")
    cfg = json.loads((bb / "config.json").read_text())
    (bb / "config.json").write_text(json.dumps(dict(cfg, vocab_size=n - 10)))
    edit(ckpt, lambda d: d["backbone"].update(path=str(bb)))
    refused(ckpt, f"token ids up to {n - 1}", f"embedding has {n - 10} rows", "another model")


# -- hllm merge never writes outside its output ------------------------------------------------------
def test_merge_refuses_escaping_head_and_writes_nothing(ckpt, tmp_path):
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.testing import tiny_slates

    (tmp_path / "evil").mkdir()
    shutil.copy(ckpt / "head.safetensors", tmp_path / "evil" / "head.safetensors")
    edit(ckpt, lambda d: d["head"].update(file="../evil/head.safetensors"))
    out = tmp_path / "out" / "merged"
    with pytest.raises(CheckpointError, match="points outside"):
        merge_checkpoint(ckpt, out, tiny_slates(1, 3))
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in (tmp_path / "evil").iterdir()) == ["head.safetensors"]


def test_merge_keeps_a_subdirectory_head_inside_its_output(ckpt, tmp_path):
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.testing import tiny_slates

    (ckpt / "w").mkdir()
    shutil.move(ckpt / "head.safetensors", ckpt / "w" / "head.safetensors")
    edit(ckpt, lambda d: d["head"].update(file="w/head.safetensors"))
    out = tmp_path / "merged"
    merge_checkpoint(ckpt, out, tiny_slates(1, 3))
    assert (out / "w" / "head.safetensors").is_file()
    assert load_manifest(out).head_path == out.resolve() / "w" / "head.safetensors"


# -- export sidecar -------------------------------------------------------------------------------------
@pytest.fixture
def export(export_dir, tmp_path) -> Path:
    dst = tmp_path / "export"
    shutil.copytree(export_dir, dst)
    return dst


def edit_sidecar(export: Path, fn) -> Path:
    d = json.loads((export / "export.json").read_text())
    d = fn(d) or d
    (export / "export.json").write_text(json.dumps(d))
    return export


def engine_refused(path, *words, **kw) -> str:
    with pytest.raises(EngineError) as e:
        resolve(path, **kw)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


def test_sidecar_file_names_must_stay_inside(export, tmp_path):
    shutil.copy(export / "model.onnx", tmp_path / "model.onnx")
    edit_sidecar(export, lambda d: d.update(onnx="../model.onnx"))
    engine_refused(export, "onnx", "points outside")
    edit_sidecar(export, lambda d: d.update(onnx="model.onnx", tokenizer="/etc/passwd"))
    engine_refused(export, "tokenizer", "absolute")


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: [d], ["expected a JSON object, got list"]),
        (lambda d: d.update(num_positions="8"), ["num_positions must be a positive integer", "'8'"]),
        (lambda d: d.update(onnx=7), ["onnx must be a file name", "7"]),
        (lambda d: d.update(prompt=[]), ["prompt must be an object"]),
        (lambda d: d["prompt"].update(candidate_template="{title} {price.usd}"), ["candidate_template", "{price.usd}"]),
        (lambda d: d.update(tokenizer_sha256=5), ["tokenizer_sha256 must be a non-empty string"]),
        (lambda d: d.update(backbone=[1]), ["backbone must be an object"]),
        (lambda d: d["backbone"].update(vocab_size="320"), ["backbone.vocab_size must be a positive integer"]),
        (lambda d: d.update(onnx_bytes="big"), ["onnx_bytes must be a positive integer"]),
        (lambda d: d.update(inputs=5), ["inputs must be a non-empty list"]),
        (lambda d: d.update(flavour=["x"]), ["flavour"]),
    ],
)
def test_sidecar_wrong_types_name_the_field(export, mutate, words):
    edit_sidecar(export, mutate)
    engine_refused(export, "export.json", *words)


def test_unreadable_sidecar(export):
    (export / "export.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    engine_refused(export, "cannot read")


def test_tokenizer_from_another_model_is_refused(export, backbones):
    shutil.copy(backbones["llama"] / "tokenizer.json", export / "tokenizer.json")  # another model's
    tok = json.loads((export / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 999, "content": "<extra>", "special": True, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False})
    (export / "tokenizer.json").write_text(json.dumps(tok))
    engine_refused(export, "tokenizer.json is not the tokenizer this model was exported with")
    edit_sidecar(export, lambda d: d.pop("tokenizer_sha256") and None)  # no fingerprint: the vocabulary still tells
    engine_refused(export, "token ids up to 999", "embedding has 320 rows", "another model")


def test_graph_replaced_is_refused_by_size_always_and_by_hash_on_request(export):
    onnx = export / "model.onnx"
    data = bytearray(onnx.read_bytes())
    onnx.write_bytes(bytes(data[:-10]))
    engine_refused(export, "is", "bytes but the export recorded", "re-export")
    data[len(data) // 2] ^= 0x01  # same size, different bytes
    onnx.write_bytes(bytes(data))
    assert resolve(export).kind == "onnx"  # the cheap check cannot see it ...
    engine_refused(export, "sha256", "the graph was replaced", verify_hash=True)  # ... the hash can
    with pytest.raises(EngineError, match="the graph was replaced"):
        read_export(onnx, verify_hash=True)


def test_ranker_from_path_verifies_the_hash_when_asked(export):
    from hllm.runtime import Ranker

    Ranker.from_path(export, verify_hash=True)  # the genuine export passes
    onnx = export / "model.onnx"
    data = bytearray(onnx.read_bytes())
    data[-5] ^= 0x01
    onnx.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="the graph was replaced"):
        Ranker.from_path(export, verify_hash=True)


def test_older_sidecar_without_the_keys_still_loads(export):
    for key in ("tokenizer_sha256", "onnx_bytes", "onnx_sha256", "backbone"):
        edit_sidecar(export, lambda d: d.pop(key) and None)
    art = resolve(export, verify_hash=True)
    assert art.kind == "onnx" and art.num_positions == 8


# -- TensorRT plan sidecar (no TensorRT needed: resolve reads only the sidecar) ---------------------------
def _plan(tmp_path, export_dir, **over) -> Path:
    """A fake plan (10 bytes) with a valid sidecar, whose keys ``over`` then replace as stored JSON."""
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"plan bytes")
    shutil.copy(export_dir / "tokenizer.json", tmp_path / "m.plan.tokenizer.json")
    meta = {
        "tensorrt_version": "10.13.0", "compute_capability": "8.0", "gpu_name": "A100",
        "profiles": [{"batch": {"min": 1, "opt": 1, "max": 2}, "seq": {"min": 2, "opt": 64, "max": 128},
                      "items": {"min": 1, "opt": 8, "max": 8}}],
        "precision": "fp16", "num_positions": 8, "prompt": PromptSpec().to_dict(),
        "tokenizer": "m.plan.tokenizer.json", "onnx_sha256": "ab" * 32, "plan_bytes": 10,
    }
    side = write_sidecar(plan, meta)
    side.write_text(json.dumps({**json.loads(side.read_text()), **over}))
    return plan


def test_plan_sidecar_paths_types_and_size(tmp_path, export_dir):
    assert resolve(_plan(tmp_path, export_dir)).kind == "tensorrt"
    engine_refused(_plan(tmp_path, export_dir, tokenizer="../tokenizer.json"), "tokenizer", "points outside")
    engine_refused(_plan(tmp_path, export_dir, tokenizer=9), "tokenizer must be a string")
    engine_refused(_plan(tmp_path, export_dir, num_positions="8"), "num_positions must be a positive integer")
    engine_refused(_plan(tmp_path, export_dir, format_version="x"), "format_version must be an integer")
    engine_refused(_plan(tmp_path, export_dir, profiles={"a": 1}), "profiles must be a list")
    engine_refused(_plan(tmp_path, export_dir, prompt={"candidate_template": "{0}{title}"}), "{0}")
    engine_refused(_plan(tmp_path, export_dir, plan_bytes=11), "10 bytes but its sidecar records 11")
    plan = _plan(tmp_path, export_dir, plan_sha256="00" * 32)
    assert resolve(plan).kind == "tensorrt"
    engine_refused(plan, "the plan was replaced", verify_hash=True)
    (tmp_path / "m.plan.json").write_text("[1]")
    engine_refused(plan, "expected a JSON object, got list")
    (tmp_path / "m.plan.json").write_bytes(b"\xff")
    engine_refused(plan, "cannot read")


# -- prompt spec on its own ---------------------------------------------------------------------------
def test_prompt_spec_literal_braces_and_format_specs():
    spec = PromptSpec(candidate_template="{{{index}}} {title}")
    assert spec.candidate_template.format(index=3, title="t") == "{3} t"
    for bad in ("{title:>5000000}", "{index:02d} {title}", "{title!r}", "{title!s:^9}"):
        with pytest.raises(CheckpointError, match="format spec or conversion"):
            PromptSpec(candidate_template=bad)
    with pytest.raises(CheckpointError, match="history_item_template.*format spec"):
        PromptSpec(history_item_template="{title:>5000000}")
    with pytest.raises(CheckpointError, match="must contain {title}"):
        PromptSpec(candidate_template="{{title}} {index}")  # a literal, not the placeholder
    with pytest.raises(CheckpointError, match="format spec"):
        PromptSpec(candidate_template="{title:d}")
    with pytest.raises(CheckpointError, match="unknown placeholder {}"):
        PromptSpec(candidate_template="{} {title}")
    with pytest.raises(CheckpointError, match="bos_token"):
        PromptSpec(bos_token="")


def test_no_internal_error_on_any_json_type(ckpt):
    """Every section, and every head / prompt field, replaced by every JSON type: a CheckpointError or
    (only where the value is valid, e.g. adapter null) a manifest — never another exception."""
    original = json.loads((ckpt / "hllm.json").read_text())
    values = [None, True, 0, -1, 1.5, "", "x", "../x", [], [1], {}, {"path": None}]
    targets = [(k,) for k in ("backbone", "adapter", "head", "prompt")]
    targets += [("head", k) for k in original["head"]] + [("prompt", k) for k in original["prompt"]]
    loaded = 0
    for path in targets:
        for v in values:
            d = json.loads(json.dumps(original))
            (d if len(path) == 1 else d[path[0]])[path[-1]] = v
            (ckpt / "hllm.json").write_text(json.dumps(d))
            try:
                load_manifest(ckpt)
                loaded += 1
            except CheckpointError:
                pass
    assert loaded < len(targets) * len(values) // 4  # the sweep really exercised the refusals


def test_calibration_set_meta_of_the_wrong_type(tmp_path):
    from hllm.errors import SlateError
    from hllm.formats.calibration_set import load_calibration_set

    np_ = pytest.importorskip("numpy")
    np_.savez(tmp_path / "calib.npz", x=np_.zeros(1))
    for content, words in ((b"[1]", "expected a JSON object, got list"), (b"\xff", "cannot read"),
                           (b'{"format": "hllm-calibration/1", "shapes": 5}', "shapes must be a list")):
        (tmp_path / "calib.json").write_bytes(content)
        with pytest.raises(SlateError, match=words):
            load_calibration_set(tmp_path / "calib")
