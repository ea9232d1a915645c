"""data.regen_num_answers: the real SmolLM2 answers each conversation several times (sampled),
each answer a sample of its own that lands on its conversation's side of the split, cached per
answer so that asking for more answers generates only the new ones."""

from __future__ import annotations

import json

import pytest
from conftest import compose

from eagle3.config.errors import ConfigError
from eagle3.data import Conversation, prepare_samples
from eagle3.data.conversation import answer_id, conversation_of
from eagle3.data.split import is_validation
from eagle3.stages.validate import validate_run_config
from eagle3.target_model.generate.hf_engine import HFRegenerator


def _conv(cid: str, question: str, split_key: str = "") -> Conversation:
    return Conversation(
        id=cid,
        messages=[{"role": "user", "content": question}, {"role": "assistant", "content": "IGNORED"}],
        split_key=split_key,
    )


def test_answer_ids_name_the_conversation_they_answer():
    assert answer_id("abc_0", 0) == "abc_0"  # one answer: the ids of a dataset without the option
    for cid in ("abc_0", "chats:12#2", "x@answerz"):
        for k in range(3):
            assert conversation_of(answer_id(cid, k)) == cid
    assert len({answer_id("abc", k) for k in range(4)}) == 4


def test_several_greedy_answers_are_refused_before_any_work():
    cfg = compose("extract", ["data.regenerate=true", "data.regen_num_answers=3"])
    with pytest.raises(ConfigError, match=r"data.regen_num_answers=3 with data.regen_temperature=0.0: greedy"):
        validate_run_config(cfg)
    with pytest.raises(ConfigError, match=r"data.regen_num_answers: expected >= 1, got 0"):
        validate_run_config(compose("extract", ["data.regen_num_answers=0"]))
    validate_run_config(
        compose("extract", ["data.regenerate=true", "data.regen_num_answers=3", "data.regen_temperature=0.7"])
    )


@pytest.mark.slow
def test_each_conversation_answered_n_times_and_cached_per_answer(smollm2_dir, tmp_path):
    convs = [_conv("capital", "What is the capital of France?"), _conv("poem_1", "Write a poem.", split_key="poem")]
    kw = dict(max_tokens=12, max_model_len=256, temperature=1.0, gen_batch_size=8)
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
        HFRegenerator(smollm2_dir, tmp_path, num_answers=2, max_tokens=4)


@pytest.mark.slow
def test_the_pipeline_keeps_every_answer_of_a_conversation_on_one_side(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    path = tmp_path / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(8):
            q = [{"role": "user", "content": f"Name a fruit number {i}."}, {"role": "assistant", "content": "x"}]
            f.write(json.dumps({"id": f"c{i}", "messages": q}) + "\n")
    regen = HFRegenerator(
        smollm2_dir, tmp_path / "cache", num_answers=2, max_tokens=6, max_model_len=128, temperature=1.0
    )
    data = prepare_samples(
        "jsonl",
        str(path),
        AutoTokenizer.from_pretrained(smollm2_dir),
        max_samples=11,  # samples, not conversations: 6 conversations answered twice, 11 kept
        max_length=128,
        overflow="drop",
        val_fraction=0.5,
        seed=1,  # c2, c4 and c5 land in val
        progress=False,
        regenerate=regen,
        regenerate_batch_size=4,
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


def _tiny_target(seed: int) -> str:
    from conftest import CACHE

    from eagle3.config.schema import run_config
    from eagle3.target_model.resolve import resolve_target

    cfg = run_config(compose("extract", ["model=tiny_llama", f"model.seed={seed}"]))
    return resolve_target(cfg.model, str(CACHE))


def test_the_answer_cache_is_keyed_by_the_weights_and_the_generation_settings(tmp_path):
    """Two tiny random Llamas that differ only in their weights (model.seed): the second is not
    answered from the first one's cache; the same target is. generation_config.json and
    max_model_len change the key too."""
    import shutil
    from pathlib import Path

    from eagle3.target_model.generate.common import cache_key

    first, second = _tiny_target(0), _tiny_target(1)
    same = ("config.json", "tokenizer.json", "tokenizer_config.json")
    assert all((Path(first) / f).read_bytes() == (Path(second) / f).read_bytes() for f in same)
    kw = dict(max_tokens=4, max_model_len=128, gen_batch_size=4)
    convs = [_conv(f"c{i}", q) for i, q in enumerate(["What is 2+2?", "Name a colour."])]

    a = HFRegenerator(first, tmp_path, **kw)
    a(convs)
    assert a.generated == 2
    again = HFRegenerator(first, tmp_path, **kw)  # the same target: every answer from the cache
    again(convs)
    assert again.generated == 0 and again.cache_file == a.cache_file
    other = HFRegenerator(second, tmp_path, **kw)  # other weights, same config and tokenizer
    assert other.cache_file != a.cache_file
    other(convs)
    assert other.generated == 2

    # generation_config.json and max_model_len are in the key
    edited = tmp_path / "edited"
    shutil.copytree(first, edited)
    gen = edited / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "repetition_penalty": 1.3}))
    assert cache_key(str(edited), 0.0, 4, 0, None, "hf") != cache_key(first, 0.0, 4, 0, None, "hf")
    assert HFRegenerator(str(edited), tmp_path, **kw).cache_file != a.cache_file
    assert HFRegenerator(first, tmp_path, **{**kw, "max_model_len": 256}).cache_file != a.cache_file


def test_a_restricted_regenerator_answers_only_the_named_samples(tmp_path):
    """restrict_to (a repair: the samples the dataset holds): the others come back with no
    answered turn, nothing generated or cached for them."""
    regen = HFRegenerator(_tiny_target(0), tmp_path, max_tokens=4, max_model_len=128)
    regen.restrict_to(["c0"])
    out = regen([_conv("c0", "What is 2+2?"), _conv("c1", "Name a colour.")])
    assert regen.generated == 1 and set(regen.cache) == {"c0"}
    assert [m["role"] for m in out[1].messages] == ["user"] and out[0].messages[-1]["content"] != "IGNORED"
