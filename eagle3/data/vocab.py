"""Token frequencies over generated tokens, and the draft vocabulary built from them.

Counting convention: ``token_frequencies`` counts ``input_ids[t]`` at every t where
``loss_mask[t]`` is 1, i.e. the tokens the target *generates* (assistant text and its
end-of-turn token). These are exactly the tokens the draft head has to predict, which is
what "frequency over loss-masked (answer) tokens" means in docs/architecture.md.

Draft vocabulary: the top-V target ids by frequency, ties broken by the
smaller id, then sorted by id; when fewer than V ids were seen, the unseen ids with the
smallest values fill the rest (they have frequency 0, so the same ordering gives them).

    d2t   int64 [V]   d2t[i] = target_id[i] - i   (draft id i -> target id i + d2t[i])
    t2d   bool  [Vt]  t2d[j] = target id j is in the draft vocabulary
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch

_FLUSH_TOKENS = 1 << 22


def _ids_and_mask(sample: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        ids, mask = sample
    else:
        ids, mask = sample.input_ids, sample.loss_mask
    ids = torch.as_tensor(ids, dtype=torch.long)
    mask = torch.as_tensor(mask, dtype=torch.bool)
    if ids.shape != mask.shape or ids.dim() != 1:
        raise ValueError(f"input_ids {tuple(ids.shape)} and loss_mask {tuple(mask.shape)} must be equal 1-D shapes")
    return ids, mask


def token_frequencies(samples: Iterable[Any], vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: how often each target id is a loss-masked (generated) token.

    ``samples`` yields objects with ``input_ids``/``loss_mask`` or (ids, mask) pairs.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    freq = torch.zeros(vocab_size, dtype=torch.long)
    # one bincount per few million tokens: a bincount per sample re-adds the whole
    # vocab-sized histogram each time (seconds for a few thousand samples)
    pending: list[torch.Tensor] = []
    pending_tokens = 0

    def flush() -> None:
        nonlocal pending_tokens
        if pending:
            freq.add_(torch.bincount(torch.cat(pending), minlength=vocab_size))
            pending.clear()
            pending_tokens = 0

    for index, sample in enumerate(samples):
        ids, mask = _ids_and_mask(sample)
        counted = ids[mask]
        if counted.numel() == 0:
            continue
        low, high = int(counted.min()), int(counted.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"sample {index}: token id {high if high >= vocab_size else low} outside the target "
                f"vocabulary [0, {vocab_size}) -- tokenizer and model.vocab_size disagree?"
            )
        pending.append(counted)
        pending_tokens += counted.numel()
        if pending_tokens >= _FLUSH_TOKENS:
            flush()
    flush()
    return freq


def build_draft_vocab(freq: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 [V], t2d bool [Vt]) for V = min(draft_vocab_size, Vt)."""
    freq = torch.as_tensor(freq)
    if freq.dim() != 1 or freq.numel() == 0:
        raise ValueError(f"freq must be a non-empty 1-D tensor over the target vocab, got shape {tuple(freq.shape)}")
    if draft_vocab_size <= 0:
        raise ValueError(f"draft_vocab_size must be positive, got {draft_vocab_size}")
    target_vocab = freq.numel()
    size = draft_vocab_size
    if size > target_vocab:
        warnings.warn(
            f"draft_vocab_size={draft_vocab_size} exceeds the target vocabulary ({target_vocab}); "
            f"using {target_vocab} (the draft vocabulary is the whole target vocabulary)",
            stacklevel=2,
        )
        size = target_vocab
    # Stable sort on descending frequency: equal counts keep ascending id order, so ties
    # go to the smaller id and unseen ids (count 0) fill up smallest first.
    order = torch.sort(-freq.to(torch.long), stable=True).indices
    target_ids = torch.sort(order[:size]).values
    d2t = target_ids - torch.arange(size, dtype=torch.long)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d
