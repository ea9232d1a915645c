"""data.mixture end to end: extract.py prints and records the counts per source; SmolLM2's self-
prompts are distinct user turns, then answered."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import two_source_mixture_args

from eagle3.data.conversation import conversation_of
from eagle3.data.mixture import source_of
from eagle3.store import Manifest

TINY = ["experiment=tiny_test"]


def test_extract_prints_and_records_the_counts_per_source(tmp_path, tiny_model_dir):
    run = subprocess.run(
        [sys.executable, "extract.py", *two_source_mixture_args(tmp_path, 1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "source a" in run.stderr and "source b" in run.stderr
    manifest = Manifest.read(Path(run.stdout.strip().splitlines()[-1]))
    counts = manifest.provenance["mixture"]
    assert set(counts) == {"a", "b"} and counts["a"]["weight"] == pytest.approx(0.75)
    assert manifest.num_samples == 40  # tiny_test's data.max_samples, over both sources
    assert Counter(source_of(i) for i in manifest.sample_ids) == {k: v["samples"] for k, v in counts.items()}
    assert Counter(source_of(i) for i in manifest.val_ids) == {k: v["val"] for k, v in counts.items() if v["val"]}
    assert counts["a"]["samples"] > counts["b"]["samples"] > 0

    # the dataset's validation prompts: its samples' served prompts (a mixture's self-written user
    # turns live in no chat file), each the opening turn of the conversation its id names
    from transformers import AutoTokenizer

    from eagle3.evaluation.prompts import heldout_prompts

    dataset_dir = Path(run.stdout.strip().splitlines()[-1])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    got = heldout_prompts(dataset_dir, max_prompts=50, humaneval_prompts=0, tokenizer=tokenizer)
    val_conversations = list(dict.fromkeys(conversation_of(i) for i in manifest.val_ids))
    assert [p.id for p in got.prompts] == val_conversations and all(p.source == "val" for p in got.prompts)
    for p in got.prompts:
        name, number = p.id.split("/")
        word = "alpha" if name == "a" else "beta"
        opening = [{"role": "user", "content": f"{word} {number}?"}]
        text = tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
        assert p.token_ids == tokenizer(text, add_special_tokens=False)["input_ids"], p.id


@pytest.mark.slow
def test_self_prompts_on_smollm2_are_distinct_user_turns_then_answered(smollm2_dir, tmp_path):
    from eagle3.target_model.generate.common import AnswerSettings
    from eagle3.target_model.generate.hf_engine import HFRegenerator
    from eagle3.target_model.generate.self_prompts import SelfPrompts

    regen = HFRegenerator(
        smollm2_dir, tmp_path, answers=AnswerSettings(max_tokens=12, max_model_len=256), gen_batch_size=3
    )
    entry = {"name": "self", "prompt_max_tokens": 16, "topics": ["math", "coding", "history"]}
    stream = iter(SelfPrompts(regen, entry, seed=0, batch_size=3))
    convs = [next(stream) for _ in range(3)]
    stream.close()
    users = [c.messages[0]["content"] for c in convs]
    assert all(u.strip() for u in users) and len(set(users)) == 3, users
    again = iter(SelfPrompts(regen, entry, seed=0, batch_size=3))  # read back from the cache: the same
    assert [next(again).messages[0]["content"] for _ in range(3)] == users
    answered = regen(convs)
    for conv, user in zip(answered, users):
        assert [m["role"] for m in conv.messages] == ["user", "assistant"]
        assert conv.messages[0]["content"] == user and conv.messages[1]["content"].strip()
