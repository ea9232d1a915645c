"""Length-aware packing of variable-length samples into batches of at most max_tokens_per_batch tokens.

Samples are packed whole into one row of at most ``max_tokens`` tokens (no padding; the
model's segment ids keep packed samples from attending to each other). The packing is
computed once and is deterministic, so every pass has the same batches and a resumed run
can skip exactly the batches it already trained on; only the batch *order* is shuffled
per pass (seeded). In DDP each rank takes every world-th batch of that order.

Below training and evaluation, which both batch a dataset this way (the Lightning data module
and the replay of an export); plain torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Callable, Protocol

import torch

from eagle3.store.batch_options import BatchOrder, BatchShape
from eagle3.store.read_ahead import ReadAheadLoader
from eagle3.store.storage_format import FP8, StorageFormat, decode_teacher
from eagle3.store.teacher_topk import TEACHER_TENSORS

# a sample's states: hidden [T, L, H], or a storage format's tensors (fp8 and int4 share the names),
# or with the teacher's top-k in place of the final layer: those tensors, its aux layers decoded
# (aux_layers [T, L-1, H]) or not
_STATE_KEYS = ("hidden", *StorageFormat(FP8).tensor_names(), *TEACHER_TENSORS, "aux_layers")


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

    def __init__(
        self,
        batches: list[list[int]],
        *,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        batches_done: int = 0,
    ):
        if world_size > 1 and len(batches) < world_size:
            raise ValueError(
                f"{len(batches)} batches cannot feed {world_size} ranks; lower train.max_tokens_per_batch or add data"
            )
        self.batches = batches
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        per_pass = self.per_pass
        self.pass_index, self.start = divmod(batches_done, per_pass) if per_pass else (0, 0)

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
        # one full pass, also right after a mid-pass resume: Lightning reads the length once
        # and caps every later epoch at it (the pass in progress stops early by itself; its
        # restored batch count already covers the part done before the resume)
        return self.per_pass

    def __iter__(self) -> Iterator[list[int]]:
        order = self._pass_order(self.pass_index)[self.start :]
        self.pass_index, self.start = self.pass_index + 1, 0
        for b in order:
            yield self.batches[b]


def pack_rows(lengths: Sequence[int], max_tokens: int, row_tokens: int | None, *, seed: int = 0) -> list[list[int]]:
    """Batches of several packed rows: samples first-fit into rows of ``row_tokens``, then
    ``max_tokens // row_tokens`` consecutive rows per batch (indices listed row after row).

    Why rows: TTT attention is dense over a row (O(row^2) per step, and the diagonal blocks
    of steps >= 1 multiply it), so one 16k-token row of 300-token samples spends most of
    its step on masked-out pairs; 8 rows of 2k do 1/8 of that work for the same tokens.
    ``row_tokens=None`` (or >= max_tokens): one row per batch, ``pack_by_length``.
    """
    if row_tokens is None or row_tokens >= max_tokens:
        return pack_by_length(lengths, max_tokens, seed=seed)
    if row_tokens < 1:
        raise ValueError(f"train.row_tokens: expected >= 1 or null, got {row_tokens}")
    rows = pack_by_length(lengths, row_tokens, seed=seed)
    per_batch = max_tokens // row_tokens
    return [[i for row in rows[b : b + per_batch] for i in row] for b in range(0, len(rows), per_batch)]


def split_rows(items: list[dict[str, Any]], row_tokens: int) -> list[list[dict[str, Any]]]:
    """Consecutive items, a new row whenever the next would overflow ``row_tokens``. For
    ``pack_rows`` batches this gives back its rows (first-fit over ascending lengths fills
    each row with a run of the order, closed by the first sample that does not fit), or
    fewer where a bucket's last row takes the next bucket's first sample: never a row over
    ``row_tokens``, never a sample dropped (a sample longer than a row is cut to one row)."""
    rows: list[list[dict[str, Any]]] = []
    used = row_tokens
    for item in items:
        n = min(int(item["input_ids"].shape[0]), row_tokens)
        if used + n > row_tokens:
            rows.append([])
            used = 0
        rows[-1].append(item)
        used += n
    return rows


def collate_rows(
    items: list[dict[str, Any]],
    max_tokens: int,
    row_tokens: int | None,
    fixed_shape: bool = False,
    *,
    split: bool = True,
    pin: bool = False,
) -> dict[str, torch.Tensor]:
    """One batch as [B, T]: a single packed row (``row_tokens`` null), or one packed row per
    line for ``pack_rows`` batches, shorter rows padded (segment -1, no loss). fixed_shape:
    always [max_tokens // row_tokens, row_tokens] (one compiled shape), [1, max_tokens] for
    a single row. ``split`` and ``pin``: see ``collate_packed``."""
    if row_tokens is None or row_tokens >= max_tokens:
        return _collate([items], max_tokens, max_tokens if fixed_shape else None, 1, split=split, pin=pin)
    rows = split_rows(items, row_tokens)
    num_rows = max_tokens // row_tokens if fixed_shape else len(rows)  # fixed: empty rows are all padding
    return _collate(rows, row_tokens, row_tokens if fixed_shape else None, num_rows, split=split, pin=pin)


def collate_packed(
    items: list[dict[str, Any]], max_tokens: int, pad_to: int | None = None, *, split: bool = True, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Concatenate samples into one row [1, T]: positions restart and segment ids change
    at each sample boundary; a sample past ``max_tokens`` is cut.

    ``pad_to``: pad the row to exactly that many tokens (segment -1, no loss, zero states),
    so every batch has one shape: a compiled step then never recompiles for a new length.
    Padding changes no loss or count (the mask and the loss skip segment -1).
    ``split``: hidden [T, L, H] becomes aux_hidden [1, T, (L-1)H] and final_hidden [1, T, H];
    else it stays ``hidden`` [1, T, L, H] for ``split_hidden`` to cut where it is cheaper (on
    the GPU: the aux reshape is a copy). ``pin``: the states in page-locked memory, written
    there directly (one copy from the dataset's memory map), for an asynchronous GPU copy."""
    return _collate([items], max_tokens, pad_to, 1, split=split, pin=pin)


def _collate(
    rows: list[list[dict[str, Any]]], cap: int, width: int | None, num_rows: int, *, split: bool, pin: bool
) -> dict[str, torch.Tensor]:
    """Rows of samples (each cut to the row's ``cap`` tokens) into [num_rows, width] tensors,
    each filled in place: every sample's states are copied once, into the batch."""
    cut_rows: list[list[tuple[dict[str, Any], int]]] = []
    for row in rows:
        used, parts = 0, []
        for item in row:
            n = min(int(item["input_ids"].shape[0]), cap - used)
            if n <= 0:
                break
            parts.append((item, n))
            used += n
        cut_rows.append(parts)
    used_per_row = [sum(n for _, n in parts) for parts in cut_rows]
    W = width if width is not None else max(used_per_row)
    B = max(num_rows, len(cut_rows))
    first = cut_rows[0][0][0]
    # the states: hidden [T, L, H], or a storage format's tensors (each [T, ...]) to decode later
    state_names = [k for k in _STATE_KEYS if k in first]
    like = first[state_names[0]]
    # where the states are (the GPU, for online training's target), else host memory: pinned on
    # request, or in a DataLoader worker shared memory (_shared_empty; the loader pins it after)
    in_worker = like.device.type == "cpu" and torch.utils.data.get_worker_info() is not None
    pinned = pin and like.device.type == "cpu" and torch.cuda.is_available() and not in_worker
    states: dict[str, torch.Tensor] = {}
    for name in state_names:
        t = first[name]
        shape = (B, W, *t.shape[1:])  # [B, W, ...]
        if in_worker:
            states[name] = _shared_empty(shape, t.dtype)
        else:
            states[name] = torch.empty(shape, dtype=t.dtype, device=t.device, pin_memory=pinned)
    input_ids = torch.zeros((B, W), dtype=torch.long)  # [B, W]
    loss_mask = torch.zeros((B, W), dtype=torch.bool)  # [B, W]
    position_ids = torch.zeros((B, W), dtype=torch.long)  # [B, W]
    segment_ids = torch.full((B, W), -1, dtype=torch.long)  # [B, W], -1: padding
    for b in range(B):
        off = 0
        for s, (item, n) in enumerate(cut_rows[b] if b < len(cut_rows) else []):
            for name, buf in states.items():
                buf[b, off : off + n] = item[name][:n]
            input_ids[b, off : off + n] = item["input_ids"][:n]
            loss_mask[b, off : off + n] = item["loss_mask"][:n]
            position_ids[b, off : off + n] = torch.arange(n)
            segment_ids[b, off : off + n] = s
            off += n
        for buf in states.values():
            # padding: zero states (zero codes and scales decode to zero), teacher ids 0 and
            # log-probabilities 0.0 (masked out of the loss)
            buf[b, off:].zero_()
    batch = {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        **states,
        "position_ids": position_ids,
        "segment_ids": segment_ids,
        # real (unpadded) tokens, on the host: read without waiting for the device
        "num_tokens": torch.tensor(sum(used_per_row)),
    }
    return split_hidden(batch) if split else batch


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory. A DataLoader worker's batch reaches the main
    process through shared memory: a batch built there crosses without another copy (one built in
    private memory is copied into shared memory when it is sent), as torch's default collate does."""
    nbytes = math.prod(shape) * dtype.itemsize
    # torch's own collate allocates so; the method has no annotations
    storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    stride = [math.prod(shape[i + 1 :]) for i in range(len(shape))]  # contiguous
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)


def decode_hidden(
    batch: dict[str, torch.Tensor], storage: StorageFormat, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """A batch collated from ``HiddenStateDataset.encoded_rows()`` (the format's tensors, each
    [B, T, ...]) -> aux_hidden [B, T, (L-1)H] and final_hidden [B, T, H] in ``dtype``, decoded on
    the tensors' device: the values of ``split_hidden`` over the batch of decoded samples, bit for
    bit. A batch that holds ``hidden`` is split as it is. A batch with the teacher's top-k
    (capture.teacher_topk) gives, in place of final_hidden, teacher_ids int64 [B, T, k] and
    teacher_logprobs float32 [B, T, k] (padding: ids 0, log-probabilities 0.0)."""
    names = storage.tensor_names()
    if "hidden" in batch or not all(name in batch for name in names):
        return split_hidden(batch)
    out = {k: v for k, v in batch.items() if k not in names}
    rows = {name: batch[name] for name in names}
    if storage.teacher_topk is not None:
        aux = storage.decode_aux(rows, dtype)  # [B, T, L-1, H]
        out["aux_hidden"] = _concat_layers(aux)  # [B, T, (L-1)H], a view
        out["teacher_ids"], out["teacher_logprobs"] = decode_teacher(rows)  # [B, T, k] int64, float32
        return out
    aux, final = storage.decode_split(rows, dtype)  # [B, T, L-1, H], [B, T, H]
    out["aux_hidden"] = _concat_layers(aux)  # [B, T, (L-1)H], a view
    out["final_hidden"] = final  # [B, T, H]
    return out


def _concat_layers(aux: torch.Tensor) -> torch.Tensor:
    """aux [B, T, L-1, H] -> [B, T, (L-1)H]: the aux layers side by side, as the head's fc reads them."""
    B, T, La, H = aux.shape
    return aux.reshape(B, T, La * H)


def split_hidden(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``hidden`` [B, T, L, H] -> aux_hidden [B, T, (L-1)H] (the aux layers, concatenated) and
    final_hidden [B, T, H] (the last id: the target's final state), on the tensor's device.
    A batch already split is returned as it is. A batch of samples with the teacher's top-k holds
    aux_layers [B, T, L-1, H] in place of hidden: aux_hidden is made of it, and teacher_ids and
    teacher_logprobs [B, T, k] stay as they are (``decode_hidden``'s keys)."""
    if "aux_layers" in batch:
        out = dict(batch)
        aux = out.pop("aux_layers")  # [B, T, L-1, H]
        out["aux_hidden"] = _concat_layers(aux)  # [B, T, (L-1)H]
        return out
    if "hidden" not in batch:
        return batch
    out = dict(batch)
    h = out.pop("hidden")  # [B, T, L, H]
    B, T, L, H = h.shape
    out["aux_hidden"] = h[:, :, : L - 1].reshape(B, T, (L - 1) * H)  # [B, T, (L-1)H]
    out["final_hidden"] = h[:, :, L - 1]  # [B, T, H]
    return out


class Samples(Protocol):
    """What the loaders index: a dataset of sample dicts (eagle3.store's HiddenStateDataset,
    TokenDataset), not necessarily a torch Dataset subclass."""

    def __getitem__(self, i: int) -> dict[str, Any]: ...

    def __len__(self) -> int: ...


class SampleSubset(torch.utils.data.Dataset[dict[str, Any]]):
    """The samples of ``base`` at ``indices``, in that order."""

    def __init__(self, base: Samples, indices: list[int]):
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.base[self.indices[i]]


def packed_loader(
    dataset: Samples,
    idx: list[int],
    batches: list[list[int]],
    *,
    shape: BatchShape,
    order: BatchOrder = BatchOrder(),
    num_workers: int = 0,
    collate: Callable[[list[dict[str, Any]]], Any] | None = None,
    pin_memory: bool = False,
    split: bool = True,
    read_ahead: int = 0,
) -> torch.utils.data.DataLoader[dict[str, Any]]:
    """A DataLoader of ``batches`` (indices into ``idx``) of these samples, read in ``order``,
    collated by ``collate_rows`` into ``shape``: batches of [B, T] (aux_hidden [B, T, (L-1)H],
    final_hidden [B, T, H]).
    ``collate``: another collate function (online training: the samples as a list, collated
    after the target has run on them). ``pin_memory``: batches in page-locked memory, so the
    copy to a GPU is a DMA that overlaps compute (a training step on CUDA). ``split=False``:
    batches keep ``hidden`` [B, T, L, H], for ``split_hidden`` after the copy to the device.
    ``read_ahead``: with no workers, a thread of this process collates that many batches ahead
    (eagle3/store/read_ahead.py); 0: the caller's thread reads each batch when it asks for it."""
    sampler = PackedBatchSampler(
        batches,
        shuffle=order.shuffle,
        seed=order.seed,
        rank=order.rank,
        world_size=order.world_size,
        batches_done=order.batches_done,
    )
    threaded = num_workers == 0 and read_ahead > 0
    loader_class = partial(ReadAheadLoader, read_ahead=read_ahead) if threaded else torch.utils.data.DataLoader
    return loader_class(
        SampleSubset(dataset, idx),
        batch_sampler=sampler,
        collate_fn=collate
        or partial(
            collate_rows,
            max_tokens=shape.max_tokens,
            row_tokens=shape.row_tokens,
            fixed_shape=shape.fixed_shape,
            split=split,
            pin=pin_memory,
        ),
        num_workers=num_workers,
        persistent_workers=num_workers > 0,  # no worker respawn at every epoch
        pin_memory=pin_memory,
    )


def unshuffled_loader(
    dataset: Any, idx: list[int], *, max_tokens: int, row_tokens: int | None = None, seed: int = 0, num_workers: int = 0
) -> torch.utils.data.DataLoader[dict[str, Any]]:
    """These samples in packed batches, unshuffled, in this process (evaluation). ``dataset``
    has ``lengths`` (tokens per sample), as eagle3.store's HiddenStateDataset."""
    lengths = dataset.lengths
    batches = pack_rows([lengths[i] for i in idx], max_tokens, row_tokens, seed=seed)
    return packed_loader(
        dataset,
        idx,
        batches,
        shape=BatchShape(max_tokens, row_tokens),
        order=BatchOrder(seed=seed),
        num_workers=num_workers,
    )
