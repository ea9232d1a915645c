"""Datasets to test with: the experiment=tiny_test overrides, a small random hidden-state
dataset written by the real ShardWriter, and a dataset over a JSONL chat file with a validation
split (the manifest alone, or a token dataset as extract.py writes one for online training)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.store import Manifest, ShardWriter
from eagle3.store.vocab_files import DraftVocabs
from eagle3.store.write_options import WriteOptions
from eagle3.target_model.adapter import CapturedSample

# seconds-long end-to-end runs: tiny random Llama, a few real ShareGPT samples
TINY = ["experiment=tiny_test"]


def two_source_mixture_args(tmp_path: Path, weight_b: float) -> list[str]:
    """tiny_test's overrides for data.mixture of two JSONL sources a (alpha, weight 3) and b (beta,
    ``weight_b``) of 60 chats each under ``tmp_path`` (a source file already there is kept), the
    datasets in tmp_path/data."""
    from helpers.chats import write_word_chats

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, word in ((a, "alpha"), (b, "beta")):
        if not path.exists():  # the test may have rewritten one
            write_word_chats(path, 60, word)
    mixture = f"[{{name: a, source: jsonl, path: '{a}', weight: 3}}, {{name: b, source: jsonl, path: '{b}', weight: {weight_b}}}]"
    return [*TINY, "data=jsonl", "data.path=null", f"data.mixture={mixture}", f"paths.datasets_dir={tmp_path / 'data'}"]


def jsonl_extract_config(tmp_path: Path, chats: Path, *more: str):
    """extract.py's composed config of tiny_test over the JSONL ``chats``, datasets in tmp_path/data."""
    from conftest import compose

    return compose(
        "extract", TINY + ["data=jsonl", f"data.path={chats}", f"paths.datasets_dir={tmp_path / 'data'}", *more]
    )


# write_random_dataset's sizes: the captured layer ids, hidden size, target and draft vocabularies
RANDOM_LAYER_IDS = (1, 2, 4)
RANDOM_H, RANDOM_VT, RANDOM_V = 8, 50, 5


def random_sample(i: int) -> CapturedSample:
    """Sample i of write_random_dataset: 4 + i tokens, every one counted in the loss."""
    g = torch.Generator().manual_seed(i)
    T = 4 + i
    return CapturedSample(
        token_ids=torch.randint(0, RANDOM_VT, (T,), generator=g),
        loss_mask=torch.ones(T, dtype=torch.bool),
        hidden=torch.randn(T, len(RANDOM_LAYER_IDS), RANDOM_H, generator=g).to(torch.bfloat16),
    )


def write_random_dataset(path: Path, n: int = 6) -> None:
    """n random samples (s0..s{n-1}) in shards of at most 20 tokens, with a draft vocabulary of
    RANDOM_V ids."""
    w = ShardWriter(
        path,
        layer_ids=RANDOM_LAYER_IDS,
        hidden_size=RANDOM_H,
        dtype=torch.bfloat16,
        fingerprint_inputs={"model": "tiny"},
        write=WriteOptions(shard_max_tokens=20),
    )
    for i in range(n):
        w.add(f"s{i}", random_sample(i))
    t2d = torch.zeros(RANDOM_VT, dtype=torch.bool)
    t2d[[3, 7, 8, 20, 41]] = True
    w.finish(torch.arange(RANDOM_VT), {RANDOM_V: (torch.tensor([3, 7, 8, 20, 41]) - torch.arange(RANDOM_V), t2d)})


# opening turns of the validation conversations (c1, c3, c4 are in the split; c4's is too long)
VAL_SPLIT_CONVERSATIONS = [
    {
        "id": "c0",
        "messages": [
            {"role": "user", "content": "What is a hash map?"},
            {"role": "assistant", "content": "A key-value table."},
        ],
    },
    {
        "id": "c1",
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name three primary colors."},
            {"role": "assistant", "content": "Red, yellow and blue."},
            {"role": "user", "content": "And secondary ones?"},
            {"role": "assistant", "content": "Orange, green and purple."},
        ],
    },
    {"id": "c2", "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]},
    {
        "id": "c3",
        "messages": [
            {"role": "user", "content": "Write a haiku about autumn leaves."},
            {"role": "assistant", "content": "Leaves fall..."},
        ],
    },
    {"id": "c4", "messages": [{"role": "user", "content": "word " * 600}, {"role": "assistant", "content": "ok"}]},
    {
        "id": "c5",
        "messages": [
            {"role": "user", "content": "Explain what a Python list comprehension is."},
            {"role": "assistant", "content": "A compact loop."},
        ],
    },
]


def write_dataset_with_val_split(
    directory: Path,
    val_ids: list[str],
    tokenizer=None,
    conversations: list[dict] = VAL_SPLIT_CONVERSATIONS,
    answer: str | None = None,
) -> Path:
    """A dataset over a JSONL chat file: the validation prompts come from the chat source the
    manifest records, picked by its val_ids. With ``tokenizer``, a token dataset (as extract.py
    writes one for online training) of the conversations rendered as extraction renders them
    (``answer``: every assistant turn replaced, as a regeneration does), against which the
    prompts are checked by content; without, the manifest alone, holding the chat file's
    content hash as the fingerprint does."""
    from eagle3.data.conversation import normalise_record
    from eagle3.data.render import ChatRenderer
    from eagle3.store import write_token_dataset
    from eagle3.util.hashing import file_sha256

    directory.mkdir(parents=True, exist_ok=True)
    chats = directory / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    data = {"name": "test", "source": "jsonl", "path": str(chats), "max_samples": None, "max_length": 2048}
    ids = [c.get("id", f"chats:{n}") for n, c in enumerate(conversations)]
    if tokenizer is None:
        data["content_sha"] = file_sha256(chats)[:16]
        Manifest(
            fingerprint="test",
            fingerprint_inputs={"data": data},
            layer_ids=[2, 15, 27, 30],
            hidden_size=576,
            dtype="bfloat16",
            sample_ids=ids,
            val_ids=val_ids,
        ).write(directory)
        return directory
    renderer, samples = ChatRenderer(tokenizer), []
    for sid, conv in zip(ids, conversations):
        messages = normalise_record(conv).messages
        if answer is not None:
            messages = [m if m["role"] != "assistant" else {**m, "content": answer} for m in messages]
        sample = renderer(messages, 2048).sample
        samples.append((sid, sample.input_ids, sample.loss_mask))
    write_token_dataset(
        directory,
        samples,
        val_ids=val_ids,
        fingerprint_inputs={"data": data},
        layer_ids=[2, 15, 27, 30],
        hidden_size=576,
        dtype=torch.bfloat16,
        vocab=DraftVocabs(torch.zeros(len(tokenizer), dtype=torch.int64)),
    )
    return directory
