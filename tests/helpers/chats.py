"""Chats to test with: real chat prompts tokenized by a real tokenizer (the loss on the last
answer), JSONL records in the shapes users give, and JSONL chat files of numbered questions."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# four short chats of different token lengths (a batch of them really pads)
SHORT_CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like the sky."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help you today with anything at all?"},
    ],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}],
]

_PHOTOSYNTHESIS = (
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light "
    "energy into chemical energy. In the light-dependent reactions, chlorophyll in the thylakoid "
    "membranes absorbs light, water is split, oxygen is released, and the energy is stored in ATP "
    "and NADPH. In the Calvin cycle, which runs in the stroma, the enzyme RuBisCO fixes carbon "
    "dioxide onto ribulose bisphosphate, and ATP and NADPH are spent to reduce the products to "
    "glyceraldehyde 3-phosphate, from which the plant builds glucose, sucrose and starch. "
)
# chats with a multi-turn one longer than vLLM's 64-token prefill step in the capture tests (chunked)
CHUNKED_PREFILL_CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colours."},
        {"role": "assistant", "content": "Red, yellow and blue."},
    ],
    [
        {"role": "user", "content": "Explain photosynthesis in detail."},
        {"role": "assistant", "content": _PHOTOSYNTHESIS},
        {"role": "user", "content": "And what limits its rate?"},
        {"role": "assistant", "content": "Light intensity, carbon dioxide concentration and temperature. " * 3},
    ],
    [
        {"role": "user", "content": "Write a haiku about the sea."},
        {
            "role": "assistant",
            "content": "Grey waves fold and break,\nsalt wind carries gull voices,\nthe tide keeps its time.",
        },
    ],
]


def chat_samples(target_dir, chats: list[list[dict]]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(chat-i, token ids, loss mask) of each chat rendered by the chat template of the tokenizer
    at ``target_dir``; the loss on the tokens after the last header."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    out = []
    for i, chat in enumerate(chats):
        ids = tok.apply_chat_template(chat, tokenize=True, return_dict=False)
        ids = ids if isinstance(ids[0], int) else ids[0]
        prompt = tok.apply_chat_template(chat[:-1], tokenize=True, add_generation_prompt=True, return_dict=False)
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[len(prompt) :] = True
        out.append((f"chat-{i}", torch.tensor(ids, dtype=torch.int64), mask))
    assert len({len(s[1]) for s in out}) == len(out)  # different lengths: batches really pad
    return out


def chat_record(n: int, rid: str | None = None, shape: str = "sharegpt") -> dict:
    """A valid one-exchange record ``question n`` / ``answer n``: ShareGPT's shape
    (conversations/from/value) or, with any other ``shape``, OpenAI's (messages/role/content)."""
    if shape == "sharegpt":
        rec = {"conversations": [{"from": "human", "value": f"question {n}"}, {"from": "gpt", "value": f"answer {n}"}]}
    else:
        rec = {
            "messages": [{"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": f"answer {n}"}]
        }
    if rid is not None:
        rec["id"] = rid
    return rec


def write_numbered_chats(path: Path, n: int = 12, answer: str = "answer") -> Path:
    """A JSONL of n id-less chats ``Say the number i.`` / ``<answer> i``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"Say the number {i}."},
                        {"role": "assistant", "content": f"{answer} {i}"},
                    ]
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def write_word_chats(path: Path, n: int, word: str) -> Path:
    """A JSONL of n chats with ids 0..n-1: ``<word> i?`` / ``ok``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"{i}",
            "messages": [{"role": "user", "content": f"{word} {i}?"}, {"role": "assistant", "content": "ok"}],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def question_conversation(cid: str, question: str, split_key: str = ""):
    """A Conversation ``cid`` of one user ``question`` and an answer that regeneration replaces."""
    from eagle3.data.conversation import Conversation

    return Conversation(
        id=cid,
        messages=[{"role": "user", "content": question}, {"role": "assistant", "content": "IGNORED"}],
        split_key=split_key,
    )
