"""Regenerate the assistant turns with the target itself (data.regenerate=true).

A draft learns to predict the *target's* continuations, so answers written by the target
(greedy, or at data.regen_temperature) beat the dataset's human/ChatGPT answers: each
user turn is answered by the target given the conversation so far (its own earlier
answers included), batched across conversations turn by turn. With
data.regen_num_answers = n > 1 (sampled: temperature > 0) each conversation is answered n
times, each copy a sample of its own (``answer_id``) that follows its own earlier answers.

Two engines write the same cache: ``vllm_engine.VLLMRegenerator`` (vLLM; the CPU build here,
CUDA vLLM elsewhere) and ``hf_engine.HFRegenerator`` (transformers, for machines without vLLM
such as the GPU image); ``dispatch.make_regenerator`` picks one. This module is what both
share: the ``Regenerator`` base (turns, cache, seeds) and the engine name.
``data.regen_backend=auto`` takes vLLM when it imports.

Answers are cached on disk, one JSON line per conversation id, so a rerun (or a resumed
extraction) regenerates nothing it already has. The cache is keyed by everything that changes
an answer (``cache_key``): the target by content (its weights' sampled hashes, as a dataset's
fingerprint holds them: ``weights_identity``, its config, generation_config.json, tokenizer
files and any remote code), the engine, the sampling settings, max_model_len (an answer's
room), the turn limit and the chat template. A fine-tuned checkpoint or another revision
with the same config and tokenizer answers afresh.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eagle3.data.conversation import Conversation, answer_id
from eagle3.target_model.quantization import vllm_name
from eagle3.util.append_lines import append_lines
from eagle3.util.faults import fault
from eagle3.util.hashing import ContentShaCache, file_short_sha, sampled_file_sha, short_sha

# the target's files whose content changes an answer, beside its weights: generate's defaults
# (penalties, end tokens, top-k) come from generation_config.json
_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
BACKENDS = ("vllm", "hf")
SEED_MAX_TURNS = 16  # data.regen_max_turns=null (all turns) is seeded by limits below this


def resolve_backend(backend: str) -> str:
    """``auto`` -> vllm when it imports, else hf; anything else must be a known engine."""
    backend = str(getattr(backend, "value", backend))
    if backend == "auto":  # looked up, not imported: train.py fingerprints with this at start-up
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if backend not in BACKENDS:
        raise ValueError(f"data.regen_backend: expected auto, {' or '.join(BACKENDS)}, got {backend!r}")
    return backend


def content_cache(cache_dir: str | Path) -> ContentShaCache:
    """The content-hash cache under ``paths.cache_dir`` (a large file is hashed once per machine)."""
    return ContentShaCache(Path(cache_dir) / "content_sha.json")


def weights_identity(target_dir: str | Path, cache: ContentShaCache) -> dict[str, str]:
    """{file name: sampled hash} of each weight file of the target (``hashing.sampled_file_sha``):
    the target's weights by content, as a dataset's fingerprint (``model.weights``) and the
    answer cache's key hold them. Empty for a hub id that is not a directory here."""
    d = Path(target_dir)
    weights = sorted(p for p in d.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES) if d.is_dir() else []
    return {p.name: cache.sha(p, "sampled", sampled_file_sha) for p in weights}


def target_identity(target_dir: str | Path, content: ContentShaCache | None = None) -> dict[str, Any]:
    """The target by content, as far as its answers go: its weights (``weights_identity``),
    config, generation_config.json, tokenizer files and any remote code (``*.py``)."""
    d = Path(target_dir)
    parts: dict[str, Any] = {f: file_short_sha(d / f) for f in _FILES if (d / f).is_file()}
    parts["weights"] = weights_identity(d, content or ContentShaCache(None))
    parts["code"] = {p.name: file_short_sha(p) for p in sorted(d.glob("*.py"))} if d.is_dir() else {}
    return parts


@dataclass(frozen=True)
class AnswerSettings:
    """Every setting that changes an answer, beside the target and the engine: what the answer
    cache's key holds (``cache_key``) with them."""

    temperature: float = 0.0  # data.regen_temperature; 0: greedy
    max_tokens: int = 512  # new tokens per answer at most (data.regen_max_tokens)
    seed: int = 0
    max_model_len: int = 4096  # an answer's room: its prompt and itself
    max_turns: int | None = None  # user turns answered (data.regen_max_turns); None: all
    chat_template: str | None = None  # model.chat_template; None: the tokenizer's
    template_kwargs: Mapping[str, Any] | None = None  # data.chat_template_kwargs
    quantization: str | None = None  # model.quantization: the vLLM engine runs the target so


def cache_key(
    target_dir: str, answers: AnswerSettings, backend: str = "vllm", *, target: dict[str, Any] | None = None
) -> str:
    """The answer cache's key: the target by content (``target_identity``; ``target``: it,
    computed already), the engine and every setting that changes an answer. The quantization (as
    vLLM names model.quantization) and the template arguments are in the key only when set, so
    the answers cached before keep theirs. A system prompt needs no key: it is a turn of the
    conversation, which each answer's record matches by its user turns' hash."""
    parts = dict(target if target is not None else target_identity(target_dir))
    quantization, template_kwargs = vllm_name(answers.quantization), dict(answers.template_kwargs or {})
    if quantization:
        parts["quantization"] = quantization
    if template_kwargs:
        parts["template_kwargs"] = template_kwargs
    chat_template = answers.chat_template
    parts.update(
        temperature=float(answers.temperature),
        max_tokens=int(answers.max_tokens),
        max_model_len=int(answers.max_model_len),
        seed=int(answers.seed),
        chat_template=short_sha(chat_template) if chat_template else None,
        backend=backend,
        max_turns=answers.max_turns,
    )
    return short_sha(json.dumps(parts, sort_keys=True))


def cache_records(path: Path) -> Iterator[dict]:
    """The records of a JSONL cache file, in file order (none when there is no file); a line cut
    by a crash is skipped, so what it held is generated again."""
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _read_cache(path: Path) -> dict[str, dict]:
    """{conversation id: record} of one cache file ({} when there is none)."""
    return {rec["id"]: rec for rec in cache_records(path)}


def _asked_sha(conv: Conversation) -> str:
    """What a cached answer was asked: the turns but the answers, and the conversation's own
    template arguments when it has them (a mixture source's mode: its answers differ)."""
    asked: Any = [m for m in conv.messages if m["role"] != "assistant"]
    if conv.template_kwargs is not None:
        asked = {"turns": asked, "template_kwargs": conv.template_kwargs}
    return short_sha(json.dumps(asked, sort_keys=True, default=str))


class Regenerator:
    """``regenerate(conversations) -> conversations`` for ``eagle3.data.pipeline.prepare_samples``.

    Subclasses supply ``_complete(prompts, rooms, seeds) -> texts``: one answer per token-id
    prompt, at most ``rooms[i]`` new tokens each, sampled with this instance's settings;
    ``seeds[i]`` is the request's own seed where the engine seeds per request (answer k of a
    conversation: seed + k, so copies of one prompt are different samples).
    """

    backend = ""

    def __init__(
        self,
        target_dir: str,
        cache_dir: str | Path,
        *,
        answers: AnswerSettings = AnswerSettings(),
        num_answers: int = 1,
        trust_remote_code: bool = False,
    ):
        """``answers``: what changes an answer (sampling, room, turns, template, quantization);
        ``num_answers``: answers per conversation (more than 1 only sampled)."""
        self.target_dir = str(target_dir)
        # model.quantization as vLLM names it: the vLLM engine runs the target so; the HF one
        # cannot (refused at compose: eagle3/stages/validate.py)
        self.quantization = vllm_name(answers.quantization)
        temperature, max_turns = answers.temperature, answers.max_turns
        self.temperature, self.max_tokens, self.seed = float(temperature), int(answers.max_tokens), int(answers.seed)
        self.max_model_len, self.chat_template = int(answers.max_model_len), answers.chat_template
        self.template_kwargs = dict(answers.template_kwargs or {})  # data.chat_template_kwargs
        self.trust_remote_code = bool(trust_remote_code)  # model.trust_remote_code, for every load
        self.num_answers = int(num_answers)
        if self.num_answers < 1 or (self.num_answers > 1 and self.temperature <= 0):
            raise ValueError(
                f"data.regen_num_answers: expected 1, or more with data.regen_temperature > 0 (greedy answers "
                f"are all the same), got {num_answers} at temperature {temperature}"
            )
        if max_turns is not None and int(max_turns) < 1:
            raise ValueError(f"data.regen_max_turns: expected null or >= 1, got {max_turns}")
        self.max_turns = None if max_turns is None else int(max_turns)

        target = target_identity(target_dir, content_cache(cache_dir))  # hashed once, for every key below

        def cache_file(turns: int | None) -> Path:
            key = cache_key(target_dir, replace(answers, max_turns=turns), self.backend, target=target)
            return Path(cache_dir) / "regenerated" / f"{key}.jsonl"

        self.cache_file = cache_file(self.max_turns)
        self.cache = _read_cache(self.cache_file)
        # answers of a run with a lower data.regen_max_turns (all else equal) answer the first
        # turns here: raising the limit generates only the turns that are new (the higher
        # limit wins where several exist)
        self.seeds: dict[str, dict] = {}
        for turns in range(1, self.max_turns or SEED_MAX_TURNS):
            self.seeds.update(_read_cache(cache_file(turns)))
        self.seeded_turns = 0  # answers taken from self.seeds by this instance
        self.generated = 0  # conversations generated (not from cache) by this instance
        self.new_tokens = 0  # tokens generated by this instance
        self.engine_start_s = 0.0  # seconds spent starting the engine (a time budget's pace leaves them out)
        self.only: set[str] | None = None  # restrict_to's sample ids (None: answer every conversation)
        self._tokenizer = None

    def restrict_to(self, sample_ids: Iterable[str]) -> None:
        """Answer only the copies (``answer_id``) named here, from the cache or generated; any
        other comes back with no answered turn (the pipeline drops and counts it) and nothing is
        generated for it. A repair: the samples the dataset holds, not those a budget cut."""
        self.only = {str(i) for i in sample_ids}

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.target_dir, trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    def close(self) -> None:
        import gc

        gc.collect()

    def _complete(self, prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[str]:
        raise NotImplementedError

    def complete(self, prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[str]:
        """The engine's texts for raw token-id prompts (self-prompts: a user turn after the
        template's user header), at this instance's temperature; nothing cached."""
        return self._complete(prompts, rooms, seeds)

    @contextmanager
    def sampling(self, temperature: float, seed: int) -> Iterator[None]:
        """This engine at another temperature and base seed for a while: self-prompts are sampled
        (~1) by the engine that answers them at data.regen_temperature."""
        saved = self.temperature, self.seed
        self.temperature, self.seed = float(temperature), int(seed)
        try:
            yield
        finally:
            self.temperature, self.seed = saved

    def _prompt_ids(self, history: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """``template_kwargs``: the conversation's own (None: this engine's, data.chat_template_kwargs)."""
        kwargs = {"chat_template": self.chat_template} if self.chat_template else {}
        extra = self.template_kwargs if template_kwargs is None else template_kwargs
        ids = self.tokenizer().apply_chat_template(
            history, add_generation_prompt=True, tokenize=True, **kwargs, **extra
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def _seeded_answers(self, conv: Conversation) -> list[str]:
        rec = self.seeds.get(conv.id)
        if rec is None or rec.get("user_sha") != _asked_sha(conv):  # another conversation
            return []
        return [m["content"] for m in rec["messages"] if m["role"] == "assistant"]

    def _generate(self, convs: list[Conversation], answers: list[int]) -> list[list[dict[str, str]]]:
        users = [[i for i, m in enumerate(c.messages) if m["role"] == "user"][: self.max_turns] for c in convs]
        histories: list[list[dict[str, str]]] = [[m for m in c.messages if m["role"] == "system"] for c in convs]
        seeded = [self._seeded_answers(c) for c in convs]
        for turn in range(max(len(u) for u in users)):
            active, prompts, seeds = [], [], []
            for j, c in enumerate(convs):
                if turn >= len(users[j]):
                    continue
                histories[j].append(dict(c.messages[users[j][turn]]))
                if turn < len(seeded[j]):
                    histories[j].append({"role": "assistant", "content": seeded[j][turn]})
                    self.seeded_turns += 1
                    continue
                ids = self._prompt_ids(histories[j], c.template_kwargs)
                if len(ids) + 1 >= self.max_model_len:  # no room to answer: stop this conversation here
                    histories[j].pop()
                    users[j] = users[j][:turn]
                    continue
                active.append(j)
                prompts.append(ids)
                seeds.append(self.seed + answers[j])
            if not prompts:  # every conversation at this turn was answered by a seed (or none is left)
                continue
            rooms = [max(1, min(self.max_tokens, self.max_model_len - len(p) - 1)) for p in prompts]
            for j, text in zip(active, self._complete(prompts, rooms, seeds)):
                histories[j].append({"role": "assistant", "content": text})
        return histories

    def __call__(self, batch: list[Conversation]) -> list[Conversation]:
        """Each conversation's ``num_answers`` answered copies, in order (the split key kept)."""
        copies = [(replace(c, id=answer_id(c.id, k)), k) for c in batch for k in range(self.num_answers)]
        batch = [c for c, _ in copies]
        answer_of = {c.id: k for c, k in copies}
        # restrict_to: the others come back with their turns unanswered, nothing generated
        unasked = set() if self.only is None else {c.id for c in batch if c.id not in self.only}
        batch = [
            replace(c, messages=[m for m in c.messages if m["role"] != "assistant"]) if c.id in unasked else c
            for c in batch
        ]
        todo = [c for c in batch if c.id not in unasked and self.cache.get(c.id, {}).get("user_sha") != _asked_sha(c)]
        if todo:
            fresh = self._generate(todo, [answer_of[c.id] for c in todo])
            recs: dict[str, dict] = {
                c.id: {"id": c.id, "user_sha": _asked_sha(c), "messages": messages} for c, messages in zip(todo, fresh)
            }
            append_lines(self.cache_file, [json.dumps(rec) for rec in recs.values()], "the regenerated-answer cache")
            self.cache.update(recs)
            self.generated += len(todo)
            fault("regen")  # crash tests: killed with this batch's answers durable, the rest not
        # a conversation with no answered turn (prompt too long) renders with no loss
        # tokens and is dropped and counted by the pipeline
        return [c if c.id in unasked else replace(c, messages=self.cache[c.id]["messages"]) for c in batch]
