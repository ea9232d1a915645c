"""data.mixture's ``self_prompts`` source: user turns the target writes itself (no download).

The chat template renders a system turn naming a topic and an empty user turn; the text up to
where the user's words would start (the template's user header) is fed to the target, which
writes the user turn, sampled at ``prompt_temperature``, ending at its end-of-turn token (the
engine's stop ids) or ``prompt_max_tokens``. The topics (``topics``; null: ``TOPICS``, the
categories of a broad prompt suite) are taken in turn, prompt k on topic k mod n, so the prompts
spread over them. The conversation ``[user turn]`` then goes through data.regenerate like any
record: the target answers it.

Prompt k is drawn with seeds fixed by (data.seed, k) and cached on disk by index
(``<cache_dir>/self_prompts/<key>.jsonl``, keyed by the target by content and every setting
that changes a prompt), so a rerun or a resumed extraction reads the same prompts. Prompts that
are empty, or near-identical to an earlier one (the same first ``DEDUPE_WORDS`` words, case and
punctuation aside), are dropped and counted.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3.data.conversation import Conversation
from eagle3.target_model.generate.common import Regenerator, cache_records, content_cache, target_identity
from eagle3.util.append_lines import append_lines
from eagle3.util.hashing import short_sha

log = logging.getLogger(__name__)

TOPICS = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction of facts from a text",
    "science and engineering",
    "history and the humanities",
    "everyday advice",
    "explaining a concept",
)
SYSTEM = "You are a user talking to an AI assistant. Write one message asking it for help with {topic}."
DEDUPE_WORDS = 16
STALL_BATCHES = 3  # batches in a row with no new prompt: the source has run out
_SENTINEL = "\u2063self-prompt\u2063"


def dedupe_key(text: str) -> str:
    """What two near-identical prompts share: their first words, lower-cased, punctuation aside."""
    return " ".join(re.findall(r"\w+", text.lower())[:DEDUPE_WORDS])


def user_header(
    tokenizer: Any, topic: str, chat_template: str | None, template_kwargs: dict[str, Any] | None = None
) -> str:
    """The template's text before a user turn's words, after a system turn naming ``topic``
    (without it where the template takes no system turn); ``template_kwargs``: data.chat_template_kwargs."""
    kwargs: dict[str, Any] = {"chat_template": chat_template} if chat_template else {}
    kwargs.update(template_kwargs or {})
    user = {"role": "user", "content": _SENTINEL}
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM.format(topic=topic)}, user], tokenize=False, **kwargs
        )
    except Exception:  # noqa: BLE001 - templates refuse a system turn in their own ways
        text = tokenizer.apply_chat_template([user], tokenize=False, **kwargs)
    return text[: text.index(_SENTINEL)]


class SelfPrompts:
    """The stream of one source: ``Conversation(id=str(k), messages=[user turn k])`` for k = 0,
    1, ... (dropped ones skipped), written by ``regenerator``'s engine in batches of
    ``batch_size``. ``entry``: the source's data.mixture entry (plain dict)."""

    def __init__(self, regenerator: Regenerator, entry: dict[str, Any], *, seed: int, batch_size: int) -> None:
        self.regen = regenerator
        self.name = str(entry["name"])
        self.topics = tuple(entry.get("topics") or TOPICS)
        self.temperature = float(entry.get("prompt_temperature", 1.0))
        self.max_tokens = int(entry.get("prompt_max_tokens", 96))
        if self.max_tokens < 1 or self.temperature <= 0:
            raise ValueError(
                f"data.mixture source {self.name}: expected prompt_max_tokens >= 1 and prompt_temperature > 0 "
                f"(greedy prompts on one topic are all the same), got {self.max_tokens} and {self.temperature}"
            )
        self.seed, self.batch_size = int(seed), max(1, int(batch_size))
        self.used = self.duplicates = self.empty = 0  # prompts read (cached or new), dropped as such
        self.generated = 0  # prompts the engine wrote in this run (the others came from the cache)
        self._headers: dict[str, list[int]] = {}
        # the template's arguments the prompts are written under: the source's own mode, else data's
        self.template_kwargs = dict(entry.get("chat_template_kwargs") or regenerator.template_kwargs)
        self.cache_file = self._cache_file()
        self.cache = _read(self.cache_file)

    def _cache_file(self) -> Path:
        regen = self.regen
        cache_dir = regen.cache_file.parent.parent  # <cache_dir>/regenerated/<key>.jsonl
        parts = {
            "target": target_identity(regen.target_dir, content_cache(cache_dir)),
            "backend": regen.backend,
            "chat_template": short_sha(regen.chat_template) if regen.chat_template else None,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "max_model_len": regen.max_model_len,
            "seed": self.seed,
            "topics": list(self.topics),
            "system": SYSTEM,
        }
        # the served target's quantization and the template's arguments, only when set (the keys of before)
        if regen.quantization:
            parts["quantization"] = regen.quantization
        if self.template_kwargs:
            parts["template_kwargs"] = self.template_kwargs
        return cache_dir / "self_prompts" / f"{short_sha(json.dumps(parts, sort_keys=True))}.jsonl"

    def _header(self, topic: str) -> list[int]:
        if topic not in self._headers:
            tok = self.regen.tokenizer()
            text = user_header(tok, topic, self.regen.chat_template, self.template_kwargs)
            self._headers[topic] = list(tok(text, add_special_tokens=False)["input_ids"])
        return self._headers[topic]

    def batch(self, start: int, n: int) -> list[str]:
        """Prompts start .. start + n - 1, from the cache or written now (then cached)."""
        cached = [self.cache.get(k) for k in range(start, start + n)]
        if all(t is not None for t in cached):
            return [str(t) for t in cached]
        prompts = [self._header(self.topics[k % len(self.topics)]) for k in range(start, start + n)]
        rooms = [max(1, min(self.max_tokens, self.regen.max_model_len - len(p) - 1)) for p in prompts]
        base = (self.seed + 1) * 1_000_003 + start  # a batch's seeds never overlap another's
        with self.regen.sampling(self.temperature, base):
            texts = self.regen.complete(prompts, rooms, [base + i for i in range(n)])
        self.generated += len(texts)
        lines = [json.dumps({"index": k, "text": text}) for k, text in zip(range(start, start + n), texts)]
        append_lines(self.cache_file, lines, "the self-prompt cache")  # under its lock, fsynced
        self.cache.update(zip(range(start, start + n), texts))
        return texts

    def __iter__(self) -> Iterator[Conversation]:
        seen: set[str] = set()
        start, stalled = 0, 0
        while stalled < STALL_BATCHES:
            new = 0
            for k, text in enumerate(self.batch(start, self.batch_size), start):
                self.used += 1
                prompt, key = text.strip(), dedupe_key(text)
                if not key:
                    self.empty += 1
                elif key in seen:
                    self.duplicates += 1
                else:
                    seen.add(key)
                    new += 1
                    yield Conversation(id=str(k), messages=[{"role": "user", "content": prompt}])
            start += self.batch_size
            stalled = 0 if new else stalled + 1
        log.warning("self-prompts %s: %d batches in a row gave no new prompt: stopped", self.name, STALL_BATCHES)

    def summary(self) -> str:
        return (
            f"self-prompts {self.name}: {self.used} read, {self.duplicates} near-duplicates and {self.empty} empty "
            f"dropped; {self.generated} written by the target in this run, in batches of {self.batch_size} "
            f"(cache: {self.cache_file})"
        )


def _read(path: Path) -> dict[int, str]:
    """{prompt index: text} of the self-prompt cache ({} when there is none)."""
    return {int(rec["index"]): str(rec["text"]) for rec in cache_records(path)}
