"""Bad chat input, well reported (issue 48): a JSONL with more than data.max_bad_fraction of its
lines bad is refused naming the file, the count and the first lines (it used to pass with up to
half bad); invalid UTF-8 is counted and named per line; an unclosed line is named at its real
column; repeated ids become unique (x, x#2, x#3), so extraction never dies on a duplicate."""

from __future__ import annotations

import json

import pytest
from helpers import chat_record

from eagle3.data.conversation import DataError, DataWarning
from eagle3.data.loaders import load_conversations


def _lines(n: int, prefix: str = "k") -> list[str]:
    return [json.dumps(chat_record(i, f"{prefix}{i}", "openai")) for i in range(n)]


def test_more_than_the_allowed_share_of_bad_lines_is_refused(tmp_path):
    lines = _lines(300)
    for i in (10, 50, 90, 130):
        lines[i] = lines[i][:-3]  # cut short
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")  # 4 of 300 bad: 1.3%
    with pytest.raises(DataError) as e:
        load_conversations("jsonl", str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: 4 of 300 non-blank lines are not valid JSON: line 11 (")
    assert "line 51 (" in msg and "line 131 (" in msg and "got 4 of 300" in msg and "data.max_bad_fraction" in msg
    # 3 of 300 (1%) are skipped with a warning; the setting raises the share
    path.write_text("\n".join(lines[:130] + lines[131:] + _lines(1, "z")) + "\n")
    with pytest.warns(DataWarning, match="skipped 3 of 300"):
        assert len(load_conversations("jsonl", str(path)).conversations) == 297
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(DataWarning, match="skipped 4 of 300"):
        assert len(load_conversations("jsonl", str(path), max_bad_fraction=0.02).conversations) == 296


def test_an_unclosed_line_is_named_at_its_real_column(tmp_path):
    lines = _lines(200)
    lines[4] = '{"id": "open", "messages": [{"role": "user", "content": "q"}'  # 61 characters, never closed
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(DataWarning) as caught:
        load_conversations("jsonl", str(path), max_bad_fraction=0.01)
    (warning,) = [str(w.message) for w in caught]
    assert (
        f"line 5 (Expecting ',' delimiter at column {len(lines[4]) + 1} (the line ends inside the record))" in warning
    )


def test_invalid_utf8_is_counted_and_named_per_line(tmp_path):
    lines = [line.encode() for line in _lines(200)]
    lines[7] = lines[7].replace(b"question 7", b"question \xff7")  # byte 0xff: never UTF-8
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    column = lines[7].index(b"\xff") + 1
    with pytest.warns(
        DataWarning, match=rf"1 of 200 non-blank lines hold invalid UTF-8 .*line 8 \(byte column {column}\)"
    ):
        result = load_conversations("jsonl", str(path))
    assert "\ufffd" in result.conversations[7].messages[0]["content"]  # read, and said
    lines[9] = lines[9].replace(b"question 9", b"question \xc3(9")
    lines[11] = lines[11].replace(b"question 11", b"question \xed\xa0\x8011")  # a UTF-16 surrogate
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=r"3 of 200 non-blank lines hold invalid UTF-8.*line 8 .*line 10 .*line 12 "):
        load_conversations("jsonl", str(path))


def test_repeated_ids_become_unique_in_file_order(tmp_path):
    # a user's own unique "x#2" and "y#2" keep their ids; only the second "x", "y#2" and "y" get a
    # suffix, one no id of the file has (the second "x" used to take "x#2" and push the user's to "x#3")
    ids = ["x", "x", "x#2", "y#2", "y#2", "y", "y", "z"]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(chat_record(i, rid, "openai")) + "\n" for i, rid in enumerate(ids)))
    got = [c.id for c in load_conversations("jsonl", str(path)).conversations]
    assert got == ["x", "x#3", "x#2", "y#2", "y#3", "y", "y#4", "z"]
    assert len(set(got)) == len(got)


def test_unique_ids_are_kept_as_they_are(tmp_path):
    ids = ["a#2", "a", "b#1", "b#3", "b"]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(chat_record(i, rid, "openai")) + "\n" for i, rid in enumerate(ids)))
    assert [c.id for c in load_conversations("jsonl", str(path)).conversations] == ids
