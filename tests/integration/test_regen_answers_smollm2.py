"""data.regen_num_answers with the real SmolLM2: each conversation answered n times (sampled) and
cached per answer; the pipeline keeps every answer of a conversation on one side of the split."""

from __future__ import annotations

import json

import pytest
from helpers.chats import question_conversation

from eagle3.data import ChatSource, Regeneration, prepare_samples
from eagle3.data.conversation import conversation_of
from eagle3.data.split import is_validation
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.hf_engine import HFRegenerator


@pytest.mark.slow
def test_each_conversation_answered_n_times_and_cached_per_answer(smollm2_dir, tmp_path):
    convs = [
        question_conversation("capital", "What is the capital of France?"),
        question_conversation("poem_1", "Write a poem.", split_key="poem"),
    ]
    kw = dict(answers=AnswerSettings(temperature=1.0, max_tokens=12, max_model_len=256), gen_batch_size=8)
    regen = HFRegenerator(smollm2_dir, tmp_path, num_answers=3, **kw)
    out = regen(convs)
    assert [c.id for c in out] == [
        "capital",
        "capital@answer1",
        "capital@answer2",
        "poem_1",
        "poem_1@answer1",
        "poem_1@answer2",
    ]
    assert [c.split_key for c in out] == ["capital"] * 3 + ["poem"] * 3  # every answer on its conversation's side
    assert regen.generated == 6
    for c in out:
        assert c.messages[0]["content"] in ("What is the capital of France?", "Write a poem.")
        assert c.messages[1]["role"] == "assistant" and c.messages[1]["content"] != "IGNORED"
    for j in (0, 3):  # sampled: the copies of one prompt are different answers
        assert len({out[j + k].messages[1]["content"] for k in range(3)}) > 1
    # a fourth answer generates only the new copies; the first three come from the cache unchanged
    more = HFRegenerator(smollm2_dir, tmp_path, num_answers=4, **kw)
    out4 = more(convs)
    assert more.generated == 2 and [c.id for c in out4][3] == "capital@answer3"
    assert [c.messages for c in out4[:3]] == [c.messages for c in out[:3]]
    ids = [json.loads(line)["id"] for line in regen.cache_file.read_text().splitlines()]
    assert sorted(ids) == sorted([c.id for c in out4])
    with pytest.raises(ValueError, match="data.regen_num_answers: expected 1, or more with data.regen_temperature > 0"):
        HFRegenerator(smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=4), num_answers=2)


@pytest.mark.slow
def test_the_pipeline_keeps_every_answer_of_a_conversation_on_one_side(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    path = tmp_path / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(8):
            q = [{"role": "user", "content": f"Name a fruit number {i}."}, {"role": "assistant", "content": "x"}]
            f.write(json.dumps({"id": f"c{i}", "messages": q}) + "\n")
    regen = HFRegenerator(
        smollm2_dir,
        tmp_path / "cache",
        answers=AnswerSettings(temperature=1.0, max_tokens=6, max_model_len=128),
        num_answers=2,
    )
    data = prepare_samples(
        ChatSource("jsonl", str(path)),
        AutoTokenizer.from_pretrained(smollm2_dir),
        max_samples=11,  # samples, not conversations: 6 conversations answered twice, 11 kept
        max_length=128,
        overflow="drop",
        val_fraction=0.5,
        seed=1,  # c2, c4 and c5 land in val
        progress=False,
        regeneration=Regeneration(regen, 4),
    )
    samples = data.train + data.val
    assert len(samples) == 11 and regen.generated == 12  # two calls: 4 conversations, then the 2 still needed
    assert data.train and data.val
    for s in samples:
        assert s.split_key == conversation_of(s.id)
        assert (s in data.val) == is_validation(conversation_of(s.id), 0.5, 1)
    sides = {}
    for side, group in (("train", data.train), ("val", data.val)):
        for s in group:
            assert sides.setdefault(conversation_of(s.id), side) == side
