"""Batched greedy/sampled decoding for Llama-family HF causal LMs, without ``generate``.

``generate`` at batch 2048 on the H200 spent ~290 ms per step moving memory: DynamicCache
re-concatenates every layer's cache each step, SDPA expands the kv heads to the query heads
(another copy), and finished rows keep running until the longest answer ends. Here the cache
is allocated once at its final width and written in place, each decode step reads it once
(query heads grouped by kv head, so no expansion), and finished rows are dropped from the
batch once enough of them have finished.

Answers equal ``generate``'s for each prompt alone: same modules (norms, projections, MLP,
rotary tables), the same position ids (counted from each row's first real token, as
``generate`` derives them from the attention mask), decode-step softmax in float32 as in
eager attention, logits in float32. In float32 they match token for token; in bf16 a near
tie can flip either way, as it does for ``generate`` between a batch and a prompt alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

MODEL_TYPES = ("llama", "mistral", "qwen2")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def _window_reason(config, total_len: int | None) -> str | None:
    odd = set(getattr(config, "layer_types", None) or []) - {"full_attention", "sliding_attention"}
    if odd:
        return f"layer types {sorted(odd)} are neither full nor sliding attention"
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    # a window at least as wide as the longest sequence never hides a key
    if total_len is not None and int(window) >= total_len:
        return None
    return f"sliding_window={window} is in use" + (
        f" and narrower than the {total_len} tokens needed" if total_len is not None else ""
    )


def unsupported_reason(model, total_len: int | None = None) -> str | None:
    """None when ``decode`` reproduces this model; otherwise a sentence saying why not.

    ``total_len`` (prompt width + new tokens) lets a sliding window that can never bite pass."""
    config = getattr(model, "config", None)
    inner: Any = getattr(model, "model", None)
    missing = [name for name in ("embed_tokens", "norm", "rotary_emb", "layers") if not hasattr(inner, name)]
    if not hasattr(model, "lm_head"):
        missing.append("lm_head")
    if missing:
        return f"{type(model).__name__} has no model.{', model.'.join(missing)}"
    for i, layer in enumerate(inner.layers):
        need = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
        gone = [n for n in need if not hasattr(layer, n)]
        gone += [
            f"self_attn.{n}"
            for n in ("q_proj", "k_proj", "v_proj", "o_proj")
            if not hasattr(getattr(layer, "self_attn", None), n)
        ]
        if gone:
            return f"layer {i} has no {', '.join(gone)}"
        extra = [n for n in ("q_norm", "k_norm") if getattr(layer.self_attn, n, None) is not None]
        if extra:
            return f"layer {i} normalises queries/keys ({', '.join(extra)}), which this decoder does not"
    # same module names do not promise the same forward (embedding multipliers, soft caps):
    # only architectures whose layers are checked against generate pass
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(MODEL_TYPES)}"
    return _window_reason(config, total_len)


class _Shape:
    """Head counts and scaling read once from the config and the first attention module."""

    def __init__(self, model):
        cfg = model.config
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        attn = model.model.layers[0].self_attn
        self.scaling = float(getattr(attn, "scaling", None) or self.head_dim**-0.5)


def _prefill(model, shape: _Shape, prompts: list[list[int]], width: int, caches, rows: slice) -> torch.Tensor:
    """Run ``prompts`` through the model and write their keys/values, left-padded to ``width``,
    into cache rows ``rows``; float32 logits of each prompt's last token.

    The prompts go in right-padded, so causal attention alone keeps every real query off the
    padding (no mask: bf16 SDPA on CPU answered a left-padded prompt with garbage beside a
    longer one, measured with torch 2.13), and positions are plain column numbers."""
    device = model.model.embed_tokens.weight.device
    b, w = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((b, w), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
    ids, lens = ids.to(device), torch.tensor([len(p) for p in prompts], device=device)
    # cache column c of a row holds its token c - start (columns before start: never attended)
    src = (torch.arange(width, device=device)[None, :] - (width - lens)[:, None]).clamp(min=0)
    src = src[:, None, :, None].expand(b, shape.kv_heads, width, shape.head_dim)
    h = model.model.embed_tokens(ids)
    cos, sin = model.model.rotary_emb(h, torch.arange(w, device=device)[None])
    cos, sin = cos[:, None], sin[:, None]  # broadcast over rows and heads
    for layer, (kc, vc) in zip(model.model.layers, caches):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, w, shape.heads, shape.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, w, shape.kv_heads, shape.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, w, shape.kv_heads, shape.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        kc[rows, :, :width] = k.gather(2, src)
        vc[rows, :, :width] = v.gather(2, src)
        if shape.group > 1:  # once per prompt, so the expansion's copy is affordable here
            k = k[:, :, None].expand(-1, -1, shape.group, -1, -1).reshape(b, shape.heads, w, shape.head_dim)
            v = v[:, :, None].expand(-1, -1, shape.group, -1, -1).reshape(b, shape.heads, w, shape.head_dim)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=shape.scaling)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(b, w, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    last = h[torch.arange(b, device=device), lens - 1][:, None]
    return model.lm_head(model.model.norm(last))[:, 0].float()


def _chunks(lengths: list[int], max_tokens: int) -> list[slice]:
    """Consecutive row ranges whose rows x longest prompt stays within ``max_tokens``."""
    out, first, longest = [], 0, 0
    for row, n in enumerate(lengths):
        if row > first and (row - first + 1) * max(longest, n) > max_tokens:
            out.append(slice(first, row))
            first, longest = row, 0
        longest = max(longest, n)
    out.append(slice(first, len(lengths)))
    return out


def _step(
    model, shape: _Shape, tok: torch.Tensor, pos: torch.Tensor, col: int, key_ok: torch.Tensor, caches
) -> torch.Tensor:
    """One token per row: ``tok`` [B] at position ``pos`` [B] goes into cache column ``col``;
    ``key_ok`` [B, col + 1] says which columns each row may attend to. Float32 logits [B, V]."""
    b = tok.shape[0]
    h = model.model.embed_tokens(tok[:, None])
    cos, sin = model.model.rotary_emb(h, pos[:, None])
    cos, sin = cos[:, None], sin[:, None]
    blocked = ~key_ok[:, None, None, :]  # [B, 1, 1, cur]
    for layer, (kc, vc) in zip(model.model.layers, caches):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, 1, shape.heads, shape.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, 1, shape.kv_heads, shape.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, 1, shape.kv_heads, shape.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        kc[:, :, col : col + 1] = k
        vc[:, :, col : col + 1] = v
        # query head j uses kv head j // group (HF's repeat_kv order), so [B, Hkv, G, D]
        # against the cache [B, Hkv, cur, D] reads each cached key once, with no copy
        q = q.reshape(b, shape.kv_heads, shape.group, shape.head_dim)
        scores = torch.matmul(q, kc[:, :, : col + 1].transpose(-1, -2)).mul_(shape.scaling)
        scores = scores.masked_fill_(blocked, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vc.dtype)
        out = torch.matmul(probs, vc[:, :, : col + 1])  # [B, Hkv, G, D]
        h = h + attn.o_proj(out.reshape(b, 1, shape.heads * shape.head_dim))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(model.model.norm(h))[:, 0].float()


@dataclass(frozen=True)
class _Sampling:
    """How the next token is picked: the argmax at ``temperature`` 0, else a draw with
    ``generator`` from softmax(logits / temperature), over the top ``top_k`` only when > 0."""

    temperature: float
    top_k: int
    generator: torch.Generator | None


def _pick(logits: torch.Tensor, sampling: _Sampling) -> torch.Tensor:
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / sampling.temperature
    top_k = sampling.top_k
    if 0 < top_k < logits.shape[-1]:  # as generate's top-k warper: keep ties with the k-th
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=sampling.generator)[:, 0]


def decode(
    model,
    prompts: list[list[int]],
    rooms: list[int],
    stop_ids,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    compact_below: float = 0.5,
    prefill_tokens: int = 262144,
    top_k: int = 0,
) -> list[list[int]]:
    """Each prompt's new tokens: at most ``rooms[i]``, ending at (and excluding) its first stop id.

    Greedy when ``temperature`` is 0, else sampled from softmax(logits / temperature) (top
    ``top_k`` only, when > 0) with ``generator``. Finished rows are dropped from the batch
    when fewer than ``compact_below`` of the current rows are live. Prompts are prefilled in
    row chunks of at most ``prefill_tokens`` padded tokens."""
    if len(prompts) != len(rooms):
        raise ValueError(f"decode: {len(prompts)} prompts but {len(rooms)} rooms")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("decode: an empty prompt has no position to continue from")
    answers: list[list[int]] = [[] for _ in prompts]
    todo = [i for i, r in enumerate(rooms) if r > 0]
    if not todo:
        return answers
    width, most = max(len(prompts[i]) for i in todo), max(rooms[i] for i in todo)
    reason = unsupported_reason(model, width + most)
    if reason:
        raise ValueError(f"decode: {reason}")
    with torch.inference_mode():
        out = _run(
            model,
            [prompts[i] for i in todo],
            [rooms[i] for i in todo],
            stop_ids,
            width,
            most,
            _Sampling(temperature, top_k, generator),
            compact_below,
            prefill_tokens,
        )
    stop = set(int(s) for s in stop_ids)
    for i, seq in zip(todo, out.tolist()):
        seq = seq[: rooms[i]]
        answers[i] = seq[: next((k for k, t in enumerate(seq) if t in stop), len(seq))]
    return answers


def _run(
    model, prompts, rooms, stop_ids, width: int, most: int, sampling: _Sampling, compact_below, prefill_tokens
) -> torch.Tensor:
    """[len(prompts), most] generated ids (-1 where a row was dropped before that step)."""
    embed = model.model.embed_tokens.weight
    device, dtype = embed.device, embed.dtype
    shape = _Shape(model)
    n = len(prompts)
    start = torch.tensor([width - len(p) for p in prompts], device=device)
    caches = [
        (
            torch.empty(n, shape.kv_heads, width + most, shape.head_dim, device=device, dtype=dtype),
            torch.empty(n, shape.kv_heads, width + most, shape.head_dim, device=device, dtype=dtype),
        )
        for _ in model.model.layers
    ]
    logits = torch.cat(
        [
            _prefill(model, shape, prompts[rows], width, caches, rows)
            for rows in _chunks([len(p) for p in prompts], int(prefill_tokens))
        ]
    )
    out = torch.full((n, most), -1, dtype=torch.long, device=device)
    row_ids = torch.arange(n, device=device)  # the original row of each live batch row
    room = torch.tensor(rooms, device=device)
    stops = torch.tensor(sorted(int(s) for s in stop_ids), dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    cols = torch.arange(width + most, device=device)
    # on CUDA, asking how many rows are live stalls the queue; every few steps is enough
    check_every = 4 if device.type == "cuda" else 1
    for step in range(most):
        tok = _pick(logits, sampling)
        out[row_ids, step] = tok
        done |= torch.isin(tok, stops) | (room <= step + 1)
        if step + 1 == most:
            break
        if (step + 1) % check_every == 0:
            live = int((~done).sum())
            if live == 0:
                break
            if live < compact_below * done.shape[0]:
                keep = (~done).nonzero()[:, 0]
                for i, (kc, vc) in enumerate(caches):  # layer by layer: the old copy goes at once
                    caches[i] = (kc.index_select(0, keep), vc.index_select(0, keep))
                    del kc, vc
                tok, start, room, row_ids, done = (t.index_select(0, keep) for t in (tok, start, room, row_ids, done))
        col = width + step
        key_ok = cols[None, : col + 1] >= start[:, None]
        logits = _step(model, shape, tok, col - start, col, key_ok, caches)
    return out.cpu()


# generate's logits processors that decode does not reproduce, each with the value that makes
# it a no-op (unset, zero and empty are no-ops too); generate reads them from the model's
# generation_config, unset ones from transformers' defaults
_NEUTRAL = dict(
    repetition_penalty=1.0,
    encoder_repetition_penalty=1.0,
    guidance_scale=1.0,
    no_repeat_ngram_size=0,
    bad_words_ids=None,
    min_length=0,
    min_new_tokens=0,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    sequence_bias=None,
    exponential_decay_length_penalty=None,
    watermarking_config=None,
)
_NEUTRAL_SAMPLING = dict(top_p=1.0, typical_p=1.0, min_p=0, epsilon_cutoff=0, eta_cutoff=0)


def generate_settings(model, temperature: float) -> tuple[str | None, int]:
    """How ``generate(do_sample=temperature > 0, temperature=temperature)`` would pick tokens
    under the model's generation_config: (a reason ``decode`` cannot match it, or None; the
    ``top_k`` to pass to ``decode``, 0 when greedy or unlimited)."""
    gc: Any = getattr(model, "generation_config", None)
    defaults = gc._get_default_generation_params() if hasattr(gc, "_get_default_generation_params") else {}

    def value(name):
        v = getattr(gc, name, None)
        return defaults.get(name) if v is None else v

    neutral = dict(_NEUTRAL, **(_NEUTRAL_SAMPLING if temperature > 0 else {}))
    odd = [f"{k}={value(k)!r}" for k, v in neutral.items() if value(k) and value(k) != v]
    if odd:
        return f"generation_config sets {', '.join(odd)}", 0
    return None, (int(value("top_k") or 0) if temperature > 0 else 0)
