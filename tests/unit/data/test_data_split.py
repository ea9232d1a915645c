"""Hash-based train/val split: deterministic, the requested fraction, and stable when
max_samples grows (through the real pipeline on the packaged ShareGPT file)."""

from __future__ import annotations

import pytest

from eagle3.data import ChatSource, is_validation, load_conversations, prepare_samples


def test_split_is_deterministic_and_near_the_fraction():
    ids = [f"conv-{i}" for i in range(20000)]
    val = [i for i in ids if is_validation(i, 0.1, seed=0)]
    assert val == [i for i in ids if is_validation(i, 0.1, seed=0)]
    assert 0.09 < len(val) / len(ids) < 0.11
    other_seed = {i for i in ids if is_validation(i, 0.1, seed=1)}
    assert 0.05 < len(other_seed & set(val)) / len(val) < 0.2  # independent draws overlap ~10%
    # a larger fraction only adds samples to val
    assert set(val) <= {i for i in ids if is_validation(i, 0.2, seed=0)}
    assert not any(is_validation(i, 0.0, seed=0) for i in ids[:1000])
    with pytest.raises(ValueError, match="val_fraction"):
        is_validation("x", 1.0, seed=0)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _prepare(tokenizer, max_samples):
    return prepare_samples(
        ChatSource("sharegpt", None),
        tokenizer,
        max_samples=max_samples,
        max_length=128,
        overflow="truncate",
        val_fraction=0.2,
        seed=3,
        progress=False,
    )


def test_split_is_stable_when_max_samples_grows(tokenizer):
    small, large = _prepare(tokenizer, 30), _prepare(tokenizer, 90)
    assert len(small.train) + len(small.val) == 30 and len(large.train) + len(large.val) == 90
    small_train, small_val = {s.id for s in small.train}, {s.id for s in small.val}
    large_train, large_val = {s.id for s in large.train}, {s.id for s in large.val}
    assert small_val and small_train  # both sides exercised
    assert small_train <= large_train and small_val <= large_val  # nobody changes side
    # the small run kept the first 30 of the large run's samples in file order
    order = {c.id: k for k, c in enumerate(load_conversations("sharegpt", limit=400).conversations)}
    large_in_order = sorted(large_train | large_val, key=order.__getitem__)
    assert set(large_in_order[:30]) == small_train | small_val
    # parts of one ShareGPT chat never straddle the split
    assert not {s.split_key for s in large.train} & {s.split_key for s in large.val}
    for s in large.train + large.val:
        assert is_validation(s.split_key, 0.2, 3) == (s.id in large_val)


def test_repeated_ids_of_a_jsonl_land_in_one_split(tmp_path, tokenizer):
    """A JSONL whose records repeat ids ("x", "x#2", ...: copies, or a conversation and its
    edit): every record sharing a source id sits on one side, never one copy in val and another
    in train (they used to be split as "x" and "x#2", independently)."""
    import json

    lines = []
    for copy in range(3):
        for i in range(40):
            messages = [
                {"role": "user", "content": f"question {i} (copy {copy})"},
                {"role": "assistant", "content": f"answer {i}"},
            ]
            lines.append(json.dumps({"id": f"conv-{i}", "messages": messages}))
    path = tmp_path / "dups.jsonl"
    path.write_text("\n".join(lines) + "\n")
    data = prepare_samples(
        ChatSource("jsonl", str(path)),
        tokenizer,
        max_samples=None,
        max_length=128,
        overflow="truncate",
        val_fraction=0.5,
        seed=0,
        progress=False,
    )
    assert len(data.train) + len(data.val) == 120 and data.val and data.train
    side: dict[str, set[str]] = {}
    for name, samples in (("train", data.train), ("val", data.val)):
        for s in samples:
            side.setdefault(s.id.split("#")[0], set()).add(name)
    assert len(side) == 40
    assert {k: v for k, v in side.items() if len(v) > 1} == {}
    assert {s.id for s in data.val} >= {"conv-%d#3" % int(s.id.split("-")[1]) for s in data.val if "#" not in s.id}
