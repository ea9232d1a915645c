"""A record nested deeper than Python's decoder can go (``[[[[...]]]]`` a hundred thousand deep)
is a bad record like any other: in a JSONL file its line is skipped and counted with its line
number; in a JSON array file it is refused naming the file and where. It used to end the
extraction with a bare RecursionError naming neither file nor line."""

from __future__ import annotations

import json

import pytest

from eagle3.data.conversation import DataError
from eagle3.data.json_stream import JsonRecordStream

DEEP = "[" * 100_000 + "]" * 100_000


def _record(i: int) -> str:
    return json.dumps({"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}]})


def test_a_deeply_nested_jsonl_line_is_skipped_and_counted_with_its_line(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join([_record(0), DEEP, _record(1), _record(2)]) + "\n")
    stream = JsonRecordStream(path, max_bad_fraction=0.5)
    assert [r["id"] for r in stream] == ["c0", "c1", "c2"]
    assert stream.end.bad_lines == 1 and stream.end.complete
    assert stream.end.first_bad[0][0] == 2 and "nested too deeply" in stream.end.first_bad[0][1]


def test_a_deeply_nested_record_in_a_json_array_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text("[" + ",\n".join([_record(0), DEEP, _record(1)]) + "]")
    with pytest.raises(DataError, match=rf"{path}: invalid JSON at byte \d+ \(line 2\): .*nested too deeply"):
        list(JsonRecordStream(path))
