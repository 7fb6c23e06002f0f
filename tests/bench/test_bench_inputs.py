"""`hllm bench markdown` / `bench chart` on hostile JSON inputs: mistyped envelope fields, old-format files,
endless or blocking inputs, mistyped per-stage figures. Each is refused with exit 2 naming the file and field."""

import copy
import json
import os
from pathlib import Path

import pytest

from hllm.cli.app import run

REPO = Path(__file__).resolve().parents[2]


def _doc(name: str) -> dict:
    return json.loads((REPO / "results" / "bench" / name).read_text(encoding="utf-8"))


class _Result:
    def __init__(self, exit_code: int, output: str):
        self.exit_code, self.output = exit_code, output


@pytest.fixture
def _invoke(capsys):
    """``hllm ARGS`` in-process through the CLI's error policy: (exit code, stdout + stderr)."""
    def invoke(*args):
        code = run([str(a) for a in args])
        o = capsys.readouterr()
        return _Result(code, o.out + o.err)
    return invoke


@pytest.mark.parametrize("field, value", [("libraries", "abc"), ("libraries", [1]), ("versions", "x"),
                                          ("kind", 7), ("created", ["t"]), ("machine", [1])])
@pytest.mark.parametrize("name", ["lapjv.json", "stages.json"])
def test_markdown_refuses_mistyped_envelope_fields(_invoke, tmp_path, name, field, value):
    doc = _doc(name)
    doc[field] = value
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    r = _invoke("bench", "markdown", f)
    assert r.exit_code == 2, r.output
    assert str(f) in r.output and f"'{field}'" in r.output and "Traceback" not in r.output


def test_markdown_reads_old_format_files(_invoke, tmp_path):
    """A file with ``benchmark`` instead of ``kind`` (written before the envelope) renders the same table."""
    doc = _doc("lapjv.json")
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    old_doc = {"benchmark": doc.pop("kind"), **doc}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(old_doc))
    a, b = _invoke("bench", "markdown", new), _invoke("bench", "markdown", old)
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    table = [ln for ln in a.output.splitlines() if ln.startswith("|")]
    assert len(table) >= 3 and table == [ln for ln in b.output.splitlines() if ln.startswith("|")]


def test_markdown_refuses_non_regular_files(_invoke, tmp_path):
    """`/dev/zero` (endless) and a FIFO (would block) are refused before any reading."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for src in ("/dev/zero", fifo):
        r = _invoke("bench", "markdown", src)
        assert r.exit_code == 2 and "not a regular file" in r.output, r.output
        assert "batch-size" not in r.output


def test_read_json_size_cap(tmp_path, monkeypatch):
    from hllm import reading
    from hllm.errors import HllmError

    f = tmp_path / "big.json"
    f.write_text(json.dumps({"pad": "x" * 200}))
    assert reading.read_json(f)["pad"] == "x" * 200
    monkeypatch.setattr(reading, "MAX_JSON_BYTES", 100)
    with pytest.raises(HllmError, match="larger than the limit of 100 bytes"):
        reading.read_json(f, HllmError)
    assert reading.read_json(f, max_bytes=1000)["pad"] == "x" * 200


@pytest.mark.parametrize("stage_ms, why", [
    ({"prompt": "x", "engine": 1.0, "decode_output": 1.0, "total": 3.0}, "non-numeric 'prompt'"),
    (None, "null or missing"), ([1], "is list"), ({"prompt": 1.0, "engine": 2.0}, "no 'total'"),
    ({"prompt": 1.0, "total": True}, "non-numeric 'total'")])
def test_chart_and_markdown_refuse_mistyped_stage_ms(_invoke, tmp_path, stage_ms, why):
    doc = copy.deepcopy(_doc("stages.json"))
    doc["records"][0]["stage_ms"] = stage_ms
    f = tmp_path / "st_bad.json"
    f.write_text(json.dumps(doc))
    png = tmp_path / "c.png"
    for args in (("bench", "chart", "--stages", f, "-o", png), ("bench", "markdown", f)):
        r = _invoke(*args)
        assert r.exit_code == 2, r.output
        assert f"{f}: records[0].stage_ms" in r.output and why in r.output and "Traceback" not in r.output
    assert not png.exists()
