"""prepare_samples end to end with the real SmolLM2 tokenizer: caps, report, failure
messages, and the hook that lets a regenerate step replace assistant turns."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from eagle3.data import ChatSource, Conversation, DataError, Regeneration, prepare_samples


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _write_jsonl(path, n, long_answer_every=0):
    lines = []
    for i in range(n):
        answer = ("word " * 400) if long_answer_every and i % long_answer_every == 0 else f"answer {i}"
        lines.append(
            json.dumps(
                {
                    "id": f"c{i}",
                    "messages": [
                        {"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": answer},
                    ],
                }
            )
        )
    lines.append(
        json.dumps(
            {
                "id": "bad",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ],
            }
        )
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_samples_report_and_drop(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "chats.jsonl", 12, long_answer_every=4)  # c0, c4, c8 too long
    data = prepare_samples(
        ChatSource("jsonl", str(path)),
        tokenizer,
        max_samples=None,
        max_length=64,
        overflow="drop",
        val_fraction=0.25,
        seed=0,
        progress=False,
    )
    samples = data.train + data.val
    assert sorted(s.id for s in samples) == sorted(f"c{i}" for i in range(12) if i % 4)
    for s in samples:
        assert s.input_ids.dtype == torch.long and s.loss_mask.dtype == torch.bool
        assert s.input_ids.shape == s.loss_mask.shape and s.input_ids.numel() <= 64
        i = int(s.id[1:])
        assert tokenizer.decode(s.input_ids[s.loss_mask]) == f"answer {i}<|im_end|>"
        assert s.messages[0] == {"role": "user", "content": f"question {i}"}
    r = data.report
    assert r.skipped == {"too_long": 3} and r.load.skipped == {"consecutive_user": 1} and r.load.complete
    assert r.train_samples + r.val_samples == 9 and r.conversations_rendered == 12
    assert r.tokens == sum(s.input_ids.numel() for s in samples)
    assert r.loss_tokens == sum(int(s.loss_mask.sum()) for s in samples)
    summary = r.summary()
    assert "skipped (render): too_long: 3" in summary and "skipped (load): consecutive_user: 1" in summary


def test_max_samples_caps_kept_samples_and_stops_reading(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "chats.jsonl", 50, long_answer_every=3)
    data = prepare_samples(
        ChatSource("jsonl", str(path)),
        tokenizer,
        max_samples=10,
        max_length=64,
        overflow="drop",
        val_fraction=0.0,
        seed=0,
        progress=False,
    )
    assert [s.id for s in data.train] == [f"c{i}" for i in range(50) if i % 3][:10] and not data.val
    assert data.report.load.stopped_at_limit and data.report.load.records_read == 15


def test_everything_dropped_fails_with_the_reason(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "chats.jsonl", 4)
    with pytest.raises(DataError, match=r"all dropped when rendering \(too_long: 4; max_length=8, overflow=drop\)"):
        prepare_samples(
            ChatSource("jsonl", str(path)),
            tokenizer,
            max_samples=None,
            max_length=8,
            overflow="drop",
            val_fraction=0.1,
            seed=0,
            progress=False,
        )
    path.write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(DataError, match="empty_conversation: 1"):
        prepare_samples(
            ChatSource("jsonl", str(path)),
            tokenizer,
            max_samples=None,
            max_length=64,
            overflow="drop",
            val_fraction=0.1,
            seed=0,
            progress=False,
        )


def _regenerated(tokenizer, path, regeneration: Regeneration, max_samples: int | None):
    """The samples of a chat file after ``regeneration``, all on the training side."""
    return prepare_samples(
        ChatSource("jsonl", str(path)),
        tokenizer,
        max_samples=max_samples,
        max_length=64,
        overflow="drop",
        val_fraction=0.0,
        seed=0,
        progress=False,
        regeneration=regeneration,
    )


def test_regenerate_replaces_assistant_turns_before_rendering(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "chats.jsonl", 20)
    batches: list[list[str]] = []

    def regenerate(batch: list[Conversation]) -> list[Conversation]:
        batches.append([c.id for c in batch])
        out = []
        for conv in batch:
            msgs = [dict(m, content=f"target says {conv.id}") if m["role"] == "assistant" else m for m in conv.messages]
            out.append(dataclasses.replace(conv, messages=msgs))
        return out

    data = _regenerated(tokenizer, path, Regeneration(regenerate, 4), max_samples=10)
    assert batches == [["c0", "c1", "c2", "c3"], ["c4", "c5", "c6", "c7"], ["c8", "c9"]]  # only what is needed
    for s in data.train:
        assert tokenizer.decode(s.input_ids[s.loss_mask]) == f"target says {s.id}<|im_end|>"
        assert s.messages[1]["content"] == f"target says {s.id}"

    def shuffles(batch):
        return list(reversed(batch))

    with pytest.raises(DataError, match=r"regenerate must return, in order, num_answers=1 answered copies"):
        _regenerated(tokenizer, path, Regeneration(shuffles, 4), max_samples=10)


def test_regenerated_conversation_without_answer_is_skipped_and_counted(tokenizer, tmp_path):
    """A prompt too long to answer comes back from regeneration with no assistant turn."""
    path = _write_jsonl(tmp_path / "chats.jsonl", 6)

    def regenerate(batch: list[Conversation]) -> list[Conversation]:
        return [dataclasses.replace(c, messages=[]) if c.id == "c2" else c for c in batch]

    data = _regenerated(tokenizer, path, Regeneration(regenerate), max_samples=None)
    assert "c2" not in {s.id for s in data.train} and len(data.train) == 5
    assert data.report.skipped["regenerated_no_answer"] == 1


def test_a_batch_near_the_deadline_is_cut_to_what_the_time_left_answers(tokenizer, tmp_path):
    """A budget's regeneration does not refuse a whole batch where part of one fits: the next batch
    is sized to the seconds left at the pace so far; once nothing fits, it stops."""
    import time

    from helpers import ScriptedDeadline

    path = _write_jsonl(tmp_path / "chats.jsonl", 40)
    sizes: list[int] = []

    def regenerate(batch: list[Conversation]) -> list[Conversation]:
        sizes.append(len(batch))
        time.sleep(0.01 * len(batch))  # 10 ms a conversation (at least)
        return batch

    # seconds left, per question: before batch 1; sizing batch 2, before it; sizing batch 3, before it
    deadline = ScriptedDeadline([1e6, 0.05, 0.05, 0.0])
    data = _regenerated(tokenizer, path, Regeneration(regenerate, 8, deadline), max_samples=None)
    assert sizes[0] == 8 and len(sizes) == 2
    assert 1 <= sizes[1] <= 4  # 0.05 s left at >= 10 ms a conversation, less the tail's margin
    assert len(data.train) == 8 + sizes[1]
    assert f"{8 + sizes[1]} conversations regenerated; the next 8 would take" in (data.report.deadline_stop or "")


def test_the_first_batch_before_any_pace_is_the_deadlines_cap(tokenizer, tmp_path):
    """Before regeneration has timed a batch, a budget's first batch is its plan's cap, not a whole
    data.regen_batch_size that could run past the share unmeasured; the batches after it are sized
    by the pace (here all of the time is left: whole batches)."""
    from helpers import ScriptedDeadline

    path = _write_jsonl(tmp_path / "chats.jsonl", 30)
    sizes: list[int] = []

    def regenerate(batch: list[Conversation]) -> list[Conversation]:
        sizes.append(len(batch))
        return batch

    deadline = ScriptedDeadline([1e6], first_batch=3)
    data = _regenerated(tokenizer, path, Regeneration(regenerate, 8, deadline), max_samples=None)
    assert sizes == [3, 8, 8, 8, 3]
    assert len(data.train) == 30
