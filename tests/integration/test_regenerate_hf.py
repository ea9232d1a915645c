"""data.regen_backend=hf: the real SmolLM2 answers user turns through transformers' generate
(the engine for machines without vLLM, like the GPU image), into the same cache format."""

from __future__ import annotations

import json

import pytest

from eagle3.data.conversation import Conversation
from eagle3.target_model.generate.common import AnswerSettings, cache_key, resolve_backend
from eagle3.target_model.generate.dispatch import make_regenerator
from eagle3.target_model.generate.hf_engine import HFRegenerator


def _convs() -> list[Conversation]:
    return [
        Conversation(
            id="capital",
            messages=[
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "IGNORED HUMAN ANSWER"},
                {"role": "user", "content": "And of Italy?"},
                {"role": "assistant", "content": "IGNORED SECOND ANSWER"},
            ],
        ),
        Conversation(
            id="long",
            messages=[
                {"role": "user", "content": "Write a long story about a robot who learns to paint. " * 17},
                {"role": "assistant", "content": "IGNORED"},
            ],
        ),
        Conversation(
            id="short",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "IGNORED"},
            ],
        ),
    ]


@pytest.mark.slow
def test_hf_answers_replace_dataset_answers_batched_and_cached(smollm2_dir, tmp_path):
    regen = HFRegenerator(
        smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=24, max_model_len=256), gen_batch_size=2
    )
    convs = _convs()
    out = regen(convs)
    assert regen.generated == 3 and 0 < regen.new_tokens <= 24 * 4  # 4 user turns, at most 24 tokens each
    for orig, new in zip(convs, out):
        assert [m["role"] for m in new.messages] == [m["role"] for m in orig.messages]
        assert [m["content"] for m in new.messages if m["role"] != "assistant"] == [
            m["content"] for m in orig.messages if m["role"] != "assistant"
        ]
        assert all(m["content"] and "IGNORED" not in m["content"] for m in new.messages if m["role"] == "assistant")
    assert "Paris" in out[0].messages[1]["content"]
    assert "Rome" in out[0].messages[3]["content"]  # the second turn saw the target's own first answer
    # the long prompt has less room than max_tokens under max_model_len: its answer is cut to that room
    tok = regen.tokenizer()
    prompt = tok.apply_chat_template(convs[1].messages[:1], add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    room = 256 - len(prompt) - 1
    assert 0 < room < 24
    assert len(tok(out[1].messages[1]["content"], add_special_tokens=False)["input_ids"]) <= room + 1
    # a second engine on the same cache generates nothing and returns the same answers
    again = HFRegenerator(
        smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=24, max_model_len=256), gen_batch_size=2
    )
    assert [c.messages for c in again(convs)] == [c.messages for c in out] and again.generated == 0
    lines = [json.loads(line) for line in regen.cache_file.read_text().splitlines()]
    assert [r["id"] for r in lines] == ["capital", "long", "short"]


@pytest.mark.slow
def test_hf_regen_max_turns_keeps_only_the_first_turns(smollm2_dir, tmp_path):
    regen = HFRegenerator(smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=8, max_model_len=256, max_turns=1))
    out = regen(_convs()[:1])
    assert [m["role"] for m in out[0].messages] == ["user", "assistant"]
    # a different turn limit (or engine) is a different cache: answers never mix
    one_turn = AnswerSettings(max_tokens=8, max_turns=1)
    assert cache_key(str(smollm2_dir), one_turn, "hf") != cache_key(
        str(smollm2_dir), AnswerSettings(max_tokens=8), "hf"
    )
    assert cache_key(str(smollm2_dir), one_turn, "hf") != cache_key(str(smollm2_dir), one_turn, "vllm")


def test_backend_names_are_checked(tmp_path):
    assert resolve_backend("hf") == "hf"
    with pytest.raises(ValueError, match="data.regen_backend: expected auto, vllm or hf, got 'sglang'"):
        resolve_backend("sglang")
    with pytest.raises(ValueError, match="regen_max_turns: expected null or >= 1, got 0"):
        make_regenerator("hf", str(tmp_path), tmp_path, answers=AnswerSettings(max_turns=0))


@pytest.mark.slow
def test_padding_leak_is_caught_and_answered_with_eager_attention(smollm2_dir, tmp_path, caplog):
    """bf16 SDPA on some CPUs answers a left-padded prompt differently when it shares a batch
    with a longer one (measured on one machine: "L'Étoile, la Marseillaise..." for the capital
    of France, a near tie at the first token: fp32 logits "The" 25.36, "L" 25.26). The
    regenerator's first-batch check must notice and redo the batch with eager attention; on a
    CPU whose SDPA does not leak there is nothing to catch. Either way the batched answer is the
    one the prompt gets alone with eager attention."""
    regen = HFRegenerator(
        smollm2_dir,
        tmp_path / "b",
        answers=AnswerSettings(max_tokens=12, max_model_len=256),
        gen_batch_size=2,
        attn_implementation="sdpa",
        fast_decode=False,
    )
    with caplog.at_level("WARNING"):
        out = regen(_convs()[:2])
    alone = HFRegenerator(
        smollm2_dir,
        tmp_path / "a",
        answers=AnswerSettings(max_tokens=12, max_model_len=256),
        gen_batch_size=1,
        attn_implementation="eager",
        fast_decode=False,
    )(_convs()[:1])
    assert out[0].messages[1]["content"] == alone[0].messages[1]["content"], caplog.text
    if "switching to eager attention" not in caplog.text:
        print("this CPU's bf16 SDPA did not leak padding: the check had nothing to catch")


@pytest.mark.slow
def test_static_cache_gives_the_dynamic_cache_answers(smollm2_dir, tmp_path):
    """data.regen_static_cache (one cache shape, so CUDA compiles the decode step once): the
    batch is topped up to gen_batch_size rows and the cache sized to max_model_len +
    max_tokens; the answers must be those of the dynamic cache. float32: in bf16 some CPUs flip
    near ties between a batch and a prompt alone (the padding check then refuses the batch),
    which is not what this compares."""
    convs = _convs()
    dynamic = HFRegenerator(
        smollm2_dir,
        tmp_path / "d",
        answers=AnswerSettings(max_tokens=16, max_model_len=256),
        gen_batch_size=4,
        fast_decode=False,
        dtype="float32",
    )
    static = HFRegenerator(
        smollm2_dir,
        tmp_path / "s",
        answers=AnswerSettings(max_tokens=16, max_model_len=256),
        gen_batch_size=4,
        static_cache=True,
        dtype="float32",
    )
    assert [c.messages for c in static(convs)] == [c.messages for c in dynamic(convs)]
    assert static.new_tokens == dynamic.new_tokens > 0


@pytest.mark.slow
def test_fast_decode_gives_the_generate_answers(smollm2_dir, tmp_path, caplog):
    """fast_decode (the default) must write the answers generate writes: same cache key.
    float32, because bf16 on this CPU flips a near tie in the long story ("Aurora" vs "Pixel",
    measured), as bf16 generate itself does between batched and alone."""
    convs = _convs()
    kwargs = dict(answers=AnswerSettings(max_tokens=24, max_model_len=256), gen_batch_size=2, dtype="float32")
    fast = HFRegenerator(smollm2_dir, tmp_path / "f", **kwargs)
    slow = HFRegenerator(smollm2_dir, tmp_path / "g", fast_decode=False, **kwargs)
    assert fast.cache_file.name == slow.cache_file.name
    with caplog.at_level("INFO"):
        answers = [c.messages for c in fast(convs)]
    assert fast._use_fast() and not slow._use_fast()
    assert "differently in a batch" not in caplog.text  # the padding check passed on the fast path
    assert answers == [c.messages for c in slow(convs)]
    assert fast.new_tokens == slow.new_tokens > 0
    assert "Paris" in answers[0][1]["content"] and "Rome" in answers[0][3]["content"]


@pytest.mark.slow
def test_a_higher_turn_limit_generates_only_the_new_turns(smollm2_dir, tmp_path):
    """data.regen_max_turns 1 -> 2: the first answers come from the 1-turn run's cache (same
    conversation only), so only the second turns are generated."""
    one = HFRegenerator(smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=8, max_model_len=256, max_turns=1))
    first = one(_convs())
    two = HFRegenerator(smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=8, max_model_len=256, max_turns=2))
    asked: list[int] = []
    complete = two._complete
    two._complete = lambda prompts, rooms, seeds: (asked.append(len(prompts)), complete(prompts, rooms, seeds))[1]
    changed = _convs()
    changed[2].messages[1]["content"] = "Say bye."  # "short": another conversation now, not seeded
    second = two(changed)
    assert asked == [1, 1]  # turn 0: "short" anew; turn 1: "capital"'s second turn
    assert two.seeded_turns == 2 and two.generated == 3

    def answers(conv):
        return [m["content"] for m in conv.messages if m["role"] == "assistant"]

    assert answers(second[0])[0] == answers(first[0])[0] and len(answers(second[0])) == 2
    assert answers(second[1]) == answers(first[1])
    assert answers(second[0])[1]  # the second turn was answered
    assert answers(second[2])[0] and two.cache_file != one.cache_file
