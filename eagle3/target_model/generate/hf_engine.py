"""data.regen_backend=hf: the target answers through transformers, for machines without vLLM
(the GPU image). Llama-family targets decode with ``eagle3.target_model.generate.fast_decode`` (a KV cache
read once per step, finished rows dropped); any other target with ``generate``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.target_model.generate.common import Regenerator
from eagle3.target_model.quantization import hf_route_refusal

log = logging.getLogger(__name__)


class HFRegenerator(Regenerator):
    """Answers in length-sorted, left-padded batches of ``gen_batch_size`` prompts (``dtype``, or
    fp32 on a CPU that would emulate it; on the GPU when there is one), each cut at its own room
    and its first end-of-turn token, so batching never changes an answer's length limit.

    ``fast_decode`` (default): ``eagle3.target_model.generate.fast_decode.decode`` for Llama-family targets, a
    preallocated KV cache read once per step (faster than ``generate`` on an H200:
    docs/records/2026-12-01-regeneration.md, docs/changelog.md), the same greedy
    answers in fp32 (bf16 near ties may flip); ``generate`` for any other target, with
    ``static_cache``, or when the generation_config asks for processing decode lacks."""

    backend = "hf"

    def __init__(
        self,
        target_dir: str,
        cache_dir: str | Path,
        *,
        gen_batch_size: int = 256,
        device: str | None = None,
        attn_implementation: str | None = None,
        static_cache: bool = False,
        fast_decode: bool = True,
        dtype: str = "bfloat16",
        **kwargs,
    ):
        super().__init__(target_dir, cache_dir, **kwargs)
        if self.quantization:
            raise ValueError(hf_route_refusal("data.regen_backend=hf", self.quantization, "data.regen_backend=vllm"))
        if int(gen_batch_size) < 1:
            raise ValueError(f"gen_batch_size: expected >= 1, got {gen_batch_size}")
        self.gen_batch_size = int(gen_batch_size)
        self.device, self.attn_implementation = device, attn_implementation
        # static KV cache of one shape (gen_batch_size rows x max_model_len + max_tokens): on
        # CUDA, transformers then compiles the decode step once (CUDA graphs) for every batch
        self.static_cache = bool(static_cache)
        self.fast_decode, self.dtype = bool(fast_decode), str(dtype)
        self._fast: bool | None = None  # decided (and a refusal logged) at the first batch
        self._top_k = 0  # generate's top-k under the model's generation_config (sampling only)
        self._model = None
        self._checked = False  # the first batch is checked for padding leaks (greedy)

    def _load(self):
        if self._model is None:
            started = time.monotonic()
            import torch
            from transformers import AutoModelForCausalLM

            from eagle3.target_model.compute_dtype import compute_dtype, compute_note

            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            # only token ids leave this engine: a CPU that would emulate bf16 decodes in fp32
            stored = getattr(torch, self.dtype)
            dtype = compute_dtype(stored, device)
            note = compute_note(stored, dtype)
            if note:
                log.info("regenerate (hf): %s", note)
            # CPU: SDPA in bf16 with left padding answered "What is the capital of France?"
            # with garbage when batched beside a longer prompt (torch 2.13, measured); eager is right
            attn = self.attn_implementation or ("sdpa" if str(device).startswith("cuda") else "eager")
            self._model = (
                AutoModelForCausalLM.from_pretrained(
                    self.target_dir,
                    dtype=dtype,
                    attn_implementation=attn,
                    trust_remote_code=self.trust_remote_code,
                )
                .to(device)
                .eval()
            )
            self.engine_start_s += time.monotonic() - started
        return self._model

    def close(self) -> None:
        self._model = None
        super().close()

    @contextmanager
    def sampling(self, temperature: float, seed: int) -> Iterator[None]:
        """As the base, and the decode path (its top-k follows the temperature) chosen afresh for
        the while; the greedy padding check is left for the answers."""
        saved = self._fast, self._top_k, self._checked
        self._fast, self._checked = None, True
        try:
            with super().sampling(temperature, seed):
                yield
        finally:
            self._fast, self._top_k, self._checked = saved

    def _stop_ids(self) -> set[int]:
        ids = self._load().generation_config.eos_token_id
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
        tok = self.tokenizer()
        if tok.eos_token_id is not None:
            ids.add(int(tok.eos_token_id))
        if not ids:
            raise ValueError(
                f"{self.target_dir}: no end-of-turn token (generation_config.eos_token_id, "
                "tokenizer.eos_token): cannot tell where an answer stops"
            )
        return ids

    def _use_fast(self) -> bool:
        if self._fast is None:
            from eagle3.target_model.generate.fast_decode import generate_settings, unsupported_reason

            reason: str | None
            if not self.fast_decode:
                reason = "fast_decode=False"
            elif self.static_cache:
                reason = "static_cache=True"
            else:
                model = self._load()
                settings_reason, self._top_k = generate_settings(model, self.temperature)
                reason = unsupported_reason(model, self.max_model_len + self.max_tokens) or settings_reason
            self._fast = reason is None
            if self.fast_decode and reason:
                log.info("regenerate (hf): transformers generate, not fast decode: %s", reason)
        return self._fast

    def _batch(self, prompts: list[list[int]], rooms: list[int]) -> list[list[int]]:
        """Each prompt's answer ids: at most its room, cut before its first stop id."""
        import torch

        model, stop = self._load(), self._stop_ids()
        if self._use_fast():
            from eagle3.target_model.generate.fast_decode import decode

            # seeded like generate's global generator: _complete seeds each batch with manual_seed
            gen = torch.Generator(device=model.device).manual_seed(torch.initial_seed())
            return decode(model, prompts, rooms, stop, temperature=self.temperature, generator=gen, top_k=self._top_k)
        tok = self.tokenizer()
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(stop)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": self.temperature}
            if self.temperature > 0
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        rows = len(prompts)
        if self.static_cache and rows < self.gen_batch_size:  # one batch shape: repeat the last row
            extra = self.gen_batch_size - rows
            ids, mask = torch.cat([ids, ids[-1:].expand(extra, -1)]), torch.cat([mask, mask[-1:].expand(extra, -1)])
        if self.static_cache:
            sampling.update(cache_implementation="static", max_cache_len=self.max_model_len + self.max_tokens)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                max_new_tokens=max(rooms),
                pad_token_id=pad,
                eos_token_id=sorted(stop),
                **sampling,
            )
        answers = []
        for seq, room in zip(out[:rows, width:].tolist(), rooms):
            seq = seq[:room]
            answers.append(seq[: next((k for k, t in enumerate(seq) if t in stop), len(seq))])
        return answers

    def _padding_is_safe(self, prompts: list[list[int]], rooms: list[int], batched: list[list[int]]) -> bool:
        """Greedy only: the most padded prompts of a batch (up to 4), answered alone, must start
        the same (first 8 tokens) as in the batch. A leak garbles every padded answer, while a
        bf16 near tie flips one now and then, so most (not all) of them must agree."""
        if self.temperature > 0 or len(prompts) < 2:
            return True
        picks = list(range(len(prompts)))[-min(4, len(prompts) - 1) :]
        same = 0
        for j in picks:
            n = min(8, rooms[j])
            same += self._batch([prompts[j]], [n])[0] == batched[j][:n]
        if same < len(picks):
            log.info("regenerate (hf): %d of %d padded prompts answered alone as in the batch", same, len(picks))
        return 2 * same > len(picks)

    def _check_padding(self, prompts: list[list[int]], rooms: list[int], batched: list[list[int]]):
        """The first batch's answers, redone with the next remedy while padding leaks."""
        while not self._padding_is_safe(prompts, rooms, batched):
            if self._fast:
                log.warning(
                    "regenerate (hf): fast decode answered a left-padded prompt differently in a batch "
                    "than alone; switching to transformers generate"
                )
                self._fast = False
            elif self._load().config._attn_implementation != "eager":
                log.warning(
                    "regenerate (hf): a left-padded prompt answered differently in a batch than alone "
                    "with %s attention; switching to eager attention",
                    self._load().config._attn_implementation,
                )
                self._load().set_attn_implementation("eager")
            else:
                raise RuntimeError(
                    "regenerate (hf): batched answers differ from answers alone even with "
                    "eager attention; use data.regen_batch_size=1 or data.regen_backend=vllm"
                )
            batched = self._batch(prompts, rooms)
        return batched

    def _rows_that_fit(self, longest: list[int], room: int) -> int:
        """Batch rows: gen_batch_size, fewer when their KV cache (longest prompt + room columns)
        would take more than half the free GPU memory (long prompts come first)."""
        import torch

        model = self._load()
        if model.device.type != "cuda":
            return self.gen_batch_size
        cfg = model.config.get_text_config()
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        per_row = (len(longest) + room) * cfg.num_hidden_layers * 2 * kv_heads * head_dim * model.dtype.itemsize
        free, _ = torch.cuda.mem_get_info(model.device)
        return max(1, min(self.gen_batch_size, int(0.5 * free // per_row)))

    def _complete(self, prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[str]:
        """``seeds`` unused: each batch draws from one generator seeded by its place in the call,
        so copies of one prompt in a batch are different rows, different samples."""
        import torch
        from tqdm.auto import tqdm

        tok = self.tokenizer()
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # longest first: OOM shows at once
        texts: list[str] = [""] * len(prompts)
        t0, made = time.perf_counter(), 0
        bar = tqdm(total=len(prompts), desc="regenerate (hf)", unit="answer")
        start = 0
        while start < len(order):
            idx = order[start : start + self._rows_that_fit(prompts[order[start]], max(rooms))]
            batch, batch_rooms = [prompts[i] for i in idx], [rooms[i] for i in idx]
            torch.manual_seed(self.seed + start)
            new = self._batch(batch, batch_rooms)
            if not self._checked:
                self._checked = True
                new = self._check_padding(batch, batch_rooms, new)
            for i, ids in zip(idx, new):
                made += len(ids)
                texts[i] = tok.decode(ids, skip_special_tokens=True)
            bar.update(len(idx))
            start += len(idx)
            bar.set_postfix(tok_s=f"{made / max(1e-9, time.perf_counter() - t0):.0f}")
        bar.close()
        self.new_tokens += made
        return texts
