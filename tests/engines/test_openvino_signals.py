"""OpenVINO's CPU plugin leaves an alternate signal stack registered on the thread that compiled a model and
frees it with the model: a later SIGINT / SIGTERM then died of SIGSEGV. hllm drops it after every compile (its
engine's and NNCF's), so interrupts end with the exit codes of the policy. Each check runs in a fresh
interpreter: OpenVINO's per-thread state must not come from other tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("openvino")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is read through Linux libc")

ALT_STACK = textwrap.dedent("""
    import ctypes
    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]
    def alt_stack():
        s = StackT()
        ctypes.CDLL(None).sigaltstack(None, ctypes.byref(s))
        return "disabled" if s.ss_flags & 2 else f"{s.ss_size} bytes"
""")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ALT_STACK + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300)


def test_no_alternate_signal_stack_is_left_after_a_compile(standard_export_dir):
    r = _run("""
        import sys
        import openvino as ov
        from hllm.engines.openvino import OpenVinoEngine, no_signal_stack_after_compile
        original = ov.Core.compile_model
        with OpenVinoEngine(sys.argv[1] + "/model.onnx", 8, threads=1) as e:
            print("engine", alt_stack())
        with no_signal_stack_after_compile():
            ov.Core().compile_model(ov.Core().read_model(sys.argv[1] + "/model.onnx"), "CPU")  # as NNCF compiles
            print("patched", alt_stack())
        print("restored", ov.Core.compile_model is original)
    """, str(standard_export_dir))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["engine", "disabled", "patched", "disabled", "restored", "True"], r.stdout


def test_sigterm_after_nncf_accuracy_control_exits_with_the_handlers_code(standard_export_dir):
    """NNCF's search compiles and frees dozens of models; a SIGTERM afterwards reaches the Python handler
    (exit 143), where it used to crash the interpreter with SIGSEGV (exit -11) every time."""
    r = _run("""
        import os, signal, sys, tempfile
        from hllm.calibration.recipes.accuracy_control import quantize_with_accuracy_control
        from hllm.calibration.recipes.openvino_int8 import calibration_feeds
        from hllm.formats.export import read_export
        from hllm.runtime.prompt import PromptBuilder, load_tokenizer
        from hllm.testing import tiny_slates
        meta = read_export(sys.argv[1])
        builder = PromptBuilder(load_tokenizer(meta.tokenizer_path), meta.prompt, max_items=meta.num_positions)
        train = [{**s, "slate_id": f"train-{i}"} for i, s in enumerate(tiny_slates(4, 8, seed=21))]
        quantize_with_accuracy_control(sys.argv[1], tempfile.mkdtemp() + "/ac", calibration_feeds(train, builder, 4, 0),
                                       tiny_slates(6, 8, seed=33), metric="regret", max_drop=0.0, ranking_subset=2,
                                       max_reverted=1)
        print("after search", alt_stack(), flush=True)
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    """, str(standard_export_dir))
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "after search disabled"
