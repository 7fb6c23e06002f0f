"""``hllm export --fp32-islands FILE.json`` reads the islands file with the project's strict JSON parser
(:func:`hllm.runtime.slates.loads_json`): duplicate keys (which ``islands`` list was meant is unknowable),
``NaN`` / ``Infinity`` and malformed JSON are exit 2 naming the file, before anything is written."""

from __future__ import annotations

import pytest

from hllm.cli import main
from hllm.errors import ExportError
from hllm.exporter.fp16 import read_islands_file


@pytest.mark.parametrize("text, words", [
    ('{"islands": ["softmax"], "islands": ["rmsnorm"]}', "duplicate key 'islands'"),
    ('{"format": "hllm-fp32-islands", "islands": ["softmax"], "threshold": NaN}', "NaN"),
    ('{"islands": ["softmax"], "tau": Infinity}', "Infinity"),
    ('{"islands": ["softmax"]', "malformed JSON"),
    ("[\"softmax\"]", "expected a JSON object with an 'islands' list"),
])
def test_islands_file_is_read_strictly(text, words, tmp_path, capsys, merged_checkpoint):
    f = tmp_path / "islands.json"
    f.write_text(text)
    with pytest.raises(ExportError, match="islands file") as e:
        read_islands_file(f)
    assert words in str(e.value) and str(f) in str(e.value)
    with pytest.raises(SystemExit) as ex:
        main(["export", str(merged_checkpoint), str(tmp_path / "e"), "--precision", "fp16", "--fp32-islands", str(f)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert ex.value.code == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "e").exists()


def test_a_valid_islands_file_still_reads(tmp_path):
    f = tmp_path / "islands.json"
    f.write_text('{"format": "hllm-fp32-islands", "islands": ["softmax", "rmsnorm"], "threshold": 0.5}')
    assert set(read_islands_file(f)) == {"softmax", "rmsnorm"}
