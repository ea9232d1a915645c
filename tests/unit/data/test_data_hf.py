"""data=hf: chat data through datasets.load_dataset, from local parquet / JSON / JSONL files
written here (no network): conversation columns with their own key names, prompt/response
column pairs, the config group, and the errors a malformed record gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose

from eagle3.data import DataError, load_conversations
from eagle3.data.hf_source import HFOptions
from eagle3.data.loaders import iter_conversations
from eagle3.data.pipeline import ChatSource, prepare_samples


def _parquet(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _chat(n: int) -> list[dict]:
    return [{"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": f"answer {n}"}]


def test_parquet_messages_column_with_ids_and_without(tmp_path):
    rows = [{"id": f"c{n}", "messages": _chat(n)} for n in range(3)]
    result = load_conversations("hf", str(_parquet(tmp_path / "chats.parquet", rows)))
    assert [c.id for c in result.conversations] == ["c0", "c1", "c2"]
    assert result.conversations[1].messages == _chat(1)
    no_ids = _parquet(tmp_path / "plain.parquet", [{"messages": _chat(n)} for n in range(2)])
    assert [c.id for c in load_conversations("hf", str(no_ids)).conversations] == ["plain:0", "plain:1"]


def test_json_prompt_response_pairs_and_custom_turn_keys(tmp_path):
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"q": f"question {n}", "a": f"answer {n}"} for n in range(4)]))
    with pytest.raises(DataError, match=r"pairs.json: expected a conversation column .*got columns \['q', 'a'\]"):
        load_conversations("hf", str(pairs))  # pairs are only read when their columns are named
    hf = HFOptions(prompt_column="q", response_column="a")
    convs = list(iter_conversations("hf", str(pairs), hf=hf))
    assert [c.messages for c in convs] == [_chat(n) for n in range(4)]
    assert [c.id for c in convs] == [f"pairs:{n}" for n in range(4)]

    turns = tmp_path / "turns.jsonl"
    turns.write_text(
        "".join(
            json.dumps(
                {"dialog": [{"speaker": "human", "text": f"question {n}"}, {"speaker": "gpt", "text": f"answer {n}"}]}
            )
            + "\n"
            for n in range(3)
        )
    )
    hf = HFOptions(messages_column="dialog", role_key="speaker", content_key="text")
    assert [c.messages for c in iter_conversations("hf", str(turns), hf=hf)] == [_chat(n) for n in range(3)]


def test_malformed_records_name_the_dataset_record_field_expected_and_got(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps({"q": "question", "a": "answer"}) + "\n" + json.dumps({"q": "question", "a": None}) + "\n"
    )
    hf = HFOptions(prompt_column="q", response_column="a")
    with pytest.raises(DataError, match=rf"data.path={pairs}: record 1: a: expected a string, got NoneType None"):
        list(iter_conversations("hf", str(pairs), hf=hf))

    turns = _parquet(
        tmp_path / "turns.parquet", [{"messages": _chat(0)}, {"messages": [{"role": "user", "content": None}]}]
    )
    with pytest.raises(
        DataError, match=r"turns.parquet: record 1: messages\[0\].content: expected a string .*got NoneType"
    ):
        list(iter_conversations("hf", str(turns)))
    with pytest.raises(
        DataError,
        match=r"record 0: messages\[0\].speaker: expected a string \(a role name; keys "
        r"there: \['content', 'role'\]\), got NoneType None",
    ):
        list(iter_conversations("hf", str(turns), hf=HFOptions(role_key="speaker")))
    with pytest.raises(DataError, match=r"data.prompt_column: expected one of the columns \['messages'\], got 'q'"):
        list(iter_conversations("hf", str(turns), hf=hf))
    flat = _parquet(tmp_path / "flat.parquet", [{"text": "hello"}])
    with pytest.raises(
        DataError, match=r"expected a conversation column \(messages or conversations.*got columns \['text'\]"
    ):
        list(iter_conversations("hf", str(flat)))
    odd = tmp_path / "odd.txt"
    odd.write_text("hello")
    with pytest.raises(
        DataError, match=r"data.path=.*odd.txt \(data.source=hf\): expected parquet, JSON, JSONL or CSV"
    ):
        list(iter_conversations("hf", str(odd)))
    with pytest.raises(DataError, match=r"expected exactly one of data.hf_name .* or data.path"):
        list(iter_conversations("hf", None))


def test_data_hf_preset_feeds_the_pipeline(tmp_path):
    """conf/data/hf.yaml composes (typed fields, source hf) and its settings reach the samples."""
    from transformers import AutoTokenizer

    from eagle3.target_model.resolve import materialize_smollm2

    rows = [{"id": f"c{n}", "prompt": f"question {n}", "answer": f"answer {n}"} for n in range(12)]
    file = _parquet(tmp_path / "qa.parquet", rows)
    cfg = compose(
        "extract",
        [
            "data=hf",
            f"data.path={file}",
            "data.prompt_column=prompt",
            "data.response_column=answer",
            "data.val_fraction=0.25",
        ],
    )
    assert cfg.data.source.value == "hf" and cfg.data.hf_split == "train"
    with pytest.raises(Exception, match="hf_splt"):
        compose("extract", ["data=hf", "data.hf_splt=test"])
    tokenizer = AutoTokenizer.from_pretrained(materialize_smollm2(ROOT / ".cache"))
    data = prepare_samples(
        ChatSource(cfg.data.source, cfg.data.path, HFOptions.from_data(cfg.data)),
        tokenizer,
        max_samples=None,
        max_length=64,
        overflow="truncate",
        val_fraction=0.25,
        seed=0,
        progress=False,
    )
    assert len(data.train) + len(data.val) == 12 and data.val
    assert {s.id for s in data.train + data.val} == {f"c{n}" for n in range(12)}
    assert data.report.load.path == str(file)


def test_hub_name_offline_fails_naming_the_dataset():
    """A hub dataset that is not cached, with no network: the error names data.hf_name."""
    code = (
        "from eagle3.data.loaders import iter_conversations; from eagle3.data.hf_source import HFOptions\n"
        "list(iter_conversations('hf', None, hf=HFOptions(name='no-such-org/no-such-chats')))"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "DataError: data.hf_name=no-such-org/no-such-chats (split train): datasets.load_dataset failed" in run.stderr
