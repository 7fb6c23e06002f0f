"""The report envelope (``kind, hllm_version, libraries, machine, created``): what :func:`envelope` makes, the
writers that must use it, and the tolerant reader that still reads the committed ``results/*.json``."""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
from pathlib import Path

import pytest

from hllm.formats.calibration_report import CalibrationResult
from hllm.formats.precision import Precision
from hllm.formats.report import ENVELOPE_KEYS, MACHINE_KEYS, envelope, is_envelope, read_envelope
from hllm.measure import describe_machine

REPO = Path(__file__).resolve().parents[2]


def _check(doc: dict, kind: str) -> None:
    assert list(doc)[:5] == list(ENVELOPE_KEYS), list(doc)[:6]
    assert doc["kind"] == kind and is_envelope(doc)
    assert set(doc["machine"]) >= MACHINE_KEYS and doc["machine"]["logical_cpus"] >= 1
    assert doc["libraries"]["python"].count(".") == 2 and doc["hllm_version"] == doc["libraries"].get("hllm")
    created = dt.datetime.strptime(doc["created"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 600
    json.dumps(doc)  # JSON-serialisable as is


def test_machine_is_a_dict_with_the_documented_keys():
    m = describe_machine(shared=True, note="n")
    assert set(m) == MACHINE_KEYS
    doc = envelope("x", {"a": 1}, shared=True, note="n")
    assert doc["machine"]["shared"] is True and doc["machine"]["note"] == "n" and doc["a"] == 1
    assert isinstance(doc["machine"]["cpu_flags"], list) and isinstance(doc["machine"]["gpus"], list)


def test_envelope_replaces_legacy_keys_and_keeps_machine_facts():
    body = {"benchmark": "frontier", "created_utc": "2020-01-01T00:00:00Z", "libraries": {"old": "1"},
            "machine": {"cpu": "given", "loadavg_1min_start": 0.5}, "rows": [1]}
    doc = envelope("frontier", body)
    _check(doc, "frontier")
    assert "benchmark" not in doc and "created_utc" not in doc and "old" not in doc["libraries"]
    assert doc["machine"]["cpu"] == "given" and doc["machine"]["loadavg_1min_start"] == 0.5
    assert body["machine"] == {"cpu": "given", "loadavg_1min_start": 0.5} and "benchmark" in body  # input unchanged
    arch = envelope("loadtest", {"machine": "x86_64"})
    assert arch["machine_arch"] == "x86_64" and isinstance(arch["machine"], dict)
    with pytest.raises(ValueError, match="non-empty"):
        envelope("", {})


def test_bench_document_is_an_envelope():
    from hllm.bench.report import document

    doc = document("lapjv", [{"n": 3}], shared=False, note=None, solvers=["lap"])
    _check(doc, "lapjv")
    assert doc["records"][0]["machine"] == doc["machine"] and doc["solvers"] == ["lap"] and doc["schema"] >= 1


def test_calibration_and_selection_reports_are_envelopes():
    from hllm.calibration.selection.select import SelectionResult

    res = CalibrationResult(precision=Precision.INT8, backend="ort-static", target=None, passed=True,
                            top1_agreement=0.9, kendall_tau_mean=0.8, recall10_delta=0.0, excluded_parts=["head"],
                            gate={}, eval_slates={}, calibration=None, options={}, reference="r",
                            reference_seconds=1.0)
    rep = res.to_report()
    _check(rep, "calibration")
    assert rep["precision"] == "int8" and rep["excluded_parts"] == ["head"]
    sel = SelectionResult(selected="a", recipes=[{"name": "a"}], machine={**describe_machine(), "note": "timed"},
                          eval_slates={}, thresholds={}).to_report()
    _check(sel, "calibration_selection")
    assert sel["machine"]["note"] == "timed" and sel["selected"] == "a" and sel["recipes"] == [{"name": "a"}]
    # a report saved before the rename (key "candidates") reads back the same
    old = {k: v for k, v in sel.items() if k != "recipes"} | {"candidates": sel["recipes"]}
    assert SelectionResult.from_dict(old).recipes == SelectionResult.from_dict(sel).recipes == [{"name": "a"}]


def test_cli_report_writers_produce_the_envelope(export_dir, tmp_path, capsys):
    """`hllm loadtest --out` and `hllm eval --out` on the tiny export: both files are envelopes."""
    from hllm.cli import main
    from hllm.runtime.slates import write_jsonl
    from hllm.testing import tiny_slates

    src = write_jsonl(tmp_path / "s.jsonl", tiny_slates(3, (2, 5), seed=5))
    lt, ev = tmp_path / "lt.json", tmp_path / "ev.json"
    for argv in (["loadtest", str(export_dir), "--slates", str(src), "--clients", "1", "--requests", "2",
                  "--rounds", "1", "--out", str(lt)],
                 ["eval", f"tiny={export_dir}", "random", "--slates", str(src), "--out", str(ev)]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, (argv, capsys.readouterr().err[-2000:])
    doc = json.loads(lt.read_text())
    _check(doc, "loadtest")
    assert doc["environment"]["arch"] and doc["modes"]["batching_on"]["ok"] == 2
    doc = json.loads(ev.read_text())
    _check(doc, "evaluation")
    assert set(doc["rankers"]) == {"tiny", "random"}


#: Where a script writes its JSON; each such script must wrap it with ``envelope(``.
_WRITE = re.compile(r"atomic_write_json\(|json\.dump\(|write_text\(json\.dumps\(")


def test_every_script_writing_results_json_uses_the_envelope():
    writers = [p for p in sorted((REPO / "scripts").glob("*.py")) if _WRITE.search(p.read_text(encoding="utf-8"))]
    assert len(writers) >= 10
    for p in writers:
        text = p.read_text(encoding="utf-8")
        for m in _WRITE.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())]
            if "build.json" in line or "write_jsonl" in line:  # an intermediate file, not a result
                continue
            assert "envelope(" in line, f"{p.name}: {line.strip()}"
        _envelope_is_imported_where_called(p)


def _envelope_is_imported_where_called(path: Path) -> None:
    """Every function calling ``envelope(`` imports it, in itself or at module level (scripts import lazily)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def imports(body) -> bool:
        return any(isinstance(n, ast.ImportFrom) and n.module == "hllm.formats.report"
                   and any(a.name == "envelope" for a in n.names) for n in body)

    if imports(tree.body):
        return
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "envelope"]
        if calls:
            assert imports(ast.walk(fn)), f"{path.name}: {fn.name} calls envelope() without importing it"


def test_committed_results_stay_readable():
    """The tolerant reader maps every committed results/ JSON (old shape: created_utc, versions, benchmark,
    a machine string) onto the envelope keys without rewriting anything."""
    files = sorted((REPO / "results").rglob("*.json"))
    assert files
    seen_created = 0
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            continue
        env = read_envelope(doc)
        assert set(env) == set(ENVELOPE_KEYS)
        assert env["machine"] is None or isinstance(env["machine"], dict), f
        seen_created += env["created"] is not None
    assert seen_created >= 3
    old = read_envelope({"benchmark": "frontier", "created_utc": "2020-01-01T00:00:00Z",
                         "records": [{"machine": {"cpu": "c"}, "versions": {"hllm": "0.1"}}]})
    assert old == {"kind": "frontier", "hllm_version": "0.1", "libraries": {"hllm": "0.1"}, "machine": {"cpu": "c"},
                   "created": "2020-01-01T00:00:00Z"}
    assert read_envelope({"machine": "x86_64"})["machine"] == {"arch": "x86_64"}
    with pytest.raises(ValueError, match="JSON object"):
        read_envelope([1])


def test_bench_frontier_writes_the_envelope(merged_checkpoint, export_dir, tmp_path, capsys):
    """`hllm bench frontier -o`: the envelope replaces the old ``benchmark`` / top-level ``libraries`` keys."""
    from hllm.cli import main
    from hllm.runtime.slates import write_jsonl
    from hllm.testing import tiny_slates

    src = write_jsonl(tmp_path / "s.jsonl", tiny_slates(1, 4, seed=9))
    f = tmp_path / "f.json"
    with pytest.raises(SystemExit) as e:
        main(["bench", "frontier", str(merged_checkpoint), "-c", f"a|{export_dir}|onnxruntime|fp32", "--slates",
              str(src), "--rounds", "1", "--warmup", "0", "--shared", "-o", str(f)])
    assert e.value.code == 0, capsys.readouterr().err[-2000:]
    doc = json.loads(f.read_text())
    _check(doc, "frontier")
    assert "benchmark" not in doc and doc["machine"]["shared"] is True
    assert [r["name"] for r in doc["rows"] if r["name"] == "a"] == ["a"] and doc["rows"][-1]["s_per_slate"] > 0


@pytest.mark.parametrize("doc, field", [({"libraries": "abc"}, "libraries"), ({"libraries": [1]}, "libraries"),
                                        ({"versions": "x"}, "versions"), ({"kind": 3}, "kind"),
                                        ({"created_utc": 1}, "created_utc"), ({"machine": [1]}, "machine"),
                                        ({"records": {"a": 1}}, "records"),
                                        ({"records": [{"versions": "x"}]}, "records[0].versions")])
def test_read_envelope_refuses_mistyped_fields(doc, field):
    from hllm.errors import HllmError
    from hllm.formats.report import ReportError

    with pytest.raises(ReportError, match=re.escape(repr(field))) as e:
        read_envelope(doc)
    assert isinstance(e.value, HllmError) and isinstance(e.value, ValueError)
