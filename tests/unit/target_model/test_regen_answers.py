"""data.regen_num_answers: answer ids, greedy answers refused before any work, the answer cache's
key and a regenerator restricted to named samples (the tiny target). The real SmolLM2 answering
several times: integration/test_regen_answers_smollm2.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import compose
from helpers.chats import question_conversation

from eagle3.config.errors import ConfigError
from eagle3.data.conversation import answer_id, conversation_of
from eagle3.stages.validate import validate_run_config
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.hf_engine import HFRegenerator


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
    answers = AnswerSettings(max_tokens=4, max_model_len=128)
    kw = dict(answers=answers, gen_batch_size=4)
    convs = [question_conversation(f"c{i}", q) for i, q in enumerate(["What is 2+2?", "Name a colour."])]

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
    assert cache_key(str(edited), AnswerSettings(max_tokens=4), "hf") != cache_key(
        first, AnswerSettings(max_tokens=4), "hf"
    )
    assert HFRegenerator(str(edited), tmp_path, **kw).cache_file != a.cache_file
    assert (
        HFRegenerator(first, tmp_path, **{**kw, "answers": replace(answers, max_model_len=256)}).cache_file
        != a.cache_file
    )


def test_a_restricted_regenerator_answers_only_the_named_samples(tmp_path):
    """restrict_to (a repair: the samples the dataset holds): the others come back with no
    answered turn, nothing generated or cached for them."""
    regen = HFRegenerator(_tiny_target(0), tmp_path, answers=AnswerSettings(max_tokens=4, max_model_len=128))
    regen.restrict_to(["c0"])
    out = regen([question_conversation("c0", "What is 2+2?"), question_conversation("c1", "Name a colour.")])
    assert regen.generated == 1 and set(regen.cache) == {"c0"}
    assert [m["role"] for m in out[1].messages] == ["user"] and out[0].messages[-1]["content"] != "IGNORED"
