"""The CLI bad-input corpus: every class of bad input to every command gets the documented exit
code (2), ONE line on stderr starting with ``error:`` (no traceback, no "internal error"), and leaves no file
behind and no existing file replaced. Cases run in-process (``hllm.cli.main``) on the tiny models of
tests/conftest.py; most fail before any model is loaded. docs/hardening.md lists the classes."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from hllm.cli import main
from hllm.testing import tiny_slates

cli_app = sys.modules["hllm.cli.app"]

# (class id, argv with {placeholders}, needle expected in the error line). Exit code 2 for all.
CASES = [
    # -- usage -----------------------------------------------------------------------------------------
    ("unknown-command", ["no-such-command"], "No such command"),
    ("unknown-option", ["rank", "{export}", "-o", "{out}", "--bogus"], "No such option"),
    ("missing-argument", ["rank"], "Missing argument"),
    ("missing-required-option", ["rank", "{export}"], "Missing option"),
    ("int-option-not-a-number", ["rank", "{export}", "-o", "{out}", "--batch-size", "two"], "--batch-size"),
    ("float-option-not-a-number", ["parity", "{ckpt}", "{export}", "--atol", "tiny"], "--atol"),
    ("root-option-after-command", ["rank", "{export}", "-o", "{out}", "--debug"], "No such option"),
    ("two-things-on-stdout", ["rank", "{export}", "-s", "{good}", "-o", "-", "--json"], "only one thing can go to stdout"),
    # -- counts out of range -------------------------------------------------
    ("batch-size-zero", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--batch-size", "0"], "--batch-size"),
    ("batch-size-negative", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "-b", "-1"], "--batch-size"),
    ("batch-size-huge", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "-b", "100000"], "--batch-size"),
    ("limit-negative", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--limit", "-1"], "--limit"),
    ("limit-zero", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--limit", "0"], "--limit"),
    ("threads-huge", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--threads", "100000"], "--threads"),
    ("threads-zero", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--threads", "0"], "--threads"),
    ("workers-huge", ["rank", "{export}", "-s", "{good}", "-o", "{out}", "--ray", "--workers", "100000"], "--workers"),
    ("atol-nan", ["parity", "{ckpt}", "{export}", "-s", "{good}", "--atol", "nan"], "--atol"),
    ("atol-negative", ["merge", "{lora}", "{tmp}/m", "--atol", "-1"], "--atol"),
    ("fraction-above-one", ["parity", "{ckpt}", "{export}", "--min-top1", "1.5"], "--min-top1"),
    ("init-candidate-tokens-zero", ["init", "{backbone}", "{tmp}/ck", "--candidate-tokens", "0"], "--candidate-tokens"),
    ("init-max-seq-len-negative", ["init", "{backbone}", "{tmp}/ck", "--max-seq-len", "-1"], "--max-seq-len"),
    ("init-lora-rank-negative", ["init", "{backbone}", "{tmp}/ck", "--lora-rank", "-1"], "--lora-rank"),
    ("positions-zero", ["init", "{backbone}", "{tmp}/ck", "-k", "0"], "--positions"),
    ("seed-negative", ["init", "{backbone}", "{tmp}/ck", "--seed", "-1"], "--seed"),
    ("port-out-of-range", ["serve", "{export}", "--port", "70000"], "--port"),
    ("serve-batch-zero-deprecated-alias", ["serve", "{export}", "--max-batch", "0"], "--batch-size"),
    ("serve-wait-nan", ["serve", "{export}", "--max-wait-ms", "nan"], "--max-wait-ms"),
    ("loadtest-clients-huge", ["loadtest", "{export}", "--clients", "100000"], "--clients"),
    ("loadtest-requests-zero", ["loadtest", "{export}", "--requests", "0"], "--requests"),
    ("loadtest-rounds-zero", ["loadtest", "{export}", "--rounds", "0"], "--rounds"),
    ("triton-instances-zero", ["triton-repo", "{export}", "{tmp}/tr", "--instances", "0"], "--instances"),
    ("build-opt-level", ["build", "{std_export}", "{tmp}/x.plan", "--opt-level", "9"], "--opt-level"),
    ("build-workspace-negative", ["build", "{std_export}", "{tmp}/x.plan", "--workspace-gb", "-1"], "--workspace-gb"),
    ("calibrate-count-zero", ["calibrate", "{export}", "{tmp}/q", "--calib-count", "0"], "--calib-count"),
    ("bench-runs-zero", ["bench", "stages", "{export}", "--runs", "0", "-o", "{out}"], "--runs"),
    ("bench-n-items-huge", ["bench", "stages", "{export}", "-n", "100000", "-o", "{out}"], "--n-items"),
    ("bench-n-items-not-ints", ["bench", "stages", "{export}", "-n", "ten", "-o", "{out}"], "--n-items"),
    ("bench-matrices-zero", ["bench", "lapjv", "--matrices", "0", "-o", "{out}"], "--matrices"),
    ("train-steps-zero", ["train", "{backbone}", "{tmp}/ck", "-s", "{good}", "--steps", "0"], "--steps"),
    ("train-lr-nan", ["train", "{backbone}", "{tmp}/ck", "-s", "{good}", "--lr", "nan"], "--lr"),
    ("features-layer-negative", ["features", "{backbone}", "{tmp}/f", "-s", "{good}", "--layer", "-1"], "--layer"),
    ("teacher-batch-zero", ["teacher", "{backbone}", "-s", "{good}", "-o", "{out}", "-b", "0"], "--batch-size"),
    ("eval-limit-zero", ["eval", "random", "-s", "{good}", "--limit", "0"], "--limit"),
    # -- choices ---------------------------------------------------------------------------------------
    ("unknown-head", ["init", "{backbone}", "{tmp}/ck", "--head", "mlp"], "head must be one of"),
    ("train-unknown-precision", ["train", "{backbone}", "{tmp}/ck", "-s", "{good}", "--precision", "fp8"],
     "precision must be one of auto, fp32, bf16"),
    ("features-unknown-device", ["features", "{backbone}", "{tmp}/f", "-s", "{good}", "--layer", "1", "--device", "tpu"],
     "device must be one of auto, cpu, cuda"),
    ("train-status-not-a-run", ["train-status", "{tmp}"], "no training_state.json"),
    ("train-status-not-a-cache", ["train-status", "--features", "{tmp}"], "is not a feature cache"),
    ("unknown-flavour", ["export", "{ckpt}", "{tmp}/e", "--flavour", "tensorrt"], "flavour must be one of ort-cpu, standard"),
    ("unknown-precision", ["export", "{ckpt}", "{tmp}/e", "--precision", "int4"], "precision must be one of"),
    ("unknown-backend", ["calibrate", "{export}", "{tmp}/q", "--backend", "tflite"], "backend must be one of"),
    # bf16 is checked against the CPU (AVX512_BF16 / AMX) and refused with the reason
    ("bf16-on-cpu", ["calibrate", "{tmp}/nope", "{tmp}/q", "--precision", "bf16"], "bf16 on CPU needs AVX512_BF16 or AMX"),
    ("fp8-on-a100", ["calibrate", "{tmp}/nope", "{tmp}/q", "--backend", "modelopt", "--precision", "fp8", "--target", "a100"],
     "fp8 is not supported on target a100"),
    ("unknown-teacher-kind", ["teacher", "{backbone}", "-s", "{good}", "-o", "{out}", "--kind", "oracle"], "kind must be one of"),
    ("unknown-objective", ["train", "{backbone}", "{tmp}/ck", "-s", "{good}", "--objective", "views"], "objective must be one of"),
    ("unknown-instance-kind", ["triton-repo", "{export}", "{tmp}/tr", "--instance-kind", "tpu"], "instance-kind must be one of"),
    ("unknown-hardware-compat", ["build", "{std_export}", "{tmp}/x.plan", "--hardware-compat", "turing"], "hardware-compat must be one of"),
    ("unknown-log-level", ["serve", "{export}", "--log-level", "loud"], "log-level must be one of"),
    ("unknown-bundle-arch", ["triton-repo", "{export}", "{tmp}/tr", "--bundle-deps", "--bundle-arch", "riscv"], "--bundle-arch"),
    ("unknown-matrix-family", ["bench", "lapjv", "--families", "cauchy", "-o", "{out}"], "unknown matrix families"),
    ("unknown-fp32-island", ["export", "{ckpt}", "{tmp}/e", "--fp32-islands", "gelu"], "unknown FP32 island"),
    # -- models and artefacts --------------------------------------------------------------------------
    ("model-missing", ["rank", "{tmp}/nope", "-s", "{good}", "-o", "{out}"], "not found"),
    ("model-not-an-artefact", ["rank", "{afile}", "-s", "{good}", "-o", "{out}"], "not a checkpoint directory"),
    ("plan-without-sidecar", ["rank", "{plan}", "-s", "{good}", "-o", "{out}"], "has no sidecar"),
    ("export-sidecar-not-json", ["rank", "{bad_export}", "-s", "{good}", "-o", "{out}"], "cannot read"),
    ("manifest-not-json", ["info", "{bad_ckpt}"], "not readable JSON"),
    ("parity-reference-missing", ["parity", "{tmp}/nope", "{export}", "-s", "{good}"], "not found"),
    ("export-has-adapter", ["export", "{lora}", "{tmp}/e", "--slates", ""], "merge"),
    ("build-fused-graph", ["build", "{export}", "{tmp}/x.plan", "--dry-run"], "--flavour standard"),
    ("build-bad-profile", ["build", "{std_export}", "{tmp}/x.plan", "--dry-run", "-p", "1:2"], "profile"),
    ("build-profile-over-k", ["build", "{std_export}", "{tmp}/x.plan", "--dry-run", "-p", "1:1:4/2:64:128/1:8:80"], "K=8"),
    ("calibrate-needs-an-export", ["calibrate", "{ckpt}", "{tmp}/q"], "not an ONNX export"),
    ("calibrate-needs-out-dir", ["calibrate", "{export}"], "OUT_DIR"),
    ("triton-needs-an-export", ["triton-repo", "{ckpt}", "{tmp}/tr"], "not a checkpoint"),
    ("init-backbone-missing", ["init", "{tmp}/nope", "{tmp}/ck"], "backbone directory not found"),
    ("init-backbone-without-config", ["init", "{emptydir}", "{tmp}/ck"], "config"),
    ("merge-checkpoint-missing", ["merge", "{tmp}/nope", "{tmp}/m"], "checkpoint directory not found"),
    ("teacher-model-missing", ["teacher", "{tmp}/nope", "-s", "{good}", "-o", "{out}"], "model directory not found"),
    ("features-backbone-missing", ["features", "{tmp}/nope", "{tmp}/f", "-s", "{good}", "--layer", "1"], "backbone directory not found"),
    ("eval-features-missing", ["eval", "random", "-s", "{good}", "--features", "{tmp}/nope"], "feature cache"),
    ("convert-gguf-missing", ["convert-gguf", "{tmp}/hf", "--gguf", "{tmp}/nope.gguf"], "GGUF file not found"),
    ("info-missing", ["info", "{tmp}/nope"], "not found"),
    ("info-unknown-file", ["info", "{afile}"], "not an hllm artefact"),
    ("info-unknown-directory", ["info", "{emptydir}"], "a directory without"),
    ("encode-model-missing", ["encode", "{tmp}/nope", "-s", "{good}", "-o", "{out}"], "not found"),
    ("loadtest-neither-model-nor-url", ["loadtest", "-s", "{good}"], "either MODEL"),
    ("loadtest-both-model-and-url", ["loadtest", "{export}", "--url", "http://127.0.0.1:1", "-s", "{good}"], "either MODEL"),
    ("bench-versus-ar-model-missing", ["bench", "versus-ar", "{export}", "--ar", "{tmp}/nope", "-o", "{out}"], "not a model directory"),
    ("bench-chart-input-missing", ["bench", "chart", "--stages", "{tmp}/nope.json", "-o", "{tmp}/c.png"], "cannot read"),
    ("bench-chart-wrong-kind", ["bench", "chart", "--stages", "{notbench}", "-o", "{tmp}/c.png"], "not a benchmark JSON"),
    ("bench-markdown-not-benchmark", ["bench", "markdown", "{notbench}"], "not a benchmark JSON"),
    # -- slates files ----------------------------------------------------------------------------------
    ("slates-missing", ["rank", "{export}", "-s", "{tmp}/nope.jsonl", "-o", "{out}"], "slates file not found"),
    ("slates-is-a-directory", ["rank", "{export}", "-s", "{emptydir}", "-o", "{out}"], "slates file not found"),
    ("slates-empty-file", ["rank", "{export}", "-s", "{empty}", "-o", "{out}"], "no slates"),
    ("slates-blank-lines-only", ["rank", "{export}", "-s", "{blank}", "-o", "{out}"], "no slates"),
    ("slates-malformed-json", ["rank", "{export}", "-s", "{malformed}", "-o", "{out}"], "malformed JSON"),
    ("slates-line-not-an-object", ["rank", "{export}", "-s", "{array}", "-o", "{out}"], "JSON object"),
    ("slates-not-utf8", ["rank", "{export}", "-s", "{latin1}", "-o", "{out}"], "not UTF-8"),
    ("slates-truncated-gzip", ["rank", "{export}", "-s", "{truncated_gz}", "-o", "{out}"], "truncated"),
    ("slates-not-gzip", ["rank", "{export}", "-s", "{fake_gz}", "-o", "{out}"], "gzip"),
    ("slates-deep-json", ["rank", "{export}", "-s", "{deep}", "-o", "{out}"], "nested too deeply"),
    ("slates-no-candidates", ["rank", "{export}", "-s", "{nocands}", "-o", "{out}"], "empty slate"),
    ("slates-over-max-documents", ["rank", "{export}", "-s", "{overlimit}", "-o", "{out}"], "over the limit of 1000 documents"),
    ("stdin-empty", ["rank", "{export}", "-s", "-", "-o", "{out}"], "<stdin>: no slates"),
    ("stdin-refused-where-a-file-is-read", ["train", "{backbone}", "{tmp}/ck", "-s", "-"], "stdin"),
    ("eval-slates-without-labels", ["eval", "random", "-s", "{nolabels}"], "labels"),
    ("encode-slate-over-k", ["encode", "{export}", "-s", "{overk}", "-o", "{out}"], "K=8"),
    ("merge-stdin-empty", ["merge", "{lora}", "{tmp}/m", "-s", "-"], "<stdin>: no slates"),
    ("train-without-slates", ["train", "{backbone}", "{tmp}/ck"], "--slates"),
    ("teacher-without-out", ["teacher", "{backbone}", "-s", "{good}"], "--out"),
    # -- outputs -------------------------------------------------------------------
    ("out-is-a-directory", ["rank", "{export}", "-s", "{good}", "-o", "{emptydir}"], "is a directory"),
    ("out-is-a-device", ["rank", "{export}", "-s", "{good}", "-o", "/dev/null"], "not a regular file"),
    ("out-parent-is-a-file", ["rank", "{export}", "-s", "{good}", "-o", "{afile}/r.jsonl"], "is not a directory"),
    ("out-not-writable", ["rank", "{export}", "-s", "{good}", "-o", "{readonly}/r.jsonl"], "cannot write"),
    ("out-device-full", ["rank", "{export}", "-s", "{good}", "-o", "{full}/r.jsonl"], "bytes free on the file system"),
    ("parity-out-is-a-directory", ["parity", "{ckpt}", "{export}", "-s", "{good}", "-o", "{emptydir}"], "is a directory"),
    ("eval-out-is-a-directory", ["eval", "random", "-s", "{good}", "-o", "{emptydir}"], "is a directory"),
    ("encode-out-is-a-directory", ["encode", "{export}", "-s", "{good}", "-o", "{emptydir}"], "is a directory"),
    ("bench-out-is-a-directory", ["bench", "lapjv", "-n", "3", "--matrices", "1", "-o", "{emptydir}"], "is a directory"),
    ("calibrate-report-is-a-directory", ["calibrate", "{export}", "{tmp}/q", "--report", "{emptydir}"], "is a directory"),
    ("ray-refuses-stdout", ["rank", "{export}", "-s", "{good}", "-o", "-", "--ray"], "--ray"),
    ("teacher-refuses-stdout", ["teacher", "{backbone}", "-s", "{good}", "-o", "-"], "file names"),
    ("export-out-exists", ["export", "{ckpt}", "{exists}", "--slates", ""], "already exists"),
    ("export-out-is-a-file", ["export", "{ckpt}", "{afile}", "--overwrite", "--slates", ""], "not a directory"),
    ("merge-out-exists", ["merge", "{lora}", "{exists}"], "already exists"),
    ("init-out-exists", ["init", "{backbone}", "{exists}"], "already exists"),
    ("calibrate-out-exists", ["calibrate", "{export}", "{exists}"], "already exists"),
    ("triton-out-exists", ["triton-repo", "{export}", "{exists}"], "already exists"),
    ("build-plan-exists", ["build", "{std_export}", "{prev}"], "already exists"),
    ("train-out-exists-without-resume", ["train", "{backbone}", "{exists}", "-s", "{good}"], "already exists"),
    ("features-out-is-a-file", ["features", "{backbone}", "{afile}", "-s", "{good}", "--layer", "1"], "not a directory"),
    ("convert-gguf-out-is-a-file", ["convert-gguf", "{afile}", "--gguf", "{good}"], "not a directory"),
    # -- hostile files never exit 70; outputs never over inputs; caches checked -----------------------------
    ("head-safetensors-empty", ["export", "{hostile}/ck-head-empty", "{tmp}/e", "--slates", ""], "cannot read head weights"),
    ("head-safetensors-random-bytes", ["export", "{hostile}/ck-head-junk", "{tmp}/e", "--slates", ""], "cannot read head weights"),
    ("head-safetensors-truncated", ["export", "{hostile}/ck-head-truncated", "{tmp}/e", "--slates", ""], "cannot read head weights"),
    ("head-safetensors-huge-header-length", ["export", "{hostile}/ck-head-hugeheader", "{tmp}/e", "--slates", ""], "cannot read head weights"),
    ("head-safetensors-header-not-json", ["export", "{hostile}/ck-head-badjson", "{tmp}/e", "--slates", ""], "cannot read head weights"),
    ("head-safetensors-other-tensors", ["export", "{hostile}/ck-head-othertensors", "{tmp}/e", "--slates", ""], "do not match the head spec"),
    ("backbone-pickled-bin", ["export", "{hostile}/ck-bin", "{tmp}/e", "--slates", ""], "only *.safetensors weights are read"),
    ("convert-gguf-not-gguf", ["convert-gguf", "{tmp}/hf", "--gguf", "{afile}"], "is not a GGUF file"),
    ("reference-scores-not-npz", ["calibrate", "{export}", "{tmp}/q", "--backend", "ort-dynamic", "-s", "{good}",
                                  "--reference-scores", "{afile}"], "not a readable .npz"),
    ("reference-scores-wrong-shape", ["calibrate", "{export}", "{tmp}/q", "--backend", "ort-dynamic", "-s", "{good}",
                                      "--reference-scores", "{hostile}/ref-wrong.npz"], "declares shape (1, 536870912)"),
    ("calibration-set-other-tokenizer", ["calibrate", "{export}", "{tmp}/q", "-s", "{good}", "--calibration", "{hostile}/calib-tok"],
     "another tokenizer"),
    ("calibration-set-huge-member", ["calibrate", "{export}", "{tmp}/q", "-s", "{good}", "--calibration", "{hostile}/calib-huge"],
     "declares shape (1, 536870912)"),
    ("teacher-jsonl-deep", ["eval", "{hostile}/teacher-deep.jsonl", "-s", "{good}"], "nested too deeply"),
    ("teacher-jsonl-not-utf8", ["eval", "{hostile}/teacher-latin1.jsonl", "-s", "{good}"], "not UTF-8"),
    ("teacher-order-strings", ["eval", "{hostile}/teacher-strings.jsonl", "-s", "{good}"], "order must be a list of integers"),
    ("teacher-order-floats", ["eval", "{hostile}/teacher-floats.jsonl", "-s", "{good}"], "order must be a list of integers"),
    ("feature-cache-layer-out-of-range", ["eval", "{ckpt}", "-s", "{good}", "--features", "{hostile}/fc-layer99"], "0 ≤ layer ≤ num_layers"),
    ("feature-cache-meta-deep", ["eval", "{ckpt}", "-s", "{good}", "--features", "{hostile}/fc-deep"], "not a feature cache manifest"),
    ("feature-cache-readout-out-of-range", ["eval", "{ckpt}", "-s", "{good}", "--features", "{hostile}/fc-readout"], "readout positions"),
    ("feature-cache-wrong-hidden-size", ["eval", "{ckpt}", "-s", "{good}", "--features", "{hostile}/fc-hidden"], "has shape"),
    ("info-calibration-shapes-a-number", ["info", "{hostile}/calib-shapes.json"], "shapes must be a list"),
    ("bench-markdown-null-values", ["bench", "markdown", "{hostile}/stages-null.json"], "non-numeric value"),
    ("export-sidecar-template-width", ["rank", "{hostile}/export-wide", "-s", "{good}", "-o", "{out}"], "format spec or conversion"),
    ("manifest-template-width", ["info", "{hostile}/ck-wide"], "format spec or conversion"),
    ("manifest-unknown-head-key", ["info", "{hostile}/ck-headkey"], "unknown head keys"),
    ("export-sidecar-duplicate-key", ["rank", "{hostile}/export-dupkey", "-s", "{good}", "-o", "{out}"], "duplicate key"),
    ("slates-duplicate-key", ["rank", "{export}", "-s", "{hostile}/dupkey.jsonl", "-o", "{out}"], "duplicate key"),
    ("slate-id-emoji-shortcode-printed-literally", ["rank", "{export}", "-s", "{hostile}/emoji.jsonl", "-o", "{out}"], ":fire: [bold]x[/bold]"),
    ("build-profile-batch-beyond-graph", ["build", "{std_export}", "{tmp}/x.plan", "--dry-run", "-p",
                                          "1:1:100000000000000000000/2:64:128/1:8:8"], "batch ≤ 1024"),
    ("build-profile-seq-beyond-graph", ["build", "{std_export}", "{tmp}/x.plan", "--dry-run", "-p", "1/2:64:70000/1:8:8"],
     "seq ≤ 65536"),
    ("out-is-the-slates-file", ["rank", "{export}", "-s", "{good}", "-o", "{good}"], "is the input"),
    ("out-inside-the-model", ["rank", "{export}", "-s", "{good}", "-o", "{export}/model.onnx"], "inside the input"),
    ("out-dir-contains-the-input", ["export", "{hostile}/holder/ck", "{hostile}/holder", "--overwrite", "--slates", ""], "contains the input"),
    ("out-dir-inside-the-input", ["init", "{hostile}/holder/ck/backbone", "{hostile}/holder/ck/backbone/new"], "inside the input"),
    ("report-is-the-slates-file", ["eval", "random", "-s", "{good}", "-o", "{good}"], "is the input"),
    ("slate-line-over-the-limit", ["rank", "{export}", "-s", "{hostile}/longline.jsonl.gz", "-o", "{out}"], "line longer than the limit"),
]


def _npy_member(zf, name: str, shape: tuple, dtype: str = "<i8", data: bytes = b"") -> None:
    """A ``.npy`` member whose header declares ``shape`` (the data may be short: only the header is meant)."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    zf.writestr(name + ".npy", buf.getvalue() + data)


def _copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="session")
def hostile_files(tmp_path_factory, export_dir, merged_checkpoint):
    """Corrupt weights, caches, calibration sets, teacher files and metadata (docs/hardening.md, "Memory,
    outputs vs inputs, caches, library file errors"), made once."""
    import struct
    import zipfile

    import numpy as np
    from safetensors.numpy import save_file

    from hllm.calibration.data import build_calibration_set
    from hllm.formats.export import read_export
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.training.features import build_cache

    d = tmp_path_factory.mktemp("hostile")
    head = (merged_checkpoint / "head.safetensors").read_bytes()
    variants = {"empty": b"", "junk": bytes(range(256)) * 2, "truncated": head[: len(head) // 3],
                "hugeheader": struct.pack("<Q", 2**62) + b"{}", "badjson": struct.pack("<Q", 9) + b"{not json"}
    for name, data in variants.items():
        (_copy_ckpt(merged_checkpoint, d / f"ck-head-{name}") / "head.safetensors").write_bytes(data)
    save_file({"x": np.zeros(3, np.float32)}, str(_copy_ckpt(merged_checkpoint, d / "ck-head-othertensors") / "head.safetensors"))
    bb = _copy_ckpt(merged_checkpoint, d / "ck-bin") / "backbone"
    for f in bb.glob("*.safetensors"):
        f.unlink()
    (bb / "pytorch_model.bin").write_bytes(b"\x80\x02cos\nsystem\nq\x00.")  # a pickle: never loaded
    man = json.loads((merged_checkpoint / "hllm.json").read_text())
    wide = json.loads(json.dumps(man))
    wide["prompt"]["candidate_template"] = "{title:>5000000}"
    (_copy_ckpt(merged_checkpoint, d / "ck-wide") / "hllm.json").write_text(json.dumps(wide))
    headkey = json.loads(json.dumps(man))
    headkey["head"]["colour"] = "red"
    (_copy_ckpt(merged_checkpoint, d / "ck-headkey") / "hllm.json").write_text(json.dumps(headkey))
    _copy_ckpt(merged_checkpoint, d / "holder" / "ck")
    side = json.loads((export_dir / "export.json").read_text())
    side["prompt"]["history_item_template"] = "{title:>5000000}"
    (_copy_ckpt(export_dir, d / "export-wide") / "export.json").write_text(json.dumps(side))
    text = (export_dir / "export.json").read_text()
    (_copy_ckpt(export_dir, d / "export-dupkey") / "export.json").write_text(text.replace("{", '{"pad_id": 0, ', 1))
    good = tiny_slates(3, (2, 6), seed=1)
    line = json.dumps(good[0])
    (d / "dupkey.jsonl").write_text(line.replace("{", '{"history": [], ', 1) + "\n")
    over = tiny_slates(1, 1001, seed=2)[0]  # over max_documents: refused, naming the slate id
    over["slate_id"] = ":fire: [bold]x[/bold]"
    _write_jsonl(d / "emoji.jsonl", [over])
    with gzip.open(d / "longline.jsonl.gz", "wb", compresslevel=1) as f:
        f.write(b'{"slate_id": "long", "candidates": [{"title": "')
        for _ in range(130):
            f.write(b"a" * (1 << 20))
        f.write(b'"}]}\n')
    # teacher files (eval reads them as rankers)
    (d / "teacher-deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (d / "teacher-latin1.jsonl").write_bytes(b'{"slate_id": "caf\xe9", "order": [0]}\n')
    _write_jsonl(d / "teacher-strings.jsonl", [{"slate_id": s["slate_id"], "order": ["0123"]} for s in good])
    _write_jsonl(d / "teacher-floats.jsonl", [{"slate_id": s["slate_id"], "order": [0.7]} for s in good])
    # reference scores keyed to these slates and this export, whose members' headers declare 2 GiB each
    from hllm.runtime.artefact import resolve
    from hllm.verify.reference import REFERENCE_FORMAT, reference_key

    key = reference_key(resolve(export_dir), good)
    with zipfile.ZipFile(d / "ref-wrong.npz", "w") as zf:
        for name, value in (("format", np.array(REFERENCE_FORMAT)), ("graph_sha256", np.array(key.graph_sha256)),
                            ("num_positions", np.array(key.num_positions)), ("slate_keys", np.array(key.slate_keys)),
                            ("slate_ids", np.array(key.slate_ids))):
            buf = __import__("io").BytesIO()
            np.save(buf, value)
            zf.writestr(f"{name}.npy", buf.getvalue())
        for i in range(len(good)):
            _npy_member(zf, f"scores/{i}", (1, 2**29), "<f4")
    # calibration sets: a real one, one with an edited tokenizer fingerprint, one declaring a huge array
    exp = read_export(export_dir)
    builder = PromptBuilder(load_tokenizer(exp.tokenizer_path), exp.prompt, max_items=exp.num_positions)
    calib = build_calibration_set([dict(s, slate_id=f"c{i}") for i, s in enumerate(tiny_slates(4, (2, 6), seed=9))],
                                  builder, 2, 0, 1, tokenizer_path=exp.tokenizer_path)
    calib.save(d / "calib-tok")
    meta = json.loads((d / "calib-tok.json").read_text())
    meta["tokenizer_sha256"] = "0" * 64
    (d / "calib-tok.json").write_text(json.dumps(meta))
    calib.save(d / "calib-huge")
    with zipfile.ZipFile(d / "calib-huge.npz", "w") as zf:
        for b in range(len(calib.batches)):
            _npy_member(zf, f"input_ids/{b}", (1, 2**29))
            _npy_member(zf, f"readout_positions/{b}", (1, 2**29))
            _npy_member(zf, f"item_mask/{b}", (1, 2**29), "|b1")
    (d / "calib-shapes.json").write_text(json.dumps({"format": "hllm-calibration/1", "shapes": 5}))
    (d / "stages-null.json").write_text(json.dumps({"kind": "stages", "records": [
        {"n_items": 5, "engine": "ort", "engine_ms": {"median": None}, "gflops": None}]}))
    # feature caches of the merged checkpoint's backbone at layer 1, then broken copies
    cache = build_cache(merged_checkpoint / "backbone", good, d / "fc", 1, man["prompt"], 8)
    for name in ("layer99", "deep", "readout", "hidden"):
        shutil.copytree(cache.root, d / f"fc-{name}")
    m = json.loads((cache.root / "meta.json").read_text())
    (d / "fc-layer99" / "meta.json").write_text(json.dumps({**m, "layer": 99}))
    (d / "fc-deep" / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with np.load(cache.root / "00000.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(d / "fc-readout" / "00000.npz", **{**arrays, "readout": arrays["readout"] + 10**6})
    np.savez(d / "fc-hidden" / "00000.npz", **{**arrays, "hidden": arrays["hidden"][:, :7]})
    return d


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def corpus_paths(tmp_path, export_dir, standard_export_dir, merged_checkpoint, lora_checkpoint, qwen3_backbone, hostile_files):
    good = tiny_slates(3, (2, 6), seed=1)
    p = {"tmp": tmp_path, "hostile": hostile_files, "export": export_dir, "std_export": standard_export_dir, "ckpt": merged_checkpoint,
         "lora": lora_checkpoint, "backbone": qwen3_backbone, "out": tmp_path / "out.json"}
    p["good"] = _write_jsonl(tmp_path / "good.jsonl", good)
    p["nolabels"] = _write_jsonl(tmp_path / "nolabels.jsonl", [{k: v for k, v in s.items() if k != "labels"} for s in good])
    p["overk"] = _write_jsonl(tmp_path / "overk.jsonl", good + tiny_slates(1, 9, seed=2))
    p["overlimit"] = _write_jsonl(tmp_path / "overlimit.jsonl", good + tiny_slates(1, 1001, seed=2))
    p["nocands"] = _write_jsonl(tmp_path / "nocands.jsonl", good + [{"slate_id": "e", "history": [], "candidates": []}])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    (tmp_path / "malformed.jsonl").write_text(json.dumps(good[0]) + '\n{"slate_id": "x", "candidates": [ }\n')
    (tmp_path / "array.jsonl").write_text("[1, 2, 3]\n")
    (tmp_path / "latin1.jsonl").write_bytes(json.dumps(good[0]).replace("tiny", "t\u00e9").encode("latin-1") + b"\n")
    blob = gzip.compress("".join(json.dumps(s) + "\n" for s in good * 20).encode())
    (tmp_path / "truncated.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "fake.jsonl.gz").write_text(json.dumps(good[0]) + "\n")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    p.update({k: tmp_path / f for k, f in [("empty", "empty.jsonl"), ("blank", "blank.jsonl"), ("malformed", "malformed.jsonl"),
                                            ("array", "array.jsonl"), ("latin1", "latin1.jsonl"),
                                            ("truncated_gz", "truncated.jsonl.gz"), ("fake_gz", "fake.jsonl.gz"),
                                            ("deep", "deep.jsonl")]})
    p["afile"] = tmp_path / "afile.txt"
    p["afile"].write_text("not an artefact\n")
    p["emptydir"] = tmp_path / "emptydir"
    p["emptydir"].mkdir()
    p["exists"] = tmp_path / "exists"
    p["exists"].mkdir()
    (p["exists"] / "keep.txt").write_text("keep\n")
    p["prev"] = tmp_path / "prev.plan"
    p["prev"].write_text("previous\n")
    p["plan"] = tmp_path / "m.plan"
    p["plan"].write_bytes(b"\0" * 16)
    p["bad_export"] = tmp_path / "bad_export"
    p["bad_export"].mkdir()
    (p["bad_export"] / "export.json").write_text("{")
    p["bad_ckpt"] = tmp_path / "bad_ckpt"
    p["bad_ckpt"].mkdir()
    (p["bad_ckpt"] / "hllm.json").write_text("not json")
    p["notbench"] = tmp_path / "notbench.json"
    p["notbench"].write_text(json.dumps({"kind": "something-else", "records": []}))
    p["readonly"] = tmp_path / "readonly"
    p["readonly"].mkdir()
    p["full"] = tmp_path / "full"
    p["full"].mkdir()
    return p


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and directory under ``root`` with its bytes (None for a directory)."""
    return {str(q.relative_to(root)): (None if q.is_dir() else q.read_bytes()) for q in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, corpus_paths, capsys, monkeypatch):
    name, argv, needle = case
    tmp = corpus_paths["tmp"]
    argv = [a.format(**corpus_paths) for a in argv]
    needle = needle.format(**corpus_paths)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # empty stdin for the '-' cases
    readonly, full = str(corpus_paths["readonly"]), str(corpus_paths["full"])
    import errno

    import hllm.files as files

    real_mkstemp, real_statvfs = files.tempfile.mkstemp, files.os.statvfs

    def mkstemp(*a, dir=None, **kw):  # root ignores permission bits: simulate a read-only directory
        if str(dir) == readonly:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkstemp(*a, dir=dir, **kw)

    class _Full:  # no full file system is mounted here: simulate one
        f_bavail = f_bfree = 0
        f_frsize = 4096

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(files.os, "statvfs", lambda p: _Full() if str(p) == full else real_statvfs(p))
    before, before_hostile = _snapshot(tmp), _snapshot(corpus_paths["hostile"])
    dev_null = os.stat("/dev/null").st_mode
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if name.endswith("-deprecated-alias"):  # a deprecated spelling says so on its own line first
        assert lines and lines[0].startswith("warning:") and "deprecated" in lines[0], err
        lines = lines[1:]
    assert e.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err and "internal error" not in err
    assert needle in lines[0], lines[0]
    assert _snapshot(tmp) == before  # nothing written, nothing replaced, no temporary file left
    assert _snapshot(corpus_paths["hostile"]) == before_hostile  # the hostile files are untouched too
    assert os.stat("/dev/null").st_mode == dev_null


def test_corpus_size():
    assert len({c[0] for c in CASES}) == len(CASES) >= 160
    commands = {c[1][0] if c[1][0] != "bench" else " ".join(c[1][:2]) for c in CASES}
    every = {"convert-gguf", "init", "merge", "export", "rank", "parity", "info", "encode", "serve", "loadtest",
             "triton-repo", "calibrate", "build", "train", "teacher", "features", "eval", "bench stages", "bench lapjv",
             "bench versus-ar", "bench chart", "bench markdown"}
    assert every <= commands, every - commands
