"""Messages of refused options say what is wrong with the value: a non-finite number, a slates file given
as a saved calibration set, an op type the quantizer does not know, an empty layer list. Each is refused
(exit 2) before the export is read (the export path given here does not exist)."""

from __future__ import annotations

import pytest

from tests.cli.conftest import run

MISSING = "/nonexistent/export"


@pytest.mark.parametrize("argv", [
    ["calibrate", MISSING, "q", "--auc-margin", "nan"],
    ["calibrate", MISSING, "q", "--min-tau", "inf"],
    ["calibrate", MISSING, "q", "--min-tau", "-inf"],
    ["debug", "precision", MISSING, "-o", "i.json", "--min-tau", "nan"],
    ["parity", MISSING, MISSING, "--min-tau", "nan"],
])
def test_a_non_finite_number_is_named_as_such(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run(argv, capsys)
    option, value = argv[-2], argv[-1]
    assert code == 2
    assert f"Invalid value for '{option}': must be a finite number (from " in err and repr(value) in err, err
    assert "less than or equal" not in err and "greater than" not in err


def test_an_out_of_range_finite_number_keeps_the_range_message(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run(["calibrate", MISSING, "q", "--auc-margin", "2"], capsys)
    assert code == 2 and "less than or equal to 1" in err and "finite" not in err


def test_calibrate_refuses_an_unknown_op_type_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run(["calibrate", MISSING, "q", "--op-type", "Bogus"], capsys)
    assert code == 2 and "['Bogus'] cannot be quantized" in err and "'MatMul'" in err, err
    assert not (tmp_path / "q").exists()


def test_quant_options_know_the_onnxruntime_registry():
    from hllm.calibration.recipes.options import QuantOptions, quantizable_op_types
    from hllm.errors import EngineError

    assert {"MatMul", "Gemm", "Conv"} <= quantizable_op_types() and "Bogus" not in quantizable_op_types()
    QuantOptions(op_types=("MatMul", "Gemm")).validate()
    with pytest.raises(EngineError, match=r"\['Bogus', 'Nope'\] cannot be quantized"):
        QuantOptions(op_types=("MatMul", "Nope", "Bogus")).validate()


@pytest.mark.parametrize("layers", [",", "", "1,,2", " , "])
def test_debug_precision_refuses_an_empty_layer_list(layers, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run(["debug", "precision", MISSING, "-o", "i.json", "--layers", layers], capsys)
    assert code == 2 and f"--layers must be a comma list of integers (omit it for all), got {layers!r}" in err, err


def test_a_slates_file_given_as_a_calibration_set_is_named(tmp_path):
    from hllm.errors import SlateError
    from hllm.formats.calibration_set import load_calibration_set

    s = tmp_path / "slates.jsonl"
    s.write_text('{"slate_id": "a", "candidates": [{"title": "x"}]}\n')
    with pytest.raises(SlateError) as e:
        load_calibration_set(s)
    msg = str(e.value)
    assert "slates.jsonl.npz is missing" in msg and "a JSONL of slates is --calib-slates" in msg, msg
    with pytest.raises(SlateError) as e:
        load_calibration_set(tmp_path / "saved")
    assert "saved.npz is missing" in str(e.value) and "--calib-slates" not in str(e.value)
