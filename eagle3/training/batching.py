"""Length-aware packing of variable-length samples into token-budget batches.

Samples are packed whole into one row of at most ``max_tokens`` tokens (no padding; the
model's segment ids keep packed samples from attending to each other). The packing is
computed once and is deterministic, so every pass has the same batches and a resumed run
can skip exactly the batches it already trained on; only the batch *order* is shuffled
per pass (seeded). In DDP each rank takes every world-th batch of that order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def pack_by_length(lengths: Sequence[int], max_tokens: int, *, bucket: int = 256, seed: int = 0) -> list[list[int]]:
    """First-fit over length-sorted buckets: similar lengths share a batch, budgets fill up.

    Shuffling happens inside buckets of ``bucket`` samples so batches are not all
    "long" or all "short" in file order, while packing stays tight.
    """
    if max_tokens < 1:
        raise ValueError(f"train.max_tokens_per_batch: expected >= 1, got {max_tokens}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=g).tolist()
    order.sort(key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for start in range(0, len(order), bucket):
        open_batches: list[tuple[int, list[int]]] = []  # (tokens, indices)
        for i in order[start : start + bucket]:
            n = min(int(lengths[i]), max_tokens)  # longer samples are cut at collate time
            for j, (used, idx) in enumerate(open_batches):
                if used + n <= max_tokens:
                    idx.append(i)
                    open_batches[j] = (used + n, idx)
                    break
            else:
                open_batches.append((n, [i]))
        batches.extend(idx for _, idx in open_batches)
    return batches


class PackedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's packed batches as one deterministic stream: pass e of the data visits
    the batches in a seeded permutation of e, and each ``__iter__`` is the next pass.

    The stream position is all the state there is, so a resumed run starts the stream at
    ``batches_done`` (optimizer steps x accumulation, restored by Lightning) and sees
    exactly the batches an uninterrupted run would have seen. Lightning's own epoch
    counter is not used (``set_epoch`` is a no-op): training length is ``max_steps``.
    """

    def __init__(self, batches: list[list[int]], *, shuffle: bool, seed: int = 0, rank: int = 0,
                 world_size: int = 1, batches_done: int = 0):
        if world_size > 1 and len(batches) < world_size:
            raise ValueError(f"{len(batches)} batches cannot feed {world_size} ranks; lower train.max_tokens_per_batch or add data")
        self.batches = batches
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        per_pass = self.per_pass
        self.pass_index, self.start = (divmod(batches_done, per_pass) if per_pass else (0, 0))

    @property
    def per_pass(self) -> int:
        # equal count per rank (drop the remainder) so DDP ranks never wait on each other
        return len(self.batches) // self.world_size

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this; the stream keeps its own count
        pass

    def _pass_order(self, index: int) -> list[int]:
        if not self.shuffle:
            order = list(range(len(self.batches)))
        else:
            g = torch.Generator().manual_seed(self.seed * 100_003 + index)
            order = torch.randperm(len(self.batches), generator=g).tolist()
        return order[self.rank :: self.world_size][: self.per_pass]

    def __len__(self) -> int:
        return self.per_pass - self.start

    def __iter__(self) -> Iterator[list[int]]:
        order = self._pass_order(self.pass_index)[self.start :]
        self.pass_index, self.start = self.pass_index + 1, 0
        for b in order:
            yield self.batches[b]


def collate_packed(items: list[dict], max_tokens: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Concatenate samples into one row [1, T]: positions restart and segment ids change
    at each sample boundary. hidden [T, L, H] splits into aux [T, (L-1)H] and final [T, H].

    ``pad_to``: pad the row to exactly that many tokens (segment -1, no loss, zero states),
    so every batch has one shape: a compiled step then never recompiles for a new length.
    Padding changes no loss or count (the mask and the loss skip segment -1)."""
    ids, mask, hidden, pos, seg = [], [], [], [], []
    used = 0
    for s, item in enumerate(items):
        n = min(int(item["input_ids"].shape[0]), max_tokens - used)
        if n <= 0:
            break
        ids.append(item["input_ids"][:n])
        mask.append(item["loss_mask"][:n])
        hidden.append(item["hidden"][:n])
        pos.append(torch.arange(n))
        seg.append(torch.full((n,), s, dtype=torch.long))
        used += n
    if pad_to is not None and pad_to > used:
        n = pad_to - used
        ids.append(torch.zeros(n, dtype=ids[0].dtype))
        mask.append(torch.zeros(n, dtype=torch.bool))
        hidden.append(hidden[0].new_zeros((n, *hidden[0].shape[1:])))
        pos.append(torch.zeros(n, dtype=torch.long))
        seg.append(torch.full((n,), -1, dtype=torch.long))
    h = torch.cat(hidden)  # [T, L, H]
    T, L, H = h.shape
    return {
        "input_ids": torch.cat(ids).long().unsqueeze(0),
        "loss_mask": torch.cat(mask).bool().unsqueeze(0),
        "aux_hidden": h[:, : L - 1].reshape(T, (L - 1) * H).unsqueeze(0),
        "final_hidden": h[:, L - 1].unsqueeze(0),
        "position_ids": torch.cat(pos).unsqueeze(0),
        "segment_ids": torch.cat(seg).unsqueeze(0),
    }
