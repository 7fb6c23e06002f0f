"""The one slate validator and reader: every field checked, each message naming
where (file:line), the slate_id, the field and the type it got; the documented policies; files that are
corrupt, truncated, not UTF-8, too deeply nested or empty are SlateErrors."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from hllm.errors import SlateError
from hllm.runtime.slates import iter_slates, loads_json, read_slates, validate_slate


def slate(**kw) -> dict:
    base = {"slate_id": "s1", "history": ["h"], "candidates": [{"item_id": "a", "title": "A"}, {"item_id": "b", "title": "B"}]}
    base.update(kw)
    return base


def cands(*pairs) -> list[dict]:
    return [dict(p) for p in pairs]


# -- fields: (slate, words every message must hold) ------------------------------------------------
BAD = {
    "not_an_object": ([1, 2], ["x:3", "a slate must be a JSON object", "got list"]),
    "slate_id_null": (slate(slate_id=None), ["slate_id must be a string or an integer", "got null"]),
    "slate_id_float": (slate(slate_id=1.5), ["slate_id", "got float"]),
    "slate_id_bool": (slate(slate_id=True), ["slate_id", "got bool"]),
    "slate_id_list": (slate(slate_id=["a"]), ["slate_id", "got list"]),
    "slate_id_empty": (slate(slate_id=""), ["slate_id must not be empty"]),
    "history_not_list": (slate(history="abc"), ["'s1'", "'history' must be a list of strings", "got str"]),
    "history_null": (slate(history=None), ["'history'", "got null"]),
    "history_item_int": (slate(history=["a", 3]), ["history[1] must be a string", "got int"]),
    "candidates_missing": ({"slate_id": "s1"}, ["'candidates' must be a list", "got null"]),
    "candidates_object": (slate(candidates={"a": 1}), ["'candidates' must be a list", "got dict"]),
    "candidates_empty": (slate(candidates=[]), ["empty slate"]),
    "candidate_not_object": (slate(candidates=["A"]), ["candidates[0] must be an object", "got str"]),
    "title_missing": (slate(candidates=cands({"item_id": "a"})), ["candidates[0] has no 'title'"]),
    "title_null": (slate(candidates=cands({"item_id": "a", "title": None})), ["candidates[0].title must be a string", "got null"]),
    "title_int": (slate(candidates=cands({"item_id": "a", "title": 7})), ["candidates[0].title", "got int"]),
    "item_id_null": (slate(candidates=cands({"item_id": None, "title": "A"})), ["candidates[0].item_id", "got null"]),
    "item_id_float": (slate(candidates=cands({"item_id": 1.5, "title": "A"})), ["candidates[0].item_id", "got float"]),
    "item_id_bool": (slate(candidates=cands({"item_id": False, "title": "A"})), ["candidates[0].item_id", "got bool"]),
    "item_id_object": (slate(candidates=cands({"item_id": {"x": 1}, "title": "A"})), ["candidates[0].item_id", "got dict"]),
    "item_id_empty": (slate(candidates=cands({"item_id": "", "title": "A"})), ["candidates[0].item_id must not be empty"]),
    "item_id_missing_on_one": (slate(candidates=cands({"item_id": "a", "title": "A"}, {"title": "B"})),
                               ["candidates[1] has no item_id but candidates[0] has one"]),
    "item_id_duplicate": (slate(candidates=cands({"item_id": "a", "title": "A"}, {"item_id": "b", "title": "B"},
                                                 {"item_id": "a", "title": "C"})),
                          ["duplicate item_id 'a'", "candidates[0] and candidates[2]"]),
    "item_id_duplicate_after_int_conversion": (slate(candidates=cands({"item_id": 7, "title": "A"}, {"item_id": "7", "title": "B"})),
                                               ["duplicate item_id '7'"]),
    "labels_not_list": (slate(labels="01"), ["'labels' must be a list with one entry per candidate (2)", "got str"]),
    "labels_wrong_length": (slate(labels=[1]), ["one entry per candidate (2)", "got 1 entries"]),
    "label_two": (slate(labels=[2, 0]), ["labels[0] must be 0 or 1", "got int 2"]),
    "label_half": (slate(labels=[0, 0.5]), ["labels[1] must be 0 or 1", "got float 0.5"]),
    "label_string": (slate(labels=["1", 0]), ["labels[0] must be 0 or 1", "got str"]),
    "label_null": (slate(labels=[None, 0]), ["labels[0]", "got null"]),
    "label_nan": (slate(labels=[math.nan, 0]), ["labels[0]", "non-finite"]),
    "label_inf": (slate(labels=[0, math.inf]), ["labels[1]", "non-finite"]),
    "lone_surrogate_title": (slate(candidates=cands({"item_id": "a", "title": "bad \ud800 text"})),
                             ["candidates[0].title holds a lone surrogate"]),
    "lone_surrogate_history": (slate(history=["\udfff"]), ["history[0] holds a lone surrogate"]),
    "lone_surrogate_item_id": (slate(candidates=cands({"item_id": "\ud83d", "title": "A"})), ["candidates[0].item_id", "lone surrogate"]),
    "lone_surrogate_slate_id": (slate(slate_id="x\ud800"), ["slate_id holds a lone surrogate"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_field_is_named(case):
    obj, words = BAD[case]
    with pytest.raises(SlateError) as e:
        validate_slate(obj, "x:3")
    msg = str(e.value)
    assert msg.startswith("x:3"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_message_names_the_slate_id():
    with pytest.raises(SlateError, match=r"^f.jsonl:7 \(slate_id 'u-42'\): candidates\[1\].title must be a string, got null$"):
        validate_slate(slate(slate_id="u-42", candidates=cands({"item_id": "a", "title": "A"}, {"item_id": "b", "title": None})), "f.jsonl:7")


def test_policies_that_accept_and_normalise():
    s = {"slate_id": 12, "candidates": [{"item_id": 3, "title": "A", "price": 9}, {"item_id": "x", "title": ""}],
         "labels": [True, 0.0], "extra": {"kept": True}}
    out = validate_slate(s)
    assert out["slate_id"] == "12"
    assert [c["item_id"] for c in out["candidates"]] == ["3", "x"]
    assert out["candidates"][0]["price"] == 9 and out["extra"] == {"kept": True}  # other keys kept
    assert out["labels"] == [1, 0] and all(type(y) is int for y in out["labels"])
    assert s["slate_id"] == 12 and s["candidates"][0]["item_id"] == 3  # the input is not modified
    no_ids = validate_slate({"candidates": [{"title": "A"}, {"title": "B"}]})  # none has an id: allowed
    assert "item_id" not in no_ids["candidates"][0] and "slate_id" not in no_ids
    assert validate_slate(slate(labels=None))["labels"] is None
    assert validate_slate(slate(history=[]))["history"] == []


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"a": NaN}', "NaN is not valid JSON"),
        ('{"a": -Infinity}', "-Infinity is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' + "9" * 5000 + "}", "malformed JSON"),
        ('{"a": }', "malformed JSON"),
    ],
)
def test_loads_json_is_strict_and_never_internal(text, words):
    with pytest.raises(SlateError, match="^where: ") as e:
        loads_json(text, "where")
    assert words in str(e.value)


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = json.dumps(slate())


def test_file_errors_name_file_and_line(tmp_path):
    p = _write(tmp_path / "s.jsonl", [GOOD, "", json.dumps(slate(slate_id="s2", labels=[0, 7]))])
    with pytest.raises(SlateError, match=r"s\.jsonl:3 \(slate_id 's2'\): labels\[1\] must be 0 or 1"):
        read_slates(p)


def test_deeply_nested_line(tmp_path):
    p = _write(tmp_path / "deep.jsonl", [GOOD, "[" * 100_000 + "]" * 100_000])
    with pytest.raises(SlateError, match=r"deep\.jsonl:2: JSON nested too deeply"):
        read_slates(p)


def test_nan_literal_in_a_file(tmp_path):
    p = _write(tmp_path / "nan.jsonl", [GOOD.replace('"s1"', '"s1", "labels": [NaN, 0]')])
    with pytest.raises(SlateError, match=r"nan\.jsonl:1: malformed JSON \(NaN is not valid JSON\)"):
        read_slates(p)


def test_non_utf8_bytes_name_the_line_and_byte(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(GOOD.encode() + b"\n" + '{"slate_id": "caf'.encode() + b"\xe9" + b'", "candidates": []}\n')
    with pytest.raises(SlateError, match=r"latin1\.jsonl:2: not UTF-8 \(byte 0xe9 at byte 18 of the line\)"):
        read_slates(p)


def test_utf8_bom_is_skipped(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    assert [s["slate_id"] for s in read_slates(p)] == ["s1"]


def test_lone_surrogate_escape_in_a_file(tmp_path):
    p = _write(tmp_path / "sur.jsonl", ['{"slate_id": "s", "candidates": [{"item_id": "a", "title": "x\\ud800y"}]}'])
    with pytest.raises(SlateError, match=r"sur\.jsonl:1 \(slate_id 's'\): candidates\[0\]\.title holds a lone surrogate"):
        read_slates(p)


def test_truncated_gzip_is_a_slate_error_not_an_abort(tmp_path):
    full = tmp_path / "full.jsonl.gz"
    with gzip.open(full, "wt", encoding="utf-8") as f:
        for i in range(200):
            f.write(json.dumps(slate(slate_id=f"s{i}", history=[f"history item {i} " * 20])) + "\n")
    data = full.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SlateError, match=r"cut\.jsonl\.gz: the gzip file is truncated \(it ends inside line \d+\)"):
        read_slates(cut)
    assert len(read_slates(full)) == 200


def test_corrupt_gzip(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"this is not gzip at all\n")
    with pytest.raises(SlateError, match=r"bad\.jsonl\.gz: not a valid gzip file"):
        read_slates(bad)
    full = gzip.compress((GOOD + "\n").encode() * 50)
    flipped = bytearray(full)
    flipped[len(full) // 2] ^= 0xFF  # corrupt the deflate stream (or its CRC)
    (tmp_path / "flip.jsonl.gz").write_bytes(bytes(flipped))
    with pytest.raises(SlateError, match="gzip"):
        read_slates(tmp_path / "flip.jsonl.gz")


@pytest.mark.parametrize("content, words", [(b"", "it is empty"), (b"\n  \n\n", "only blank lines")])
def test_empty_file_says_so(tmp_path, content, words):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(content)
    with pytest.raises(SlateError, match=f"empty.jsonl: no slates in the file \\({words}\\)"):
        read_slates(p)
    gz = tmp_path / "empty.jsonl.gz"
    gz.write_bytes(gzip.compress(content))
    with pytest.raises(SlateError, match="no slates in the file"):
        read_slates(gz)


def test_missing_and_directory(tmp_path):
    with pytest.raises(SlateError, match="slates file not found"):
        read_slates(tmp_path / "nope.jsonl")
    with pytest.raises(SlateError, match="is a directory, not a file"):
        read_slates(tmp_path)


def test_limit_reads_lazily(tmp_path):
    p = _write(tmp_path / "s.jsonl", [GOOD, json.dumps(slate(slate_id="s2")), "{broken"])
    assert [s["slate_id"] for s in read_slates(p, limit=2)] == ["s1", "s2"]
    assert list(iter_slates(p, limit=0)) == []
