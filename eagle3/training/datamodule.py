"""LightningDataModule over a dataset: lazy reads, packed batches, DDP split.

Offline, the dataset holds the hidden states. Online (``online`` given), it holds token ids
only and the target computes the states of each batch on the training device, in
``on_before_batch_transfer`` (eagle3/training/online.py).

A dataset stored in fp8 or int4 (``capture.storage``) is decoded where the training runs when
that is a GPU: the loader hands the format's tensors (a third to a half of the bytes), and
``on_after_batch_transfer`` decodes them on the device into the values a loader worker's decode
gives, bit for bit (eagle3/store/storage_format.py). On a CPU the loader's workers decode.

Batches are made over the samples in sample-id order, not the order they sit on disk (which
depends on how the capture batched them): the same samples give the same batches whichever
backend, engine or mode wrote the dataset, so an online run reads exactly what an offline
run of the same samples reads.
"""

from __future__ import annotations

import warnings

import lightning as L
import torch

from eagle3.store import HiddenStateDataset, TokenDataset, open_dataset
from eagle3.store.batch_options import BatchOrder, BatchShape
from eagle3.store.packing import decode_hidden, pack_rows, packed_loader, split_hidden, unshuffled_loader
from eagle3.store.read_ahead import ReadAheadLoader
from eagle3.training.online import OnlineHiddenStates


class Eagle3DataModule(L.LightningDataModule):
    def __init__(
        self,
        dataset_dir: str,
        *,
        shape: BatchShape,
        seed: int = 0,
        num_workers: int = 0,
        read_ahead: int = 0,
        require_train: bool = True,
        online: OnlineHiddenStates | None = None,
        pin_memory: bool = False,
        decode_on_device: bool | None = None,
        selection_dir: str | None = None,
    ):
        """``shape``: every loader's batches (train.max_tokens_per_batch; train.row_tokens and one
        fixed shape as the step path resolved them). ``decode_on_device``: an fp8/int4 dataset's batches travel encoded and are decoded after
        the copy to the training device (None: when that device is a GPU, decided in ``setup``).
        ``selection_dir``: the selection set's dataset (eagle3/stages/selection.py), validated on
        beside the validation split, every sample of it, never trained on."""
        super().__init__()
        self.dataset_dir = dataset_dir
        self.max_tokens = int(shape.max_tokens)
        self.fixed_shape = bool(shape.fixed_shape)  # one batch shape (train.compile): rows padded
        self.row_tokens = int(shape.row_tokens) if shape.row_tokens else None  # several packed rows per batch
        self.seed, self.num_workers = int(seed), int(num_workers)
        if read_ahead < 0:
            raise ValueError(f"train.read_ahead: expected >= 0 batches, got {read_ahead}")
        self.read_ahead = int(read_ahead)
        self._read_ahead_loaders: list[ReadAheadLoader] = []  # closed at teardown
        self.dataset = open_dataset(dataset_dir)
        self.online = online
        self.pin_memory = bool(pin_memory) and online is None  # online batches are made on the device
        if isinstance(self.dataset, TokenDataset) and online is None:
            raise ValueError(f"{dataset_dir}: holds token ids only; train it with train.hidden_states=online")
        if isinstance(self.dataset, HiddenStateDataset) and online is not None:
            raise ValueError(f"{dataset_dir}: holds hidden states; online training reads a token dataset")
        val = set(self.dataset.val_indices())
        by_id = sorted(range(len(self.dataset)), key=self.dataset.sample_id)
        self.train_idx = [i for i in by_id if i not in val]
        self.val_idx = [i for i in by_id if i in val]
        if not self.train_idx and require_train:  # measuring (replay_export) needs no training split
            raise ValueError(f"{dataset_dir}: no training samples (all {len(self.dataset)} are validation)")
        lengths: list[int] = self.dataset.lengths.tolist()
        if self.row_tokens and max(lengths) > self.row_tokens:
            raise ValueError(
                f"train.row_tokens={self.row_tokens}: shorter than the longest sample of {dataset_dir} "
                f"({max(lengths)} tokens), which would be cut; expected >= {max(lengths)} or null"
            )
        self.train_batches = pack_rows(
            [lengths[i] for i in self.train_idx], self.max_tokens, self.row_tokens, seed=self.seed
        )
        self.val_batches = pack_rows(
            [lengths[i] for i in self.val_idx], self.max_tokens, self.row_tokens, seed=self.seed
        )
        self.selection = _selection_set(self.dataset, selection_dir) if selection_dir else None
        self.selection_idx = sorted(range(len(self.selection)), key=self.selection.sample_id) if self.selection else []
        selection_lengths: list[int] = self.selection.lengths.tolist() if self.selection else []
        self.selection_batches = pack_rows(
            [selection_lengths[i] for i in self.selection_idx], self.max_tokens, self.row_tokens, seed=self.seed
        )
        self._resume_start = 0
        self.decode_on_device = decode_on_device
        # CUDA: the stream batches are copied on (transfer_batch_to_device)
        self._copy_stream: torch.cuda.Stream | None = None

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer else (0, 1)

    def _loader(
        self,
        idx: list[int],
        batches: list[list[int]],
        shuffle: bool,
        batches_done: int = 0,
        split_across_ranks: bool = True,
        dataset=None,
    ):
        rank, world = self._rank_world() if split_across_ranks else (0, 1)
        dataset = dataset if dataset is not None else self.dataset
        if self.decode_on_device and isinstance(dataset, HiddenStateDataset):
            dataset = dataset.encoded_rows()  # the format's tensors travel; decoded on the device
        loader = packed_loader(
            dataset,
            idx,
            batches,
            shape=BatchShape(self.max_tokens, self.row_tokens, self.fixed_shape),
            order=BatchOrder(shuffle, self.seed, rank, world, batches_done),
            num_workers=self.num_workers,
            read_ahead=self.read_ahead,
            collate=list if self.online is not None else None,
            pin_memory=self.pin_memory,
            split=False,  # hidden [B, T, L, H] travels whole; split on the device (on_after_batch_transfer)
        )
        if isinstance(loader, ReadAheadLoader):
            self._read_ahead_loaders.append(loader)
        return loader

    def setup(self, stage: str) -> None:
        if self.decode_on_device is None:
            device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
            self.decode_on_device = device.type == "cuda"
        if self.online is not None:  # the target onto this process's training device
            self.online.setup(self.trainer.strategy.root_device if self.trainer else "cpu")

    def teardown(self, stage: str) -> None:
        # a pass stopped at max_steps leaves its reading thread blocked on a full queue of batches
        for loader in self._read_ahead_loaders:
            loader.close()
        self._read_ahead_loaders.clear()

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # online: token samples -> the batch with hidden states, computed on the training device
        return self.online(batch) if self.online is not None else batch

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """On CUDA, the copy runs on a side stream, beside the previous step's kernels: the step
        waits for its own batch only (a copy on the step's stream would wait for the previous
        step to finish). ``num_tokens`` stays on the host."""
        if device.type != "cuda" or not isinstance(batch, dict):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)
        with torch.cuda.stream(self._copy_stream):
            moved = {
                k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and k != "num_tokens" else v
                for k, v in batch.items()
            }
        step_stream = torch.cuda.current_stream(device)
        step_stream.wait_stream(self._copy_stream)
        for v in moved.values():
            if isinstance(v, torch.Tensor) and v.is_cuda:
                v.record_stream(step_stream)  # its memory is not reused until the step is done with it
        return moved

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # the aux/final split on the training device: on a GPU its reshape copy is ~free, on the
        # host it was a second pass over every batch's states. A batch that came encoded is
        # decoded here, on that device. (Lightning runs this hook, not the LightningModule's, when
        # the data module defines it: the decode lives here, beside the split it replaces.)
        if isinstance(self.dataset, HiddenStateDataset):
            return decode_hidden(batch, self.dataset.storage, self.dataset.dtype)
        return split_hidden(batch)  # online: the target's states, computed whole

    def loader_for(self, idx: list[int]):
        """These samples in this module's batches, unshuffled, in this process (evaluation)."""
        return unshuffled_loader(
            self.dataset,
            idx,
            max_tokens=self.max_tokens,
            row_tokens=self.row_tokens,
            seed=self.seed,
            num_workers=self.num_workers,
        )

    def train_dataloader(self):
        trainer = self.trainer
        # resumed runs continue the batch stream where the checkpoint left it
        done = trainer.global_step * max(1, trainer.accumulate_grad_batches) if trainer is not None else 0
        # Lightning warns that a mid-epoch resume with this loader "can cause unreliable
        # results": not so here, the sampler starts at the restored step (test_train's resume
        # test: 3 + 13 steps across passes == 16 in one go), so the advice would only mislead
        warnings.filterwarnings(
            "ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended"
        )
        return self._loader(self.train_idx, self.train_batches, shuffle=True, batches_done=done)

    @property
    def val_set_names(self) -> list[str]:
        """The metric prefix of each validation loader, in val_dataloader's order."""
        return (["val"] if self.val_idx else []) + (["select"] if self.selection_idx else [])

    def val_dataloader(self):
        # every validation batch counts exactly once over all ranks (the counts are summed), so
        # ranks may get unequal numbers of them; the training stream instead trims to equal counts
        rank, world = self._rank_world()
        loaders = []
        for name, dataset, idx, batches in (
            ("validation", self.dataset, self.val_idx, self.val_batches),
            ("selection", self.selection, self.selection_idx, self.selection_batches),
        ):
            if not idx:
                continue
            if len(batches) < world:
                raise ValueError(
                    f"{getattr(dataset, 'directory', self.dataset_dir)}: {len(batches)} {name} batches cannot feed "
                    f"{world} ranks; lower train.max_tokens_per_batch or raise "
                    f"{'data.val_fraction' if name == 'validation' else 'selection.samples'}"
                )
            loaders.append(
                self._loader(idx, batches[rank::world], shuffle=False, split_across_ranks=False, dataset=dataset)
            )
        return loaders[0] if len(loaders) == 1 else loaders


def _selection_set(dataset, selection_dir: str) -> HiddenStateDataset:
    """The selection set's dataset, read as the training data is: the same layers, hidden size,
    dtype and storage (one decode for every batch), else an error naming what differs."""
    selection = open_dataset(selection_dir)
    if not isinstance(selection, HiddenStateDataset) or not isinstance(dataset, HiddenStateDataset):
        raise ValueError(f"{selection_dir}: a selection set holds stored hidden states, as the training data must")
    for field, want, got in (
        ("layer_ids", list(dataset.manifest.layer_ids), list(selection.manifest.layer_ids)),
        ("hidden_size", dataset.manifest.hidden_size, selection.manifest.hidden_size),
        ("dtype", dataset.dtype, selection.dtype),
        ("storage", dataset.storage, selection.storage),
    ):
        if want != got:
            raise ValueError(
                f"{selection_dir}/manifest.json: {field}: expected {want} (the training data's), got {got}; "
                "extract the selection set with the training data's overrides"
            )
    return selection
